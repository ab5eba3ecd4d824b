//! JAX's rules for long sequences, run under the pinned JAX on simulated CPU devices, and
//! shardlab held to the same answers: how many all-gathers XLA's partitioner emits for causal
//! attention on a sequence-sharded input (K and V, once, reused by the backward) and how many
//! arrays of partial sums it reduces (dK and dV); and what sequence parallelism's sharding
//! constraints make of a Megatron MLP (an all-gather before, a reduce-scatter after, where tp
//! has one all-reduce; XLA:CPU spells a reduce-scatter as an all-reduce and a dynamic-slice).
use shardlab::ir::Op;
use shardlab::model::GptConfig;
use shardlab::plan::{build, Parallel, Strategy, TrainerOptions};
use shardlab::sharding::Mesh;

const SCRIPT: &str = r#"
import json, re
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

def counts(f, *args):
    out = {}
    for line in f.lower(*args).compile().as_text().splitlines():
        m = re.search(r"\b(all-gather|all-reduce|reduce-scatter|collective-permute|all-to-all)(-start)?\(", line)
        if m:
            kind = m.group(1)
            out[kind] = out.get(kind, 0) + 1
            if kind == "all-reduce":
                # The arrays one all-reduce reduces (a tuple all-reduce has several).
                out["all-reduce operands"] = out.get("all-reduce operands", 0) + len(re.findall(r"%[\w.-]+", line.split("all-reduce(")[1].split(")")[0]))
    return out

B, H, T, D = 2, 4, 32, 8
def attn(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True)
for cp in [2, 4]:
    mesh = Mesh(np.array(jax.devices()[:cp]), ("cp",))
    sh = NamedSharding(mesh, P(None, "cp", None, None))  # (B, T, H, D), the sequence split
    x = jnp.ones((B, T, H, D), jnp.float32)
    fwd = jax.jit(attn, in_shardings=(sh, sh, sh), out_shardings=sh)
    loss = lambda q, k, v: jnp.sum(attn(q, k, v) ** 2)
    both = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), in_shardings=(sh, sh, sh), out_shardings=(sh, sh, sh))
    print(json.dumps({"case": f"attention cp={cp}", "forward": counts(fwd, x, x, x), "both": counts(both, x, x, x)}))

Bm, Tm, d = 4, 16, 32
def ln(x):
    m = x.mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)
for sp in [False, True]:
    mesh = Mesh(np.array(jax.devices()[:2]), ("tp",))
    wsc = lambda x, spec: jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
    def mlp(x, w_fc, w_out):
        h = ln(x)
        if sp:
            h = wsc(h, P())
        y = jax.nn.gelu(h @ w_fc) @ w_out
        if sp:
            y = wsc(y, P(None, "tp", None))
        return x + y
    xs = NamedSharding(mesh, P(None, "tp", None) if sp else P())
    ws = (NamedSharding(mesh, P(None, "tp")), NamedSharding(mesh, P("tp", None)))
    args = (jnp.ones((Bm, Tm, d)), jnp.ones((d, 4 * d)), jnp.ones((4 * d, d)))
    fwd = jax.jit(mlp, in_shardings=(xs,) + ws, out_shardings=xs)
    print(json.dumps({"case": f"mlp sp={str(sp).lower()}", "forward": counts(fwd, *args)}))
"#;

fn config() -> GptConfig {
    GptConfig {
        layers: 1,
        d_model: 32,
        heads: 4,
        seq: 16,
        batch: 4,
        vocab: 32,
        tied: false,
        dropout: 0.0,
        attention: Default::default(),
        remat: Default::default(),
        precision: Default::default(),
        moe: None,
    }
}

fn jax_counts() -> Vec<serde_json::Value> {
    let out = shardlab_tests::run_jax_script("long-sequence-jax", "counts", SCRIPT, 4);
    out.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn get(v: &serde_json::Value, phase: &str, kind: &str) -> usize {
    v[phase][kind].as_u64().unwrap_or(0) as usize
}

/// Tests that run JAX: in the jax step (`under_jax::`), after it installs the venv.
mod under_jax {
    use super::*;

    #[test]
    fn shardlab_gathers_and_reduces_as_many_arrays_as_xla_for_sequence_sharded_attention_and_sequence_parallelism() {
        if shardlab_tests::jax_python().is_none() {
            return;
        }
        let cases = jax_counts();
        for cp in [2, 4] {
            let c = cases
                .iter()
                .find(|c| c["case"] == format!("attention cp={cp}"))
                .unwrap();
            // XLA: K and V gathered once each; the backward reuses them and reduces dK and dV.
            assert_eq!(get(c, "forward", "all-gather"), 2, "{c}");
            assert_eq!(get(c, "both", "all-gather"), 2, "{c}");
            assert_eq!(get(c, "both", "all-reduce operands"), 2, "{c}");
            let mesh = Mesh::parse(&format!("cp={cp}")).unwrap();
            let opts = TrainerOptions::new(
                config(),
                Parallel::Auto {
                    par: Strategy::Cp.compose(&mesh).unwrap(),
                    specs: vec![],
                },
            );
            let p = build(&opts).unwrap();
            let inserted = p.inserted.unwrap();
            let attention_gathers = inserted
                .iter()
                .filter(|r| r.op == "all_gather" && r.source_op == "dot_product_attention")
                .count();
            assert_eq!(attention_gathers, get(c, "both", "all-gather"), "cp={cp}");
            let reduced = inserted
                .iter()
                .filter(|r| r.op == "psum_scatter" && r.rule.contains("partial-sum over (cp)"))
                .count();
            assert_eq!(reduced, get(c, "both", "all-reduce operands"), "cp={cp}");
        }
        let tp = cases.iter().find(|c| c["case"] == "mlp sp=false").unwrap();
        let sp = cases.iter().find(|c| c["case"] == "mlp sp=true").unwrap();
        // Megatron's MLP: one all-reduce; with sequence parallelism an all-gather and a
        // reduce-scatter (XLA:CPU's all-reduce + dynamic-slice), no other collective.
        assert_eq!(
            (get(tp, "forward", "all-reduce"), get(tp, "forward", "all-gather")),
            (1, 0),
            "{tp}"
        );
        assert_eq!(
            (get(sp, "forward", "all-gather"), get(sp, "forward", "all-reduce")),
            (1, 1),
            "{sp}"
        );
        let p = build(&TrainerOptions::new(
            config(),
            Parallel::Auto {
                par: Strategy::TpSp.compose(&Mesh::parse("tp=2").unwrap()).unwrap(),
                specs: vec![],
            },
        ))
        .unwrap();
        let prog = &p.step.program;
        let mlp = prog.instrs[..p.step.forward_end]
            .iter()
            .skip_while(|i| {
                !i.outputs
                    .iter()
                    .any(|o| prog.info(*o).name.as_deref() == Some("h0.x_att"))
            })
            .filter(|i| i.op.is_collective())
            .map(|i| i.op.name())
            .collect::<Vec<_>>();
        assert_eq!(
            mlp,
            ["all_gather", "psum_scatter"],
            "shardlab's MLP of layer 0, forward"
        );
        assert!(prog.instrs.iter().all(|i| !matches!(i.op, Op::Ppermute { .. })));
    }
}
