#!/usr/bin/env python3
"""Writes tests/fixtures/rng.json: known answers of JAX's Threefry-2x32 PRNG.

shardlab's Rust generator (crate/src/rng) and its WGSL twin (shaders/random.wgsl) must be
bit-exact with JAX, so that a flax-style dropout in JAX draws the same masks. This script
records, with the installed JAX on the CPU backend:

  * raw `threefry_2x32(keypair, counts)` on several keys and count arrays, including the
    Random123 test vectors (counts of length 2 are one hashed pair (x0, x1));
  * `PRNGKey(seed)` key data, in the default 32-bit mode and with `jax_enable_x64`;
  * `split(key, n)` and `fold_in(key, data)`;
  * `bits(key, shape, uint32)`, `uniform(key, shape)`, `bernoulli(key, p, shape)` and a
    flax-style dropout, each under both settings of `jax_threefry_partitionable`:
    False ("original" layout, JAX's default before 0.5.0) and True ("partitionable").

Everything is deterministic (fixed seeds and shapes; no host randomness). Arrays are
stored flattened in row-major order with their shape beside them; u32 values as plain
integers, f32 values as their u32 bit patterns (`*_bits` fields) so that JSON round
trips are exact. CI does not need JAX: the output is committed.

Usage:  python3 tests/golden/make_rng_fixtures.py   (from the repository root)
"""
import json
import os

import jax

jax.config.update("jax_platforms", "cpu")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.extend.random import threefry_2x32  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "rng.json")

LAYOUTS = {"original": False, "partitionable": True}
SEEDS = [0, 1, 42, 1234, -1, -7, 2**31 - 1, 2**32 + 5, 0xDEADBEEFCAFE]
# Keys (as raw key data) used for the draws below: a seed key, a split key, a fold_in key.
BITS_SHAPES = [[1], [2], [3], [7], [8], [16], [17], [65], [3, 5], [4, 4], [2, 8, 3], [2, 3, 4, 5], []]
FLOAT_SHAPES = [[5], [64], [3, 7], [2, 3, 4]]
BERNOULLI_P = [0.9, 0.5, 0.1]


def u32_list(a):
    return [int(v) for v in np.asarray(a, dtype=np.uint32).reshape(-1)]


def f32_bits(a):
    return u32_list(np.asarray(a, dtype=np.float32).view(np.uint32))


def raw_key(seed):
    return jax.random.PRNGKey(seed)


def threefry_cases():
    """Raw threefry_2x32 on (key, counts); counts of any length (odd ones are padded)."""
    cases = []
    # Random123 known answers for Threefry-2x32 with 20 rounds.
    vectors = [
        ([0x00000000, 0x00000000], [0x00000000, 0x00000000]),
        ([0xFFFFFFFF, 0xFFFFFFFF], [0xFFFFFFFF, 0xFFFFFFFF]),
        ([0x13198A2E, 0x03707344], [0x243F6A88, 0x85A308D3]),
    ]
    for key, counts in vectors:
        cases.append((key, counts))
    rng = np.random.RandomState(20240607)
    for key, n in [([0, 42], 1), ([0, 42], 5), ([12345, 678910], 8), ([0xDEADBEEF, 0x01234567], 13)]:
        cases.append((key, list(range(n))))
    for n in [2, 7, 10]:
        key = [int(v) for v in rng.randint(0, 2**32, size=2, dtype=np.uint64)]
        counts = [int(v) for v in rng.randint(0, 2**32, size=n, dtype=np.uint64)]
        cases.append((key, counts))
    out = []
    for key, counts in cases:
        k = jnp.asarray(np.array(key, dtype=np.uint32))
        c = jnp.asarray(np.array(counts, dtype=np.uint32))
        out.append({"key": key, "counts": counts, "out": u32_list(threefry_2x32(k, c))})
    return out


def seed_cases():
    out = []
    for s in SEEDS:
        out.append({"seed": s, "key": u32_list(jax.random.PRNGKey(s))})
    jax.config.update("jax_enable_x64", True)
    out64 = []
    for s in SEEDS:
        out64.append({"seed": s, "key": u32_list(jax.random.PRNGKey(s))})
    jax.config.update("jax_enable_x64", False)
    return out, out64


def draw_keys():
    """The keys every draw below is made with, as raw key data."""
    k0 = raw_key(0)
    k42 = raw_key(42)
    kf = jax.random.fold_in(raw_key(7), 3)
    return [u32_list(k0), u32_list(k42), u32_list(kf)]


def per_layout(keys):
    layouts = {}
    for name, flag in LAYOUTS.items():
        jax.config.update("jax_threefry_partitionable", flag)
        split = []
        for key in keys:
            k = jnp.asarray(np.array(key, dtype=np.uint32))
            for n in [1, 2, 3, 5]:
                split.append({"key": key, "n": n, "keys": u32_list(jax.random.split(k, n))})
        bits = []
        for key in keys:
            k = jnp.asarray(np.array(key, dtype=np.uint32))
            for shape in BITS_SHAPES:
                b = jax.random.bits(k, tuple(shape), jnp.uint32)
                bits.append({"key": key, "shape": shape, "bits": u32_list(b)})
        uniform = []
        bernoulli = []
        for key in keys[:2]:
            k = jnp.asarray(np.array(key, dtype=np.uint32))
            for shape in FLOAT_SHAPES:
                u = jax.random.uniform(k, tuple(shape), jnp.float32)
                uniform.append({"key": key, "shape": shape, "values_bits": f32_bits(u)})
                for p in BERNOULLI_P:
                    m = jax.random.bernoulli(k, p, tuple(shape))
                    bernoulli.append({"key": key, "shape": shape, "p": p, "keep": [int(v) for v in np.asarray(m).reshape(-1)]})
        dropout = []
        for key in keys[1:]:
            k = jnp.asarray(np.array(key, dtype=np.uint32))
            for shape, rate in [([2, 3, 8], 0.25), ([17], 0.5), ([4, 9], 0.1)]:
                n = int(np.prod(shape))
                x = (jnp.arange(n, dtype=jnp.float32).reshape(shape) * 0.37 - 1.5)
                # flax.linen.Dropout, written out: keep ~ bernoulli(1 - rate), x / keep_prob.
                keep_prob = 1.0 - rate
                mask = jax.random.bernoulli(k, p=keep_prob, shape=tuple(shape))
                y = jax.lax.select(mask, x / keep_prob, jnp.zeros_like(x))
                dropout.append(
                    {"key": key, "shape": shape, "rate": rate, "x_bits": f32_bits(x), "y_bits": f32_bits(y)}
                )
        layouts[name] = {"split": split, "bits": bits, "uniform": uniform, "bernoulli": bernoulli, "dropout": dropout}
    jax.config.update("jax_threefry_partitionable", True)
    return layouts


def fold_in_cases(keys):
    out = []
    for key in keys:
        k = jnp.asarray(np.array(key, dtype=np.uint32))
        for data in [0, 1, 3, 12345, 0xFFFFFFFF]:
            out.append({"key": key, "data": data, "out": u32_list(jax.random.fold_in(k, np.uint32(data)))})
    return out


def main():
    seeds32, seeds64 = seed_cases()
    keys = draw_keys()
    fixture = {
        "generator": "tests/golden/make_rng_fixtures.py",
        "jax_version": jax.__version__,
        "threefry_2x32": threefry_cases(),
        "prng_key": seeds32,
        "prng_key_x64": seeds64,
        "fold_in": fold_in_cases(keys),
        "layouts": per_layout(keys),
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.normpath(OUT)} (jax {jax.__version__})")


if __name__ == "__main__":
    main()
