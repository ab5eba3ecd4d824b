

# ----------------------------------------------------------------------------------- main


def main():
    dataset = Dataset()
    params = init_params()
    train_step, params, opt_state = make_train_step(params, init_opt_state(params))
    eval_loss = jax.jit(forward_loss)  # the global forward, as shardlab's final eval
    for k in range(STEPS):
        inputs, targets = dataset.batch(k)
        loss, params, opt_state = train_step(params, opt_state, inputs, targets, step_key(k), adamw_hyper(k + 1))
        loss = float(loss)
        if not math.isfinite(loss):
            sys.exit(f"error: the loss became {loss} at step {k}: lower the learning rate")
        print(json.dumps({"step": k, "loss": loss}, separators=(",", ":")), flush=True)
    inputs, targets = dataset.batch(STEPS)
    final = float(eval_loss(global_params(params), inputs, targets, step_key(STEPS)))
    print(json.dumps({"done": True, "steps": STEPS, "final_loss": final}, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
