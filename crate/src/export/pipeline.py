

# ------------------------------------------ shard_map: a pipeline over "pp", by hand
# Strategy {{STRATEGY}}: {{STRATEGY_DOC}}
# The blocks in PP contiguous stages, each block's weights stacked on a leading stage axis split
# over "pp" (as MaxText stacks its stages); the embeddings, the final layer norm and the head
# replicated. A loop over ticks: stage s runs its blocks on microbatch t - s and ppermute
# passes the result on. Every device runs the same code, so a stage with nothing to do (the
# pipeline filling or draining) computes on a zero microbatch whose result nothing reads.

PP_AXIS = "pp"
DP_AXIS = {{DP_AXIS}}  # the batch and the gradient reduction (None: no data parallelism)
SCHEDULE = {{SCHEDULE}}  # "gpipe" or "1f1b"
PP = dict(MESH_AXES)[PP_AXIS]
STAGE_LAYERS = LAYERS // PP
# Under "dp" every device's masks are its block of the one-device run's.
SPLIT = Split(dp=DP_AXIS, blocks=True) if DP_AXIS is not None else None
BATCH_SPEC = P(DP_AXIS, None) if DP_AXIS is not None else P()


def stage_layout():
    """The step's parameters: wte, wpe, then per block j of a stage and each of its 12
    parameters the stack over stages (row s: block s * STAGE_LAYERS + j), then the final layer
    norm and head. Each as (MODEL.md indices it holds, in_spec)."""
    n = len(param_shapes())
    tail = 2 + 12 * LAYERS
    held = [([0], P()), ([1], P())]
    for i in range(12 * STAGE_LAYERS):
        held.append(([2 + i + s * 12 * STAGE_LAYERS for s in range(PP)], P(PP_AXIS)))
    held += [([i], P()) for i in range(tail, n)]
    return held


def to_stages(params):
    return [params[idx[0]] if len(idx) == 1 else np.stack([params[i] for i in idx]) for idx, _ in stage_layout()]


def global_params(held):
    """The parameters in MODEL.md order, unstacked."""
    out = [None] * len(param_shapes())
    for (idx, _), p in zip(stage_layout(), held):
        if len(idx) == 1:
            out[idx[0]] = p
        else:
            for s, i in enumerate(idx):
                out[i] = p[s]
    return out


def stage_block():
    """A block as a stage runs it: its layer number is the stage's (traced), not static."""
    if REMAT is None:
        return block
    return jax.checkpoint(block, policy=getattr(jax.checkpoint_policies, REMAT), static_argnums=(4,))


def run_stage(blocks, x, key, stage):
    """This stage's blocks on x, each with its own layer's dropout keys."""
    run = stage_block()
    for j in range(STAGE_LAYERS):
        x = run(x, blocks[12 * j : 12 * (j + 1)], key, stage * STAGE_LAYERS + j, SPLIT)
    return x


def stage_head_loss(y, tail, wte, targets):
    """The last stage's loss: the model's head (with wte, tied) on the stage's output."""
    return head_loss(y, tail[0], tail[1], wte.T if TIED else tail[2], targets)


