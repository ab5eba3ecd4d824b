#!/usr/bin/env python3
"""Golden numbers for shardlab's transformer, from a float32 JAX implementation of docs/MODEL.md.

This file is a direct, readable transcription of docs/MODEL.md (the model contract):
parameter order and names, the formula init, the formula batch, the forward pass, the
mean cross-entropy loss, and the SGD / AdamW updates. Dropout is 0 (identity) throughout.

For each configuration it writes tests/fixtures/golden_<name>.json with:
  * config, optimizer          what was run
  * losses                     loss at init, then after each of the first `steps` updates
                               (steps + 1 numbers; losses[k] is the loss at the parameters
                               after k updates)
  * grad_global_norms          sqrt(sum of squares of all gradients) at the parameters
                               before update k (k = 0..steps-1); for debugging
  * init / final checksums     per parameter (index, name, shape): sum and sum of squares,
                               accumulated in float64 over the float32 values; `init` is
                               taken before any update, `final` after the last one
  * grad0                      per-parameter checksums of the gradient at init (debugging)
  * jax_version, command       provenance

Usage (from the repository root):
    python3 tests/golden/make_golden.py --out tests/fixtures
    python3 tests/golden/make_golden.py --out tests/fixtures --only tiny
    python3 tests/golden/make_golden.py --check      # recompute, compare, write nothing

CI does not need JAX: the JSON files are committed and the Rust tests read them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from dataclasses import asdict, dataclass

import numpy as np

import jax

# Everything in float32; matmuls in full float32 (no TF32 / bf16 passes on any backend).
jax.config.update("jax_enable_x64", False)
jax.config.update("jax_default_matmul_precision", "highest")

import jax.numpy as jnp  # noqa: E402  (after the config updates on purpose)

HIGHEST = jax.lax.Precision.HIGHEST
LN_EPS = 1e-5
MASK_VALUE = -1e30


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class Config:
    layers: int
    d_model: int
    heads: int
    seq: int
    batch: int
    vocab: int
    tied: bool
    dropout: float = 0.0


@dataclass(frozen=True)
class Optimizer:
    name: str  # "sgd" | "adamw"
    lr: float
    # AdamW constants, fixed by docs/MODEL.md (recorded for the reader; unused by SGD).
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01  # applied to 2-D weights only


@dataclass(frozen=True)
class Golden:
    name: str
    config: Config
    optimizer: Optimizer
    steps: int = 5


TINY = Config(layers=1, d_model=32, heads=4, seq=8, batch=2, vocab=64, tied=False)
TIED = Config(layers=2, d_model=48, heads=3, seq=16, batch=3, vocab=50, tied=True)

GOLDENS = [
    Golden("tiny", TINY, Optimizer("sgd", 0.1)),
    Golden("tied", TIED, Optimizer("sgd", 0.1)),
    Golden("adamw", TINY, Optimizer("adamw", 1e-3)),
]


# ----------------------------------------------------------------------- parameters


def param_shapes(cfg: Config) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) in docs/MODEL.md order; the list position is param_index."""
    d, v, t = cfg.d_model, cfg.vocab, cfg.seq
    shapes = [("wte", (v, d)), ("wpe", (t, d))]
    for layer in range(cfg.layers):
        p = f"blocks.{layer}."
        shapes += [
            (p + "ln1_g", (d,)),
            (p + "ln1_b", (d,)),
            (p + "w_qkv", (d, 3 * d)),
            (p + "b_qkv", (3 * d,)),
            (p + "w_proj", (d, d)),
            (p + "b_proj", (d,)),
            (p + "ln2_g", (d,)),
            (p + "ln2_b", (d,)),
            (p + "w_fc", (d, 4 * d)),
            (p + "b_fc", (4 * d,)),
            (p + "w_out", (4 * d, d)),
            (p + "b_out", (d,)),
        ]
    shapes += [("lnf_g", (d,)), ("lnf_b", (d,))]
    if not cfg.tied:
        shapes.append(("w_head", (d, v)))
    return shapes


def formula_init(cfg: Config) -> list[jnp.ndarray]:
    """W[i, j] = 0.02 * sin(1.3 i + 0.7 j + param_index) in float64, rounded to float32;
    LayerNorm gains 1; LayerNorm biases and all other biases 0."""
    params = []
    for index, (name, shape) in enumerate(param_shapes(cfg)):
        if len(shape) == 2:
            i = np.arange(shape[0], dtype=np.float64)[:, None]
            j = np.arange(shape[1], dtype=np.float64)[None, :]
            w = (0.02 * np.sin(1.3 * i + 0.7 * j + float(index))).astype(np.float32)
        elif name.split(".")[-1] in ("ln1_g", "ln2_g", "lnf_g"):
            w = np.ones(shape, dtype=np.float32)
        else:
            w = np.zeros(shape, dtype=np.float32)
        params.append(jnp.asarray(w))
    return params


