
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


def param_shapes():
    """(name, shape) of every parameter; the list position is MODEL.md's param_index."""
    d, v, t = D_MODEL, VOCAB, SEQ
    shapes = [("wte", (v, d)), ("wpe", (t, d))]
    for layer in range(LAYERS):
        block = [
            ("ln1_g", (d,)), ("ln1_b", (d,)), ("w_qkv", (d, 3 * d)), ("b_qkv", (3 * d,)),
            ("w_proj", (d, d)), ("b_proj", (d,)), ("ln2_g", (d,)), ("ln2_b", (d,)),
            ("w_fc", (d, 4 * d)), ("b_fc", (4 * d,)), ("w_out", (4 * d, d)), ("b_out", (d,)),
        ]
        shapes += [(f"h{layer}.{name}", shape) for name, shape in block]
    shapes += [("lnf_g", (d,)), ("lnf_b", (d,))]
    if not TIED:
        shapes.append(("w_head", (d, v)))
    return shapes


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
    """Initial parameters (numpy float32) in MODEL.md order. 1-D: gains 1, biases 0.
    formula: W[i, j] = 0.02 sin(1.3 i + 0.7 j + param_index) in float64, rounded.
    random: N(0, 0.02) from SplitMix64(INIT_SEED), residual projections (w_proj, w_out)
    scaled by 1/sqrt(2 layers), drawn in parameter order, 2-D parameters only."""
    rng = SplitMix64(INIT_SEED)
    params = []
    with np.errstate(over="ignore"):
        for index, (name, shape) in enumerate(param_shapes()):
            if len(shape) == 1:
                w = np.full(shape, 1.0 if name.endswith("_g") else 0.0, dtype=np.float32)
            elif INIT == "formula":
                i = np.arange(shape[0], dtype=np.float64)[:, None]
                j = np.arange(shape[1], dtype=np.float64)[None, :]
                w = (0.02 * np.sin(1.3 * i + 0.7 * j + float(index))).astype(np.float32)
            else:
                residual = name.endswith("w_proj") or name.endswith("w_out")
                std = 0.02 / math.sqrt(2.0 * LAYERS) if residual else 0.02
                w = (rng.normals(math.prod(shape)) * std).astype(np.float32).reshape(shape)
            params.append(w)
    return params


def init_opt_state(params):
    """AdamW: (m, v), zeros like every parameter; SGD: no state."""
    if OPTIMIZER == "sgd":
        return ()
    return ([np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params])


# ----------------------------------------------------------------------------------- data

TASK_SYMBOLS = 8  # copy / reverse: symbols 1..8, separator 0
MODADD_MAX_P = 97


class Dataset:
    """The batch of each step, as shardlab's Dataset makes it (step k's generator is
    SplitMix64(SEED ^ k * GAMMA); rows are drawn in order from it)."""

    def __init__(self):
        self.corpus = None
        if DATA == "text":
            chars = sorted(set(TEXT))  # token id = position among the distinct characters
            ids = {c: i for i, c in enumerate(chars)}
            self.corpus = np.array([ids[c] for c in TEXT], dtype=np.int32)

    def batch(self, step):
        """(inputs, targets), int32 (B, T): tokens[:, 0:T] and tokens[:, 1:T+1]."""
        rng = SplitMix64(SEED ^ ((step * GAMMA) & U64))
        tokens = np.array([self.row(b, rng) for b in range(BATCH)], dtype=np.int32)  # (B, T+1)
        return tokens[:, :SEQ], tokens[:, 1:]

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
# automatic mode); the automatic section fills it, other modes leave it empty.
CONSTRAINTS = {}
# with_sharding_constraint on the gradient the update reads, by parameter (ZeRO-1 in automatic
# mode: replicated, so that it is all-reduced; the update then slices each device's block).
UPDATE_GRAD_SPECS = {}


