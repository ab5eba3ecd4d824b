//! `shardlab bench model`: the cost model checked against what can be measured. A sweep of
//! small configurations (both modes, all four strategies, 1 to 8 simulated devices, both RNG
//! layouts, two model sizes) runs here; each one's measured step time stands beside the
//! model's prediction for the same program on the calibrated `this` profile, simulated
//! placement (all devices as shards of this one adapter, as they run).
use crate::exec::{Backend, ExecError, Parallel, Trainer, TrainerOptions};
use crate::ir::RngLayout;
use crate::model::{DataSource, GptConfig, Init, Optimizer};
use crate::plan::{DropoutKey, Strategy};
use crate::profile::{compare_ops, predict, DeviceProfile, OpComparison, Placement};
use crate::sharding::Mesh;

/// One configuration of the sweep and its two times.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelCheck {
    pub name: String,
    pub mode: &'static str,
    pub strategy: &'static str,
    pub mesh: String,
    pub devices: usize,
    pub rng: &'static str,
    pub size: &'static str,
    /// Median measured wall time of a step on this adapter.
    pub measured_ms: f64,
    /// The cost model's step time for the same program on `this`.
    pub predicted_ms: f64,
    /// |predicted - measured| / measured, in percent.
    pub error_pct: f64,
}

/// The sweep's results.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelSweep {
    pub device: String,
    pub checks: Vec<ModelCheck>,
    /// Mean absolute percentage error over `checks`.
    pub mape_pct: f64,
    pub steps: usize,
}

/// The two model sizes of the sweep: tiny enough for lavapipe, different enough that the
/// matmul, RNG and launch shares move.
fn sizes() -> [(&'static str, GptConfig); 2] {
    [
        (
            "xs",
            GptConfig {
                layers: 1,
                d_model: 32,
                heads: 2,
                seq: 16,
                batch: 8,
                vocab: 32,
                tied: false,
                dropout: 0.1,
                attention: Default::default(),
                remat: Default::default(),
            },
        ),
        (
            "s",
            GptConfig {
                layers: 2,
                d_model: 64,
                heads: 4,
                seq: 32,
                batch: 16,
                vocab: 64,
                tied: false,
                dropout: 0.1,
                attention: Default::default(),
                remat: Default::default(),
            },
        ),
    ]
}

/// Meshes per strategy and size: 1 to 8 devices over the sweep.
fn mesh_for(strategy: Strategy, size: usize) -> &'static str {
    match (strategy, size) {
        (Strategy::Dp, 0) => "dp=8",
        (Strategy::Dp, _) => "dp=2",
        (Strategy::Fsdp, 0) => "dp=4",
        (Strategy::Fsdp, _) => "dp=8",
        (Strategy::Tp, 0) => "tp=2",
        (Strategy::Tp, _) => "tp=4",
        (Strategy::DpTp, 0) => "dp=2,tp=2",
        (Strategy::DpTp, _) => "dp=4,tp=2",
        // Not in the sweep: their example meshes.
        (s, _) => s.example_mesh(),
    }
}

