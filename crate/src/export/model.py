
DH = D_MODEL // HEADS  # head dim
# The dtype policy (jmp's params=float32,compute=COMPUTE_DTYPE): parameters and optimizer state
# are float32 masters; the step computes with a copy of the weights in COMPUTE, so activations
# and gradients are COMPUTE too, and the update converts the gradients to float32.
COMPUTE = jnp.dtype(COMPUTE_DTYPE)
LN_EPS = 1e-5
MASK_VALUE = -1e30
GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment
U64 = (1 << 64) - 1


# ----------------------------------------------------------- parameters, in MODEL.md order

# The 12 parameters of a block, in MODEL.md order. The state holds each as one stack over the
# layers (leading axis LAYERS), so that the layers run as one jax.lax.scan, compiled once.
# With a mixture of experts the router and the experts' stacked weights take the dense MLP's
# places (the experts have no bias, as Switch's and Mixtral's).


def block_shapes():
    """(name, shape) of a block's parameters, in MODEL.md order."""
    d = D_MODEL
    attention = [
        ("ln1_g", (d,)), ("ln1_b", (d,)), ("w_qkv", (d, 3 * d)), ("b_qkv", (3 * d,)),
        ("w_proj", (d, d)), ("b_proj", (d,)), ("ln2_g", (d,)), ("ln2_b", (d,)),
    ]
    if EXPERTS:
        e, f = EXPERTS, EXPERT_WIDTH
        mlp = [("w_router", (d, e)), ("w_fc", (e, d, f)), ("w_out", (e, f, d))]
    else:
        mlp = [("w_fc", (d, 4 * d)), ("b_fc", (4 * d,)), ("w_out", (4 * d, d))]
    return attention + mlp + [("b_out", (d,))]


BLOCK = tuple(name for name, _ in block_shapes())


def param_shapes():
    """(name, shape) of every parameter; the list position is MODEL.md's param_index."""
    d, v, t = D_MODEL, VOCAB, SEQ
    shapes = [("wte", (v, d)), ("wpe", (t, d))]
    for layer in range(LAYERS):
        shapes += [(f"h{layer}.{name}", shape) for name, shape in block_shapes()]
    shapes += [("lnf_g", (d,)), ("lnf_b", (d,))]
    if not TIED:
        shapes.append(("w_head", (d, v)))
    return shapes


def state_shapes():
    """(name, stored shape) of each array of the training state: MODEL.md's parameters with
    every block parameter `hN.name` stacked into `name` of shape (LAYERS, ...)."""
    shapes = {}
    for name, shape in param_shapes():
        layer, _, leaf = name.rpartition(".")
        if not layer:
            shapes[name] = shape
        elif layer == "h0":
            shapes[leaf] = (LAYERS, *shape)
    return list(shapes.items())


def stack_params(flat):
    """MODEL.md's list of parameters as the state: a dict, the blocks' stacked."""
    named = dict(zip((name for name, _ in param_shapes()), flat))
    state = {}
    for name, _ in state_shapes():
        if name in BLOCK:
            state[name] = np.stack([named[f"h{layer}.{name}"] for layer in range(LAYERS)])
        else:
            state[name] = named[name]
    return state


def pipeline_rows():
    """A pipeline's block stack as laid out, (CHUNKS, PP, ROWS, ...) flattened to its rows: the
    layer each row holds, -1 for a row of zeros (a chunk with fewer blocks than ROWS)."""
    rows = max(len(layers) for stages in PIPELINE_LAYERS for layers in stages)
    return [layers[i] if i < len(layers) else -1 for stages in PIPELINE_LAYERS for layers in stages for i in range(rows)]


def laid_out(name, x):
    """A stored array (numpy, the state's shape) with its rows as its layout holds them: a
    pipeline's block stack in the stages' order, padded with rows of zeros (the caller reshapes
    it to the layout's shape); anything else as it is."""
    if PIPELINE_LAYERS is None or name not in BLOCK:
        return x
    return np.concatenate([x, np.zeros_like(x[:1])])[pipeline_rows()]


def in_model_order(name, x):
    """`laid_out`'s inverse on an array in its layout's shape: a pipeline's block stack as
    (LAYERS, ...) in model order (the padding dropped); anything else as it is."""
    if PIPELINE_LAYERS is None or name not in BLOCK:
        return x
    rows = pipeline_rows()
    return x.reshape(-1, *x.shape[3:])[np.array([rows.index(layer) for layer in range(LAYERS)])]


# AdamW decays weight matrices only (2-D, and the experts' stacks of them; a stack over the
# layers decays as each of its layers' parameter does).
DECAYS = {name: len(shape) - (name in BLOCK) >= 2 for name, shape in state_shapes()}


