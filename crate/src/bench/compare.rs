//! `shardlab bench compare`: the automatic and the shard_map train steps of the same model,
//! strategy and mesh, run interleaved in one process (alternating after warm-up; medians),
//! so that noise on a shared machine hits both alike.
use crate::exec::{Backend, ExecError, Trainer};
use crate::plan::{MemoryLimits, TrainerOptions};
use crate::profile::summarize;

#[derive(Clone, Debug, serde::Serialize)]
pub struct Comparison {
    /// Median wall time of one step of each program on this machine (all simulated devices).
    pub auto_ms: f64,
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

/// Builds both trainers from `opts` (whose `parallel` names the strategy and mesh), each
/// checked against `limits`, and alternates `steps` steps of each after 2 warm-up steps each.
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
    let Some((auto_opts, sm_opts)) = opts.auto_and_shard_map() else {
        return Err(ExecError::Input(
            "bench compare needs a strategy and mesh: use --preset seed or --strategy and --mesh".into(),
        ));
    };
    let mut auto = Trainer::with_limits(backend.clone(), auto_opts, limits).await?;
    let mut sm = Trainer::with_limits(backend, sm_opts, limits).await?;
    for _ in 0..2 {
        auto.step().await?;
        sm.step().await?;
    }
    let (mut a, mut s) = (vec![], vec![]);
    for _ in 0..steps {
        a.push(auto.step().await?.step_ms);
        s.push(sm.step().await?.step_ms);
    }
    let (sa, ss) = (summarize(auto.program()), summarize(sm.program()));
    let pairs: Vec<f64> = a.iter().zip(&s).map(|(x, y)| x / y).collect();
    let (auto_ms, shard_map_ms) = (median(a), median(s));
    Ok(Comparison {
        auto_ms,
        shard_map_ms,
        ratio: auto_ms / shard_map_ms,
        ratio_low: quantile(pairs.clone(), 0.25),
        ratio_high: quantile(pairs, 0.75),
        devices: sa.devices,
        auto_rng_bits_per_device: sa.rng_bits,
        shard_map_rng_bits_per_device: ss.rng_bits,
        auto_all_reduces: sa.collective_totals()["all-reduce"].count,
        shard_map_all_reduces: ss.collective_totals()["all-reduce"].count,
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
