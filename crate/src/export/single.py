

# ------------------------------------------------------------------- one device: plain jit
# The global step under jit on the default device; every array whole.

PARAM_LAYOUT = {name: (shape, None) for name, shape in state_shapes()}
STATE_LAYOUT = PARAM_LAYOUT
BATCH_SPEC = TARGETS_SPEC = None


def make_train_step():
    return jax.jit(global_train_step, donate_argnums=(0, 1))