def constrain(x, name):
    """x pinned to CONSTRAINTS[name] (jax.lax.with_sharding_constraint), else x unchanged."""
    spec = CONSTRAINTS.get(name)
    return x if spec is None else jax.lax.with_sharding_constraint(x, NamedSharding(make_mesh(), spec))


def layer_norm(x, g, b):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)  # biased
    return (x - mean) / jnp.sqrt(var + LN_EPS) * g + b


def gelu(x):
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


# How a shard_map body splits the step; None on one device and under jit (shapes are global).
# tp: Megatron's axis; sp: sequence parallelism over it; cp: context parallelism's axis; dp:
# the batch's axis; order: how cp lays the sequence's blocks on its ring (contiguous, zigzag).
# blocks: every mask is the device's block of the one-device run's (a pipeline under "dp").
Split = collections.namedtuple(
    "Split", "tp sp cp dp order blocks", defaults=(None, False, None, None, "contiguous", False)
)


def seq_axis(split):
    """The mesh axis the residual stream's sequence is split over, if any."""
    if split is None:
        return None
    return split.cp or (split.tp if split.sp else None)


def seq_positions(split, length, shift=0):
    """The global positions of this device's `length` rows of the sequence: its block, or (ring
    step `shift`) the block of the device `shift` places before it on the ring. Zig-zag holds
    chunks b and 2n-1-b of 2n."""
    axis = seq_axis(split)
    n = jax.lax.axis_size(axis)
    b = (jax.lax.axis_index(axis) - shift) % n
    if split.cp is not None and split.order == "zigzag":
        c = length // 2
        return jnp.concatenate([b * c + jnp.arange(c), (2 * n - 1 - b) * c + jnp.arange(c)])
    return b * length + jnp.arange(length)


def block_bits(key, shape, split, heads):
    """This device's block of jax.random.bits(key, global shape) of an array of local `shape`,
    (B, T, ...) or, `heads`, (B, H, T, T): bit for bit the one-device run's mask. A JAX user
    cannot ask jax.random for a block, so the body draws the global bits and slices them."""
    size = lambda axis: 1 if axis is None else jax.lax.axis_size(axis)  # noqa: E731
    glob = list(shape)
    glob[0] *= size(split.dp)
    if heads:
        glob[1] *= size(split.tp)
    elif seq_axis(split) is not None:
        glob[1] = SEQ
    bits = jax.random.bits(key, tuple(glob), jnp.uint32)
    if split.dp is not None:
        bits = jax.lax.dynamic_slice_in_dim(bits, jax.lax.axis_index(split.dp) * shape[0], shape[0], 0)
    if heads and split.tp is not None:
        bits = jax.lax.dynamic_slice_in_dim(bits, jax.lax.axis_index(split.tp) * shape[1], shape[1], 1)
    elif not heads and seq_axis(split) is not None:
        bits = jnp.take(bits, seq_positions(split, shape[1]), axis=1)
    return bits


def keep_of_bits(bits):
    """jax.random.bernoulli's keep mask from its bits: uniform(bits) < 1 - rate."""
    keep_prob = np.float32(1.0 - float(np.float32(DROPOUT)))
    u = jax.lax.bitcast_convert_type((bits >> 9) | np.uint32(0x3F800000), jnp.float32) - np.float32(1.0)
    return u < keep_prob


def dropout(x, key, site, split=None, heads=False):
    """Inverted dropout; site 3*layer + s (s: 0 attention probabilities, 1 attention output,
    2 MLP output) has the key fold_in(step key, site). The mask is drawn for x's shape (the
    local shape inside shard_map), or, where the body splits the sequence, is the device's
    block of the global mask."""
    if DROPOUT == 0.0:
        return x
    keep_prob = np.float32(1.0 - float(np.float32(DROPOUT)))
    site_key = jax.random.fold_in(key, site)
    if seq_axis(split) is None and not (split is not None and split.blocks):
        keep = jax.random.bernoulli(site_key, keep_prob, x.shape)
    else:
        keep = keep_of_bits(block_bits(site_key, x.shape, split, heads))
    # A Python float (weakly typed) keeps x's dtype; its value is the float32 quotient.
    return jnp.where(keep, x * float(np.float32(1.0) / keep_prob), 0.0)


