

# ------------------------------------------------ shard_map: the per-device body, by hand
# Strategy {{STRATEGY}}: {{STRATEGY_DOC}}
# Every collective is written out; autodiff adds the transposes of those in the forward pass.

# Each state array's layout: (global shape, in_spec), by state name (a block's parameter
# stacked over the layers: its spec's first entry is the layer axis). Under tensor
# parallelism w_qkv and b_qkv are viewed with their columns as (3, H, Dh) (row-major: the
# same data) and split per head.
{{PARAM_LAYOUT}}
# Each parameter's optimizer state layout: its parameter's, except under ZeRO, which splits
# the state over "dp" while the parameter stays whole.
{{STATE_LAYOUT}}
DP_AXIS = {{DP_AXIS}}  # the batch and the gradient reduction (None: no data parallelism)
TP_AXIS = {{TP_AXIS}}  # Megatron tensor parallelism (None: none)
GRADIENTS_SPLIT = {{GRADIENTS_SPLIT}}  # ZeRO-2: each device holds only its block of a split state's gradient
SP = {{SP}}  # sequence parallelism over TP_AXIS: the layer-norm and dropout regions split on the sequence
CP_AXIS = {{CP_AXIS}}  # context parallelism: the sequence split, ring attention (None: none)
CP_ORDER = {{CP_ORDER}}  # how the sequence's blocks lie on the ring: "contiguous" or "zigzag"
# The tokens' in_spec: the batch over DP_AXIS, the sequence over the axis that splits it
# (zig-zag's two chunks are no block of a spec: every device takes its rows of the whole).
BATCH_SPEC = TARGETS_SPEC = {{BATCH_SPEC}}
SPLIT = Split(tp=TP_AXIS, sp=SP, cp=CP_AXIS, dp=DP_AXIS, order=CP_ORDER)
# The axes that split the tokens: the loss is their mean, a replicated gradient their sum.
TOKEN_AXES = tuple(a for a in (DP_AXIS, CP_AXIS, TP_AXIS if SP else None) if a is not None)


def spec_axes(name):
    return set(jax.tree.leaves(tuple(PARAM_LAYOUT[name][1])))


def dp_sharded(name):
    return DP_AXIS is not None and DP_AXIS in spec_axes(name)


def dp_dim(spec):
    """The dimension a spec splits over DP_AXIS (a stack's first is its layer axis)."""
    return next(d for d, axes in enumerate(spec) if DP_AXIS in jax.tree.leaves(axes))


def summed_over(name):
    """The token axes a parameter's gradient is summed over: those its layout does not split."""
    return tuple(a for a in TOKEN_AXES if a not in spec_axes(name))


def block_update(name):
    """ZeRO-1 and 2: the parameter is whole on every device, its state split over DP_AXIS:
    each device updates its block and the updated blocks are gathered."""
    split = DP_AXIS is not None and DP_AXIS in jax.tree.leaves(tuple(STATE_LAYOUT[name][1]))
    return split and not dp_sharded(name)


def own_block(x, name):
    """This device's block over DP_AXIS of the dimension the state of `name` splits."""
    dim = dp_dim(STATE_LAYOUT[name][1])
    n = x.shape[dim] // jax.lax.axis_size(DP_AXIS)
    return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(DP_AXIS) * n, n, dim)


def body(params, opt_state, tokens, targets, key, hyper):
    """One device's step: its blocks of the parameters, state and batch in, its blocks out."""
    n = math.prod(jax.lax.axis_size(a) for a in TOKEN_AXES)
    # The weights computed with are COMPUTE copies of the float32 masters, so FSDP's gathers
    # and the gradient reduction move COMPUTE. FSDP gathers the parameters it shards before
    # use. Parameters not split over a token axis are marked as varying over it, so that their
    # gradients stay per device until the explicit reduction. The gradients are taken with
    # respect to these whole, per-device arrays.
    full = {}
    for name, p in to_compute(params).items():
        if dp_sharded(name):
            p = jax.lax.all_gather(p, DP_AXIS, axis=dp_dim(PARAM_LAYOUT[name][1]), tiled=True)
        if summed_over(name) and not dp_sharded(name):
            p = jax.lax.pcast(p, summed_over(name), to="varying")
        full[name] = p
    if DROPOUT_KEY == "fold_in" and DP_AXIS is not None:
        key = jax.random.fold_in(key, jax.lax.axis_index(DP_AXIS))
    if CP_AXIS is not None and CP_ORDER == "zigzag":
        rows = seq_positions(SPLIT, SEQ // jax.lax.axis_size(CP_AXIS))
        tokens, targets = jnp.take(tokens, rows, axis=1), jnp.take(targets, rows, axis=1)

    def local_loss(full, x, y, k):
        loss = forward_loss(full, x, y, k, split=SPLIT)
        # The global loss is the mean of the devices' (and microbatches') local means:
        # differentiate loss/(n K), n the devices splitting the tokens, so that summing the
        # gradients over them and the microbatches gives the mean's.
        scaled = loss * (1.0 / (n * MICROBATCHES)) if TOKEN_AXES or MICROBATCHES > 1 else loss
        return scaled, loss

    def scattered(name):
        # FSDP's and ZeRO-2's gradients: reduce-scattered to this device's block as each
        # microbatch makes them (what the all_gather's transpose does under FSDP).
        return dp_sharded(name) or (GRADIENTS_SPLIT and block_update(name))

    def reduce_each(name, g):
        if scattered(name):
            dim = dp_dim(STATE_LAYOUT[name][1])
            return jax.lax.psum_scatter(g, DP_AXIS, scatter_dimension=dim, tiled=True)
        return g

    loss, grads = accumulate(local_loss, full, tokens, targets, key, on_grad=reduce_each)
    if MICROBATCHES > 1:
        loss = loss * np.float32(1.0 / MICROBATCHES)
    if TOKEN_AXES:
        # Data parallelism and ZeRO-1: all-reduce the gradients of parameters not split over a
        # token axis once, after the last microbatch.
        grads = {
            name: g if scattered(name) or not summed_over(name) else jax.lax.psum(g, summed_over(name))
            for name, g in grads.items()
        }
        loss = jax.lax.pmean(loss, TOKEN_AXES)
    # ZeRO-1 and 2 update this device's block (ZeRO-1 slices it from the whole gradient), then
    # gather the updated blocks into the whole parameter, the same on every device.
    blocks = {n: own_block(p, n) if block_update(n) else p for n, p in params.items()}
    grads = {n: own_block(g, n) if block_update(n) and not GRADIENTS_SPLIT else g for n, g in grads.items()}
    blocks, opt_state = apply_updates(blocks, grads, opt_state, hyper)
    params = {
        n: jax.lax.all_gather(p, DP_AXIS, axis=dp_dim(STATE_LAYOUT[n][1]), tiled=True, to="invarying")
        if block_update(n) else p
        for n, p in blocks.items()
    }
    return loss, params, opt_state


def make_train_step():
    param_specs = {name: spec for name, (_, spec) in PARAM_LAYOUT.items()}
    state_spec = {name: spec for name, (_, spec) in STATE_LAYOUT.items()}
    state_specs = () if OPTIMIZER == "sgd" else (state_spec, state_spec)
    return jax.jit(
        jax.shard_map(
            body,
            mesh=make_mesh(),
            in_specs=(param_specs, state_specs, BATCH_SPEC, BATCH_SPEC, P(), P()),
            out_specs=(P(), param_specs, state_specs),
        ),
        donate_argnums=(0, 1),
    )
