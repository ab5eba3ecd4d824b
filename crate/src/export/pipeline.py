

# ------------------------------------------ shard_map: a pipeline over "pp", by hand
# The blocks cut into PP * CHUNKS virtual stages in model order, virtual stage k being chunk
# k // PP of stage k % PP: with CHUNKS > 1 each device holds CHUNKS runs of blocks PP apart
# (Megatron's interleaving; MaxText's circular pipeline with CHUNKS repeats). Each block
# parameter is laid out (CHUNKS, PP, ROWS, ...) with "pp" splitting the stage axis, so a device
# holds its own chunks' rows (PIPELINE_LAYERS lists them); a chunk with fewer blocks than ROWS
# (--stage-layers) holds rows of zeros, which its scan runs and drops (one program for every
# device). The embeddings, the final layer norm and the head replicated: the first virtual
# stage embeds, the last runs the head.
#
# The passes run in shardlab's order: PASSES is its table of the schedule in lockstep steps, at
# step t stage s running PASSES[t][s], a forward ("F"), a backward ("B") or a weight pass
# ("W") of (microbatch, chunk), or nothing. At the end of a step one ppermute carries each
# forward's activation to the next virtual stage and one carries each backward's input
# gradient to the one before; a device keeps what it receives in a buffer slot until the
# backward that reads it last. Every device runs the same code, so a step is one forward slot
# and one backward slot that every device runs on its own pass's microbatch and chunk (tables
# indexed by the stage); a device whose stage has no such pass in the step computes on what its
# buffer holds and its result is masked out. The steps are shardlab's order, not its timing: a
# step here costs a forward and a backward on every device, where a stage runs one pass.

PP_AXIS = "pp"
SCHEDULE = {{SCHEDULE}}  # shardlab's --schedule: "gpipe", "1f1b" (interleaved with CHUNKS > 1) or "zb_h1"
PASSES = {{PASSES}}
PP = dict(MESH_AXES)[PP_AXIS]
CHUNKS = len(PIPELINE_LAYERS)  # --virtual-stages: chunks of blocks per stage
VIRTUAL = PP * CHUNKS
TAIL = ("lnf_g", "lnf_b") + (() if TIED else ("w_head",))


def stage_extra(name):
    """A stage's layers are its own; the embeddings and the head every stage holds, and only
    one uses each (the embeddings the first, the head the last; tied, wte both): their
    gradients are summed over "pp" too."""
    return () if name in BLOCK else (PP_AXIS,)


def add(a, b):
    return jax.tree.map(jnp.add, a, b)


def pass_tables(kind):
    """Per step, per stage, the stage's pass of `kind` ("F", "B") in the step: whether it runs
    one, its microbatch and its chunk, as int32 arrays (steps, PP) to index by the stage."""
    runs = np.zeros((len(PASSES), PP), np.int32)
    mb, chunk = np.zeros_like(runs), np.zeros_like(runs)
    for t, step in enumerate(PASSES):
        for s, p in enumerate(step):
            if p is not None and p[0] == kind:
                runs[t, s], mb[t, s], chunk[t, s] = 1, p[1], p[2]
    return runs, mb, chunk