def column_parallel_input(x, split):
    """Megatron: the replicated activation enters column-parallel weights as a varying value
    (its transpose sums the gradient over the tensor-parallel group); with sequence
    parallelism the device's rows are gathered (its transpose reduce-scatters)."""
    if split is None or split.tp is None:
        return x
    if split.sp:
        return jax.lax.all_gather(x, split.tp, axis=1, tiled=True)
    return jax.lax.pcast(x, split.tp, to="varying")


def row_parallel_output(y, split):
    """Megatron: partial products of row-parallel weights are summed over the group; with
    sequence parallelism summed and scattered, each device keeping its rows."""
    if split is None or split.tp is None:
        return y
    if split.sp:
        return jax.lax.psum_scatter(y, split.tp, scatter_dimension=1, tiled=True)
    return jax.lax.psum(y, split.tp)


def causal_attention(q, k, v, key, layer, split):
    """softmax(q k^T / sqrt(Dh), causal) with dropout, times v: (B, H, T, Dh)."""
    t = q.shape[2]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))  # keep j <= i
    # A Python float (weakly typed) keeps q's dtype; its value is the float32 quotient.
    s = jnp.einsum("bhid,bhjd->bhij", q, k) * float(np.float32(1.0) / np.sqrt(np.float32(DH)))
    a = constrain(jax.nn.softmax(jnp.where(causal, s, MASK_VALUE), axis=-1), f"h{layer}.att")
    a = dropout(a, key, 3 * layer + 0, split, heads=True)
    return jnp.einsum("bhij,bhjd->bhid", a, v)


def ring_block(q, k, v, qpos, kpos, bits):
    """One ring step: this device's queries against one block of keys, by global positions.
    Returns (o, lse); a row that sees no key of the block has o = 0 and lse = -inf."""
    s = jnp.einsum("bhid,bhjd->bhij", q, k) * (np.float32(1.0) / np.sqrt(np.float32(DH)))
    seen = kpos[None, :] <= qpos[:, None]
    s = jnp.where(seen, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, np.float32(0.0))
    p = jnp.exp(s - m)  # 0 where unseen
    l = jnp.sum(p, axis=-1, keepdims=True)
    lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), -jnp.inf)[..., 0]
    w = p if bits is None else jnp.where(keep_of_bits(bits), p * (np.float32(1.0) / np.float32(1.0 - float(np.float32(DROPOUT)))), 0.0)
    o = jnp.einsum("bhij,bhjd->bhid", w, v) / jnp.where(l > 0, l, 1.0)
    return o, lse


def ring_combine(o1, lse1, o2, lse2):
    """Two partial attentions of the same rows over disjoint keys, merged (online softmax)."""
    m = jnp.maximum(lse1, lse2)
    m = jnp.where(jnp.isfinite(m), m, np.float32(0.0))
    total = jnp.exp(lse1 - m) + jnp.exp(lse2 - m)
    lse = jnp.where(total > 0, m + jnp.log(jnp.where(total > 0, total, 1.0)), -jnp.inf)
    w1 = jnp.where(jnp.isfinite(lse), jnp.exp(lse1 - lse), 0.0)[..., None]
    w2 = jnp.where(jnp.isfinite(lse), jnp.exp(lse2 - lse), 0.0)[..., None]
    return w1 * o1 + w2 * o2, lse


