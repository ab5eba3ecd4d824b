# The mesh's axes typed as the run types them, and the choices of shardlab's explicit program
# (`shardlab inspect --mode explicit` lists them), by the model code's names of the values.
AXIS_TYPES = {{AXIS_TYPES}}
# out_sharding= on the op that makes the value (`matmul(x, w, name)`, `shaped(x, shape, name)`,
# the embedding's gather): where JAX could not tell the result's type (a contraction over a
# sharded dimension), or the model wants another than the rule gives.
{{OUT_SHARDINGS}}
# jax.sharding.reshard of the value after the op that makes it (`constrain(x, name)`), a block
# parameter where the block reads it (FSDP's gather), a gradient as it is summed (dNAME).
{{RESHARDS}}
# The optimizer update on each device's block (ZeRO): its operands resharded to the finest of
# their types for the update alone; jit's out_shardings lay the new parameters out.
{{UPDATE_RESHARDS}}
