//! The mixture-of-experts block alone (router, top-k, renormalised gates, capacity in GShard's
//! order, the experts' GELU MLPs, the gated combine, Switch's load-balancing loss) and its
//! gradients: the WGSL kernels against their CPU twins, and both against a plain JAX
//! implementation of the same block (one-hot dispatch masks and einsums, `jax.grad`), with
//! routing that drops choices and dropless routing.
use shardlab::autodiff::grad;
use shardlab::exec::{GpuExecutor, ReferenceExecutor, Tensor};
use shardlab::ir::{Builder, DType, Program, RngLayout, Role, ValueId};
use shardlab::model::{moe_mlp, Activations, Capacity, GptConfig, Local, Moe};
use shardlab_tests::{assert_close, rand_vec};

/// Two sequences of 6 tokens of width 8, 4 experts of 12 hidden units, top-2.
const G: usize = 2;
const S: usize = 6;
const D: usize = 8;

fn moe(capacity: Capacity) -> Moe {
    Moe {
        top_k: 2,
        width: 12,
        capacity,
        aux: 0.05,
        ..Moe::new(4, D)
    }
}

/// loss = sum(block(x) * r) + aux, with the block's output, its load-balancing loss, its
/// routing (places, load) and the gradients of x, w_router, w_fc and w_out as outputs.
fn program(m: &Moe) -> Program {
    let cfg = GptConfig {
        d_model: D,
        seq: S,
        batch: G,
        moe: Some(*m),
        ..GptConfig::tiny()
    };
    let mut b = Builder::new();
    let f32_in = |b: &mut Builder, name: &str, shape: &[usize]| b.input(name, shape, DType::F32, Role::Other);
    let x = f32_in(&mut b, "x", &[G, S, D]);
    let w_router = f32_in(&mut b, "w_router", &[D, m.experts]);
    let w_fc = f32_in(&mut b, "w_fc", &[m.experts, D, m.width]);
    let w_out = f32_in(&mut b, "w_out", &[m.experts, m.width, D]);
    let r = f32_in(&mut b, "r", &[G, S, D]);
    let tokens = b.input("tokens", &[G, S], DType::U32, Role::Other);
    let key = b.input("key", &[2], DType::U32, Role::Other);
    let a = Activations {
        params: &[],
        tokens,
        targets: tokens,
        key,
        rng_layout: RngLayout::Partitionable,
        local: Local::of(&cfg),
    };
    let (y, aux) = moe_mlp(&mut b, m, &a, 0, x, x, [w_router, w_fc, w_out]);
    let yr = b.mul(y, r);
    let total = b.sum(yr, &[0, 1, 2]);
    let loss = b.add(total, aux);
    let grads = grad(&mut b, loss, &[x, w_router, w_fc, w_out]).unwrap();
    let routing: Vec<ValueId> = ["h0.moe.places", "h0.moe.load"].iter().map(|n| named(&b, n)).collect();
    for v in [loss, y, aux].into_iter().chain(routing).chain(grads) {
        b.output(v);
    }
    b.finish().unwrap()
}

fn named(b: &Builder, name: &str) -> ValueId {
    let at = b.program().values.iter().position(|v| v.name.as_deref() == Some(name));
    ValueId(at.unwrap_or_else(|| panic!("the block names no {name}")) as u32)
}

/// The inputs: random, the router's weights larger so that its choices are clear-cut.
fn feed(m: &Moe) -> Vec<Tensor> {
    let (e, f) = (m.experts, m.width);
    let scaled = |n: usize, seed: u32, by: f32| Tensor::F32(rand_vec(n, seed).iter().map(|v| v * by).collect());
    vec![
        scaled(G * S * D, 1, 1.0),
        scaled(D * e, 2, 2.0),
        scaled(e * D * f, 3, 0.5),
        scaled(e * f * D, 4, 0.5),
        scaled(G * S * D, 5, 1.0),
        Tensor::U32(vec![0; G * S]),
        Tensor::U32(vec![0, 0]),
    ]
}

