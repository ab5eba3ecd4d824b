

# ------------------------------------------ shard_map: a pipeline over "pp", by hand
# The blocks in PP contiguous stages: each block parameter's stack over the layers is split
# over "pp" on its layer axis, so a stage holds its layers' rows (as MaxText stacks its
# stages); the embeddings, the final layer norm and the head replicated. Ticks: stage s runs
# its layers (a jax.lax.scan) on microbatch t - s and ppermute passes the result on. Every
# device runs the same code, so a stage with nothing to do (the pipeline filling or
# draining) computes on a zero microbatch whose result nothing reads.

PP_AXIS = "pp"
SCHEDULE = {{SCHEDULE}}  # "gpipe" (the ticks a jax.lax.scan) or "1f1b" (a loop: its slots differ)
PP = dict(MESH_AXES)[PP_AXIS]
STAGE_LAYERS = LAYERS // PP
TAIL = ("lnf_g", "lnf_b") + (() if TIED else ("w_head",))


def stage_extra(name):
    """A stage's layers are its own; the embeddings and the head every stage holds, and only
    one uses each (the embeddings the first, the head the last; tied, wte both): their
    gradients are summed over "pp" too."""
    return () if name in BLOCK else (PP_AXIS,)


def run_stage(blocks, x, key, stage):
    """This stage's layers on x, each with its own layer's dropout keys. (Their load-balancing
    losses are 0: shardlab runs no mixture of experts in a pipeline.)"""
    return run_blocks(blocks, x, key, SPLIT, first=stage * STAGE_LAYERS)[0]


def stage_head_loss(y, tail, wte, targets):
    """The last stage's loss: the model's head (with wte, tied) on the stage's output."""
    return head_loss(y, tail["lnf_g"], tail["lnf_b"], wte.T if TIED else tail["w_head"], targets)


def add(a, b):
    return jax.tree.map(jnp.add, a, b)


