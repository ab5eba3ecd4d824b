//! `shardlab bench peers`: shardlab against its peers on the same CPU cores, in one run. Each
//! configuration alternates one shardlab measurement with one of the peer (JAX's train step of
//! the same experiment, or numpy's matmul), after warm-up, and compares the medians, so that
//! load from other work on a shared machine hits both alike. Each measurement is the second of
//! two runs in a row of its side, and the peer's threads get a pause to go quiet before
//! shardlab's: neither side is timed while the other's thread pool still spins or wakes. The
//! peer runs in another process (see peers.py); this module measures shardlab and reduces the
//! pairs to rows.
use crate::exec::{Backend, ExecError, Trainer};
use crate::gpu::GpuContext;
use crate::ir::RngLayout;
use crate::kernels::matmul::{choose_variant, matmul, time_dispatches, MatmulShape};
use crate::model::{DataSource, GptConfig, Init, Optimizer};
use crate::plan::{DropoutKey, MemoryLimits, Parallel, Parallelism, Preset, TrainerOptions};
use crate::profile::{step_floor, Roofline};
use crate::reference;

use super::kernels::{check_matmul, noise};

/// The peer process's program: run as `python peers.py SCRIPT|numpy` (see its docstring).
pub const DRIVER: &str = include_str!("peers.py");

/// Steps (or matmuls) of each side run before the measured ones: the first compiles.
pub const WARMUP: usize = 2;

/// The issue's sizes, or tiny ones that finish in seconds (tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    Full,
    Tiny,
}

/// What one configuration runs on both sides.
#[derive(Clone, Debug)]
pub enum Workload {
    /// A train step: shardlab's `Trainer` vs the `shardlab export jax` script of the same options.
    Train(Box<TrainerOptions>),
    /// C = A @ B, float32, n x n x n: shardlab's autotuned matmul vs numpy's.
    Matmul { n: usize },
}

/// One row of the benchmark, before it runs.
#[derive(Clone, Debug)]
pub struct PeerConfig {
    pub name: String,
    pub workload: Workload,
    /// The goal: shardlab's median time at most this many times the peer's.
    pub goal_max_ratio: f64,
}

impl PeerConfig {
    /// `jax` or `numpy`.
    pub fn peer(&self) -> &'static str {
        match self.workload {
            Workload::Train(_) => "jax",
            Workload::Matmul { .. } => "numpy",
        }
    }

    /// Simulated devices the peer needs (JAX's `--xla_force_host_platform_device_count`).
    pub fn devices(&self) -> usize {
        match &self.workload {
            Workload::Train(o) => o.parallel.devices(),
            Workload::Matmul { .. } => 1,
        }
    }
}

/// One measured row: medians of the alternated samples and their ratio.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PeerRow {
    pub config: String,
    pub peer: &'static str,
    /// Median ms of one shardlab step (or matmul), measured.
    pub shardlab_ms: f64,
    /// Median ms of one peer step (or matmul), measured in the same run, alternating.
    pub peer_ms: f64,
    /// shardlab_ms / peer_ms: how many times slower shardlab is.
    pub ratio: f64,
    /// The goal, as a ratio that must not be exceeded.
    pub goal_max_ratio: f64,
    pub met: bool,
    /// Matmul rows: GFLOP/s of each side; train rows: null.
    pub shardlab_gflops: Option<f64>,
    pub peer_gflops: Option<f64>,
    /// What shardlab ran: the matmul variant the autotuner chose; train rows: null.
    pub variant: Option<&'static str>,
    /// Measured samples of each side (after warm-up).
    pub samples: usize,
    /// shardlab's floor on this adapter's measured ceilings ([`floor_ms`]), when measured.
    pub floor_ms: Option<f64>,
    /// floor_ms / peer_ms: the least ratio this adapter allows, every op at its ceilings.
    pub floor_ratio: Option<f64>,
}

impl PeerRow {
    /// The row with shardlab's floor beside its measurement.
    pub fn with_floor(mut self, floor_ms: f64) -> Self {
        self.floor_ms = Some(floor_ms);
        self.floor_ratio = Some(floor_ms / self.peer_ms);
        self
    }
}

/// What `config` takes on an adapter with `roofline`'s ceilings at the least: a train step's
/// [`step_floor`] (its program as the trainer builds it), or a matmul's FLOPs over the FMA ceiling
/// (its three matrices over the copy ceiling, if more). No tuning of these kernels beats it there.
pub fn floor_ms(config: &PeerConfig, roofline: Roofline) -> Result<f64, ExecError> {
    Ok(match &config.workload {
        Workload::Train(opts) => {
            let built = crate::plan::build(opts).map_err(|e| ExecError::Input(e.to_string()))?;
            step_floor(&built.step.program, roofline).total_ms
        }
        Workload::Matmul { n } => {
            let n = *n as f64;
            1e3 * (2.0 * n.powi(3) / roofline.flops).max(12.0 * n * n / roofline.bytes_per_s)
        }
    })
}

