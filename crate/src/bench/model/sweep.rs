//! The blocks measured in interleaved rounds and priced: per configuration its median step
//! beside the model's; per block and size class the error; over the ranking block, how well
//! the predicted order matches the measured one.
use std::sync::Arc;

use super::configs::{all, Block, Config};
use super::stats::{errors, spearman, GroupError};
use crate::exec::{Backend, ExecError, Trainer};
use crate::gpu::GpuContext;
use crate::profile::{predict, Budget, Calibration, CalibrationPrograms, Placement};

/// One configuration and its two times.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelCheck {
    pub name: String,
    pub block: Block,
    pub mode: &'static str,
    pub strategy: String,
    pub mesh: String,
    pub devices: usize,
    pub rng: &'static str,
    pub size: &'static str,
    /// Median measured wall time of a step on this adapter.
    pub measured_ms: f64,
    /// The cost model's step time for the same program on `this`.
    pub predicted_ms: f64,
    /// (predicted - measured) / measured, in percent: positive when over-predicted.
    pub signed_pct: f64,
    /// |predicted - measured| / measured, in percent.
    pub error_pct: f64,
}

/// The measured blocks and what they say.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelSweep {
    pub device: String,
    /// The calibration made in the same rounds, which every prediction is priced on: its
    /// profile, its measurements and how far its programs spread over the rounds.
    pub calibration: Calibration,
    pub checks: Vec<ModelCheck>,
    /// Mean absolute percentage error over the sweep.
    pub mape_pct: f64,
    /// Over the held-out block (configurations the sweep does not have, the seed preset's size
    /// and larger).
    pub held_out_mape_pct: f64,
    /// Per block and size class: the error and its sign.
    pub groups: Vec<GroupError>,
    /// Spearman's rank correlation between the predicted and the measured step times of the
    /// ranking block: whether the search orders what runs here as it runs.
    pub spearman: Option<f64>,
    pub steps: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs every block on `ctx` and prices every program on the `this` profile calibrated in the
/// same rounds (simulated placement). The calibration's programs and every configuration's
/// trainer are built and warmed up first; then `steps` rounds each run every calibration
/// program once and take one step of every configuration, in turn, so the calibration and the
/// checks see the same load, a burst of it slows one round of all of them rather than every
/// step of one, and each median leaves it out. The profile is fitted to the calibration's own
/// programs only, never to a configuration it checks. `progress` is told each finished check.
pub async fn run_sweep(
    ctx: &Arc<GpuContext>,
    steps: usize,
    mut progress: impl FnMut(&ModelCheck),
) -> Result<ModelSweep, ExecError> {
    let backend = Backend::Gpu(ctx.clone());
    let calibration = CalibrationPrograms::prepare(ctx, Budget::FULL).await?;
    let mut trainers: Vec<(Config, Trainer)> = vec![];
    for config in all()? {
        let mut t = Trainer::new(backend.clone(), config.options.clone()).await?;
        for _ in 0..2 {
            t.step().await?;
        }
        trainers.push((config, t));
    }
    let rounds = steps.max(1);
    let mut calibration_runs = vec![Vec::with_capacity(rounds); calibration.len()];
    let mut times = vec![Vec::with_capacity(rounds); trainers.len()];
    for _ in 0..rounds {
        for (i, runs) in calibration_runs.iter_mut().enumerate() {
            runs.push(calibration.run(ctx, i).await?);
        }
        for ((_, t), times) in trainers.iter_mut().zip(&mut times) {
            times.push(t.step().await?.step_ms);
        }
    }
    let calibration = calibration.fit(ctx, &calibration_runs);
    let device = &calibration.profile;
    let mut checks = vec![];
    for ((config, t), times) in trainers.into_iter().zip(times) {
        let parallel = &config.options.parallel;
        let (mode, strategy, mesh) = match parallel.mesh() {
            None => ("single", "none".to_string(), "-".to_string()),
            Some(mesh) => (parallel.mode_name(), parallel.label(), mesh.to_string()),
        };
        let measured_ms = median(times);
        let p = predict(t.program(), device, Placement::Simulated);
        let signed_pct = 100.0 * (p.step_ms - measured_ms) / measured_ms;
        let check = ModelCheck {
            name: config.name,
            block: config.block,
            mode,
            strategy,
            mesh,
            devices: t.program().devices(),
            rng: config.rng,
            size: config.size,
            measured_ms,
            predicted_ms: p.step_ms,
            signed_pct,
            error_pct: signed_pct.abs(),
        };
        progress(&check);
        checks.push(check);
    }
    let block = |b: Block| checks.iter().filter(move |c| c.block == b);
    let mape = |b: Block| errors(&block(b).map(|c| c.signed_pct).collect::<Vec<_>>()).0;
    let mut groups = vec![];
    for b in [Block::Sweep, Block::HeldOut, Block::Ranking] {
        let mut sizes: Vec<&'static str> = block(b).map(|c| c.size).collect();
        sizes.dedup();
        for size in sizes {
            let signed: Vec<f64> = block(b).filter(|c| c.size == size).map(|c| c.signed_pct).collect();
            let (mape_pct, bias_pct) = errors(&signed);
            groups.push(GroupError {
                block: b,
                size,
                count: signed.len(),
                mape_pct,
                bias_pct,
            });
        }
    }
    let (predicted, measured): (Vec<f64>, Vec<f64>) =
        block(Block::Ranking).map(|c| (c.predicted_ms, c.measured_ms)).unzip();
    Ok(ModelSweep {
        device: device.label.clone(),
        calibration,
        mape_pct: mape(Block::Sweep),
        held_out_mape_pct: mape(Block::HeldOut),
        spearman: spearman(&predicted, &measured),
        groups,
        checks,
        steps,
    })
}
