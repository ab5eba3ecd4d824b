

# ----------------------------------------------------------------------------------- main

# Steps before the timed ones: the first runs the compiled step cold, the second settles caches.
WARMUP = 2


def place(host, layout):
    """Whole numpy arrays (the same on every process) as global arrays in the mode's layout:
    each process puts only its own devices' blocks."""
    placed = {}
    for name, (shape, spec) in layout.items():
        x = laid_out(name, np.asarray(host[name])).reshape(shape)
        if spec is None:
            placed[name] = jax.device_put(x)
        else:
            placed[name] = jax.make_array_from_callback(shape, sharding(spec), lambda index, x=x: x[index])
    return placed


def process_rows(spec):
    """The rows of a (B, T) batch with in_spec `spec` that this process's devices hold, in the
    order jax.make_array_from_process_local_data takes them: its distinct row blocks, sorted."""
    held = sharding(spec).addressable_devices_indices_map((BATCH, SEQ)).values()
    blocks = sorted({index[0].indices(BATCH)[:2] for index in held})
    return [row for start, stop in blocks for row in range(start, stop)]


def batch_arrays(dataset, step):
    """Step `step`'s (inputs, targets): each process makes only the rows its devices hold (from
    the same data stream as every other), and JAX assembles the global arrays."""
    if BATCH_SPEC is None:
        return dataset.batch(step)
    arrays = []
    for spec, columns in ((BATCH_SPEC, slice(0, SEQ)), (TARGETS_SPEC, slice(1, SEQ + 1))):
        local = dataset.tokens(step, process_rows(spec))[:, columns]
        arrays.append(jax.make_array_from_process_local_data(sharding(spec), local, (BATCH, SEQ)))
    return tuple(arrays)


def model_flops_per_step():
    """The step's model FLOPs as MFU counts them (PaLM, appendix B): per token, 6 per weight of
    the matmuls (forward and backward) a token passes through (a mixture's router and its
    TOP_K experts) and 12 L T d for attention; recomputation not counted."""
    mlp = D_MODEL * EXPERTS + TOP_K * 2 * D_MODEL * EXPERT_WIDTH if EXPERTS else 8 * D_MODEL * D_MODEL
    weights = LAYERS * (4 * D_MODEL * D_MODEL + mlp) + D_MODEL * VOCAB
    return BATCH * SEQ * (6 * weights + 12 * LAYERS * SEQ * D_MODEL)


def peak_flops():
    """The device kind's bf16 matmul peak (dense), None for a kind without one listed."""
    kind = jax.devices()[0].device_kind
    return next((flops for name, flops in PEAK_FLOPS if name in kind), None)


def rates(seconds):
    """tokens/s and MFU (against MESH_DEVICES devices at their peak) of a step of `seconds`."""
    peak = peak_flops()
    mfu = None if peak is None else round(model_flops_per_step() / (seconds * MESH_DEVICES * peak), 5)
    return round(BATCH * SEQ / seconds, 1), mfu


def compile_step(train_step, *args):
    """The step compiled ahead of the loop: its compile time and JAX's memory analysis of one
    device's program (the bytes of its arguments, outputs and temporaries)."""
    t0 = time.perf_counter()
    compiled = train_step.lower(*args).compile()
    seconds = time.perf_counter() - t0
    m = compiled.memory_analysis()
    memory = None if m is None else {
        "argument_bytes": m.argument_size_in_bytes,
        "output_bytes": m.output_size_in_bytes,
        "alias_bytes": m.alias_size_in_bytes,
        "temp_bytes": m.temp_size_in_bytes,
    }
    return compiled, round(seconds, 3), memory


def main():
    start_processes(FLAGS)
    steps, directory = FLAGS.steps, FLAGS.checkpoint_dir
    dataset = Dataset()
    first, host = 0, None
    if directory is not None:
        prepare_checkpoints(directory)
        first, host = restore(directory)
        if first:
            say({"resumed": True, "step": first, "checkpoint": os.path.join(directory, f"step-{first}")})
    if host is None:
        host = (init_params(), ())
        host = (host[0], init_opt_state(host[0]))
    params = place(host[0], PARAM_LAYOUT)
    opt_state = tuple(place(state, STATE_LAYOUT) for state in host[1])
    inputs, targets = batch_arrays(dataset, first)
    train_step, compile_s, memory = compile_step(
        make_train_step(), params, opt_state, inputs, targets, np.asarray(step_key(first)), adamw_hyper(first + 1)
    )
    step_ms = []
    for k in range(first, steps):
        inputs, targets = batch_arrays(dataset, k)
        t0 = time.perf_counter()
        loss, params, opt_state = train_step(params, opt_state, inputs, targets, np.asarray(step_key(k)), adamw_hyper(k + 1))
        loss = float(loss)  # waits for the step: the time covers all of it
        step_ms.append((time.perf_counter() - t0) * 1e3)
        if not math.isfinite(loss):
            fail(f"the loss became {loss} at step {k}: lower the learning rate")
        tokens_per_s, _ = rates(step_ms[-1] / 1e3)
        say({"step": k, "loss": loss, "step_ms": round(step_ms[-1], 3), "tokens_per_s": tokens_per_s})
        if directory is not None and checkpoint_due(k + 1, steps):
            save(directory, k + 1, params, opt_state)
    say(done_record(dataset, params, steps, step_ms, compile_s, memory))


def checkpoint_due(done, steps):
    """Whether the state after `done` updates is saved: every --checkpoint-every, and the last."""
    every = FLAGS.checkpoint_every
    return done == steps or (every > 0 and done % every == 0)


def laid_out_loss(params, tokens, targets, key):
    """forward_loss of the parameters as laid out (a pipeline's block stacks in model order)."""
    return forward_loss({name: in_model_order(name, p) for name, p in params.items()}, tokens, targets, key)


def done_record(dataset, params, steps, step_ms, compile_s, memory):
    """The last line: the final loss (the global forward on the next batch, as shardlab's final
    eval), the median step after the warm-up, its rates, the compile time and the memory."""
    inputs, targets = batch_arrays(dataset, steps)
    replicated = {} if BATCH_SPEC is None else {"out_shardings": sharding(P())}
    eval_loss = jax.jit(laid_out_loss, **replicated)
    final = float(eval_loss(to_compute(params), inputs, targets, np.asarray(step_key(steps))))
    timed = sorted(step_ms[WARMUP:])
    median_ms = round(timed[len(timed) // 2], 3) if timed else None
    tokens_per_s, mfu = rates(median_ms / 1e3) if timed else (None, None)
    return {
        "done": True, "steps": steps, "final_loss": final, "mode": MODE, "median_step_ms": median_ms,
        "timed_steps": len(timed), "tokens_per_s": tokens_per_s, "mfu": mfu, "model_flops_per_step": model_flops_per_step(),
        "compile_s": compile_s, "memory_per_device": memory, "processes": jax.process_count(),
    }


if __name__ == "__main__":
    main()