const OUTPUTS: [&str; 9] = [
    "loss",
    "y",
    "aux",
    "places",
    "load",
    "dx",
    "dw_router",
    "dw_fc",
    "dw_out",
];

fn run_gpu(ctx: &shardlab::gpu::GpuContext, prog: &Program, inputs: &[Tensor]) -> Vec<Tensor> {
    pollster::block_on(async {
        let exec = GpuExecutor::new(ctx, prog.clone()).await.unwrap();
        for (i, t) in inputs.iter().enumerate() {
            exec.write_input(ctx, i, t).unwrap();
        }
        exec.submit(ctx);
        let mut outs = vec![];
        for k in 0..prog.outputs.len() {
            outs.push(exec.read_output(ctx, k).await.unwrap());
        }
        outs
    })
}

fn gpu_matches_twin(capacity: Capacity) {
    let ctx = shardlab_tests::gpu_or_skip!();
    let m = moe(capacity);
    let prog = program(&m);
    let inputs = feed(&m);
    let want = ReferenceExecutor::run(&prog, &inputs, 1).unwrap();
    let got = run_gpu(ctx, &prog, &inputs);
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        let what = format!("{} ({})", OUTPUTS[k], capacity.text());
        match (g, w) {
            (Tensor::U32(g), Tensor::U32(w)) => assert_eq!(g, w, "{what}"),
            _ => assert_close(&what, g.f32(), w.f32(), 1e-5, 1e-4),
        }
    }
}

#[test]
fn gpu_kernels_route_and_differentiate_the_block_as_the_cpu_twin_when_dropping() {
    gpu_matches_twin(Capacity::Factor(0.5));
}

#[test]
fn gpu_kernels_route_and_differentiate_the_block_as_the_cpu_twin_dropless() {
    gpu_matches_twin(Capacity::Dropless);
}

/// The same block in plain JAX: one-hot dispatch and combine masks from `lax.top_k`, the
/// capacity counted by a cumulative sum over the choices in GShard's order (every token's
/// first choice, then every second choice), einsums for the experts; `jax.grad` for the rest.
const JAX_BLOCK: &str = r#"
import json, sys
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", False)
HI = jax.lax.Precision.HIGHEST
cfg, ins = json.loads(sys.argv[1]), json.loads(sys.argv[2])
G, S, D, E, F, K, C, AUX = (cfg[k] for k in ["G", "S", "D", "E", "F", "K", "C", "AUX"])
x, wr, wfc, wout, r = (jnp.asarray(ins[k], jnp.float32).reshape(s) for k, s in
    [("x", (G, S, D)), ("w_router", (D, E)), ("w_fc", (E, D, F)), ("w_out", (E, F, D)), ("r", (G, S, D))])

def gelu(v):
    return 0.5 * v * (1.0 + jnp.tanh(jnp.sqrt(2.0 / jnp.pi) * (v + 0.044715 * v**3)))

def routing(logits):
    probs = jax.nn.softmax(logits, axis=-1)
    top, chosen = jax.lax.top_k(logits, K)                      # (G, S, K)
    gates = jax.nn.softmax(top, axis=-1)
    onehot = jax.nn.one_hot(chosen, E, dtype=jnp.float32)       # (G, S, K, E)
    order = onehot.transpose(0, 2, 1, 3).reshape(G, K * S, E)   # choice-major: GShard's order
    slot = (jnp.cumsum(order, axis=1) - 1.0) * order
    slot = slot.sum(-1).reshape(G, K, S).transpose(0, 2, 1)     # (G, S, K)
    kept = (slot < C).astype(jnp.float32)
    mask = onehot[..., None] * jax.nn.one_hot(slot, C)[:, :, :, None, :] * kept[..., None, None]
    return probs, gates, mask, onehot, kept