/// The benchmark's configurations: "small" on one device, the seed preset on dp=8 in both
/// modes, and matmul at n = 1024 (tiny scale: the same shapes of run, small enough for tests);
/// with `gpt2`, GPT-2 124M on one device last (for GPUs; tiny scale: a tiny tied model).
pub fn configs(scale: Scale, gpt2: bool) -> Result<Vec<PeerConfig>, ExecError> {
    let (small, seed, devices, n) = match scale {
        Scale::Full => (("small", super::train::small_config()), Preset::Seed.config(), 8, 1024),
        Scale::Tiny => (
            ("tiny", GptConfig::tiny()),
            GptConfig {
                dropout: 0.1,
                ..GptConfig::tiny()
            },
            2,
            64,
        ),
    };
    let seed_name = if scale == Scale::Full { "seed" } else { "tiny seed" };
    let par = Parallelism::dp(devices).map_err(|e| ExecError::Input(e.to_string()))?;
    // The bench train run: formula init, AdamW, no dropout.
    let single = TrainerOptions {
        config: small.1,
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
    // `--preset seed`: random init, AdamW 3e-3, dropout 0.1, JAX's original RNG layout.
    let seed_opts = |parallel| TrainerOptions {
        config: seed.clone(),
        optimizer: Optimizer::AdamW { lr: 3e-3 },
        init: Init::Random { seed: 0 },
        data: DataSource::Copy,
        seed: 0,
        rng_layout: RngLayout::Original,
        parallel,
        combine_all_reduces: false,
        microbatches: 1,
        cp_order: Default::default(),
        schedule: Default::default(),
        virtual_stages: 1,
        stage_layers: vec![],
    };
    let gpt2_row = PeerConfig {
        name: (if scale == Scale::Full { "gpt2 124M" } else { "tiny gpt2" }).into(),
        workload: Workload::Train(Box::new(TrainerOptions {
            config: match scale {
                Scale::Full => super::train::gpt2_config(),
                Scale::Tiny => GptConfig {
                    tied: true,
                    ..GptConfig::tiny()
                },
            },
            ..single.clone()
        })),
        // Issue 54's goal on a real GPU: GPT-2 124M within 1.5x of JAX in f32.
        goal_max_ratio: 1.5,
    };
    let mut rows = vec![
        PeerConfig {
            name: small.0.into(),
            workload: Workload::Train(Box::new(single)),
            // Issue 25's goals: small within 4x of JAX on the same cores, the seed preset 5x.
            goal_max_ratio: 4.0,
        },
        PeerConfig {
            name: format!("{seed_name} auto dp={devices}"),
            workload: Workload::Train(Box::new(seed_opts(Parallel::Auto {
                par: par.clone(),
                specs: vec![],
            }))),
            goal_max_ratio: 5.0,
        },
        PeerConfig {
            name: format!("{seed_name} shard_map dp={devices}"),
            workload: Workload::Train(Box::new(seed_opts(Parallel::ShardMap {
                par,
                dropout_key: DropoutKey::Same,
            }))),
            goal_max_ratio: 5.0,
        },
        PeerConfig {
            name: format!("matmul n={n}"),
            workload: Workload::Matmul { n },
            // At least 25% of numpy's throughput.
            goal_max_ratio: 4.0,
        },
    ];
    if gpt2 {
        rows.push(gpt2_row);
    }
    Ok(rows)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The row of `config` from its alternated samples (both non-empty, in ms).
pub fn row(config: &PeerConfig, shardlab: &[f64], peer: &[f64], variant: Option<&'static str>) -> PeerRow {
    let (shardlab_ms, peer_ms) = (median(shardlab), median(peer));
    let ratio = shardlab_ms / peer_ms;
    let gflops = |ms: f64| match config.workload {
        Workload::Matmul { n } => Some(2.0 * (n as f64).powi(3) / (ms * 1e6)),
        Workload::Train(_) => None,
    };
    PeerRow {
        config: config.name.clone(),
        peer: config.peer(),
        shardlab_ms,
        peer_ms,
        ratio,
        goal_max_ratio: config.goal_max_ratio,
        met: ratio <= config.goal_max_ratio,
        shardlab_gflops: gflops(shardlab_ms),
        peer_gflops: gflops(peer_ms),
        variant,
        samples: shardlab.len().min(peer.len()),
        floor_ms: None,
        floor_ratio: None,
    }
}

/// The peer's side of one measurement: runs one step or matmul unmeasured and one measured (as
/// shardlab's side does, so neither is timed straight after the other's work), returns the
/// measured one's ms once the peer's threads have gone quiet.
pub type PeerStep<'a> = &'a mut dyn FnMut() -> Result<f64, String>;

fn peer_error(e: String) -> ExecError {
    ExecError::Input(format!("the peer failed: {e}"))
}

/// Alternates `steps` shardlab train steps with `steps` peer steps, after [`WARMUP`] of each. Each
/// measured step is the second of two in a row of its side: thread pools that wake or spin
/// after the other side's work (see [`PeerStep`]) cost the first.
pub async fn measure_train(
    backend: Backend,
    opts: &TrainerOptions,
    limits: &MemoryLimits,
    steps: usize,
    peer: PeerStep<'_>,
) -> Result<(Vec<f64>, Vec<f64>), ExecError> {
    if steps == 0 {
        return Err(ExecError::Input(
            "--steps must be at least 1: the benchmark compares medians".into(),
        ));
    }
    let mut t = Trainer::with_limits(backend, opts.clone(), limits).await?;
    for _ in 0..WARMUP {
        t.step().await?;
        peer().map_err(peer_error)?;
    }
    let (mut ours, mut theirs) = (vec![], vec![]);
    for _ in 0..steps {
        t.step().await?;
        ours.push(t.step().await?.step_ms);
        theirs.push(peer().map_err(peer_error)?);
    }
    Ok((ours, theirs))
}

/// Alternates `reps` runs of shardlab's autotuned n x n matmul with `reps` of the peer's, after
/// [`WARMUP`] of each. The GPU result is checked against the CPU reference, so a fast wrong
/// kernel fails the benchmark. Also returns the variant that ran.
pub async fn measure_matmul(
    ctx: &GpuContext,
    n: usize,
    reps: usize,
    peer: PeerStep<'_>,
) -> Result<(Vec<f64>, Vec<f64>, &'static str), ExecError> {
    if reps == 0 {
        return Err(ExecError::Input(
            "--steps must be at least 1: the benchmark compares medians".into(),
        ));
    }
    let s = MatmulShape::new(1, n, n, n);
    let (a_data, b_data) = (noise(n * n, 1), noise(n * n, 2));
    let a = ctx.upload("peers A", &a_data)?;
    let b = ctx.upload("peers B", &b_data)?;
    let c = ctx.zeros("peers C", n * n)?;
    let variant = choose_variant(ctx, &s).await?;
    let d = matmul(ctx, &s, &a, &b, None, &c, Some(variant)).await?;
    for _ in 0..WARMUP {
        time_dispatches(ctx, &d).await?;
        peer().map_err(peer_error)?;
    }
    let mut want = vec![0f32; n * n];
    reference::matmul::matmul(&s, &a_data, &b_data, None, &mut want);
    check_matmul(ctx, &c, &want, variant, n).await?;
    let (mut ours, mut theirs) = (vec![], vec![]);
    for _ in 0..reps {
        time_dispatches(ctx, &d).await?;
        ours.push(time_dispatches(ctx, &d).await?);
        theirs.push(peer().map_err(peer_error)?);
    }
    Ok((ours, theirs, variant.name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_the_ratio_of_the_medians_and_meets_its_goal_only_within_it() {
        let c = &configs(Scale::Full, false).unwrap()[0];
        let r = row(c, &[30.0, 10.0, 25.0], &[5.0, 4.0, 100.0], None);
        assert_eq!((r.shardlab_ms, r.peer_ms), (25.0, 5.0));
        assert_eq!(r.ratio, 5.0);
        assert!(!r.met, "small's goal is 4x");
        let r = row(c, &[20.0], &[5.0], None);
        assert!(r.met && r.ratio == 4.0);
    }

    #[test]
    fn the_full_configurations_are_the_issues() {
        let c = configs(Scale::Full, false).unwrap();
        let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["small", "seed auto dp=8", "seed shard_map dp=8", "matmul n=1024"]
        );
        assert_eq!(c.iter().map(|c| c.devices()).collect::<Vec<_>>(), [1, 8, 8, 1]);
        assert_eq!(
            c.iter().map(|c| c.goal_max_ratio).collect::<Vec<_>>(),
            [4.0, 5.0, 5.0, 4.0]
        );
        // On a GPU, GPT-2 124M on one device follows, held to 1.5x.
        let with = configs(Scale::Full, true).unwrap();
        let last = with.last().unwrap();
        assert_eq!(
            (last.name.as_str(), last.devices(), last.goal_max_ratio),
            ("gpt2 124M", 1, 1.5)
        );
        let Workload::Train(o) = &last.workload else {
            panic!("a train row")
        };
        assert_eq!(
            (o.config.layers, o.config.d_model, o.config.seq, o.config.batch),
            (12, 768, 1024, 8)
        );
    }

    #[test]
    fn a_matmul_row_reports_both_sides_gflops() {
        let c = &configs(Scale::Full, false).unwrap()[3];
        let r = row(c, &[40.0], &[8.0], Some("tex16"));
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["config"], "matmul n=1024");
        assert_eq!(v["peer"], "numpy");
        assert_eq!(v["ratio"], 5.0);
        assert_eq!(v["met"], false);
        let gflops = 2.0 * 1024f64.powi(3) / 40e6;
        assert!((v["shardlab_gflops"].as_f64().unwrap() - gflops).abs() < 1e-9);
        assert!((v["peer_gflops"].as_f64().unwrap() - 5.0 * gflops).abs() < 1e-6);
    }
}
