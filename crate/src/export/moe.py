

# ------------------------------------------------------------------- mixture of experts
# With EXPERTS > 0 every block's MLP is a mixture (MODEL.md, "Mixture of experts"): a linear
# router with a softmax, each token's TOP_K largest logits chosen (ties to the lower expert,
# lax.top_k) with their probabilities renormalised as gates, CAPACITY slots per expert and
# sequence filled in GShard's order (every token's first choice in sequence order, then every
# second choice, ...; a choice past its expert's slots is dropped, its token passing by the
# residual alone), each expert's GELU MLP on its slots, and the gated outputs summed back per
# token. Switch's load-balancing loss, AUX_LOSS * E * sum_e f_e P_e, joins the loss.
#
# Dispatch and combine are GShard's einsums with one-hot masks over (sequence, token, expert,
# slot): the slots of every expert, (E, G, C, D), are the buffer the experts' matmuls read.
# Where the experts are split over "ep": in shard_map, two jax.lax.all_to_all over "ep" move
# each device's sequences' slots to the devices holding their experts and back; under jit, the
# buffer's shardings (experts over "ep" for the matmuls, sequences over the data axes for the
# tokens) make the partitioner move them (automatic mode: with_sharding_constraint; explicit
# mode: reshard), and so do its cotangents' (`dmoe.dispatched`, `dmoe.expert_out`: the other
# layout than the value's), so that the backward moves them by all-to-all too. Automatic mode
# pins the dispatch's result where the tokens are (`moe.slots`) before it moves.
#
# Dropless routing gives every expert a slot per token (CAPACITY = SEQ), the buffer moving by
# the same all_to_all. jax.lax.ragged_all_to_all would send only the kept rows, but XLA:CPU
# does not run it (JAX 0.10.2: "UNIMPLEMENTED: HLO opcode `ragged-all-to-all` is not supported
# by XLA:CPU ThunkEmitter"), and the simulated mesh runs on the CPU.


def route(logits):
    """logits (G, S, E) -> the router's probabilities (G, S, E), the dispatch mask (G, S, E, C:
    1 where a token's kept choice takes a slot), the combine weights (the mask times the
    choice's gate) and the choices' one-hot experts (G, S, K, E), kept or dropped."""
    g, s, e = logits.shape
    probs = jax.nn.softmax(logits, axis=-1)
    top, chosen = jax.lax.top_k(logits, TOP_K)  # (G, S, K), largest first
    gates = jax.nn.softmax(top, axis=-1)
    onehot = jax.nn.one_hot(chosen, e, dtype=jnp.int32)  # (G, S, K, E)
    # GShard's order, choice-major: an expert's j-th choice in this order takes slot j.
    order = onehot.transpose(0, 2, 1, 3).reshape(g, TOP_K * s, e)
    slot = ((jnp.cumsum(order, axis=1) - 1) * order).sum(-1).reshape(g, TOP_K, s).transpose(0, 2, 1)
    # one_hot of a slot past the capacity is all zeros: the dropped choice takes none.
    slots = jax.nn.one_hot(slot, CAPACITY, dtype=logits.dtype)  # (G, S, K, C)
    mask = jnp.einsum("gske,gskc->gsec", onehot.astype(logits.dtype), slots)
    combine = jnp.einsum("gske,gskc,gsk->gsec", onehot.astype(logits.dtype), slots, gates)
    return probs, mask, combine, onehot


def moe_mlp(routed, h, p, split):
    """The mixture on h (G, S, D), the layer norm's output (tensor parallelism's varying copy
    where there is one; the router reads `routed`, the same rows before it): returns the
    combined experts' outputs (G, S, D), partial sums over "tp" where the experts' width is
    split, and the block's load-balancing loss."""
    logits = routed @ p["w_router"]
    probs, mask, combine, onehot = route(logits)
    ep = None if split is None else split.ep
    slots = constrain(jnp.einsum("gsec,gsd->egcd", mask, h), "moe.slots")  # where the tokens are
    slots = constrain(cotangent_pinned(slots, "dmoe.dispatched"), "moe.dispatched")
    if ep is not None:  # this device's experts' slots of its "ep" group's sequences
        slots = jax.lax.all_to_all(slots, ep, 0, 1, tiled=True)
    e, g, c, d = slots.shape
    rows = slots.reshape(e, g * c, d)
    up = jnp.einsum("end,edf->enf", rows, p["w_fc"])
    down = jnp.einsum("enf,efd->end", gelu(up), p["w_out"], out_sharding=out_sharding("moe.down"))
    out = constrain(down, "moe.down").reshape(e, g, c, d)
    if ep is not None:  # back to the devices holding the sequences
        out = jax.lax.all_to_all(out, ep, 1, 0, tiled=True)
    out = constrain(cotangent_pinned(out, "dmoe.expert_out"), "moe.expert_out")
    y = jnp.einsum("gsec,egcd->gsd", combine, out, out_sharding=out_sharding("mlp"))
    return constrain(y, "mlp"), balance_loss(probs, onehot, split)


def balance_loss(probs, onehot, split):
    """Switch's load-balancing loss, AUX_LOSS * E * sum_e f_e P_e: f_e the fraction of the
    step's choices (every device's, kept or dropped) that chose expert e, a count with no
    gradient; P_e the mean probability of e over this device's tokens. Linear in P, so the
    devices' mean is the whole batch's."""
    g, s, e = probs.shape
    routed = onehot.sum((0, 1, 2)).astype(jnp.float32)  # (E)
    axes = () if split is None else split.batch + split.seq
    if axes:
        routed = jax.lax.psum(routed, axes)
    f = routed * (np.float32(1.0) / np.float32(g * s * axes_size(axes) * TOP_K))
    p = probs.astype(jnp.float32).sum((0, 1)) * (np.float32(1.0) / np.float32(g * s))
    return np.float32(AUX_LOSS * EXPERTS) * jnp.dot(f, p)


def cotangent_pinned(x, name):
    """x, its cotangent pinned as `constrain(..., name)` pins a value (x itself where nothing
    pins `name`)."""
    return x if name not in CONSTRAINTS and name not in RESHARDS else pin_cotangent(x, name)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def pin_cotangent(x, name):
    return x


def pin_cotangent_fwd(x, name):
    return x, None


def pin_cotangent_bwd(name, _, dx):
    return (constrain(dx, name),)


pin_cotangent.defvjp(pin_cotangent_fwd, pin_cotangent_bwd)
