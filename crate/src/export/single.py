

# ------------------------------------------------------------------- one device: plain jit


def make_train_step(params, opt_state):
    """The global step under jit on the default device."""
    step = jax.jit(global_train_step, donate_argnums=(0, 1))
    return step, jax.device_put(params), jax.device_put(opt_state)


def global_params(params):
    return params
