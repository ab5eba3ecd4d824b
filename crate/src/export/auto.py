

# ---------------------------------------------- automatic partitioning: jit with shardings
# The global step, unchanged; the strategy is only the in/out shardings below. XLA's SPMD
# partitioner inserts the collectives (shardlab's --mode auto does the same).

# in_shardings of the parameters and of their optimizer state (ZeRO splits the state while
# the parameter stays whole), by state name (a block's parameter stacked over the layers:
# its spec's first entry is the layer axis); outputs keep them.
{{PARAM_SPECS}}
{{STATE_SPECS}}
BATCH_SPEC = {{BATCH_SPEC}}  # tokens
TARGETS_SPEC = {{TARGETS_SPEC}}
# with_sharding_constraint on named values of the step (model code: `constrain(x, name)`):
# the --spec overrides, and the gradients' layout of ZeRO-2 and FSDP (every sum dNAME in its
# state's blocks: each microbatch's gradient is reduce-scattered as it is made).
{{CONSTRAINTS}}
# ZeRO-1: the gradient the update reads, replicated (all-reduced once after the microbatches).
{{UPDATE_GRAD_SPECS}}
PARAM_LAYOUT = {name: (shape, PARAM_SPECS[name]) for name, shape in state_shapes()}
STATE_LAYOUT = {name: (shape, STATE_SPECS[name]) for name, shape in state_shapes()}


def make_train_step():
    params = {name: sharding(spec) for name, (_, spec) in PARAM_LAYOUT.items()}
    state = {name: sharding(spec) for name, (_, spec) in STATE_LAYOUT.items()}
    state = () if OPTIMIZER == "sgd" else (state, state)
    replicated = sharding(P())
    return jax.jit(
        global_train_step,
        in_shardings=(params, state, sharding(BATCH_SPEC), sharding(TARGETS_SPEC), replicated, replicated),
        out_shardings=(replicated, params, state),
        donate_argnums=(0, 1),
    )