def arrivals(step):
    """What a step's sends bring: (receiving stage, "act" or "grad", (microbatch, its chunk
    there)) for each forward's activation (to the next virtual stage) and each backward's
    input gradient (to the one before)."""
    for s, p in enumerate(step):
        if p is None:
            continue
        k = p[2] * PP + s
        if p[0] == "F" and k + 1 < VIRTUAL:
            yield (s + 1) % PP, "act", (p[1], (k + 1) // PP)
        if p[0] == "B" and k > 0:
            yield (s - 1) % PP, "grad", (p[1], (k - 1) // PP)


def buffer_slots():
    """Where each stage keeps what it receives: a value takes the lowest free slot of its buffer
    when it arrives and frees it at the backward that reads it last, so that a buffer holds what
    the schedule keeps in flight (1F1B's at most PP a stage; GPipe's every microbatch). Returns
    the slots a buffer needs and, per step and stage as int32 arrays (steps, PP), -1 for none:
    the activation the forward reads ("F"), the activation and gradient the backward reads
    ("B act", "B grad"), and the slots the step's arrivals take ("act", "grad")."""
    table = {name: np.full((len(PASSES), PP), -1, np.int32) for name in ("F", "B act", "B grad", "act", "grad")}
    held = [{"act": [], "grad": []} for _ in range(PP)]  # per stage, per slot: its (microbatch, chunk)
    for t, step in enumerate(PASSES):
        for s, p in enumerate(step):
            if p is None:
                continue
            mine = (p[1], p[2])
            if p[0] == "F" and mine in held[s]["act"]:
                table["F"][t, s] = held[s]["act"].index(mine)
            for kind in ("act", "grad"):
                if p[0] == "B" and mine in held[s][kind]:
                    i = held[s][kind].index(mine)
                    table[f"B {kind}"][t, s], held[s][kind][i] = i, None
        for s, kind, value in arrivals(step):
            slots = held[s][kind]
            i = slots.index(None) if None in slots else len(slots)
            slots[i:i + 1] = [value]
            table[kind][t, s] = i
    size = max(len(h[kind]) for h in held for kind in h)
    return max(size, 1), table


def chunk_runs():
    """Per stage, per chunk: (its first layer, its blocks), as int32 arrays (PP, CHUNKS)."""
    first = np.zeros((PP, CHUNKS), np.int32)
    blocks = np.zeros_like(first)
    for c, stages in enumerate(PIPELINE_LAYERS):
        for s, layers in enumerate(stages):
            # A chunk may hold no block (only the embedding, or only the head): first unread.
            first[s, c], blocks[s, c] = (layers[0] if layers else 0), len(layers)
    return first, blocks


def filed(buffer, value, slot):
    """The buffer with `value` in slot `slot` (unchanged where slot is -1: nothing arrived)."""
    at = jnp.maximum(slot, 0)
    return buffer.at[at].set(jnp.where(slot >= 0, value, buffer[at]))


def read(buffer, slot):
    """Slot `slot` of the buffer, zeros where slot is -1 (the first virtual stage receives no
    activation, the last no gradient)."""
    return jnp.where(slot >= 0, buffer[jnp.maximum(slot, 0)], 0)


def body(params, opt_state, tokens, targets, key, hyper):
    """One device's step: its chunks' layers, the parameters every stage holds and its rows in;
    inside a stage the other axes compose as in the flat body."""
    stage = jax.lax.axis_index(PP_AXIS)
    m = MICROBATCHES
    scale = np.float32(1.0 / (m * math.prod(jax.lax.axis_size(a) for a in TOKEN_AXES)))
    held = {name: gathered(name, p, stage_extra(name)) for name, p in to_compute(params).items()}
    wte, wpe = held["wte"], held["wpe"]
    # (CHUNKS, 1, ROWS, ...) on this device: its chunks' rows, (CHUNKS, ROWS, ...).
    blocks = {name: held[name].reshape(CHUNKS, *held[name].shape[2:]) for name in BLOCK}
    tail = {name: held[name] for name in TAIL}
    tokens, targets = own_rows(tokens), own_rows(targets)
    key = device_key(key)
    xs, ys = jnp.stack(microbatches(tokens)), jnp.stack(microbatches(targets))
    first, counts = (jnp.asarray(t)[stage] for t in chunk_runs())
    forward_ring = [(s, (s + 1) % PP) for s in range(PP)]
    backward_ring = [(s, (s - 1) % PP) for s in range(PP)]

    def mb_key(j):
        # The one-device run's key of microbatch j (traced: it depends on the stage).
        return key if m == 1 else jax.random.fold_in(key, j)

    def run_chunk(rows, x, j, c):
        """Chunk c's blocks on microbatch j's x, each drawing its own layer's dropout keys. (Their
        load-balancing losses are 0: shardlab runs no mixture of experts in a pipeline.)"""
        return run_blocks(rows, x, mb_key(j), SPLIT, first=first[c], count=counts[c])[0]

    def chunk_loss(x_in, wte, wpe, rows, tail, j, c):
        """Virtual stage c * PP + stage on microbatch j: its output, and its loss where it is the
        last (the head on its output; 0 elsewhere). The first embeds the tokens in place of
        x_in."""
        k = c * PP + stage
        x = jnp.where(k == 0, embed(wte, wpe, xs[j], SPLIT), x_in)
        y = run_chunk(rows, x, j, c)
        loss = head_loss(y, tail["lnf_g"], tail["lnf_b"], wte.T if TIED else tail["w_head"], ys[j])
        return y, loss * (k == VIRTUAL - 1).astype(jnp.float32)

    # What the stage has received and not yet backed: the activations its forwards read (and
    # its backwards recompute from), and the output gradients its backwards read.
    size, slots = buffer_slots()
    x0 = embed(wte, wpe, xs[0], SPLIT)
    received = jnp.zeros_like(x0)[None].repeat(size, axis=0)
    returned = jnp.zeros_like(received)
    g_wte, g_wpe = jnp.zeros_like(wte), jnp.zeros_like(wpe)
    g_blocks, g_tail = jax.tree.map(jnp.zeros_like, blocks), jax.tree.map(jnp.zeros_like, tail)
    total = jnp.zeros((), jnp.float32)
    forwards, backwards = pass_tables("F"), pass_tables("B")
    mine = {name: jnp.asarray(table)[:, stage] for name, table in slots.items()}  # (steps,) each
    # ZB-H1's weight passes ("W") compute nothing here: each backward computes its weight
    # gradient with its input gradient. The sums are the same (the losses are 1F1B's); where
    # the weight work sits in time is the schedule's bubble, not its numbers.
    for t in range(len(PASSES)):
        sent_down = sent_up = None
        if forwards[0][t].any():
            runs, j, c = (jnp.asarray(a[t])[stage] for a in forwards)
            rows = jax.tree.map(lambda w: w[c], blocks)
            y, _ = chunk_loss(read(received, mine["F"][t]), wte, wpe, rows, tail, j, c)
            sent_down = y * runs.astype(y.dtype)
        if backwards[0][t].any():
            # The pullback of the chunk recomputed from its saved input: the step that runs a
            # backward differs between devices, so what a forward keeps for it lives in a buffer
            # indexed by tables, and its input is the least it can keep.
            runs, j, c = (jnp.asarray(a[t])[stage] for a in backwards)
            rows = jax.tree.map(lambda w: w[c], blocks)
            last = (c * PP + stage == VIRTUAL - 1).astype(jnp.float32) * runs
            (y, loss), pullback = jax.vjp(
                lambda x, wte, wpe, rows, tail: chunk_loss(x, wte, wpe, rows, tail, j, c),
                read(received, mine["B act"][t]), wte, wpe, rows, tail,
            )
            ct = read(returned, mine["B grad"][t]) * runs.astype(y.dtype)
            dx, gw, gp, gb, gt = pullback((ct, jnp.zeros_like(loss) + scale * last))
            total = total + loss * last
            g_wte, g_wpe, g_tail = g_wte + gw, g_wpe + gp, add(g_tail, gt)
            g_blocks = jax.tree.map(lambda g, d: g.at[c].add(d), g_blocks, gb)
            sent_up = dx
        if sent_down is not None and (slots["act"][t] >= 0).any():
            got = jax.lax.ppermute(sent_down, PP_AXIS, forward_ring)
            received = filed(received, got, mine["act"][t])
        if sent_up is not None and (slots["grad"][t] >= 0).any():
            got = jax.lax.ppermute(sent_up, PP_AXIS, backward_ring)
            returned = filed(returned, got, mine["grad"][t])
    g_blocks = {name: g.reshape(held[name].shape) for name, g in g_blocks.items()}
    grads = {"wte": g_wte, "wpe": g_wpe, **g_blocks, **g_tail}
    grads = {n: reduced(n, scattered(n, g), stage_extra(n)) for n, g in grads.items()}
    loss = jax.lax.psum(total * np.float32(1.0 / m), PP_AXIS)
    if TOKEN_AXES:
        loss = jax.lax.pmean(loss, TOKEN_AXES)
    params, opt_state = update(params, grads, opt_state, hyper)
    return loss, params, opt_state
