

# ------------------------------------------------ shard_map: the per-device body, by hand
# Strategy {{STRATEGY}}: {{STRATEGY_DOC}}
# Every collective is written out; autodiff adds the transposes of those in the forward pass.

# Each parameter's layout: (global shape, in_spec). Under tensor parallelism w_qkv and
# b_qkv are viewed with their columns as (3, H, Dh) (row-major: the same data) and split
# per head.
{{PARAM_LAYOUT}}
# Each parameter's optimizer state layout: its parameter's, except under ZeRO, which splits
# the state over "dp" while the parameter stays whole.
{{STATE_LAYOUT}}
DP_AXIS = {{DP_AXIS}}  # the batch and the gradient reduction (None: no data parallelism)
TP_AXIS = {{TP_AXIS}}  # Megatron tensor parallelism (None: none)
GRADIENTS_SPLIT = {{GRADIENTS_SPLIT}}  # ZeRO-2: each device holds only its block of a split state's gradient
DROPOUT_KEY = {{DROPOUT_KEY}}  # "same": one key on every device; "fold_in": fold_in(key, axis_index(dp))
BATCH_SPEC = P(DP_AXIS, None) if DP_AXIS else P()


def dp_sharded(name):
    return DP_AXIS is not None and DP_AXIS in jax.tree.leaves(tuple(PARAM_LAYOUT[name][1]))


def block_update(name):
    """ZeRO-1 and 2: the parameter is whole on every device, its state split over DP_AXIS:
    each device updates its block and the updated blocks are gathered."""
    split = DP_AXIS is not None and DP_AXIS in jax.tree.leaves(tuple(STATE_LAYOUT[name][1]))
    return split and not dp_sharded(name)


def own_block(x):
    """This device's block of dimension 0 over DP_AXIS."""
    n = x.shape[0] // jax.lax.axis_size(DP_AXIS)
    return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(DP_AXIS) * n, n, 0)


def body(params, opt_state, tokens, targets, key, hyper):
    """One device's step: its blocks of the parameters, state and batch in, its blocks out."""
    names = [name for name, _ in param_shapes()]
    dp = 1 if DP_AXIS is None else jax.lax.axis_size(DP_AXIS)
    # The weights computed with are COMPUTE copies of the float32 masters, so FSDP's gathers
    # and the gradient reduction move COMPUTE.
    # FSDP gathers the parameters it shards before use. Replicated parameters are marked as
    # varying over DP_AXIS so that their gradients stay per device until the explicit
    # reduction. The gradients are taken with respect to these whole, per-device arrays.
    full = []
    for name, p in zip(names, to_compute(params)):
        if dp_sharded(name):
            full.append(jax.lax.all_gather(p, DP_AXIS, axis=0, tiled=True))
        elif DP_AXIS is not None:
            full.append(jax.lax.pcast(p, DP_AXIS, to="varying"))
        else:
            full.append(p)

    if DROPOUT_KEY == "fold_in" and DP_AXIS is not None:
        key = jax.random.fold_in(key, jax.lax.axis_index(DP_AXIS))

    def local_loss(full, x, y, k):
        loss = forward_loss(full, x, y, k, tp_axis=TP_AXIS)
        # The global loss is the mean of the devices' (and microbatches') local means:
        # differentiate loss/(dp K) so that summing the gradients gives the mean's.
        scaled = loss * (1.0 / (dp * MICROBATCHES)) if DP_AXIS is not None or MICROBATCHES > 1 else loss
        return scaled, loss

    def reduce_each(name, g):
        # FSDP's and ZeRO-2's gradients: reduce-scattered to this device's block as each
        # microbatch makes them (what the all_gather's transpose does under FSDP).
        if dp_sharded(name) or (GRADIENTS_SPLIT and block_update(name)):
            return jax.lax.psum_scatter(g, DP_AXIS, scatter_dimension=0, tiled=True)
        return g

    loss, grads = accumulate(local_loss, full, tokens, targets, key, on_grad=reduce_each)
    if MICROBATCHES > 1:
        loss = loss * np.float32(1.0 / MICROBATCHES)
    if DP_AXIS is not None:
        # Data parallelism and ZeRO-1: all-reduce the gradients of replicated parameters once,
        # after the last microbatch.
        grads = [
            g if dp_sharded(name) or (GRADIENTS_SPLIT and block_update(name)) else jax.lax.psum(g, DP_AXIS)
            for name, g in zip(names, grads)
        ]
        loss = jax.lax.pmean(loss, DP_AXIS)
    # ZeRO-1 and 2 update this device's block (ZeRO-1 slices it from the whole gradient), then
    # gather the updated blocks into the whole parameter, the same on every device.
    blocks = [own_block(p) if block_update(n) else p for n, p in zip(names, params)]
    grads = [
        own_block(g) if block_update(n) and not GRADIENTS_SPLIT else g for n, g in zip(names, grads)
    ]
    blocks, opt_state = apply_updates(blocks, grads, opt_state, hyper)
    params = [
        jax.lax.all_gather(p, DP_AXIS, axis=0, tiled=True, to="invarying") if block_update(n) else p
        for n, p in zip(names, blocks)
    ]
    return loss, params, opt_state


def make_train_step(params, opt_state):
    mesh = make_mesh()
    names = [name for name, _ in param_shapes()]
    param_specs = [PARAM_LAYOUT[name][1] for name in names]
    state_spec = [STATE_LAYOUT[name][1] for name in names]
    state_specs = () if OPTIMIZER == "sgd" else (state_spec, state_spec)
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
    view = lambda ps, layout: [p.reshape(layout[name][0]) for name, p in zip(names, ps)]  # noqa: E731
    shardings = [NamedSharding(mesh, spec) for spec in param_specs]
    params = jax.device_put(view(params, PARAM_LAYOUT), shardings)
    if OPTIMIZER != "sgd":
        state = [NamedSharding(mesh, spec) for spec in state_spec]
        opt_state = jax.device_put(
            (view(opt_state[0], STATE_LAYOUT), view(opt_state[1], STATE_LAYOUT)), (state, state)
        )
    return step, params, opt_state


def global_params(params):
    """The parameters in their stored shapes (undoing the per-head views)."""
    return [p.reshape(shape) for (_, shape), p in zip(param_shapes(), params)]
