

# -------------------------------------------------------- tiled attention and its ring
# FlashAttention's blocking (Dao et al., 2022), and ring attention (Liu et al., 2023) on
# top of it for a sequence split over "cp". Queries and keys are cut into tiles of at most
# RING_TILE rows; each tile of queries meets each tile of keys in a scan, merged with an
# online softmax, so a device never holds more than one (B, H, tile, tile) block of scores.
# With "cp" each device keeps its queries (B, H, T/cp, Dh) and the key and value blocks
# travel the ring by ppermute, one jax.lax.scan step per hop; a device holds one chunk of
# positions (contiguous order) or two (zig-zag: chunks b and 2cp-1-b of 2cp). Without it
# the ring has one device and no hop: plain FlashAttention, which is what shardlab's fused
# kernel computes. A tile pair whose keys all lie after its queries is skipped
# (jax.lax.cond), as shardlab's kernel skips it, so zig-zag gives every device the same
# work. With dropout each tile pair draws the bits of its own block of the mask the
# composition would draw. A custom VJP sends K and V round again in the backward with the
# dK and dV accumulators beside them, so a device holds only its own blocks between the
# passes. In bf16 the tiles keep jax.nn.dot_product_attention's precision: the dots take
# bfloat16 operands and give float32 (scores, partial outputs, gradients), the online
# softmax's statistics and the accumulators are float32, and only the results are cast back
# to the operands' dtype (in float32 every cast is a no-op).

RING_TILE = 128


def dot(spec, a, b):
    """A tile's dot: operands in the activations' dtype (b's), the product in float32."""
    return jnp.einsum(spec, a.astype(b.dtype), b, preferred_element_type=jnp.float32)


def tile_block(q, k, v, qpos, kpos, bits):
    """Queries against one chunk of keys, by global positions. Returns (o, lse); a row that
    sees no key of the chunk has o = 0 and lse = -inf."""
    s = dot("bhid,bhjd->bhij", q, k) * (np.float32(1.0) / np.sqrt(np.float32(DH)))
    seen = kpos[None, :] <= qpos[:, None]
    s = jnp.where(seen, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, np.float32(0.0))
    p = jnp.exp(s - m)  # 0 where unseen
    l = jnp.sum(p, axis=-1, keepdims=True)
    lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), -jnp.inf)[..., 0]
    w = p if bits is None else jnp.where(keep_of_bits(bits), p * keep_scale(), 0.0)
    o = dot("bhij,bhjd->bhid", w, v) / jnp.where(l > 0, l, 1.0)
    return o, lse


def online_combine(o1, lse1, o2, lse2):
    """Two partial attentions of the same rows over disjoint keys, merged (online softmax)."""
    m = jnp.maximum(lse1, lse2)
    m = jnp.where(jnp.isfinite(m), m, np.float32(0.0))
    total = jnp.exp(lse1 - m) + jnp.exp(lse2 - m)
    lse = jnp.where(total > 0, m + jnp.log(jnp.where(total > 0, total, 1.0)), -jnp.inf)
    w1 = jnp.where(jnp.isfinite(lse), jnp.exp(lse1 - lse), 0.0)[..., None]
    w2 = jnp.where(jnp.isfinite(lse), jnp.exp(lse2 - lse), 0.0)[..., None]
    return w1 * o1 + w2 * o2, lse


def mask_frame(split, b, h):
    """The batch rows and heads of the attention-probability mask a device draws, and the
    mask's shape: its block of the global (B, H, SEQ, SEQ) mask, or, where each device draws
    a mask of its own shape (jit's global view, or a body without MASK_BLOCKS), that mask."""
    if split is None or not split.blocks:
        return jnp.arange(b), jnp.arange(h), (b, h, SEQ, SEQ)
    glob = (b * axes_size(split.batch), h * axes_size(tp_axes(split)), SEQ, SEQ)
    return offsets(split.batch, b), offsets(tp_axes(split), h), glob