def body(params, opt_state, tokens, targets, key, hyper):
    """One device's step: its stage's layers, the parameters every stage holds and its rows in;
    inside a stage the other axes compose as in the flat body."""
    stage = jax.lax.axis_index(PP_AXIS)
    m = MICROBATCHES
    scale = np.float32(1.0 / (m * math.prod(jax.lax.axis_size(a) for a in TOKEN_AXES)))
    held = {name: gathered(name, p, stage_extra(name)) for name, p in to_compute(params).items()}
    wte, wpe = held["wte"], held["wpe"]
    blocks = {name: held[name] for name in BLOCK}
    tail = {name: held[name] for name in TAIL}
    tokens, targets = own_rows(tokens), own_rows(targets)
    key = device_key(key)
    xs, ys = microbatches(tokens), microbatches(targets)
    first = (stage == 0).astype(COMPUTE)
    last = (stage == PP - 1).astype(jnp.float32)
    forward_ring = [(s, s + 1) for s in range(PP - 1)]
    backward_ring = [(s + 1, s) for s in range(PP - 1)]

    def mb_key(j):
        # The one-device run's key of microbatch j (traced: it depends on the stage).
        return key if m == 1 else jax.random.fold_in(key, j)

    def enter(wte, wpe, j):
        return embed(wte, wpe, xs[j], SPLIT) * first

    if SCHEDULE == "gpipe":

        def pipeline_loss(wte, wpe, blocks, tail):
            entering = jnp.stack([enter(wte, wpe, j) for j in range(m)])
            targets = jnp.stack(ys)

            def tick(received, t):
                x = received + jnp.where(t < m, entering[jnp.minimum(t, m - 1)], 0.0)
                y = run_stage(blocks, x, mb_key(t - stage), stage)
                j = jnp.clip(t - (PP - 1), 0, m - 1)
                return y, jnp.where(t >= PP - 1, stage_head_loss(y, tail, wte, targets[j]) * last, 0.0)

            def passed_on(received, t):
                y, l = tick(received, t)
                return jax.lax.ppermute(y, PP_AXIS, forward_ring), l

            # Every tick but the last passes its result on; the last one's nothing reads, so it
            # runs outside the scan and sends nothing (as shardlab's program has it).
            received, losses = jax.lax.scan(passed_on, jnp.zeros_like(entering[0]), jnp.arange(m + PP - 2))
            total = jnp.sum(losses) + tick(received, m + PP - 2)[1]
            return total * scale, total

        (_, total), (g_wte, g_wpe, g_blocks, g_tail) = jax.value_and_grad(
            pipeline_loss, argnums=(0, 1, 2, 3), has_aux=True
        )(wte, wpe, blocks, tail)
    else:
        # 1F1B in lockstep: a forward slot (stage s on microbatch t - s) and a backward slot
        # (stage s on microbatch t - 2(PP-1) + s), the backward recomputing the stage from its
        # saved input. Each pullback is jax.grad of sum(f(x) * cotangent).
        g_wte, g_wpe = jnp.zeros_like(wte), jnp.zeros_like(wpe)
        g_blocks, g_tail = jax.tree.map(jnp.zeros_like, blocks), jax.tree.map(jnp.zeros_like, tail)
        on_stage = [(stage == s).astype(COMPUTE) for s in range(PP)]
        inputs, received, returned, total = [], None, None, None
        ticks = m + 2 * (PP - 1)
        for t in range(ticks):
            head_ct = None
            if t < m + PP - 1:
                entering = enter(wte, wpe, t) if t < m else None
                if received is None:
                    x = entering
                else:
                    x = received + entering if entering is not None else received
                inputs.append(x)
                y = run_stage(blocks, x, mb_key(t - stage), stage)
                if t >= PP - 1:
                    j = t - (PP - 1)

                    def f(y, tail, wte):
                        l = stage_head_loss(y, tail, wte, ys[j]) * last
                        return l * scale, l

                    (_, l), (head_ct, gt, gw) = jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(y, tail, wte)
                    total = l if total is None else total + l
                    g_tail, g_wte = add(g_tail, gt), g_wte + gw
                if t + 1 < m + PP - 1:
                    received = jax.lax.ppermute(y, PP_AXIS, forward_ring)
            if t + 1 < PP:
                continue
            base = t - 2 * (PP - 1)
            saved = None
            for s in range(PP):
                at = t - 2 * (PP - 1 - s)
                if 0 <= at < len(inputs):
                    mine = inputs[at] * on_stage[s]
                    saved = mine if saved is None else saved + mine
            if returned is None:
                ct = head_ct
            else:
                ct = returned + head_ct if head_ct is not None else returned
            k = mb_key(base + stage)
            pull = lambda x, blocks: jnp.sum(run_stage(blocks, x, k, stage) * ct)  # noqa: E731
            dx, gb = jax.grad(pull, argnums=(0, 1))(saved, blocks)
            g_blocks = add(g_blocks, gb)
            if 0 <= base < m:
                pull_in = lambda wte, wpe: jnp.sum(enter(wte, wpe, base) * dx)  # noqa: E731
                gw, gp = jax.grad(pull_in, argnums=(0, 1))(wte, wpe)
                g_wte, g_wpe = g_wte + gw, g_wpe + gp
            if t + 1 < ticks:
                returned = jax.lax.ppermute(dx, PP_AXIS, backward_ring)
    grads = {"wte": g_wte, "wpe": g_wpe, **g_blocks, **g_tail}
    grads = {n: reduced(n, scattered(n, g), stage_extra(n)) for n, g in grads.items()}
    loss = jax.lax.psum(total * np.float32(1.0 / m), PP_AXIS)
    if TOKEN_AXES:
        loss = jax.lax.pmean(loss, TOKEN_AXES)
    params, opt_state = update(params, grads, opt_state, hyper)
    return loss, params, opt_state