class SplitMix64:
    """shardlab's generator for the random init and the synthetic data."""

    def __init__(self, state):
        self.state = state & U64

    def next_u64(self):
        self.state = (self.state + GAMMA) & U64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
        return z ^ (z >> 31)

    def normals(self, count):
        """`count` Box-Muller normals (float64), each from two uniforms: the same numbers as
        `count` calls of shardlab's SplitMix64::normal, computed in one vectorized go."""
        k = np.arange(1, 2 * count + 1, dtype=np.uint64)
        z = np.uint64(self.state) + k * np.uint64(GAMMA)  # wraps modulo 2^64
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
        self.state = (self.state + 2 * count * GAMMA) & U64
        u = ((z >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
        u1, u2 = u[0::2], u[1::2]
        return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)


def init_params():
    """Initial parameters (numpy float32) as the state (`stack_params`). 1-D: gains 1, biases 0.
    formula: W[i, j] = 0.02 sin(1.3 i + 0.7 j + param_index) in float64, rounded; an
    expert's slice W[e] of a 3-D stack of experts' weights offset by 0.5 e.
    random: N(0, 0.02) from SplitMix64(INIT_SEED), residual projections (w_proj, w_out)
    scaled by 1/sqrt(2 layers), drawn in parameter order, 1-D parameters excepted."""
    rng = SplitMix64(INIT_SEED)
    params = []
    with np.errstate(over="ignore"):
        for index, (name, shape) in enumerate(param_shapes()):
            if len(shape) == 1:
                w = np.full(shape, 1.0 if name.endswith("_g") else 0.0, dtype=np.float32)
            elif INIT == "formula":
                e = np.arange(math.prod(shape[:-2]), dtype=np.float64).reshape(*shape[:-2], 1, 1)
                i = np.arange(shape[-2], dtype=np.float64)[:, None]
                j = np.arange(shape[-1], dtype=np.float64)[None, :]
                w = (0.02 * np.sin(1.3 * i + 0.7 * j + 0.5 * e + float(index))).astype(np.float32)
            else:
                residual = name.endswith("w_proj") or name.endswith("w_out")
                std = 0.02 / math.sqrt(2.0 * LAYERS) if residual else 0.02
                w = (rng.normals(math.prod(shape)) * std).astype(np.float32).reshape(shape)
            params.append(w)
    return stack_params(params)


def init_opt_state(params):
    """AdamW: (m, v), zeros like every parameter; SGD: no state."""
    if OPTIMIZER == "sgd":
        return ()
    return ({n: np.zeros_like(p) for n, p in params.items()}, {n: np.zeros_like(p) for n, p in params.items()})


# ----------------------------------------------------------------------------------- data

TASK_SYMBOLS = 8  # copy / reverse: symbols 1..8, separator 0
MODADD_MAX_P = 97


class Dataset:
    """The batch of each step, as shardlab's Dataset makes it: step k's generator is
    SplitMix64(SEED ^ k * GAMMA), and rows are drawn in order from it, each taking the same
    number of draws. So any row can be made alone (SplitMix64 jumps ahead by adding to its
    state), and each process makes only the rows its devices hold."""

    def __init__(self):
        self.corpus = None
        if DATA == "text":
            chars = sorted(set(TEXT))  # token id = position among the distinct characters
            ids = {c: i for i, c in enumerate(chars)}
            self.corpus = np.array([ids[c] for c in TEXT], dtype=np.int32)

    def tokens(self, step, rows):
        """int32 (len(rows), T+1): the rows `rows` of step `step`'s tokens."""
        seed = SEED ^ ((step * GAMMA) & U64)
        return np.array([self.row(b, SplitMix64(seed + b * self.draws() * GAMMA)) for b in rows], dtype=np.int32)

    def batch(self, step):
        """(inputs, targets), int32 (B, T): tokens[:, 0:T] and tokens[:, 1:T+1]."""
        tokens = self.tokens(step, range(BATCH))
        return tokens[:, :SEQ], tokens[:, 1:]

    def draws(self):
        """Draws of the generator per row."""
        n = SEQ + 1
        return {"formula": 0, "copy": (n - 1) // 2, "reverse": (n - 1) // 2, "modadd": 2 * -(-n // 5), "text": 1}[DATA]

    def row(self, b, rng):
        n, v = SEQ + 1, VOCAB
        if DATA == "formula":  # the same batch every step
            return [(7 * b + 3 * t * t + 1) % v for t in range(n)]
        if DATA in ("copy", "reverse"):
            k = min(TASK_SYMBOLS, v - 1)
            run = [1 + rng.next_u64() % k for _ in range((n - 1) // 2)]
            second = run[::-1] if DATA == "reverse" else run
            return (run + [0] + second + [0] * n)[:n]
        if DATA == "modadd":  # a + b = (a+b) mod p, packed; '+' = p, '=' = p + 1
            p = min(v - 2, MODADD_MAX_P)
            row = []
            while len(row) < n:
                a, c = rng.next_u64() % p, rng.next_u64() % p
                row += [a, p, c, p + 1, (a + c) % p]
            return row[:n]
        start = rng.next_u64() % (len(self.corpus) - n + 1)  # text: a random window
        return self.corpus[start : start + n].tolist()


# -------------------------------------------------------------------------------- forward


# with_sharding_constraint per named value of shardlab's program (`--spec h0.att=P(...)` in
# automatic mode; a block's values by their name in the block, `att`, as every layer of the
# scan pins it); the automatic section fills it, other modes leave it empty.
CONSTRAINTS = {}
# with_sharding_constraint on the gradient the update reads, by parameter (ZeRO-1 in automatic
# mode: replicated, so that it is all-reduced; the update then slices each device's block).
UPDATE_GRAD_SPECS = {}
# Explicit mode's choices, by the same names (a block parameter by its name in the block where
# it is read, its stack elsewhere): out_sharding= on the op that makes a value, a
# jax.sharding.reshard after it, and the optimizer update's own reshards of its operands; the
# explicit section fills them, other modes leave them empty.
OUT_SHARDINGS = {}
RESHARDS = {}
UPDATE_RESHARDS = {}


def constrain(x, name):
    """x pinned to CONSTRAINTS[name] (jax.lax.with_sharding_constraint), or resharded to
    RESHARDS[name] (jax.sharding.reshard), else x unchanged."""
    spec = CONSTRAINTS.get(name)
    if spec is not None:
        return jax.lax.with_sharding_constraint(x, sharding(spec))
    spec = RESHARDS.get(name)
    return x if spec is None else jax.sharding.reshard(x, spec)


def out_sharding(name):
    """The out_sharding= the op making value `name` is given (explicit mode), else None."""
    return OUT_SHARDINGS.get(name)


def shaped(x, shape, name):
    """jnp.reshape to `shape`, making the value `name`."""
    return constrain(jnp.reshape(x, shape, out_sharding=out_sharding(name)), name)


def matmul(x, w, name):
    """x @ w, making the value `name`."""
    return constrain(jnp.matmul(x, w, out_sharding=out_sharding(name)), name)


def bits_sharding(x):
    """Explicit mode draws dropout bits typed like the value they mask
    (out_sharding=jax.typeof(x).sharding), so each device makes only its block where the layout
    allows; elsewhere the bits take the default."""
    return jax.typeof(x).sharding if MODE == "explicit" else None


# The layer norm and GELU are ops with their own backward, as shardlab's kernels are: each
# saves its input (and the layer norm its row statistics) and recomputes the rest, so that
# the backward holds what shardlab's program holds, not every intermediate of the formula.


@jax.custom_vjp
def layer_norm(x, g, b):
    return layer_norm_fwd(x, g, b)[0]


def layer_norm_fwd(x, g, b):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    std = jnp.sqrt(jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True) + LN_EPS)  # biased variance
    return (x - mean) / std * g + b, (x, mean, std, g)


def layer_norm_bwd(res, dy):
    x, mean, std, g = res
    xhat = (x - mean) / std
    dxhat = dy * g
    rows = tuple(range(x.ndim - 1))
    dx = (dxhat - jnp.mean(dxhat, axis=-1, keepdims=True) - xhat * jnp.mean(dxhat * xhat, axis=-1, keepdims=True)) / std
    return dx, jnp.sum(dy * xhat, axis=rows), jnp.sum(dy, axis=rows)


layer_norm.defvjp(layer_norm_fwd, layer_norm_bwd)

GELU_C = math.sqrt(2.0 / math.pi)


@jax.custom_vjp
def gelu(x):
    return 0.5 * x * (1.0 + jnp.tanh(GELU_C * (x + 0.044715 * x**3)))


def gelu_fwd(x):
    return gelu(x), x


def gelu_bwd(x, dy):
    t = jnp.tanh(GELU_C * (x + 0.044715 * x**3))
    return (dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3 * 0.044715 * x * x)),)


gelu.defvjp(gelu_fwd, gelu_bwd)


# How a shard_map body splits the step; None on one device and under jit (shapes are global).
# batch: the axes that split the batch; tp: Megatron's axis; sp: sequence parallelism over it;
# seq: the axes that split the residual stream's sequence (cp's, then tp's under sp); cp:
# context parallelism's axis; order: how cp lays the sequence's blocks on its ring
# (contiguous, zigzag); blocks: every mask is the device's block of the one-device run's; ep:
# expert parallelism's axis (a mixture of experts' experts split over it).
Split = collections.namedtuple(
    "Split", "batch tp sp seq cp order blocks ep", defaults=((), None, False, (), None, "contiguous", False, None)
)


def axes_size(axes):
    """The devices a tuple of mesh axes splits into (1 for none)."""
    return jax.lax.axis_size(axes) if axes else 1


def seq_positions(axes, length, order="contiguous", shift=0):
    """The global positions of this device's `length` rows of the sequence, split over `axes`:
    its block, or (ring step `shift`) the block of the device `shift` places before it on the
    ring. Zig-zag holds chunks b and 2n-1-b of 2n."""
    n = jax.lax.axis_size(axes)
    b = (jax.lax.axis_index(axes) - shift) % n
    if order == "zigzag":
        c = length // 2
        return jnp.concatenate([b * c + jnp.arange(c), (2 * n - 1 - b) * c + jnp.arange(c)])
    return b * length + jnp.arange(length)


def zigzag_global(split):
    """Whether this program holds the sequence in zig-zag order of ZIGZAG blocks (jit's view
    under --cp-order zigzag; a shard_map body takes its chunks' rows instead)."""
    return ZIGZAG is not None and split is None


def zigzag_chunks():
    """Zig-zag's 2n chunks in the order the "cp" devices hold them: r and 2n-1-r side by side."""
    return [c for r in range(ZIGZAG) for c in (r, 2 * ZIGZAG - 1 - r)]


def reorder(x, axis, back=False):
    """x's sequence `axis` put in zig-zag order of ZIGZAG blocks (`back`: returned to its
    order), as MaxText's reorder_sequence does under jit, so that jit's contiguous block r of
    the sequence over "cp" is zig-zag's chunks r and 2n-1-r."""
    order = zigzag_chunks()
    if back:
        order = [order.index(c) for c in range(len(order))]
    chunks = jnp.split(x, len(order), axis=axis)
    return jnp.concatenate([chunks[c] for c in order], axis=axis)


def query_positions(t, split):
    """The global positions of the rows of a whole sequence of t as the program holds them
    (traced, as jnp.arange is: a constant array would be a residual the backward holds)."""
    positions = jnp.arange(t)
    return reorder(positions, 0) if zigzag_global(split) else positions


def offsets(axes, length):
    """The global indices of this device's `length` rows of a dimension split over `axes`."""
    if not axes:
        return jnp.arange(length)
    return jax.lax.axis_index(axes) * length + jnp.arange(length)


def tp_axes(split):
    return () if split.tp is None else (split.tp,)


def block_bits(key, shape, split, heads):
    """This device's block of jax.random.bits(key, global shape) of an array of local `shape`,
    (B, T, ...) or, `heads`, (B, H, T, T): bit for bit the one-device run's mask, and only
    the block is computed (`bits_at`)."""
    glob = list(shape)
    glob[0] *= axes_size(split.batch)
    coords = [offsets(split.batch, shape[0])] + [jnp.arange(n) for n in shape[1:]]
    if heads:
        glob[1] *= axes_size(tp_axes(split))
        coords[1] = offsets(tp_axes(split), shape[1])
    elif split.seq:
        glob[1] = SEQ
        coords[1] = seq_positions(split.seq, shape[1], split.order)
    return bits_at(key, coords, glob)


def keep_of_bits(bits):
    """jax.random.bernoulli's keep mask from its bits: uniform(bits) < 1 - rate."""
    keep_prob = np.float32(1.0 - float(np.float32(DROPOUT)))
    u = jax.lax.bitcast_convert_type((bits >> 9) | np.uint32(0x3F800000), jnp.float32) - np.float32(1.0)
    return u < keep_prob


def keep_scale():
    """What kept values are multiplied by: 1 / (1 - rate) as float32 (a Python float, weakly
    typed, keeps the activations' dtype)."""
    return float(np.float32(1.0) / np.float32(1.0 - float(np.float32(DROPOUT))))


def dropout(x, key, site, split=None, heads=False):
    """Inverted dropout; site 3*layer + s (s: 0 attention probabilities, 1 attention output,
    2 MLP output) has the key fold_in(step key, site). The mask is drawn for x's shape (the
    local shape inside shard_map), or, where the body draws blocks (MASK_BLOCKS), is the
    device's block of the global mask."""
    if DROPOUT == 0.0:
        return x
    keep_prob = np.float32(1.0 - float(np.float32(DROPOUT)))
    site_key = jax.random.fold_in(key, site)
    if split is None or not split.blocks:
        keep = jax.random.bernoulli(site_key, keep_prob, x.shape, out_sharding=bits_sharding(x))
        if zigzag_global(split):
            keep = reorder(keep, 1)  # the one-device run's rows, in the program's order
    else:
        keep = keep_of_bits(block_bits(site_key, x.shape, split, heads))
    return jnp.where(keep, x * keep_scale(), 0.0)


def column_parallel_input(x, split):
    """Megatron: the replicated activation enters column-parallel weights as a varying value
    (its transpose sums the gradient over the tensor-parallel group); with sequence
    parallelism the device's rows are gathered (its transpose reduce-scatters)."""
    if split is None or split.tp is None:
        return x
    if split.sp:
        return jax.lax.all_gather(x, split.tp, axis=1, tiled=True)
    return jax.lax.pcast(x, split.tp, to="varying")


def column_parallel(x, w, bias, split):
    """Megatron's column-parallel x @ w + bias on a layer norm's output. Under sequence
    parallelism the gather and the matmul run under jax.checkpoint, as Megatron-LM's sequence
    parallelism does: the backward holds the device's rows of x and gathers them again for w's
    gradient. Under REMAT the block's recompute gathers them again already."""

    def linear(x, w, bias):
        return column_parallel_input(x, split) @ w + bias

    if split is not None and split.sp and REMAT is None:
        linear = jax.checkpoint(linear, policy=jax.checkpoint_policies.nothing_saveable)
    return linear(x, w, bias)


def row_parallel_output(y, split):
    """Megatron: partial products of row-parallel weights are summed over the group; with
    sequence parallelism summed and scattered, each device keeping its rows."""
    if split is None or split.tp is None:
        return y
    if split.sp:
        return jax.lax.psum_scatter(y, split.tp, scatter_dimension=1, tiled=True)
    return jax.lax.psum(y, split.tp)


def attention(q, k, v, key, layer, split):
    """softmax(q k^T / sqrt(Dh), causal) with dropout, times v: (B, H, T, Dh). Ring attention
    where the sequence is split over "cp". For --attention fused (unless the sharding editor
    constrains the probabilities, which fused attention never holds):
    jax.nn.dot_product_attention, or, with dropout, which it lacks, FlashAttention's tiles
    drawing each block's mask as shardlab's fused kernel draws it inside. Else the
    composition."""
    if split is not None and split.cp is not None:
        return tiled_attention(q, k, v, key, layer, split)
    if zigzag_global(split):
        k, v = reorder(k, 2, back=True), reorder(v, 2, back=True)  # XLA gathers them whole
    if ATTENTION == "fused" and "att" not in CONSTRAINTS:
        if sequence_typed_split(q):
            # The tiles cut the sequence, which the queries' type splits: in explicit mode the
            # fused attention runs with the mesh axes left to the compiler (auto_axes), its
            # result typed like the queries (its traced operands are passed in, not closed over).
            fused = functools.partial(fused_attention, split=split)
            y = jax.sharding.auto_axes(fused, out_sharding=jax.typeof(q).sharding)(q, k, v, key, layer)
        else:
            y = fused_attention(q, k, v, key, layer, split)
        return constrain(y, "att")  # fused attention's `att` is its output (explicit mode's reshard)
    t = q.shape[2]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))  # keep j <= i
    s = jnp.einsum("bhid,bhjd->bhij", q, k) * attention_scale()
    a = constrain(jax.nn.softmax(jnp.where(causal, s, MASK_VALUE), axis=-1), "att")
    a = dropout(a, key, 3 * layer + 0, split, heads=True)
    return jnp.einsum("bhij,bhjd->bhid", a, v)


