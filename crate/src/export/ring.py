

# ------------------------------------------------------------------------ ring attention
# Ring attention (Liu et al., 2023) in the shard_map body, for a sequence split over "cp":
# each device keeps its queries (B, H, T/cp, Dh); the key and value blocks travel the ring
# by ppermute, merged with an online softmax, one jax.lax.scan step per hop. The unit is a
# chunk of positions: a device holds one (contiguous order) or two (zig-zag: chunks b and
# 2cp-1-b of 2cp). A pair of chunks whose keys all lie after its queries is skipped
# (jax.lax.cond), as shardlab's kernel skips it, so zig-zag gives every device the same work.
# With dropout each pair draws the bits of its own (B, H, chunk, chunk) block of the global
# mask. A custom VJP sends K and V round again in the backward with the dK and dV
# accumulators beside them, so a device holds only its own blocks between the passes.


def ring_block(q, k, v, qpos, kpos, bits):
    """Queries against one chunk of keys, by global positions. Returns (o, lse); a row that
    sees no key of the chunk has o = 0 and lse = -inf."""
    s = jnp.einsum("bhid,bhjd->bhij", q, k) * (np.float32(1.0) / np.sqrt(np.float32(DH)))
    seen = kpos[None, :] <= qpos[:, None]
    s = jnp.where(seen, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, np.float32(0.0))
    p = jnp.exp(s - m)  # 0 where unseen
    l = jnp.sum(p, axis=-1, keepdims=True)
    lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), -jnp.inf)[..., 0]
    w = p if bits is None else jnp.where(keep_of_bits(bits), p * keep_scale(), 0.0)
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
    axis = split.cp
    n = jax.lax.axis_size(axis)
    perm = [(i, (i + 1) % n) for i in range(n)]
    hop = lambda x: jax.lax.ppermute(x, axis, perm)  # noqa: E731
    t = q.shape[2]
    chunks = 2 if split.order == "zigzag" else 1
    c = t // chunks
    part = lambda x, i: x[:, :, i * c : (i + 1) * c]  # noqa: E731  chunk i of a (B, H, T/cp, ...) block
    size = lambda a: 1 if a is None else jax.lax.axis_size(a)  # noqa: E731
    glob = (q.shape[0] * size(split.dp), q.shape[1] * size(split.tp), SEQ, SEQ)
    # Positions and offsets come from axis_index, computed inside the custom VJP's functions
    # (which take no closed-over traced values).
    query_chunks = lambda: [seq_positions(split, t)[i * c : (i + 1) * c] for i in range(chunks)]  # noqa: E731

    def bits(site, qp, kp):
        if DROPOUT == 0.0:
            return None
        rows, heads = offsets(split.dp, q.shape[0]), offsets(split.tp, q.shape[1])
        return bits_at(site, (rows, heads, qp, kp), glob)

    def pairs(qp, shift):
        """(query chunk, key chunk, key positions, whether any key is seen) of one hop."""
        kpos = seq_positions(split, t, shift)
        for i in range(chunks):
            for j in range(chunks):
                kp = kpos[j * c : (j + 1) * c]
                yield i, j, kp, kp[0] <= qp[i][-1]

    def attend_hop(q, kk, vv, o, lse, site, shift):
        qp = query_chunks()
        for i, j, kp, seen in pairs(qp, shift):
            merge = lambda o, lse: ring_combine(o, lse, *ring_block(part(q, i), part(kk, j), part(vv, j), qp[i], kp, bits(site, qp[i], kp)))  # noqa: E731
            o[i], lse[i] = jax.lax.cond(seen, merge, lambda o, lse: (o, lse), o[i], lse[i])
        return o, lse

    def forward(q, k, v, site):
        o = [jnp.zeros_like(part(q, i)) for i in range(chunks)]
        lse = [jnp.zeros_like(part(q, i)[..., 0]) - jnp.inf for i in range(chunks)]  # varying as q is
        o, lse = attend_hop(q, k, v, o, lse, site, 0)

        def step(carry, shift):
            kk, vv, o, lse = carry
            kk, vv = hop(kk), hop(vv)
            return (kk, vv, *attend_hop(q, kk, vv, o, lse, site, shift)), None

        (_, _, o, lse), _ = jax.lax.scan(step, (k, v, o, lse), jnp.arange(1, n))
        return jnp.concatenate(o, axis=2), jnp.concatenate(lse, axis=2)

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
        delta = jnp.sum(do * o, axis=-1)

        def grads_hop(kk, vv, dq, dk, dv, shift):
            """dq, dk, dv plus this hop's contributions (pairs whose keys are all unseen add
            nothing and are skipped)."""
            dk, dv = [part(dk, j) for j in range(chunks)], [part(dv, j) for j in range(chunks)]
            qp = query_chunks()
            for i, j, kp, seen in pairs(qp, shift):

                def add(dq_i, dk_j, dv_j, i=i, j=j, kp=kp, qp=qp):
                    q_i, do_i, kk_j, vv_j = part(q, i), part(do, i), part(kk, j), part(vv, j)
                    visible = kp[None, :] <= qp[i][:, None]
                    sc = jnp.einsum("bhid,bhjd->bhij", q_i, kk_j) * scale
                    p = jnp.where(visible, jnp.exp(sc - part(lse, i)[..., None]), 0.0)
                    b = bits(site, qp[i], kp)
                    keep = 1.0 if b is None else jnp.where(keep_of_bits(b), keep_scale(), 0.0)
                    dp = keep * jnp.einsum("bhid,bhjd->bhij", do_i, vv_j)
                    ds = scale * p * (dp - part(delta, i)[..., None])
                    return (
                        dq_i + jnp.einsum("bhij,bhjd->bhid", ds, kk_j),
                        dk_j + jnp.einsum("bhij,bhid->bhjd", ds, q_i),
                        dv_j + jnp.einsum("bhij,bhid->bhjd", p * keep, do_i),
                    )

                dq[i], dk[j], dv[j] = jax.lax.cond(seen, add, lambda *g: g, dq[i], dk[j], dv[j])
            return dq, jnp.concatenate(dk, axis=2), jnp.concatenate(dv, axis=2)

        dq = [jnp.zeros_like(part(q, i)) for i in range(chunks)]
        dq, dk, dv = grads_hop(k, v, dq, jnp.zeros_like(k), jnp.zeros_like(v), 0)

        def step(carry, shift):
            kk, vv, dq, dk, dv = carry
            kk, vv, dk, dv = hop(kk), hop(vv), hop(dk), hop(dv)
            return (kk, vv, *grads_hop(kk, vv, dq, dk, dv, shift)), None

        (_, _, dq, dk, dv), _ = jax.lax.scan(step, (k, v, dq, dk, dv), jnp.arange(1, n))
        # After the last hop each accumulator belongs to the next device: one more hop.
        if n > 1:
            dk, dv = hop(dk), hop(dv)
        return jnp.concatenate(dq, axis=2), dk, dv, None

    attend.defvjp(attend_fwd, attend_bwd)
    return attend(q, k, v, jax.random.fold_in(key, 3 * layer + 0))
