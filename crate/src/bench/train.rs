//! `shardlab bench train`: steps/s, tokens/s, and where a step's time goes.
use std::sync::Arc;

use crate::exec::{Backend, ExecError, Trainer};
use crate::gpu::GpuContext;
use crate::ir::RngLayout;
use crate::model::{DataSource, GptConfig, Init, Optimizer, TrainStep};
use crate::plan::{MemoryLimits, Parallel, TrainerOptions};
use crate::profile::{breakdown, measured_timeline, profiled_floor, MeasuredBreakdown, Roofline, StepFloor, Timeline};

/// The "small": the configuration `bench train` and `bench peers` both measure.
pub fn small_config() -> GptConfig {
    GptConfig {
        layers: 2,
        d_model: 128,
        heads: 4,
        seq: 64,
        batch: 8,
        vocab: 256,
        tied: false,
        dropout: 0.0,
        attention: Default::default(),
        remat: Default::default(),
        precision: Default::default(),
        moe: None,
    }
}

/// GPT-2 124M (12 layers of width 768, 12 heads, tied embeddings, vocab 50304) at seq 1024 and
/// batch 8, without dropout: the one-device step the issue holds against JAX on a real GPU.
pub fn gpt2_config() -> GptConfig {
    GptConfig {
        layers: 12,
        d_model: 768,
        heads: 12,
        seq: 1024,
        batch: 8,
        vocab: 50304,
        tied: true,
        ..small_config()
    }
}

/// The configurations `bench train --config` names: `tiny`, `small` and `gpt2`.
pub const CONFIG_NAMES: [&str; 3] = ["tiny", "small", "gpt2"];

/// The configuration `name` (one of [`CONFIG_NAMES`]).
pub fn config_named(name: &str) -> Option<GptConfig> {
    match name {
        "tiny" => Some(GptConfig::tiny()),
        "small" => Some(small_config()),
        "gpt2" => Some(gpt2_config()),
        _ => None,
    }
}

/// The two configurations `bench train` reports unless told others.
pub fn configs() -> Vec<(&'static str, GptConfig)> {
    vec![("tiny", GptConfig::tiny()), ("small", small_config())]
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct TrainBench {
    pub config: String,
    pub params: usize,
    pub steps: usize,
    /// Median wall time of a whole step (submit to loss read back), measured.
    pub ms_per_step: f64,
    pub steps_per_s: f64,
    pub tokens_per_s: f64,
    /// Wall time of each phase run alone, measured.
    pub forward_ms: f64,
    pub backward_ms: f64,
    pub update_ms: f64,
    /// A profiled step, measured by wall clock with split submissions: ops, categories and
    /// phases against the step (see `profile::MeasuredBreakdown`).
    pub profile: MeasuredBreakdown,
    pub dispatches_per_step: usize,
    /// Of `dispatches_per_step`, the buffer-to-texture copies.
    pub copies_per_step: usize,
    pub peak_bytes: u64,
    /// The step's floor on this adapter's measured ceilings, when they were given.
    pub floor: Option<StepFloor>,
    /// The profiled step as a timeline on the adapter (what `--trace` writes).
    #[serde(skip)]
    pub timeline: Timeline,
    /// The train step that ran, whose instructions the timeline names.
    #[serde(skip)]
    pub step: TrainStep,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Trains `cfg` for `steps` measured steps (after 2 warm-up steps) with AdamW, within `limits`;
/// with the adapter's `roofline`, also prices the step's floor on it.
pub async fn train(
    ctx: Arc<GpuContext>,
    name: &str,
    cfg: GptConfig,
    steps: usize,
    roofline: Option<Roofline>,
    limits: &MemoryLimits,
) -> Result<TrainBench, ExecError> {
    let opts = TrainerOptions {
        config: cfg.clone(),
        optimizer: Optimizer::AdamW { lr: 1e-3 },
        init: Init::Formula,
        data: DataSource::Copy,
        seed: 0,
        rng_layout: RngLayout::Partitionable,
        parallel: Parallel::None,
        combine_all_reduces: false,
        microbatches: 1,
        cp_order: Default::default(),
        schedule: Default::default(),
        virtual_stages: 1,
        stage_layers: vec![],
    };
    let adapter = ctx.summary.name.clone();
    let mut t = Trainer::with_limits(Backend::Gpu(ctx), opts, limits).await?;
    for _ in 0..2 {
        t.step().await?;
    }
    let mut wall = vec![];
    for _ in 0..steps.max(1) {
        wall.push(t.step().await?.step_ms);
    }
    let ms = median(wall);
    let (_, profile) = t.profile_step().await?;
    let profile = profile.expect("GPU runs are profiled");
    let read = breakdown(t.program(), &profile);
    Ok(TrainBench {
        config: name.to_string(),
        params: cfg.num_params(),
        steps,
        ms_per_step: ms,
        steps_per_s: 1e3 / ms,
        tokens_per_s: (cfg.batch * cfg.seq) as f64 * 1e3 / ms,
        forward_ms: profile.phases_ms[0],
        backward_ms: profile.phases_ms[1],
        update_ms: profile.phases_ms[2],
        profile: read,
        dispatches_per_step: t.dispatches_per_step(),
        copies_per_step: t.copies_per_step(),
        peak_bytes: t.peak_bytes(),
        floor: roofline.map(|r| profiled_floor(t.program(), &profile, r)),
        timeline: measured_timeline(t.program(), &profile, &adapter),
        step: t.train_step().clone(),
    })
}
