

# ------------------------------------------------ shard_map: the per-device body, by hand
# The mesh {{MESH}}, composed per axis: {{COMPOSITION_DOC}}
# Every collective is written out; autodiff adds the transposes of those in the forward pass.
# Each axis adds its own piece, whatever the other axes are: "dp" and "fsdp" split the batch
# (the gradients summed over them), "ep" splits the batch and a mixture's experts (two
# all_to_alls a block), "fsdp" gathers each parameter it splits before use and
# reduce-scatters its gradient, ZeRO updates each "dp" device's block of the state, "tp" runs
# Megatron's collectives inside the blocks, "cp" runs ring attention, "pp" the stages.

# Each state array's layout: (global shape, in_spec), by state name (a block's parameter
# stacked over the layers: its spec's first entry is the layer axis, split over "pp" in a
# pipeline). Under tensor parallelism w_qkv and b_qkv are viewed with their columns as
# (3, H, Dh) (row-major: the same data) and split per head.
{{PARAM_LAYOUT}}
# Each parameter's optimizer state layout: its parameter's, but under ZeRO, which splits the
# state over "dp" too where the parameter is whole over it.
{{STATE_LAYOUT}}
BATCH_AXES = {{BATCH_AXES}}  # the axes that split the batch: data parallelism, FSDP and ep
SEQ_AXES = {{SEQ_AXES}}  # the axes that split the residual stream's sequence
TP_AXIS = {{TP_AXIS}}  # Megatron tensor parallelism (None: none)
SP = {{SP}}  # sequence parallelism over TP_AXIS: the layer-norm and dropout regions split on the sequence
CP_AXIS = {{CP_AXIS}}  # context parallelism: the sequence split, ring attention (None: none)
CP_ORDER = {{CP_ORDER}}  # how the sequence's blocks lie on the ring: "contiguous" or "zigzag"
ZERO = {{ZERO}}  # ZeRO's stage on "dp": 1 the optimizer state split, 2 the gradients too (0: off)
# Every dropout mask is this device's block of the one-device run's (where the sequence is
# split, in a pipeline, and under DROPOUT_KEY = "global"); else drawn on the local shape.
MASK_BLOCKS = {{MASK_BLOCKS}}
# The tokens' in_spec: the batch over BATCH_AXES, the sequence over SEQ_AXES (zig-zag's two
# chunks are no block of a spec: every device takes its rows of the whole).
BATCH_SPEC = TARGETS_SPEC = {{BATCH_SPEC}}
EP_AXIS = {{EP_AXIS}}  # expert parallelism: a mixture of experts' experts split (None: none)
SPLIT = Split(
    batch=BATCH_AXES, tp=TP_AXIS, sp=SP, seq=SEQ_AXES, cp=CP_AXIS, order=CP_ORDER, blocks=MASK_BLOCKS, ep=EP_AXIS
)
# The axes that split the tokens: the loss is their mean, a gradient their sum where its
# parameter is not split over them.
TOKEN_AXES = BATCH_AXES + SEQ_AXES


def spec_axes(spec):
    return set(jax.tree.leaves(tuple(spec)))


def dim_of(spec, axis):
    """The dimension of a spec that `axis` splits, None where it splits none."""
    return next((d for d, axes in enumerate(spec) if axis in jax.tree.leaves(axes)), None)


def fsdp_dim(name):
    """FSDP: the dimension of the parameter that "fsdp" splits (the rules pick it)."""
    return dim_of(PARAM_LAYOUT[name][1], "fsdp")


def block_dim(name):
    """ZeRO: the dimension of the state that "dp" splits, where the parameter is whole over
    "dp": each device updates its block of it."""
    if "dp" in spec_axes(PARAM_LAYOUT[name][1]):
        return None
    return dim_of(STATE_LAYOUT[name][1], "dp")


def summed_over(name, extra=()):
    """The token axes (and `extra`) a parameter's gradient is summed over: those its layout
    does not split, but "dp" where ZeRO-2 reduce-scattered it already."""
    scattered = ZERO == 2 and block_dim(name) is not None
    spec = spec_axes(PARAM_LAYOUT[name][1])
    return tuple(a for a in TOKEN_AXES + extra if a not in spec and not (scattered and a == "dp"))


def gathered(name, p, extra=()):
    """The parameter as the device computes with it: FSDP's block all-gathered, and marked as
    varying over the axes its gradient is summed over, so that the gradient stays per device
    until the explicit sum (check_vma holds the body to it)."""
    if fsdp_dim(name) is not None:
        p = jax.lax.all_gather(p, "fsdp", axis=fsdp_dim(name), tiled=True)
    vary = tuple(a for a in TOKEN_AXES + extra if a not in spec_axes(PARAM_LAYOUT[name][1]))
    return jax.lax.pcast(p, vary, to="varying") if vary else p


def scattered(name, g):
    """A gradient of the gathered parameter back to what the device holds: FSDP's block
    (reduce-scatter, the all_gather's transpose), and ZeRO-2's block over "dp" (each
    microbatch's reduce-scattered as it is made)."""
    if fsdp_dim(name) is not None:
        g = jax.lax.psum_scatter(g, "fsdp", scatter_dimension=fsdp_dim(name), tiled=True)
    if ZERO == 2 and block_dim(name) is not None:
        g = jax.lax.psum_scatter(g, "dp", scatter_dimension=block_dim(name), tiled=True)
    return g


def reduced(name, g, extra=()):
    """The gradient summed over the devices that split its tokens (data parallelism's
    all-reduce, once after the microbatches)."""
    axes = summed_over(name, extra)
    return jax.lax.psum(g, axes) if axes else g


def own_block(x, name):
    """This device's block over "dp" of the dimension the state of `name` splits."""
    dim = block_dim(name)
    n = x.shape[dim] // jax.lax.axis_size("dp")
    return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index("dp") * n, n, dim)


def update(params, grads, opt_state, hyper):
    """The optimizer on what each device holds; under ZeRO on its block over "dp" (ZeRO-1
    slices it from the whole gradient), the updated blocks gathered into the whole parameter,
    the same on every device."""
    blocks = {n: own_block(p, n) if block_dim(n) is not None else p for n, p in params.items()}
    grads = {n: own_block(g, n) if block_dim(n) is not None and ZERO == 1 else g for n, g in grads.items()}
    blocks, opt_state = apply_updates(blocks, grads, opt_state, hyper)
    params = {
        n: jax.lax.all_gather(p, "dp", axis=block_dim(n), tiled=True, to="invarying") if block_dim(n) is not None else p
        for n, p in blocks.items()
    }
    return params, opt_state


def device_key(key):
    """The step's key as --dropout-key says: folded in with the batch axes' index under
    "fold_in"."""
    if DROPOUT_KEY == "fold_in" and BATCH_AXES:
        return jax.random.fold_in(key, jax.lax.axis_index(BATCH_AXES))
    return key


def own_rows(tokens):
    """Zig-zag: every "cp" device got the whole sequence of tokens; it takes its rows."""
    if CP_AXIS is None or CP_ORDER != "zigzag":
        return tokens
    return jnp.take(tokens, seq_positions(SEQ_AXES, SEQ // jax.lax.axis_size(SEQ_AXES), CP_ORDER), axis=1)


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
