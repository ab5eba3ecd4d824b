

# ---------------------------------------------- automatic partitioning: jit with shardings
# The global step, unchanged; the strategy is only the in/out shardings below. XLA's SPMD
# partitioner inserts the collectives (shardlab's --mode auto does the same).

# in_shardings of the parameters and of their optimizer state (ZeRO splits the state while
# the parameter stays whole); outputs keep them.
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


def make_train_step(params, opt_state):
    mesh = make_mesh()
    param_shardings = [NamedSharding(mesh, PARAM_SPECS[name]) for name, _ in param_shapes()]
    state = [NamedSharding(mesh, STATE_SPECS[name]) for name, _ in param_shapes()]
    state_shardings = () if OPTIMIZER == "sgd" else (state, state)
    batch, targets = NamedSharding(mesh, BATCH_SPEC), NamedSharding(mesh, TARGETS_SPEC)
    replicated = NamedSharding(mesh, P())
    step = jax.jit(
        global_train_step,
        in_shardings=(param_shardings, state_shardings, batch, targets, replicated, replicated),
        out_shardings=(replicated, param_shardings, state_shardings),
        donate_argnums=(0, 1),
    )
    return step, jax.device_put(params, param_shardings), jax.device_put(opt_state, state_shardings)


def global_params(params):
    return params
