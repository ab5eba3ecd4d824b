//! Shared helpers of the integration tests: one GPU context per test binary, deterministic
//! data, and tolerance checks that say where two arrays differ.
use std::sync::OnceLock;

use shardlab::gpu::GpuContext;

mod lanes;
mod python;
mod skip;

pub use lanes::{check_with_16_lanes, lavapipe_lanes};
pub use python::{jax_python, python, python_program, remove_script, run_jax_script, PYTHON_VAR};
pub use skip::{adapter_lacks, unavailable, Need, SKIP_LOG_VAR};

/// The process-wide GPU context. With no adapter the calling test fails, unless
/// `SHARDLAB_ALLOW_NO_GPU=1`: then the skip is recorded and this returns `None`.
pub fn gpu() -> Option<&'static GpuContext> {
    static CTX: OnceLock<Result<GpuContext, String>> = OnceLock::new();
    match CTX.get_or_init(|| GpuContext::new_blocking().map_err(|e| e.to_string())) {
        Ok(ctx) => Some(ctx),
        Err(why) => {
            unavailable(Need::Gpu, why);
            None
        }
    }
}

/// Returns the GPU context, or returns from the test when [`gpu`] allows it to be skipped.
#[macro_export]
macro_rules! gpu_or_skip {
    () => {
        match $crate::gpu() {
            Some(ctx) => ctx,
            None => return,
        }
    };
}

/// Deterministic values in [-1, 1) from a 32-bit LCG (no rand dependency; reproducible).
pub fn rand_vec(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

/// Asserts |a - b| <= atol + rtol * |b| elementwise, naming the first failing index.
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length {} vs {}", got.len(), want.len());
    let mut worst = (0usize, 0f32);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        assert!(
            err.is_finite() || g == w,
            "{what}: non-finite at {i}: got {g}, want {w}"
        );
        let excess = err - (atol + rtol * w.abs());
        if excess > worst.1 {
            worst = (i, excess);
        }
    }
    if worst.1 > 0.0 {
        let i = worst.0;
        panic!(
            "{what}: mismatch at index {i} of {}: got {}, want {} (atol {atol}, rtol {rtol})",
            got.len(),
            got[i],
            want[i]
        );
    }
}

/// Submits `dispatches` and reads `out` back as f32.
pub fn run_dispatches(
    ctx: &GpuContext,
    dispatches: &[shardlab::gpu::Dispatch],
    out: &shardlab::gpu::GpuBuffer,
) -> Vec<f32> {
    ctx.run(dispatches);
    ctx.read_blocking::<f32>(out).unwrap()
}

/// MODEL.md's formula init and data, no dropout, the partitionable RNG layout: the setting in
/// which every partitioning must reproduce the one-device run.
pub fn formula_options(
    config: shardlab::model::GptConfig,
    optimizer: shardlab::model::Optimizer,
    parallel: shardlab::exec::Parallel,
) -> shardlab::exec::TrainerOptions {
    shardlab::exec::TrainerOptions {
        config,
        optimizer,
        init: shardlab::model::Init::Formula,
        data: shardlab::model::DataSource::Formula,
        seed: 0,
        rng_layout: shardlab::ir::RngLayout::Partitionable,
        parallel,
        combine_all_reduces: false,
        microbatches: 1,
        cp_order: Default::default(),
        schedule: Default::default(),
        virtual_stages: 1,
        stage_layers: vec![],
    }
}

/// The losses of `steps` train steps and the parameters after them.
pub fn train_steps(
    backend: &shardlab::exec::Backend,
    opts: shardlab::exec::TrainerOptions,
    steps: usize,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    pollster::block_on(async {
        let mut t = shardlab::exec::Trainer::new(backend.clone(), opts).await.unwrap();
        let mut losses = vec![];
        for _ in 0..steps {
            losses.push(t.step().await.unwrap().loss);
        }
        (losses, t.params().await.unwrap())
    })
}

/// One device, then every strategy on a small mesh in shard_map mode (with `dropout_key`) and
/// in automatic mode: the runs an equivalence test holds to each other.
pub fn every_mode(dropout_key: shardlab::plan::DropoutKey) -> Vec<(String, shardlab::exec::Parallel)> {
    use shardlab::exec::Parallel;
    use shardlab::plan::Strategy;
    let mesh = |m: &str| shardlab::sharding::Mesh::parse(m).expect("a valid mesh");
    let mut cases = vec![("one device".to_string(), Parallel::None)];
    for (strategy, m) in [
        (Strategy::Dp, "dp=2"),
        (Strategy::Zero1, "dp=2"),
        (Strategy::Zero2, "dp=2"),
        (Strategy::Fsdp, "dp=2"),
        (Strategy::Tp, "tp=2"),
        (Strategy::DpTp, "dp=2,tp=2"),
        (Strategy::Cp, "cp=2"),
        (Strategy::DpCp, "dp=2,cp=2"),
        (Strategy::TpSp, "tp=2"),
    ] {
        cases.push((
            format!("shard_map {} on {m}", strategy.name()),
            Parallel::ShardMap {
                par: strategy.compose(&mesh(m)).unwrap(), // Where the sequence is split every device draws its block of the one-device
                // masks: there is no key to choose.
                dropout_key: if strategy.compose(&mesh(m)).unwrap().draws_mask_blocks() {
                    shardlab::plan::DropoutKey::Same
                } else {
                    dropout_key
                },
            },
        ));
        cases.push((
            format!("auto {} on {m}", strategy.name()),
            Parallel::Auto {
                par: strategy.compose(&mesh(m)).unwrap(),
                specs: vec![],
            },
        ));
    }
    cases
}