def ring_attention(q, k, v, key, layer, split):
    """Ring attention (Liu et al., 2023) in the shard_map body: the device keeps its queries
    (B, H, T/cp, Dh); the key and value blocks travel the ring by ppermute, merged with an
    online softmax. A custom VJP sends them round again in the backward, with the dK and dV
    accumulators beside them, so a device holds only its own blocks between the passes.
    Dropout's bits of each block are the global (B, H, T, T) bits at its rows' positions."""
    axis = split.cp
    n = jax.lax.axis_size(axis)
    perm = [(i, (i + 1) % n) for i in range(n)]
    t = q.shape[2]
    site = jax.random.fold_in(key, 3 * layer + 0)

    def step_bits(site, qpos, kpos):
        if DROPOUT == 0.0:
            return None
        bsz, heads = q.shape[0], q.shape[1]
        glob = (bsz * (1 if split.dp is None else jax.lax.axis_size(split.dp)), heads, SEQ, SEQ)
        bits = jax.random.bits(site, glob, jnp.uint32)
        if split.dp is not None:
            bits = jax.lax.dynamic_slice_in_dim(bits, jax.lax.axis_index(split.dp) * bsz, bsz, 0)
        return jnp.take(jnp.take(bits, qpos, axis=2), kpos, axis=3)

    def forward(q, k, v, site):
        qpos = seq_positions(split, t)
        o, lse = ring_block(q, k, v, qpos, qpos, step_bits(site, qpos, qpos))
        kk, vv = k, v
        for s in range(1, n):
            kk = jax.lax.ppermute(kk, axis, perm)
            vv = jax.lax.ppermute(vv, axis, perm)
            kpos = seq_positions(split, t, s)
            o_s, lse_s = ring_block(q, kk, vv, qpos, kpos, step_bits(site, qpos, kpos))
            o, lse = ring_combine(o, lse, o_s, lse_s)
        return o, lse

    # The site's key is an argument (custom_vjp takes no closed-over traced values); it gets
    # no cotangent.
    @jax.custom_vjp
    def attend(q, k, v, site):
        return forward(q, k, v, site)[0]

    def attend_fwd(q, k, v, site):
        o, lse = forward(q, k, v, site)
        return o, (q, k, v, o, lse, site)

    def attend_bwd(res, do):
        q, k, v, o, lse, site = res
        scale = np.float32(1.0) / np.sqrt(np.float32(DH))
        qpos = seq_positions(split, t)
        delta = jnp.sum(do * o, axis=-1)
        kk, vv = k, v
        dq = jnp.zeros_like(q)
        dk = dv = None
        for s in range(n):
            if s > 0:
                kk, vv, dk, dv = (jax.lax.ppermute(x, axis, perm) for x in (kk, vv, dk, dv))
            kpos = seq_positions(split, t, s)
            seen = kpos[None, :] <= qpos[:, None]
            sc = jnp.einsum("bhid,bhjd->bhij", q, kk) * scale
            p = jnp.where(seen, jnp.exp(sc - lse[..., None]), 0.0)
            bits = step_bits(site, qpos, kpos)
            keep = 1.0 if bits is None else jnp.where(keep_of_bits(bits), np.float32(1.0) / np.float32(1.0 - float(np.float32(DROPOUT))), 0.0)
            dp = keep * jnp.einsum("bhid,bhjd->bhij", do, vv)
            ds = scale * p * (dp - delta[..., None])
            dq = dq + jnp.einsum("bhij,bhjd->bhid", ds, kk)
            dk_s = jnp.einsum("bhij,bhid->bhjd", ds, q)
            dv_s = jnp.einsum("bhij,bhid->bhjd", p * keep, do)
            dk = dk_s if dk is None else dk + dk_s
            dv = dv_s if dv is None else dv + dv_s
        # After the last step each accumulator belongs to the next device: one more hop.
        if n > 1:
            dk, dv = jax.lax.ppermute(dk, axis, perm), jax.lax.ppermute(dv, axis, perm)
        return dq, dk, dv, None

    attend.defvjp(attend_fwd, attend_bwd)
    return attend(q, k, v, site)