def body(params, opt_state, tokens, targets, key, hyper):
    """One device's step: its stage's blocks, the replicated parameters and its rows in."""
    stage = jax.lax.axis_index(PP_AXIS)
    m, n_dp = MICROBATCHES, 1 if DP_AXIS is None else jax.lax.axis_size(DP_AXIS)
    scale = np.float32(1.0 / (m * n_dp))
    nb = 12 * STAGE_LAYERS
    held = to_compute(params)
    # The replicated parameters vary per device from here (each stage's use of them is its
    # own), and under "dp" the stage's blocks too: the gradients stay per device until the
    # explicit sums after the loop.
    rep = tuple(a for a in (DP_AXIS, PP_AXIS) if a is not None)
    vary = lambda p, axes: jax.lax.pcast(p, axes, to="varying") if axes else p  # noqa: E731
    wte, wpe = vary(held[0], rep), vary(held[1], rep)
    blocks = [vary(p[0], (DP_AXIS,) if DP_AXIS else ()) for p in held[2 : 2 + nb]]
    tail = [vary(p, rep) for p in held[2 + nb :]]
    xs, ys = microbatches(tokens), microbatches(targets)
    first = (stage == 0).astype(COMPUTE)
    last = (stage == PP - 1).astype(jnp.float32)
    on_stage = [(stage == s).astype(COMPUTE) for s in range(PP)]
    forward_ring = [(s, s + 1) for s in range(PP - 1)]
    backward_ring = [(s + 1, s) for s in range(PP - 1)]

    def mb_key(j):
        # The one-device run's key of microbatch j (traced: it depends on the stage).
        return key if m == 1 else jax.random.fold_in(key, j)

    def enter(wte, wpe, j):
        return (wte[xs[j]] + wpe[: xs[j].shape[1]]) * first

    if SCHEDULE == "gpipe":

        def pipeline_loss(wte, wpe, blocks, tail):
            entering = [enter(wte, wpe, j) for j in range(m)]
            received, total = None, None
            for t in range(m + PP - 1):
                if received is None:
                    x = entering[t]
                else:
                    x = received + entering[t] if t < m else received
                y = run_stage(blocks, x, mb_key(t - stage), stage)
                if t >= PP - 1:
                    l = stage_head_loss(y, tail, wte, ys[t - (PP - 1)]) * last
                    total = l if total is None else total + l
                if t + 1 < m + PP - 1:
                    received = jax.lax.ppermute(y, PP_AXIS, forward_ring)
            return total * scale, total

        (_, total), (g_wte, g_wpe, g_blocks, g_tail) = jax.value_and_grad(
            pipeline_loss, argnums=(0, 1, 2, 3), has_aux=True
        )(wte, wpe, blocks, tail)
    else:
        # 1F1B in lockstep: a forward slot (stage s on microbatch t - s) and a backward slot
        # (stage s on microbatch t - 2(PP-1) + s), the backward recomputing the stage from its
        # saved input. Each pullback is jax.grad of sum(f(x) * cotangent).
        zeros = lambda ps: [jnp.zeros_like(p) for p in ps]  # noqa: E731
        g_wte, g_wpe, g_blocks, g_tail = jnp.zeros_like(wte), jnp.zeros_like(wpe), zeros(blocks), zeros(tail)
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
                    g_tail = [a + b for a, b in zip(g_tail, gt)]
                    g_wte = g_wte + gw
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
            g_blocks = [a + b for a, b in zip(g_blocks, gb)]
            if 0 <= base < m:
                pull_in = lambda wte, wpe: jnp.sum(enter(wte, wpe, base) * dx)  # noqa: E731
                gw, gp = jax.grad(pull_in, argnums=(0, 1))(wte, wpe)
                g_wte, g_wpe = g_wte + gw, g_wpe + gp
            if t + 1 < ticks:
                returned = jax.lax.ppermute(dx, PP_AXIS, backward_ring)
    # A stage's blocks are its own; the replicated parameters were used by one stage each (the
    # embeddings by the first, the head by the last; tied, wte by both): sum over the devices.
    grads = [jax.lax.psum(g_wte, rep), jax.lax.psum(g_wpe, rep)]
    grads += [(jax.lax.psum(g, DP_AXIS) if DP_AXIS else g)[None] for g in g_blocks]
    grads += [jax.lax.psum(g, rep) for g in g_tail]
    loss = jax.lax.psum(total * np.float32(1.0 / m), PP_AXIS)
    if DP_AXIS is not None:
        loss = jax.lax.pmean(loss, DP_AXIS)
    # A stack decays as its parameters do.
    shapes = param_shapes()
    decays = [len(shapes[idx[0]][1]) == 2 for idx, _ in stage_layout()]
    params, opt_state = apply_updates(params, grads, opt_state, hyper, decays)
    return loss, params, opt_state


def make_train_step(params, opt_state):
    mesh = make_mesh()
    specs = [spec for _, spec in stage_layout()]
    state_specs = () if OPTIMIZER == "sgd" else (specs, specs)
    step = jax.jit(
        jax.shard_map(
            body,
            mesh=mesh,
            in_specs=(specs, state_specs, BATCH_SPEC, BATCH_SPEC, P(), P()),
            out_specs=(P(), specs, state_specs),
        ),
        donate_argnums=(0, 1),
    )
    shardings = [NamedSharding(mesh, spec) for spec in specs]
    params = jax.device_put(to_stages(params), shardings)
    if OPTIMIZER != "sgd":
        opt_state = jax.device_put((to_stages(opt_state[0]), to_stages(opt_state[1])), (shardings, shardings))
    return step, params, opt_state
