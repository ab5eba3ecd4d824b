

def body(params, opt_state, tokens, targets, key, hyper):
    """One device's step: its blocks of the parameters, state and batch in, its blocks out."""
    n = math.prod(jax.lax.axis_size(a) for a in TOKEN_AXES)
    # The weights computed with are COMPUTE copies of the float32 masters, so FSDP's gathers
    # and the gradient reduction move COMPUTE. The gradients are taken with respect to the
    # gathered, per-device arrays.
    full = {name: gathered(name, p) for name, p in to_compute(params).items()}
    tokens, targets = own_rows(tokens), own_rows(targets)

    def local_loss(full, x, y, k):
        loss = forward_loss(full, x, y, k, split=SPLIT)
        # The global loss is the mean of the devices' (and microbatches') local means:
        # differentiate loss/(n K), n the devices splitting the tokens, so that summing the
        # gradients over them and the microbatches gives the mean's.
        scaled = loss * (1.0 / (n * MICROBATCHES)) if TOKEN_AXES or MICROBATCHES > 1 else loss
        return scaled, loss

    loss, grads = accumulate(local_loss, full, tokens, targets, device_key(key), on_grad=scattered)
    if MICROBATCHES > 1:
        loss = loss * np.float32(1.0 / MICROBATCHES)
    grads = {name: reduced(name, g) for name, g in grads.items()}
    if TOKEN_AXES:
        loss = jax.lax.pmean(loss, TOKEN_AXES)
    params, opt_state = update(params, grads, opt_state, hyper)
    return loss, params, opt_state