def tiled_attention(q, k, v, key, layer, split):
    axis = None if split is None else split.cp
    order = "contiguous" if axis is None else split.order
    n = 1 if axis is None else jax.lax.axis_size(axis)
    perm = [(i, (i + 1) % n) for i in range(n)]
    hop = (lambda x: x) if axis is None else (lambda x: jax.lax.ppermute(x, axis, perm))  # noqa: E731
    t = q.shape[2]
    # Tiles of at most RING_TILE rows, each inside one chunk (contiguous positions).
    chunks = 2 if order == "zigzag" else 2 * ZIGZAG if zigzag_global(split) else 1
    tile = math.gcd(t // chunks, RING_TILE)
    nt = t // tile

    def tiles(x):
        """(B, H, T/cp, ...) as (tiles, B, H, tile, ...)."""
        return jnp.moveaxis(x.reshape(*x.shape[:2], nt, tile, *x.shape[3:]), 2, 0)

    def untiles(x):
        x = jnp.moveaxis(x, 0, 2)
        return x.reshape(*x.shape[:2], t, *x.shape[4:])

    def positions(shift):
        """The global positions of the rows this device holds at ring step `shift`, a row of
        tile positions per tile. Positions come from axis_index, computed inside the custom
        VJP's functions (which take no closed-over traced values)."""
        if axis is None:
            return jnp.arange(t).reshape(nt, tile)
        return seq_positions((axis,), t, order, shift).reshape(nt, tile)

    def query_tiles_positions():
        """The queries' positions, tiled: the device's rows at step 0, or, under jit's zig-zag
        order, the whole sequence in that order (keys are put back in order)."""
        if axis is None:
            return query_positions(t, split).reshape(nt, tile)
        return positions(0)

    def bits(site, qp, kp):
        if DROPOUT == 0.0:
            return None
        rows, heads, shape = mask_frame(split, q.shape[0], q.shape[1])
        return bits_at(site, (rows, heads, qp, kp), shape)

    def attend_hop(qt, kk, vv, o, lse, site, shift):
        """(o, lse), tiled, merged with this hop's keys: per query tile a scan over the key
        tiles, a tile pair whose keys all lie after its queries skipped."""
        # What a hop computes must stay in the layers' scan: without the barrier, JAX's partial
        # evaluation of that scan would hoist whatever depends on positions alone (which come
        # from axis_index, or are constants without "cp"): every tile pair's masks and the
        # bits' counters, held for the whole step.
        qpos, kpos, site = jax.lax.optimization_barrier((query_tiles_positions(), positions(shift), site))
        key_tiles = (tiles(kk), tiles(vv), kpos)

        def query_tile(args):
            q_a, o_a, lse_a, qp = args

            def key_tile(carry, xs):
                k_b, v_b, kp = xs
                merge = lambda o, lse: online_combine(o, lse, *tile_block(q_a, k_b, v_b, qp, kp, bits(site, qp, kp)))  # noqa: E731
                return jax.lax.cond(kp[0] <= qp[-1], merge, lambda o, lse: (o, lse), *carry), None

            return jax.lax.scan(key_tile, (o_a, lse_a), key_tiles)[0]

        return jax.lax.map(query_tile, (qt, o, lse, qpos))

    def forward(q, k, v, site):
        qt = tiles(q)
        o = jnp.zeros_like(qt, dtype=jnp.float32)
        lse = jnp.zeros_like(qt[..., 0], dtype=jnp.float32) - jnp.inf  # varying as q is
        o, lse = attend_hop(qt, k, v, o, lse, site, 0)

        def step(carry, shift):
            kk, vv, o, lse = carry
            kk, vv = hop(kk), hop(vv)
            return (kk, vv, *attend_hop(qt, kk, vv, o, lse, site, shift)), None

        (_, _, o, lse), _ = jax.lax.scan(step, (k, v, o, lse), jnp.arange(1, n))
        return untiles(o).astype(q.dtype), untiles(lse)

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
        query_tiles = (jnp.arange(nt), tiles(q), tiles(do), tiles(lse), tiles(jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)), query_tiles_positions())

        def grads_hop(kk, vv, dq, dk, dv, shift):
            """dq (tiled), dk, dv plus this hop's contributions: per key tile a scan over the
            query tiles (tile pairs whose keys are all unseen add nothing and are skipped)."""

            def key_tile(dq, xs):
                k_b, v_b, kp = xs

                def query_tile(carry, xs):
                    dq, dk_b, dv_b = carry
                    a, q_a, do_a, lse_a, delta_a, qp = xs

                    def add(dq_a, dk_b, dv_b):
                        visible = kp[None, :] <= qp[:, None]
                        sc = dot("bhid,bhjd->bhij", q_a, k_b) * scale
                        p = jnp.where(visible, jnp.exp(sc - lse_a[..., None]), 0.0)
                        b = bits(site, qp, kp)
                        keep = 1.0 if b is None else jnp.where(keep_of_bits(b), keep_scale(), 0.0)
                        dp = keep * dot("bhid,bhjd->bhij", do_a, v_b)
                        ds = scale * p * (dp - delta_a[..., None])
                        return (
                            dq_a + dot("bhij,bhjd->bhid", ds, k_b),
                            dk_b + dot("bhij,bhid->bhjd", ds, q_a),
                            dv_b + dot("bhij,bhid->bhjd", p * keep, do_a),
                        )

                    dq_a, dk_b, dv_b = jax.lax.cond(kp[0] <= qp[-1], add, lambda *g: g, dq[a], dk_b, dv_b)
                    return (dq.at[a].set(dq_a), dk_b, dv_b), None

                zero = jnp.zeros_like(k_b, dtype=jnp.float32)
                (dq, dk_b, dv_b), _ = jax.lax.scan(query_tile, (dq, zero, zero), query_tiles)
                return dq, (dk_b, dv_b)

            dq, (dk_t, dv_t) = jax.lax.scan(key_tile, dq, (tiles(kk), tiles(vv), positions(shift)))
            return dq, dk + untiles(dk_t), dv + untiles(dv_t)

        dq = jnp.zeros_like(tiles(q), dtype=jnp.float32)
        dq, dk, dv = grads_hop(k, v, dq, *(jnp.zeros_like(x, dtype=jnp.float32) for x in (k, v)), 0)

        def step(carry, shift):
            kk, vv, dq, dk, dv = carry
            kk, vv, dk, dv = hop(kk), hop(vv), hop(dk), hop(dv)
            return (kk, vv, *grads_hop(kk, vv, dq, dk, dv, shift)), None

        (_, _, dq, dk, dv), _ = jax.lax.scan(step, (k, v, dq, dk, dv), jnp.arange(1, n))
        # After the last hop each accumulator belongs to the next device: one more hop.
        if n > 1:
            dk, dv = hop(dk), hop(dv)
        return untiles(dq).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None

    attend.defvjp(attend_fwd, attend_bwd)
    return attend(q, k, v, jax.random.fold_in(key, 3 * layer + 0))