def formula_batch(cfg: Config) -> tuple[jnp.ndarray, jnp.ndarray]:
    """tokens[b, t] = (7 b + 3 t^2 + 1) % V, t in [0, T]; inputs = [:, :T], targets = [:, 1:]."""
    b = np.arange(cfg.batch, dtype=np.int64)[:, None]
    t = np.arange(cfg.seq + 1, dtype=np.int64)[None, :]
    tokens = (7 * b + 3 * t * t + 1) % cfg.vocab
    return jnp.asarray(tokens[:, : cfg.seq], jnp.int32), jnp.asarray(tokens[:, 1:], jnp.int32)


# -------------------------------------------------------------------------- forward


def layer_norm(x, g, b):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)  # biased
    return (x - mean) / jnp.sqrt(var + LN_EPS) * g + b


def gelu(x):
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def matmul(x, w):
    return jnp.matmul(x, w, precision=HIGHEST)


def attention(cfg: Config, h, w_qkv, b_qkv, w_proj, b_proj):
    bsz, t, d = h.shape
    nh, dh = cfg.heads, d // cfg.heads
    qkv = matmul(h, w_qkv) + b_qkv
    q, k, v = qkv[..., 0:d], qkv[..., d : 2 * d], qkv[..., 2 * d : 3 * d]
    # Head n uses columns n*Dh:(n+1)*Dh: [B, T, d] -> [B, H, T, Dh].
    split = lambda z: z.reshape(bsz, t, nh, dh).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    s = jnp.einsum("bhid,bhjd->bhij", q, k, precision=HIGHEST) / math.sqrt(dh)
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))  # keep j <= i
    s = jnp.where(causal, s, MASK_VALUE)
    a = jax.nn.softmax(s, axis=-1)  # dropout(a) = a at rate 0
    o = jnp.einsum("bhij,bhjd->bhid", a, v, precision=HIGHEST)
    o = o.transpose(0, 2, 1, 3).reshape(bsz, t, d)  # concat_heads
    return matmul(o, w_proj) + b_proj


def forward_loss(cfg: Config, params, inputs, targets):
    assert cfg.dropout == 0.0, "the goldens are defined with dropout 0"
    wte, wpe = params[0], params[1]
    x = wte[inputs] + wpe[0 : cfg.seq]
    for layer in range(cfg.layers):
        (ln1_g, ln1_b, w_qkv, b_qkv, w_proj, b_proj,
         ln2_g, ln2_b, w_fc, b_fc, w_out, b_out) = params[2 + 12 * layer : 2 + 12 * (layer + 1)]
        x = x + attention(cfg, layer_norm(x, ln1_g, ln1_b), w_qkv, b_qkv, w_proj, b_proj)
        h = layer_norm(x, ln2_g, ln2_b)
        x = x + (matmul(gelu(matmul(h, w_fc) + b_fc), w_out) + b_out)
    base = 2 + 12 * cfg.layers
    x = layer_norm(x, params[base], params[base + 1])
    w_head = wte.T if cfg.tied else params[base + 2]
    logits = matmul(x, w_head)  # [B, T, V], no bias
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(lse - picked)


# ------------------------------------------------------------------------ optimizers


def sgd_update(opt: Optimizer, params, grads, state, step):
    return [p - opt.lr * g for p, g in zip(params, grads)], state


def adamw_init(params):
    return ([jnp.zeros_like(p) for p in params], [jnp.zeros_like(p) for p in params])


def adamw_update(opt: Optimizer, params, grads, state, step):
    """step counts from 1. p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p), wd only for 2-D."""
    ms, vs = state
    c1 = 1.0 - opt.b1**step
    c2 = 1.0 - opt.b2**step
    new_p, new_m, new_v = [], [], []
    for p, g, m, v in zip(params, grads, ms, vs):
        m = opt.b1 * m + (1.0 - opt.b1) * g
        v = opt.b2 * v + (1.0 - opt.b2) * g * g
        mhat, vhat = m / c1, v / c2
        wd = opt.weight_decay if p.ndim == 2 else 0.0
        new_p.append(p - opt.lr * (mhat / (jnp.sqrt(vhat) + opt.eps) + wd * p))
        new_m.append(m)
        new_v.append(v)
    return new_p, (new_m, new_v)


