

# ----------------------------------------------------------------------------------- main


# Steps before the timed ones: the first compiles the step, the second settles caches.
WARMUP = 2


def main():
    dataset = Dataset()
    params = init_params()
    train_step, params, opt_state = make_train_step(params, init_opt_state(params))
    eval_loss = jax.jit(forward_loss)  # the global forward, as shardlab's final eval
    step_ms = []
    for k in range(STEPS):
        inputs, targets = dataset.batch(k)
        t0 = time.perf_counter()
        loss, params, opt_state = train_step(params, opt_state, inputs, targets, step_key(k), adamw_hyper(k + 1))
        loss = float(loss)  # waits for the step: the time covers all of it
        step_ms.append((time.perf_counter() - t0) * 1e3)
        if not math.isfinite(loss):
            sys.exit(f"error: the loss became {loss} at step {k}: lower the learning rate")
        print(json.dumps({"step": k, "loss": loss, "step_ms": round(step_ms[-1], 3)}, separators=(",", ":")), flush=True)
    inputs, targets = dataset.batch(STEPS)
    final = float(eval_loss(to_compute(global_params(params)), inputs, targets, step_key(STEPS)))
    timed = sorted(step_ms[WARMUP:])
    median_ms = round(timed[len(timed) // 2], 3) if timed else None
    done = {"done": True, "steps": STEPS, "final_loss": final, "mode": MODE, "median_step_ms": median_ms}
    done["timed_steps"] = len(timed)
    print(json.dumps(done, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