def sequence_typed_split(x):
    """Whether the type of x, (B, H, T, Dh), splits its sequence over a mesh axis (explicit
    mode's context parallelism)."""
    if MODE != "explicit":
        return False
    spec = tuple(jax.typeof(x).sharding.spec)
    return len(spec) > 2 and spec[2] is not None


def fused_attention(q, k, v, key, layer, split):
    """jax.nn.dot_product_attention, or, with dropout, FlashAttention's tiles."""
    if DROPOUT != 0.0:
        return tiled_attention(q, k, v, key, layer, split)
    # jax.nn's layout is (B, T, H, Dh); the backend picks the implementation.
    qt, kt, vt = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    if zigzag_global(split):
        # Queries in zig-zag order: the causal mask by their positions.
        t = q.shape[2]
        seen = jnp.arange(t)[None, :] <= query_positions(t, split)[:, None]
        y = jax.nn.dot_product_attention(qt, kt, vt, scale=attention_scale(), mask=seen[None, None])
    else:
        y = jax.nn.dot_product_attention(qt, kt, vt, scale=attention_scale(), is_causal=True)
    return y.transpose(0, 2, 1, 3)


def attention_scale():
    """1 / sqrt(Dh) as float32, a Python float (weakly typed: it keeps q's dtype)."""
    return float(np.float32(1.0) / np.sqrt(np.float32(DH)))