# ---------------------------------------------------------------------------- run


def checksums(cfg: Config, arrays) -> list[dict]:
    out = []
    for index, ((name, shape), a) in enumerate(zip(param_shapes(cfg), arrays)):
        a64 = np.asarray(a, dtype=np.float32).astype(np.float64)
        assert a64.shape == shape, (name, a64.shape, shape)
        out.append({
            "index": index,
            "name": name,
            "shape": list(shape),
            "sum": float(a64.sum()),
            "sumsq": float(np.square(a64).sum()),
        })
    return out


def run(golden: Golden) -> dict:
    cfg, opt = golden.config, golden.optimizer
    assert cfg.d_model % cfg.heads == 0
    params = formula_init(cfg)
    inputs, targets = formula_batch(cfg)

    value_and_grad = jax.jit(jax.value_and_grad(
        lambda ps: forward_loss(cfg, ps, inputs, targets)))
    if opt.name == "sgd":
        update, state = sgd_update, None
    elif opt.name == "adamw":
        update, state = adamw_update, adamw_init(params)
    else:
        raise ValueError(f"unknown optimizer {opt.name!r}")
    update = jax.jit(update, static_argnums=(0, 4))

    init_sums = checksums(cfg, params)
    losses, grad_norms, grad0 = [], [], None
    for step in range(1, golden.steps + 1):
        loss, grads = value_and_grad(params)
        losses.append(float(loss))
        grad_norms.append(float(np.sqrt(sum(
            np.square(np.asarray(g, np.float64)).sum() for g in grads))))
        if grad0 is None:
            grad0 = checksums(cfg, grads)
        params, state = update(opt, params, grads, state, step)
    losses.append(float(value_and_grad(params)[0]))

    for p in params:
        assert p.dtype == jnp.float32
    return {
        "name": golden.name,
        "config": asdict(cfg),
        "optimizer": asdict(opt) if opt.name == "adamw" else {"name": opt.name, "lr": opt.lr},
        "init": "formula",
        "data": "formula",
        "steps": golden.steps,
        "losses": losses,
        "grad_global_norms": grad_norms,
        "tolerance": 1e-5,
        "params_init": init_sums,
        "params_final": checksums(cfg, params),
        "grad0": grad0,
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "command": command_line(),
        "notes": (
            "Generated by tests/golden/make_golden.py from MODEL.md, float32, matmul "
            "precision highest, dropout 0. losses[k] = loss after k updates. "
            "grad_global_norms[k] = global L2 norm of the gradient used by update k+1. "
            "Checksums: sum and sum of squares in float64 of the float32 values."
        ),
    }


def command_line() -> str:
    script = os.path.relpath(os.path.abspath(sys.argv[0]), repo_root())
    return shlex.join(["python3", script, *sys.argv[1:]])


def repo_root() -> str:
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(repo_root(), "tests", "fixtures"),
                        help="directory for golden_<name>.json (default: tests/fixtures)")
    parser.add_argument("--only", action="append", choices=[g.name for g in GOLDENS],
                        help="generate only this configuration (repeatable)")
    parser.add_argument("--check", action="store_true",
                        help="do not write; compare with the existing files and report")
    args = parser.parse_args(argv)

    os.makedirs(args.out, exist_ok=True)
    status = 0
    with jax.default_matmul_precision("highest"):
        for golden in GOLDENS:
            if args.only and golden.name not in args.only:
                continue
            result = run(golden)
            path = os.path.join(args.out, f"golden_{golden.name}.json")
            losses = " ".join(f"{x:.7f}" for x in result["losses"])
            if args.check:
                with open(path) as f:
                    old = json.load(f)
                diff = max(abs(a - b) for a, b in zip(old["losses"], result["losses"]))
                ok = diff <= 1e-6
                status |= 0 if ok else 1
                print(f"{golden.name:6s} {'ok' if ok else 'DIFFERS'} max|dloss|={diff:.2e}  {losses}")
            else:
                with open(path, "w") as f:
                    json.dump(result, f, indent=1)
                    f.write("\n")
                print(f"{golden.name:6s} -> {path}  log(V)={math.log(golden.config.vocab):.4f}  "
                      f"losses: {losses}")
    return status


if __name__ == "__main__":
    sys.exit(main())
