//! `shardlab bench compare`: the train steps of the same model, strategy and mesh in JAX's
//! three modes (automatic, explicit and shard_map), run interleaved in one process
//! (round-robin after warm-up; medians), so that noise on a shared machine hits all alike.
use crate::exec::{Backend, ExecError, Trainer};
use crate::plan::{MemoryLimits, Mode, TrainerOptions};
use crate::profile::summarize;

/// One mode's measured step and what its program does.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModeRun {
    pub mode: Mode,
    /// Median wall time of one step on this machine (all simulated devices).
    pub ms: f64,
    /// ms / shard_map's ms.
    pub ratio_to_shard_map: f64,
    /// Random bits each device generates per step.
    pub rng_bits_per_device: u64,
    pub all_reduces: usize,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Comparison {
    /// Median wall time of one step of each program on this machine (all simulated devices).
    pub auto_ms: f64,
    pub explicit_ms: f64,
    pub shard_map_ms: f64,
    /// auto_ms / shard_map_ms.
    pub ratio: f64,
    /// The spread of the ratio: the lower and upper quartile of the interleaved pairs' ratios
    /// (each auto step over the shard_map step after it). A gap is real where 1.0 lies outside.
    pub ratio_low: f64,
    pub ratio_high: f64,
    pub devices: usize,
    /// Random bits each device generates per step, in each program.
    pub auto_rng_bits_per_device: u64,
    pub shard_map_rng_bits_per_device: u64,
    pub auto_all_reduces: usize,
    pub shard_map_all_reduces: usize,
    /// Every mode, in [`Mode::PARTITIONED`]'s order.
    pub modes: Vec<ModeRun>,
    pub steps: usize,
}

fn median(v: Vec<f64>) -> f64 {
    quantile(v, 0.5)
}

/// The `q`-quantile of `v` (non-empty): the element at rank round(q (n - 1)) in order.
fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[(q * (v.len() - 1) as f64).round() as usize]
}

/// Builds the three trainers from `opts` (whose `parallel` names the strategy and mesh), each
/// checked against `limits`, and takes `steps` steps of each in turn after 2 warm-up steps each.
pub async fn compare(
    backend: Backend,
    opts: &TrainerOptions,
    limits: &MemoryLimits,
    steps: usize,
) -> Result<Comparison, ExecError> {
    if steps == 0 {
        return Err(ExecError::Input(
            "--steps must be at least 1: the comparison reports medians of measured steps".into(),
        ));
    }
    let Some(every) = opts.in_every_mode() else {
        return Err(ExecError::Input(
            "bench compare needs a strategy and mesh: use --preset seed or --strategy and --mesh".into(),
        ));
    };
    let mut trainers = vec![];
    for o in every {
        trainers.push(Trainer::with_limits(backend.clone(), o, limits).await?);
    }
    for _ in 0..2 {
        for t in &mut trainers {
            t.step().await?;
        }
    }
    let mut times = vec![vec![]; trainers.len()];
    for _ in 0..steps {
        for (t, ms) in trainers.iter_mut().zip(&mut times) {
            ms.push(t.step().await?.step_ms);
        }
    }
    // Each auto step over the shard_map step of its round: the spread of the ratio.
    let pairs: Vec<f64> = times[0].iter().zip(&times[2]).map(|(x, y)| x / y).collect();
    let medians: Vec<f64> = times.into_iter().map(median).collect();
    let shard_map_ms = medians[2];
    let modes: Vec<ModeRun> = trainers
        .iter()
        .zip(&medians)
        .map(|(t, &ms)| {
            let s = summarize(t.program());
            ModeRun {
                mode: t.options().parallel.mode(),
                ms,
                ratio_to_shard_map: ms / shard_map_ms,
                rng_bits_per_device: s.rng_bits,
                all_reduces: s.collective_totals()["all-reduce"].count,
            }
        })
        .collect();
    let (auto, sm) = (&modes[0], &modes[2]);
    Ok(Comparison {
        auto_ms: auto.ms,
        explicit_ms: modes[1].ms,
        shard_map_ms,
        ratio: auto.ms / shard_map_ms,
        ratio_low: quantile(pairs.clone(), 0.25),
        ratio_high: quantile(pairs, 0.75),
        devices: opts.parallel.devices(),
        auto_rng_bits_per_device: auto.rng_bits_per_device,
        shard_map_rng_bits_per_device: sm.rng_bits_per_device,
        auto_all_reduces: auto.all_reduces,
        shard_map_all_reduces: sm.all_reduces,
        modes,
        steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quartiles_of_a_few_pairs_are_elements_of_them() {
        let v = vec![1.4, 1.0, 1.2, 1.6, 1.1];
        assert_eq!(quantile(v.clone(), 0.25), 1.1);
        assert_eq!(quantile(v.clone(), 0.5), 1.2);
        assert_eq!(quantile(v, 0.75), 1.4);
        assert_eq!(quantile(vec![2.0], 0.25), 2.0);
    }
}