def block(x, p, key, layer, split):
    """One block on the residual stream x (B, T, d): attention, then the MLP (or the mixture of
    experts), each with its residual add; returns x and the block's load-balancing loss (0 for
    a dense MLP). `p` holds the block's 12 parameters by name; `layer` (traced under the scan)
    picks its dropout keys."""
    p = {name: constrain(w, name) for name, w in p.items()}  # where read (FSDP gathers them)
    # attention; head n uses columns n*Dh:(n+1)*Dh of q, k and v
    ln1 = constrain(layer_norm(x, p["ln1_g"], p["ln1_b"]), "ln1")
    qkv = column_parallel(ln1, p["w_qkv"].reshape(D_MODEL, -1), p["b_qkv"].reshape(-1), split)
    qkv = constrain(qkv, "qkv")  # (B, T, 3 * H * Dh)
    bsz, t, _ = qkv.shape  # the whole sequence in sequence parallelism's matmul regions
    heads = qkv.shape[-1] // (3 * DH)
    qkv = shaped(qkv, (bsz, t, 3, heads, DH), "heads").transpose(2, 0, 3, 1, 4)
    q, k, v = (shaped(a, (bsz, heads, t, DH), n) for a, n in zip(jnp.split(qkv, 3), "qkv"))  # (B, H, T, Dh)
    y = attention(q, k, v, key, layer, split).transpose(0, 2, 1, 3).reshape(bsz, t, -1)
    y = row_parallel_output(matmul(y, p["w_proj"], "proj"), split) + p["b_proj"]
    x = constrain(x + dropout(y, key, 3 * layer + 1, split), "x_att")
    # MLP
    ln2 = constrain(layer_norm(x, p["ln2_g"], p["ln2_b"]), "ln2")
    if EXPERTS:
        # The router reads the rows before tensor parallelism's cast, the same on every "tp" device.
        f, aux = moe_mlp(ln2, column_parallel_input(ln2, split), p, split)
    else:
        f = gelu(column_parallel(ln2, p["w_fc"], p["b_fc"], split))
        f, aux = matmul(f, p["w_out"], "mlp"), jnp.zeros((), jnp.float32)
    f = row_parallel_output(f, split) + p["b_out"]
    return constrain(x + dropout(f, key, 3 * layer + 2, split), "x_mlp"), aux