def block(x, layer_params, key, layer, split):
    """Block `layer` on the residual stream x (B, T, d): attention, then the MLP, each with its
    residual add."""
    (ln1_g, ln1_b, w_qkv, b_qkv, w_proj, b_proj, ln2_g, ln2_b, w_fc, b_fc, w_out, b_out) = layer_params
    # attention; head n uses columns n*Dh:(n+1)*Dh of q, k and v
    h = column_parallel_input(constrain(layer_norm(x, ln1_g, ln1_b), f"h{layer}.ln1"), split)
    bsz, t, _ = h.shape  # the whole sequence in sequence parallelism's matmul regions
    qkv = constrain(h @ w_qkv.reshape(D_MODEL, -1) + b_qkv.reshape(-1), f"h{layer}.qkv")  # (B, T, 3 * H * Dh)
    heads = qkv.shape[-1] // (3 * DH)
    q, k, v = qkv.reshape(bsz, t, 3, heads, DH).transpose(2, 0, 3, 1, 4)  # 3 x (B, H, T, Dh)
    if split is not None and split.cp is not None:
        y = ring_attention(q, k, v, key, layer, split)
    else:
        y = causal_attention(q, k, v, key, layer, split)
    y = y.transpose(0, 2, 1, 3).reshape(bsz, t, -1)
    y = row_parallel_output(constrain(y @ w_proj, f"h{layer}.proj"), split) + b_proj
    x = constrain(x + dropout(y, key, 3 * layer + 1, split), f"h{layer}.x_att")
    # MLP
    h = column_parallel_input(constrain(layer_norm(x, ln2_g, ln2_b), f"h{layer}.ln2"), split)
    f = gelu(h @ w_fc + b_fc)
    f = row_parallel_output(constrain(f @ w_out, f"h{layer}.mlp"), split) + b_out
    return constrain(x + dropout(f, key, 3 * layer + 2, split), f"h{layer}.x_mlp")


def remat_block():
    """The block as each layer runs it: under jax.checkpoint with REMAT's policy (the backward
    recomputes what the policy does not save), or plain when REMAT is None."""
    if REMAT is None:
        return block
    return jax.checkpoint(block, policy=getattr(jax.checkpoint_policies, REMAT), static_argnums=(3, 4))


def forward_loss(params, tokens, targets, key, split=None):
    """MODEL.md's forward pass and mean cross-entropy. Shapes come from the arrays, so the
    same code runs on global arrays (jit) and on one device's blocks (shard_map): with
    tensor parallelism w_qkv is (d, 3, H/tp, Dh) and b_qkv (3, H/tp, Dh); where the sequence
    is split, each device reads the rows of wpe at its positions."""
    bsz, t = tokens.shape
    wte, wpe = params[0], params[1]
    rows = wpe[:t] if seq_axis(split) is None else jnp.take(wpe, seq_positions(split, t), axis=0)
    x = constrain(wte[tokens] + rows, "x0")  # (B, T, d)
    run = remat_block()
    for layer in range(LAYERS):
        x = run(x, params[2 + 12 * layer : 2 + 12 * (layer + 1)], key, layer, split)
    base = 2 + 12 * LAYERS
    return head_loss(x, params[base], params[base + 1], wte.T if TIED else params[base + 2], targets)


def head_loss(x, lnf_g, lnf_b, w_head, targets):
    """The final layer norm, the head (no bias) and the mean cross-entropy of the residual
    stream x (B, T, d)."""
    x = layer_norm(x, lnf_g, lnf_b)
    logits = constrain(x @ w_head, "logits")  # (B, T, V)
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
    return [p.astype(COMPUTE) for p in params]