def block(x, wr, wfc, wout):
    logits = jnp.einsum("gsd,de->gse", x, wr, precision=HI)
    probs, gates, mask, onehot, kept = routing(logits)
    mask = jax.lax.stop_gradient(mask)
    slots = jnp.einsum("gskec,gsd->egcd", mask, x, precision=HI)
    h = gelu(jnp.einsum("egcd,edf->egcf", slots, wfc, precision=HI))
    out = jnp.einsum("egcf,efd->egcd", h, wout, precision=HI)
    y = jnp.einsum("gskec,gsk,egcd->gsd", mask, gates, out, precision=HI)
    f = jax.lax.stop_gradient(onehot).sum((0, 1, 2)) / (G * S * K)
    p = probs.mean((0, 1))
    aux = AUX * E * jnp.sum(f * p)
    return y, aux, onehot, kept

def loss(x, wr, wfc, wout):
    y, aux, _, _ = block(x, wr, wfc, wout)
    return jnp.sum(y * r) + aux, (y, aux)

step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))
(value, (y, aux)), grads = step(x, wr, wfc, wout)
_, _, onehot, kept = jax.jit(block)(x, wr, wfc, wout)
load = jnp.stack([onehot.sum((1, 2)), (onehot * kept[..., None]).sum((1, 2))], axis=1)  # (G, 2, E)
out = {"loss": [float(value)], "y": y, "aux": [float(aux)], "load": load,
       "dx": grads[0], "dw_router": grads[1], "dw_fc": grads[2], "dw_out": grads[3]}
print(json.dumps({k: [float(v) for v in jnp.ravel(jnp.asarray(a))] for k, a in out.items()}))
"#;

fn jax_matches(capacity: Capacity) {
    let Some(python) = shardlab_tests::jax_python() else {
        return;
    };
    let m = moe(capacity);
    let prog = program(&m);
    let inputs = feed(&m);
    let ours = ReferenceExecutor::run(&prog, &inputs, 1).unwrap();
    let cfg = serde_json::json!({
        "G": G, "S": S, "D": D, "E": m.experts, "F": m.width, "K": m.top_k, "C": m.slots(S), "AUX": m.aux,
    });
    let names = ["x", "w_router", "w_fc", "w_out", "r"];
    let ins: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .zip(&inputs)
        .map(|(n, t)| (n.to_string(), serde_json::json!(t.f32())))
        .collect();
    let out = std::process::Command::new(python)
        .args([
            "-c",
            JAX_BLOCK,
            &cfg.to_string(),
            &serde_json::Value::Object(ins).to_string(),
        ])
        .env("JAX_PLATFORMS", "cpu")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the JAX block failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let jax: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let dropped: f32 = (0..G)
        .flat_map(|g| (0..m.experts).map(move |e| (g, e)))
        .map(|(g, e)| {
            let load = ours[4].f32();
            load[g * 2 * m.experts + e] - load[(g * 2 + 1) * m.experts + e]
        })
        .sum();
    match capacity {
        Capacity::Dropless => assert_eq!(dropped, 0.0, "dropless routing dropped {dropped} choices"),
        Capacity::Factor(_) => assert!(dropped > 0.0, "a capacity of {} slots dropped nothing", m.slots(S)),
    }
    for (k, name) in OUTPUTS.iter().enumerate() {
        if *name == "places" {
            continue;
        }
        let want: Vec<f32> = jax[name]
            .as_array()
            .unwrap_or_else(|| panic!("JAX gave no {name}"))
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_close(
            &format!("{name} ({}) vs JAX", capacity.text()),
            ours[k].f32(),
            &want,
            1e-5,
            1e-4,
        );
    }
}

/// Named `under_jax::` so that `cargo xtask test` runs them in its JAX step, with the venv: the
/// native step runs before the venv exists on a bare machine.
mod under_jax {
    use super::*;

    #[test]
    fn block_loss_and_gradients_match_plain_jax_when_dropping() {
        jax_matches(Capacity::Factor(0.5));
    }

    #[test]
    fn block_loss_and_gradients_match_plain_jax_dropless() {
        jax_matches(Capacity::Dropless);
    }
}