def run_blocks(blocks, x, key, split, first=0, count=None):
    """The blocks whose parameters `blocks` stacks (leading axis: layers first, first+1, ...)
    on x, as one jax.lax.scan: the block is traced and compiled once, whatever the depth.
    Under REMAT each layer runs under jax.checkpoint with that jax.checkpoint_policies policy
    (the backward recomputes what the policy does not save). Returns x and the sum of the
    blocks' load-balancing losses, carried through the scan. With `count` (traced), only the
    first `count` rows are blocks: x passes the rows after them (a pipeline's padding) as it is."""

    def one(x, p, layer):
        return block(x, p, key, layer, split)

    if REMAT is not None:
        one = jax.checkpoint(one, policy=getattr(jax.checkpoint_policies, REMAT))

    def step(carry, lp):
        x, aux = one(carry[0], lp[1], lp[0])
        if count is not None:
            # Every device runs the same scan: a row past its chunk's blocks runs on zeros and
            # its result is dropped.
            x, aux = jnp.where(lp[0] - first < count, x, carry[0]), jnp.where(lp[0] - first < count, aux, 0.0)
        return (x, carry[1] + aux), None

    layers = first + jnp.arange(jax.tree.leaves(blocks)[0].shape[0])
    # The losses' sum starts as a zero varying as x does (over the axes that split the tokens).
    (x, aux), _ = jax.lax.scan(step, (x, jnp.zeros_like(x, jnp.float32, shape=())), (layers, blocks))
    return x, aux