/// Every configuration of the sweep: one device per size, then both modes x four
/// strategies x both RNG layouts x two sizes (34 in all).
pub fn sweep_options() -> Result<Vec<(String, &'static str, &'static str, TrainerOptions)>, ExecError> {
    let mut out = vec![];
    let base = |config: GptConfig, rng_layout: RngLayout, parallel: Parallel| TrainerOptions {
        config,
        optimizer: Optimizer::AdamW { lr: 3e-3 },
        init: Init::Random { seed: 0 },
        data: DataSource::Copy,
        seed: 0,
        rng_layout,
        parallel,
        combine_all_reduces: false,
        cp_order: Default::default(),
    };
    for (si, (size, config)) in sizes().into_iter().enumerate() {
        out.push((
            format!("{size} single"),
            size,
            "partitionable",
            base(config.clone(), RngLayout::Partitionable, Parallel::None),
        ));
        for strategy in [Strategy::Dp, Strategy::Fsdp, Strategy::Tp, Strategy::DpTp] {
            let mesh = Mesh::parse(mesh_for(strategy, si)).map_err(|e| ExecError::Input(e.to_string()))?;
            for (rng, layout) in [
                ("original", RngLayout::Original),
                ("partitionable", RngLayout::Partitionable),
            ] {
                for mode in ["auto", "shard_map"] {
                    let parallel = if mode == "auto" {
                        Parallel::Auto {
                            strategy,
                            mesh: mesh.clone(),
                            specs: vec![],
                        }
                    } else {
                        Parallel::ShardMap {
                            strategy,
                            mesh: mesh.clone(),
                            dropout_key: DropoutKey::Same,
                        }
                    };
                    let name = format!("{size} {mode} {} {} {rng}", strategy.name(), mesh_for(strategy, si));
                    out.push((name, size, rng, base(config.clone(), layout, parallel)));
                }
            }
        }
    }
    Ok(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs the sweep on `backend` and prices every program on `device` (simulated placement).
/// Every configuration's trainer is built and warmed up first; then `steps` rounds each take
/// one step of every configuration in turn, so a burst of load slows one round of all of them
/// rather than every step of one, and each configuration's median leaves it out. `progress`
/// is told each finished check.
pub async fn run_sweep(
    backend: Backend,
    device: &DeviceProfile,
    steps: usize,
    mut progress: impl FnMut(&ModelCheck),
) -> Result<ModelSweep, ExecError> {
    let mut trainers = vec![];
    for (name, size, rng, opts) in sweep_options()? {
        let (mode, strategy, mesh) = match &opts.parallel {
            Parallel::None => ("single", "none", "-".to_string()),
            Parallel::Auto { strategy, mesh, .. } => ("auto", strategy.name(), mesh.to_string()),
            Parallel::ShardMap { strategy, mesh, .. } => ("shard_map", strategy.name(), mesh.to_string()),
        };
        let mut t = Trainer::new(backend.clone(), opts).await?;
        for _ in 0..2 {
            t.step().await?;
        }
        trainers.push((name, size, rng, mode, strategy, mesh, t));
    }
    let mut times = vec![Vec::with_capacity(steps.max(1)); trainers.len()];
    for _ in 0..steps.max(1) {
        for (entry, times) in trainers.iter_mut().zip(&mut times) {
            times.push(entry.6.step().await?.step_ms);
        }
    }
    let mut checks = vec![];
    for ((name, size, rng, mode, strategy, mesh, t), times) in trainers.into_iter().zip(times) {
        let measured_ms = median(times);
        let p = predict(t.program(), device, Placement::Simulated);
        let check = ModelCheck {
            name,
            mode,
            strategy,
            mesh,
            devices: t.program().devices(),
            rng,
            size,
            measured_ms,
            predicted_ms: p.step_ms,
            error_pct: 100.0 * (p.step_ms - measured_ms).abs() / measured_ms,
        };
        progress(&check);
        checks.push(check);
    }
    let mape_pct = checks.iter().map(|c| c.error_pct).sum::<f64>() / checks.len().max(1) as f64;
    Ok(ModelSweep {
        device: device.label.clone(),
        checks,
        mape_pct,
        steps,
    })
}

/// The configurations `bench model --ops` profiles when none is named: one device, data
/// parallel with its all-reduces, FSDP with its gathers and tensor parallel with its inserted
/// copies, at both sizes.
pub const OPS_DEFAULT: [&str; 4] = [
    "xs single",
    "xs auto dp dp=8 original",
    "s auto fsdp dp=8 partitionable",
    "s shard_map tp tp=4 partitionable",
];

/// One configuration's step, predicted on `device` beside its measured per-op profile.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OpsCheck {
    pub name: String,
    pub comparison: OpComparison,
}

/// The sweep's configurations `names` pick: a name as the sweep prints it, else every
/// configuration whose name contains it. A name that picks none is an error that says so.
pub fn pick_configs(names: &[String]) -> Result<Vec<(String, TrainerOptions)>, ExecError> {
    let all = sweep_options()?;
    let mut picked = vec![];
    for n in names {
        let hits: Vec<_> = match all.iter().find(|(name, ..)| name == n) {
            Some(e) => vec![e],
            None => all.iter().filter(|(name, ..)| name.contains(n.as_str())).collect(),
        };
        if hits.is_empty() {
            return Err(ExecError::Input(format!(
                "--config {n}: no configuration of the sweep is named like it; `shardlab bench model` lists them"
            )));
        }
        picked.extend(hits.into_iter().map(|(name, _, _, opts)| (name.clone(), opts.clone())));
    }
    Ok(picked)
}

/// Profiles `configs` (from [`pick_configs`]) op by op and compares each op's measured time
/// with the model's price on `device`.
pub async fn run_ops(
    backend: Backend,
    device: &DeviceProfile,
    configs: Vec<(String, TrainerOptions)>,
    mut progress: impl FnMut(&OpsCheck),
) -> Result<Vec<OpsCheck>, ExecError> {
    let mut out = vec![];
    for (name, opts) in configs {
        let mut t = Trainer::new(backend.clone(), opts).await?;
        for _ in 0..2 {
            t.step().await?;
        }
        let (_, profile) = t.profile_step().await?;
        let profile = profile.ok_or_else(|| ExecError::Input("--ops needs the GPU backend".into()))?;
        let check = OpsCheck {
            name,
            comparison: compare_ops(t.program(), device, Placement::Simulated, &profile),
        };
        progress(&check);
        out.push(check);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_configs_are_picked_by_exact_name_or_part_of_one() {
        let exact = pick_configs(&["xs single".to_string()]).unwrap();
        assert_eq!(exact.len(), 1);
        assert_eq!(exact[0].0, "xs single");
        // "s single" is a configuration of its own, not every name containing it.
        assert_eq!(pick_configs(&["s single".to_string()]).unwrap().len(), 1);
        let tp = pick_configs(&["s shard_map tp tp=4".to_string()]).unwrap();
        assert_eq!(tp.len(), 2, "both RNG layouts");
        for name in OPS_DEFAULT {
            assert_eq!(pick_configs(&[name.to_string()]).unwrap()[0].0, name);
        }
        let e = pick_configs(&["xl single".to_string()]).unwrap_err().to_string();
        assert!(e.contains("--config xl single") && e.contains("bench model"), "{e}");
    }
}
