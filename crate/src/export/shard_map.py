

# ------------------------------------------------ shard_map: the per-device body, by hand
# Strategy {{STRATEGY}}: {{STRATEGY_DOC}}
# Every collective is written out; autodiff adds the transposes of those in the forward pass.

# Each parameter's layout: (global shape, in_spec). Under tensor parallelism w_qkv and
# b_qkv are viewed with their columns as (3, H, Dh) (row-major: the same data) and split
# per head. Optimizer state is laid out like its parameter.
{{PARAM_LAYOUT}}
DP_AXIS = {{DP_AXIS}}  # the batch and the gradient reduction (None: no data parallelism)
TP_AXIS = {{TP_AXIS}}  # Megatron tensor parallelism (None: none)
SP = {{SP}}  # sequence parallelism over TP_AXIS: the layer-norm and dropout regions split on the sequence
CP_AXIS = {{CP_AXIS}}  # context parallelism: the sequence split, ring attention (None: none)
CP_ORDER = {{CP_ORDER}}  # how the sequence's blocks lie on the ring: "contiguous" or "zigzag"
DROPOUT_KEY = {{DROPOUT_KEY}}  # "same": one key on every device; "fold_in": fold_in(key, axis_index(dp))
# The tokens' in_spec: the batch over DP_AXIS, the sequence over the axis that splits it
# (zig-zag's two chunks are no block of a spec: every device takes its rows of the whole).
BATCH_SPEC = {{BATCH_SPEC}}
SPLIT = Split(tp=TP_AXIS, sp=SP, cp=CP_AXIS, dp=DP_AXIS, order=CP_ORDER)
# The axes that split the tokens: the loss is their mean, a replicated gradient their sum.
TOKEN_AXES = tuple(a for a in (DP_AXIS, CP_AXIS, TP_AXIS if SP else None) if a is not None)


def spec_axes(name):
    return set(jax.tree.leaves(tuple(PARAM_LAYOUT[name][1])))


def dp_sharded(name):
    return DP_AXIS is not None and DP_AXIS in spec_axes(name)


def summed_over(name):
    """The token axes a parameter's gradient is summed over: those its layout does not split."""
    return tuple(a for a in TOKEN_AXES if a not in spec_axes(name))


def body(params, opt_state, tokens, targets, key, hyper):
    """One device's step: its blocks of the parameters, state and batch in, its blocks out."""
    names = [name for name, _ in param_shapes()]
    n = math.prod(jax.lax.axis_size(a) for a in TOKEN_AXES)
    # FSDP gathers the parameters it shards before use. Parameters not split over a token axis
    # are marked as varying over it, so that their gradients stay per device until the
    # explicit psum.
    full = []
    for name, p in zip(names, params):
        if dp_sharded(name):
            p = jax.lax.all_gather(p, DP_AXIS, axis=0, tiled=True)
        if summed_over(name) and not dp_sharded(name):
            p = jax.lax.pcast(p, summed_over(name), to="varying")
        full.append(p)
    if DROPOUT_KEY == "fold_in" and DP_AXIS is not None:
        key = jax.random.fold_in(key, jax.lax.axis_index(DP_AXIS))
    if CP_AXIS is not None and CP_ORDER == "zigzag":
        rows = seq_positions(SPLIT, SEQ // jax.lax.axis_size(CP_AXIS))
        tokens, targets = jnp.take(tokens, rows, axis=1), jnp.take(targets, rows, axis=1)

    def local_loss(full):
        loss = forward_loss(full, tokens, targets, key, split=SPLIT)
        # The global loss is the mean of the devices' local means: differentiate loss/n so
        # that summing the gradients over the n devices splitting the tokens gives the mean's.
        return loss * (1.0 / n), loss

    (_, loss), grads = jax.value_and_grad(local_loss, has_aux=True)(full)
    if TOKEN_AXES:
        # Data parallelism: all-reduce the gradients of replicated parameters; FSDP:
        # reduce-scatter those of sharded ones back to this device's block.
        grads = [
            jax.lax.psum_scatter(g, DP_AXIS, scatter_dimension=0, tiled=True) if dp_sharded(name)
            else jax.lax.psum(g, summed_over(name)) if summed_over(name)
            else g
            for name, g in zip(names, grads)
        ]
        loss = jax.lax.pmean(loss, TOKEN_AXES)
    params, opt_state = apply_updates(params, grads, opt_state, hyper)
    return loss, params, opt_state


def make_train_step(params, opt_state):
    mesh = make_mesh()
    names = [name for name, _ in param_shapes()]
    param_specs = [PARAM_LAYOUT[name][1] for name in names]
    state_specs = () if OPTIMIZER == "sgd" else (param_specs, param_specs)
    step = jax.jit(
        jax.shard_map(
            body,
            mesh=mesh,
            in_specs=(param_specs, state_specs, BATCH_SPEC, BATCH_SPEC, P(), P()),
            out_specs=(P(), param_specs, state_specs),
        ),
        donate_argnums=(0, 1),
    )
    # Parameters (and state) in their layout shapes, placed on the mesh once.
    view = lambda ps: [p.reshape(PARAM_LAYOUT[name][0]) for name, p in zip(names, ps)]  # noqa: E731
    shardings = [NamedSharding(mesh, spec) for spec in param_specs]
    params = jax.device_put(view(params), shardings)
    if OPTIMIZER != "sgd":
        opt_state = jax.device_put((view(opt_state[0]), view(opt_state[1])), (shardings, shardings))
    return step, params, opt_state


def global_params(params):
    """The parameters in their stored shapes (undoing the per-head views)."""
    return [p.reshape(shape) for (_, shape), p in zip(param_shapes(), params)]
