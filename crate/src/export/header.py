#!/usr/bin/env python3
"""A shardlab experiment as a standalone JAX script (written by `shardlab export jax`).

{{SUMMARY}}

It trains MODEL.md's GPT-style transformer as `shardlab train` does: the same parameters at
init, the same batches, the same optimizer, the same partitioning, the same dropout keys.
It prints one JSON line per step, {"step":k,"loss":L,"step_ms":t} (the loss before update k,
like `shardlab train --json`), then {"done":true,"steps":n,"final_loss":L,"mode":M,
"median_step_ms":t,"timed_steps":k}: the median wall time of the steps after 2 warm-up steps
(null when there are none), to hold against shardlab's modelled step. With dropout 0 the
losses match shardlab's.

Needs jax and numpy (`pip install jax`). Run: python3 this_file.py
On a machine with fewer accelerators than the mesh has devices, it simulates the mesh on
the CPU.
"""

import collections
import json
import math
import os
import sys
import time

# ------------------------------------------------------------------------ the experiment

{{SETTINGS}}

MESH_DEVICES = math.prod(size for _, size in MESH_AXES)

# XLA reads this flag when its CPU backend starts, so it is set before jax is imported. It
# only changes how many CPU devices there are: accelerators, when there are enough, are used.
if MESH_DEVICES > 1 and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={MESH_DEVICES}"
    ).strip()

import numpy as np  # noqa: E402  (after XLA_FLAGS on purpose)
import jax  # noqa: E402

# float32 matmuls in full float32 (no TF32 / bf16 passes on GPUs or TPUs); under
# COMPUTE_DTYPE = "bfloat16" the model computes with bfloat16 copies of the float32 weights.
jax.config.update("jax_enable_x64", False)
jax.config.update("jax_default_matmul_precision", "highest")
# The random-bit layout of dropout masks (shardlab's --rng original / partitionable).
jax.config.update("jax_threefry_partitionable", RNG_PARTITIONABLE)

import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402
