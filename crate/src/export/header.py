#!/usr/bin/env python3
"""A shardlab experiment as a standalone JAX script (written by `shardlab export jax`).

{{SUMMARY}}

It trains MODEL.md's GPT-style transformer as `shardlab train` does: the same parameters at
init, the same batches, the same optimizer, the same partitioning, the same dropout keys.
It prints one JSON line per step, {"step":k,"loss":L,"step_ms":t,"tokens_per_s":r} (the loss
before update k, like `shardlab train --json`), then {"done":true,"steps":n,"final_loss":L,
"mode":M,"median_step_ms":t,"timed_steps":k,...}: the median wall time of the steps after 2
warm-up steps (null when there are none), tokens/s and MFU at that median, the compile time
and JAX's memory analysis of the compiled step. With dropout 0 the losses match shardlab's.

Needs jax and numpy (`pip install jax`). Run it as it is on one host (python3 this_file.py),
or once per host of a cluster (see --help): each process feeds its own devices and only
process 0 prints and writes files. On one host with fewer accelerators than the mesh has
devices, it simulates the mesh on the CPU.
"""

import argparse
import collections
import functools
import json
import math
import os
import shutil
import sys
import time

# ------------------------------------------------------------------------ the experiment

{{SETTINGS}}

MESH_DEVICES = math.prod(size for _, size in MESH_AXES)
MESH_TEXT = ",".join(f"{name}={size}" for name, size in MESH_AXES) or "one device"
