//! MODEL.md parity: with dropout 0, formula init and data, the loss at init and after each
//! of 5 updates matches a float32 JAX implementation (tests/golden/make_golden.py) to 1e-5,
//! on the CPU reference executor and on the GPU executor.
use std::sync::Arc;

use serde_json::Value;
use shardlab::exec::{Backend, Parallel, Trainer, TrainerOptions};
use shardlab::ir::RngLayout;
use shardlab::model::{DataSource, GptConfig, Init, Optimizer};

fn golden(name: &str) -> Value {
    let path = format!("{}/fixtures/golden_{name}.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn options(g: &Value) -> TrainerOptions {
    let c = &g["config"];
    let u = |k: &str| c[k].as_u64().unwrap() as usize;
    let config = GptConfig {
        layers: u("layers"),
        d_model: u("d_model"),
        heads: u("heads"),
        seq: u("seq"),
        batch: u("batch"),
        vocab: u("vocab"),
        tied: c["tied"].as_bool().unwrap(),
        dropout: 0.0,
        attention: Default::default(),
        remat: Default::default(),
        precision: Default::default(),
        moe: None,
    };
    let lr = g["optimizer"]["lr"].as_f64().unwrap() as f32;
    let optimizer = match g["optimizer"]["name"].as_str().unwrap() {
        "sgd" => Optimizer::Sgd { lr },
        "adamw" => Optimizer::AdamW { lr },
        other => panic!("unknown optimizer {other}"),
    };
    TrainerOptions {
        config,
        optimizer,
        init: Init::Formula,
        data: DataSource::Formula,
        seed: 0,
        rng_layout: RngLayout::Partitionable,
        parallel: Parallel::None,
        combine_all_reduces: false,
        microbatches: 1,
        cp_order: Default::default(),
        schedule: Default::default(),
        virtual_stages: 1,
        stage_layers: vec![],
    }
}

/// Losses at init and after each of 5 updates, and the final parameters.
fn run(backend: Backend, g: &Value) -> (Vec<f32>, Vec<Vec<f32>>) {
    pollster::block_on(async {
        let mut t = Trainer::new(backend, options(g)).await.unwrap();
        let mut losses = vec![];
        for _ in 0..5 {
            losses.push(t.step().await.unwrap().loss);
        }
        losses.push(t.eval_loss().await.unwrap());
        (losses, t.params().await.unwrap())
    })
}

fn check(what: &str, g: &Value, losses: &[f32], params: &[Vec<f32>], param_rtol: f64) {
    let want: Vec<f64> = g["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    // zip stops at the shorter: a missing or extra loss must fail, not pass unchecked.
    assert_eq!(
        losses.len(),
        want.len(),
        "{what}: {} losses against JAX's {}",
        losses.len(),
        want.len()
    );
    for (k, (&got, &w)) in losses.iter().zip(&want).enumerate() {
        assert!(
            (got as f64 - w).abs() <= 1e-5,
            "{what}: loss after {k} updates is {got}, JAX says {w} (diff {:e})",
            (got as f64 - w).abs()
        );
    }
    for p in g["params_final"].as_array().unwrap() {
        let i = p["index"].as_u64().unwrap() as usize;
        assert!(
            i < params.len(),
            "{what}: JAX has parameter {i}, shardlab {}",
            params.len()
        );
        let sum: f64 = params[i].iter().map(|&x| x as f64).sum();
        let sumsq: f64 = params[i].iter().map(|&x| (x as f64) * (x as f64)).sum();
        let (ws, wq) = (p["sum"].as_f64().unwrap(), p["sumsq"].as_f64().unwrap());
        let name = p["name"].as_str().unwrap();
        assert!(
            (sumsq - wq).abs() <= param_rtol * wq.abs() + 1e-6,
            "{what}: {name} sum of squares {sumsq} vs JAX {wq}"
        );
        assert!(
            (sum - ws).abs() <= param_rtol * (wq.sqrt() * 10.0) + 1e-5,
            "{what}: {name} sum {sum} vs JAX {ws}"
        );
    }
}

fn parity(name: &str, param_rtol: f64) {
    let g = golden(name);
    let (losses, params) = run(Backend::Reference, &g);
    check(&format!("{name} (reference)"), &g, &losses, &params, param_rtol);
    match shardlab_tests::gpu() {
        Some(_) => {
            let ctx = Arc::new(shardlab::gpu::GpuContext::new_blocking().unwrap());
            let (losses, params) = run(Backend::Gpu(ctx), &g);
            check(&format!("{name} (GPU)"), &g, &losses, &params, param_rtol);
        }
        None => eprintln!("skipped the GPU half: no adapter"),
    }
}

#[test]
fn tiny_model_matches_jax_for_five_sgd_steps() {
    parity("tiny", 1e-4);
}

#[test]
fn tied_two_layer_model_matches_jax_for_five_sgd_steps() {
    parity("tied", 1e-4);
}

#[test]
fn adamw_matches_jax_for_five_steps() {
    parity("adamw", 1e-3);
}