def embed(wte, wpe, tokens, split):
    """wte[tokens] + the rows of wpe at the tokens' positions (the device's, where the sequence
    is split)."""
    t = tokens.shape[1]
    rows = wpe[:t] if split is None or not split.seq else jnp.take(wpe, seq_positions(split.seq, t, split.order), axis=0)
    if zigzag_global(split):
        rows = reorder(rows, 0)
    tok = constrain(wte.at[tokens].get(out_sharding=out_sharding("tok_emb")), "tok_emb")
    return constrain(tok + rows, "x0")  # (B, T, d)


def forward_loss(params, tokens, targets, key, split=None):
    """MODEL.md's forward pass and mean cross-entropy, plus a mixture of experts' load-balancing
    losses. Shapes come from the arrays, so the
    same code runs on global arrays (jit) and on one device's blocks (shard_map): with
    tensor parallelism w_qkv is (L, d, 3, H/tp, Dh) and b_qkv (L, 3, H/tp, Dh); where the
    sequence is split, each device reads the rows of wpe at its positions."""
    params = {name: p if name in BLOCK else constrain(p, name) for name, p in params.items()}  # where read
    if zigzag_global(split):
        # The tokens in zig-zag order, split over "cp" as the rules split the sequence.
        tokens, targets = (constrain(reorder(x, 1), f"{n}.zigzag") for x, n in ((tokens, "tokens"), (targets, "targets")))
    x = embed(params["wte"], params["wpe"], tokens, split)
    x, aux = run_blocks({name: params[name] for name in BLOCK}, x, key, split)
    w_head = params["wte"].T if TIED else params["w_head"]
    loss = head_loss(x, params["lnf_g"], params["lnf_b"], w_head, targets)
    return constrain(loss + aux, "loss") if EXPERTS else loss