def apply_updates(params, grads, opt_state, hyper, decays=None):
    """SGD: p -= lr g. AdamW (optax's order): m = (1-b1) g + b1 m, v = (1-b2) g^2 + b2 v,
    p -= lr (mhat / (sqrt(vhat) + eps) + wd p), wd 0.01 for 2-D weights only (`decays`, per
    array; by default MODEL.md's parameters'). On the float32 masters, with the gradients
    converted to float32."""
    grads = [g.astype(jnp.float32) for g in grads]
    lr = np.float32(LR)
    if OPTIMIZER == "sgd":
        return [p - lr * g for p, g in zip(params, grads)], opt_state
    one_minus_b1, one_minus_b2 = np.float32(1.0 - 0.9), np.float32(1.0 - 0.999)
    if decays is None:
        decays = [len(shape) == 2 for _, shape in param_shapes()]
    new_p, new_m, new_v = [], [], []
    for decay, p, g, m, v in zip(decays, params, grads, *opt_state):
        m = one_minus_b1 * g + B1 * m
        v = one_minus_b2 * (g * g) + B2 * v
        mhat, vhat = m / hyper[0], v / hyper[1]
        wd = WEIGHT_DECAY if decay else np.float32(0.0)
        new_p.append(p - lr * (mhat / (jnp.sqrt(vhat) + EPS) + wd * p))
        new_m.append(m)
        new_v.append(v)
    return new_p, (new_m, new_v)


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
    names = [name for name, _ in param_shapes()]
    total, sums = None, None
    for j, (x, y) in enumerate(zip(microbatches(tokens), microbatches(targets))):
        k = key if MICROBATCHES == 1 else jax.random.fold_in(key, j)
        (_, loss), grads = jax.value_and_grad(loss_of, has_aux=True)(params, x, y, k)
        grads = [on_grad(n, g) for n, g in zip(names, grads)]
        sums = grads if sums is None else [a + g for a, g in zip(sums, grads)]
        sums = [constrain(g, f"d{n}") for n, g in zip(names, sums)]
        total = loss if total is None else total + loss
    return total, sums


def global_train_step(params, opt_state, tokens, targets, key, hyper):
    """The whole step on global arrays: loss at the current parameters, gradients (summed
    over the microbatches), update."""
    names = [name for name, _ in param_shapes()]

    def loss_of(params, x, y, k):
        loss = forward_loss(params, x, y, k)
        # Each microbatch's mean over K: the sums are the whole batch's means.
        loss = loss if MICROBATCHES == 1 else loss * np.float32(1.0 / MICROBATCHES)
        return loss, loss

    loss, grads = accumulate(loss_of, to_compute(params), tokens, targets, key)
    grads = [
        g if n not in UPDATE_GRAD_SPECS
        else jax.lax.with_sharding_constraint(g, NamedSharding(make_mesh(), UPDATE_GRAD_SPECS[n]))
        for n, g in zip(names, grads)
    ]
    params, opt_state = apply_updates(params, grads, opt_state, hyper)
    return loss, [constrain(p, f"{n}'") for n, p in zip(names, params)], opt_state


# ------------------------------------------------------------------------- keys and mesh


def step_key(step):
    """fold_in(PRNGKey(SEED), step) as raw uint32[2] key data (PRNGKey keeps the low 32
    bits of the seed)."""
    root = jnp.array([0, SEED & 0xFFFFFFFF], dtype=jnp.uint32)
    return jax.random.fold_in(root, step)


def make_mesh():
    """The mesh over the first MESH_DEVICES devices, row-major like shardlab's device ids;
    the CPU's (simulated) devices when there are too few accelerators."""
    devices = jax.devices()
    if len(devices) < MESH_DEVICES:
        cpus = jax.devices("cpu")
        if len(cpus) < MESH_DEVICES:
            sys.exit(
                f"error: the mesh needs {MESH_DEVICES} devices but there are {len(devices)}: "
                f"run with XLA_FLAGS=--xla_force_host_platform_device_count={MESH_DEVICES} "
                "to simulate them on the CPU"
            )
        if devices[0].platform != "cpu":
            print(f"note: {len(devices)} {devices[0].platform} devices are too few for the mesh; "
                  f"using {MESH_DEVICES} simulated CPU devices", file=sys.stderr)
        devices = cpus
    names = tuple(name for name, _ in MESH_AXES)
    shape = tuple(size for _, size in MESH_AXES)
    return Mesh(np.array(devices[:MESH_DEVICES]).reshape(shape), names)