def head_loss(x, lnf_g, lnf_b, w_head, targets):
    """The final layer norm, the head (no bias) and the mean cross-entropy of the residual
    stream x (B, T, d)."""
    x = layer_norm(x, lnf_g, lnf_b)
    logits = matmul(x, w_head, "logits")  # (B, T, V)
    logits = logits.astype(jnp.float32)  # the loss in float32 whatever the compute dtype
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return constrain(jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked), "loss")


# ----------------------------------------------------------------------------- optimizers

B1, B2, EPS, WEIGHT_DECAY = np.float32(0.9), np.float32(0.999), np.float32(1e-8), np.float32(0.01)


def adamw_hyper(t):
    """Bias corrections 1 - b1^t, 1 - b2^t of update t (from 1), as float32 scalars."""
    if OPTIMIZER == "sgd":
        return np.zeros(2, np.float32)
    pow1, pow2 = np.float32(float(B1) ** t), np.float32(float(B2) ** t)
    return np.array([np.float32(1.0) - pow1, np.float32(1.0) - pow2], np.float32)


def to_compute(params):
    """The weights the step computes with: the float32 masters cast to COMPUTE (a no-op in
    float32)."""
    return {name: p.astype(COMPUTE) for name, p in params.items()}


def apply_updates(params, grads, opt_state, hyper):
    """SGD: p -= lr g. AdamW (optax's order): m = (1-b1) g + b1 m, v = (1-b2) g^2 + b2 v,
    p -= lr (mhat / (sqrt(vhat) + eps) + wd p), wd 0.01 for 2-D weights only (DECAYS). On the
    float32 masters, with the gradients converted to float32; every dict by state name."""
    grads = {name: g.astype(jnp.float32) for name, g in grads.items()}
    lr = np.float32(LR)
    if OPTIMIZER == "sgd":
        return {name: update_operand(p, name) - lr * update_operand(grads[name], f"d{name}") for name, p in params.items()}, opt_state
    one_minus_b1, one_minus_b2 = np.float32(1.0 - 0.9), np.float32(1.0 - 0.999)
    new_p, new_m, new_v = {}, {}, {}
    for name, p in params.items():
        p, g = update_operand(p, name), update_operand(grads[name], f"d{name}")
        m, v = opt_state[0][name], opt_state[1][name]
        m = one_minus_b1 * g + B1 * m
        v = one_minus_b2 * (g * g) + B2 * v
        mhat, vhat = m / hyper[0], v / hyper[1]
        wd = WEIGHT_DECAY if DECAYS[name] else np.float32(0.0)
        new_p[name] = p - lr * (mhat / (jnp.sqrt(vhat) + EPS) + wd * p)
        new_m[name], new_v[name] = m, v
    return new_p, (new_m, new_v)


def update_operand(x, name):
    """The update's operand `name` (a parameter, dNAME its gradient) on each device's block where
    the update runs on blocks finer than it is laid out (ZeRO in explicit mode: UPDATE_RESHARDS)."""
    spec = UPDATE_RESHARDS.get(name)
    return x if spec is None else jax.sharding.reshard(x, spec)


# ------------------------------------------------------------------ gradient accumulation


def microbatches(x):
    """MICROBATCHES slices of a batch (rows first): slice j holds rows j, j + K, j + 2K, ...
    Strided, so that a batch split over "dp" in blocks of rows leaves every slice split over
    "dp" the same way (each device slices its own rows; nothing moves)."""
    if MICROBATCHES == 1:
        return [x]
    grouped = x.reshape(x.shape[0] // MICROBATCHES, MICROBATCHES, *x.shape[1:])
    return [grouped[:, j] for j in range(MICROBATCHES)]


def accumulate(loss_of, params, tokens, targets, key, on_grad=lambda name, g: g):
    """Gradient accumulation as a Python loop of jax.value_and_grad over the microbatches (jit
    unrolls it): microbatch j gets the key fold_in(key, j) (the step's key with one), and
    `loss_of(params, x, y, key)` returns (what to differentiate, the loss to report). Each
    gradient goes through `on_grad` into its running sum `dNAME`, pinnable like any named
    value. Returns the reported losses' sum and the sums of the gradients."""
    total, sums = None, None
    for j, (x, y) in enumerate(zip(microbatches(tokens), microbatches(targets))):
        k = key if MICROBATCHES == 1 else jax.random.fold_in(key, j)
        (_, loss), grads = jax.value_and_grad(loss_of, has_aux=True)(params, x, y, k)
        grads = {n: on_grad(n, g) for n, g in grads.items()}
        sums = grads if sums is None else {n: sums[n] + g for n, g in grads.items()}
        sums = {n: constrain(g, f"d{n}") for n, g in sums.items()}
        total = loss if total is None else total + loss
    return total, sums


def global_train_step(params, opt_state, tokens, targets, key, hyper):
    """The whole step on global arrays: loss at the current parameters, gradients (summed
    over the microbatches), update."""

    def loss_of(params, x, y, k):
        loss = forward_loss(params, x, y, k)
        # Each microbatch's mean over K: the sums are the whole batch's means.
        loss = loss if MICROBATCHES == 1 else loss * np.float32(1.0 / MICROBATCHES)
        return loss, loss

    loss, grads = accumulate(loss_of, to_compute(params), tokens, targets, key)
    grads = {
        n: g if n not in UPDATE_GRAD_SPECS else jax.lax.with_sharding_constraint(g, sharding(UPDATE_GRAD_SPECS[n]))
        for n, g in grads.items()
    }
    params, opt_state = apply_updates(params, grads, opt_state, hyper)
    return loss, {n: constrain(p, f"{n}'") for n, p in params.items()}, opt_state


# ------------------------------------------------------------------------------------ keys


def step_key(step):
    """fold_in(PRNGKey(SEED), step) as raw uint32[2] key data (PRNGKey keeps the low 32
    bits of the seed)."""
    root = jnp.array([0, SEED & 0xFFFFFFFF], dtype=jnp.uint32)
    return jax.random.fold_in(root, step)


def bits_at(key, coords, shape):
    """jax.random.bits(key, shape, uint32) at the elements whose indices are the outer product
    of `coords` (one array of indices per dimension), computed for those elements alone: in
    the partitionable layout element i's bits are threefry2x32(key, (i >> 32, i & 0xffffffff)),
    both words xored; in the original one the counts iota(n) are cut in halves (h = ceil(n/2))
    and element i is a word of the pair (i, i + h) (i < h: the first) or (i - h, i) (the
    second), the count past the end being 0. Flat indices past 2^32 are carried in two words."""
    rank = len(shape)
    grid = [jnp.asarray(c).astype(jnp.uint32).reshape([-1 if d == i else 1 for d in range(rank)]) for i, c in enumerate(coords)]
    hi, lo = jnp.zeros((), jnp.uint32), grid[0]
    for d in range(1, rank):
        hi, lo = u64_mul_add(hi, lo, shape[d], grid[d])
    out = tuple(len(c) for c in coords)
    hi, lo = jnp.broadcast_to(hi, out), jnp.broadcast_to(lo, out)
    if RNG_PARTITIONABLE:
        b1, b2 = threefry2x32_p.bind(key[0], key[1], hi, lo)
        return b1 ^ b2
    n = math.prod(shape)
    if n >= 2**32 - 1:
        raise ValueError(f"dropout over {n} elements: the original RNG layout splits the key past 2^32; export with --rng partitionable")
    half = np.uint32((n + 1) // 2)
    first = lo < half
    x0 = jnp.where(first, lo, lo - half)
    x1 = jnp.where(first, lo + half, lo)
    x1 = jnp.where(x1 == np.uint32(n), np.uint32(0), x1)
    b1, b2 = threefry2x32_p.bind(key[0], key[1], x0, x1)
    return jnp.where(first, b1, b2)


def u64_mul_add(hi, lo, m, c):
    """(hi * 2^32 + lo) * m + c as two uint32 words (m a Python int below 2^32, c uint32)."""
    m0, m1 = np.uint32(m & 0xFFFF), np.uint32(m >> 16)
    a0, a1 = lo & np.uint32(0xFFFF), lo >> 16
    p00, p01, p10, p11 = a0 * m0, a0 * m1, a1 * m0, a1 * m1
    mid = (p00 >> 16) + (p01 & np.uint32(0xFFFF)) + (p10 & np.uint32(0xFFFF))
    low = (p00 & np.uint32(0xFFFF)) | (mid << 16)
    high = hi * np.uint32(m) + p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16)
    total = low + c
    return high + (total < low).astype(jnp.uint32), total
