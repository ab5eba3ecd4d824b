//! Calibrates the `this` device profile on the local adapter with microbenchmarks, each a
//! tiny IR program run through [`GpuExecutor`] exactly as train steps run: launch overhead
//! (a chain of tiny ops at two lengths), memory bandwidth (large copies), vector arithmetic
//! (GELU), random-bit throughput (Threefry) and matmuls at several shapes (fitted to a peak
//! and a half-peak size). The CLI's calibration then fits the launch cost inside a step to eight
//! small whole one-device train steps, since a step's dispatches switch pipelines and bindings
//! as a chain of one kernel does not; their work is priced at the microbenchmarks' rates,
//! unscaled. The sizes are a CPU adapter's; on a fast GPU each program is first grown
//! until its work outweighs its launches. Every program is timed in interleaved rounds
//! (medians) and the launch fit leaves out steps a burst of load slowed, so one burst moves the
//! profile little.
use super::collective::CollectiveKind;
use super::cost::attention_flops;
use super::device::{DeviceProfile, MatmulFit, Topology};
use super::fit::{
    calibration_spread, fit_launch, fit_matmul, fit_nonnegative, growth_to_work_bound, relative_spread, StepRow,
};
use super::price::{price_ops, sim_collective_bytes};
use super::work::Placement;
use super::work::THREEFRY_INT_OPS;
use crate::exec::{ExecError, GpuExecutor, Tensor};
use crate::gpu::{now_ms, GpuContext};
use crate::ir::size_in_bytes;
use crate::ir::{Builder, DType, Op, Program, RngLayout, Role};
use crate::kernels::matmul::Variant;
use crate::kernels::Tuning;
use crate::model::{DataSource, GptConfig, Init, Optimizer};
use crate::plan::{Parallel, TrainerOptions};
use crate::sharding::Mesh;

/// One microbenchmark's result, reported with the profile.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Measurement {
    pub name: String,
    /// Median milliseconds of one run of the program.
    pub ms: f64,
    /// The derived rate (FLOP/s, bytes/s, ops/s) or seconds (launch), as `name` says.
    pub value: f64,
    /// How far its program's timed rounds spread (the interquartile range of its rounds over
    /// their median); 0 for derived figures.
    #[serde(default)]
    pub spread: f64,
}

/// A calibration whose programs spread more than this between rounds was made on a busy
/// machine: on lavapipe, rounds of a quiet machine agree within a few percent.
pub const NOISY_SPREAD: f64 = 0.10;

/// A calibrated profile with the measurements behind it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Calibration {
    pub adapter: String,
    pub profile: DeviceProfile,
    pub measurements: Vec<Measurement>,
    /// Wall time of the whole calibration, seconds.
    pub seconds: f64,
    /// The part of `seconds` spent building the programs' pipelines, tuning their matmul
    /// classes and warming them up: once per process (per page), shared with training.
    #[serde(default)]
    pub prepare_seconds: f64,
    /// How far the programs' timed rounds spread (the 75th percentile of its programs'
    /// spreads): above [`NOISY_SPREAD`] the machine was busy and the figures are not to be trusted or kept.
    #[serde(default)]
    pub spread: f64,
    /// When it was made (seconds since the Unix epoch), where the caller knows the time.
    #[serde(default)]
    pub made_unix_s: Option<u64>,
}

impl Calibration {
    /// Whether the machine was busy while it was made.
    pub fn noisy(&self) -> bool {
        self.spread > NOISY_SPREAD
    }
}

/// Matmul shapes (m, k, n) timed: the small, square and skinny products of per-device steps.
const DOT_SHAPES: [(usize, usize, usize); 5] = [
    (32, 32, 32),
    (64, 64, 64),
    (128, 128, 128),
    (256, 256, 256),
    (512, 64, 256),
];

/// Batched matmul shapes (batch, m, k, n): products the executor runs as one batched kernel
/// (attention's dots; every dot of a mesh simulated here, batched over its devices), which the
/// autotuner tunes as classes of their own and so may run on other kernels than single ones.
/// The first two are attention's shapes at the sweep's sizes (many heads and devices of small
/// products), where lavapipe runs far below the large batched products' rate.
const BATCHED_SHAPES: [(usize, usize, usize, usize); 8] = [
    (64, 32, 16, 32),
    (64, 32, 32, 16),
    (8, 32, 16, 32),
    (8, 64, 64, 64),
    (4, 128, 64, 128),
    (2, 256, 64, 256),
    // Simulated devices' weight matmuls, one product per device: the seed preset's q/k/v
    // projection on 8 devices, and a larger one, so the fit's rate is measured where those
    // steps run rather than extrapolated from small products.
    (8, 256, 128, 384),
    (4, 512, 128, 512),
];

/// The page's matmul shapes: each family's within one of the autotuner's shape classes
/// (medium, aligned), so its first calibration tunes two classes rather than four.
const QUICK_DOT_SHAPES: [(usize, usize, usize); 3] = [(64, 64, 64), (128, 128, 128), (512, 64, 256)];
const QUICK_BATCHED_SHAPES: [(usize, usize, usize, usize); 3] = [(64, 32, 16, 32), (8, 64, 64, 64), (2, 256, 64, 256)];

/// The fused attention timed, forward and backward: (batch, heads, T, Dh), from the sweep's
/// smallest to past the seed preset's per-device size.
const ATTENTION_SHAPES: [(usize, usize, usize, usize); 5] = [
    (8, 2, 16, 16),
    (16, 4, 32, 16),
    (4, 4, 64, 32),
    (32, 4, 64, 32),
    (8, 8, 128, 32),
];
/// The page's: the three smallest, within its few seconds on SwiftShader.
const QUICK_ATTENTION_SHAPES: [(usize, usize, usize, usize); 3] = [(8, 2, 16, 16), (16, 4, 32, 16), (4, 4, 64, 32)];

/// How long the microbenchmarks run: the CLI's full calibration (under 20 s on lavapipe) or the
/// page's quick one (under 5 s on SwiftShader): fewer timed runs, smaller arrays, fewer FLOPs
/// per matmul program, fewer matmul shape classes to tune.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Timed runs per program (after one warm-up); the median is taken.
    pub runs: usize,
    /// Array sizes are divided by 2^shrink.
    pub shrink: u32,
    /// FLOPs of work each matmul program aims at.
    pub matmul_flops: f64,
    /// The matmul shapes (m, k, n) timed, at least the two points their fit needs.
    pub single: &'static [(usize, usize, usize)],
    /// The batched matmul shapes (batch, m, k, n) timed, at least the three points their fit
    /// needs.
    pub batched: &'static [(usize, usize, usize, usize)],
    /// The fused attention shapes (batch, heads, T, Dh) timed, forward and backward: at least
    /// the two points their fit needs.
    pub attention: &'static [(usize, usize, usize, usize)],
    /// Whether to time the matmuls with one variant on CPU adapters (the one their autotuner
    /// picks for most classes there) instead of tuning the calibration's classes: tuning
    /// compiles every variant, most of a first calibration on SwiftShader. Training still tunes
    /// its own classes.
    pub heuristic_matmul: bool,
    /// Whether to time the simulated collectives (the rate of collectives between simulated
    /// devices of this adapter, which only the simulated placement prices): the CLI's
    /// calibration does (`bench model`); the page's predictions are for real devices.
    pub sim_collectives: bool,
    /// Whether to fit the launch cost inside a step to eight whole reference train steps (a
    /// second or two on lavapipe with their pipelines to build): the CLI's calibration does; the
    /// page's keeps within its few seconds without.
    pub fit_steps: bool,
}

impl Budget {
    pub const FULL: Budget = Budget {
        runs: 5,
        shrink: 0,
        matmul_flops: 32e6,
        single: &DOT_SHAPES,
        batched: &BATCHED_SHAPES,
        attention: &ATTENTION_SHAPES,
        heuristic_matmul: false,
        sim_collectives: true,
        fit_steps: true,
    };
    pub const QUICK: Budget = Budget {
        runs: 3,
        shrink: 3,
        matmul_flops: 4e6,
        single: &QUICK_DOT_SHAPES,
        batched: &QUICK_BATCHED_SHAPES,
        attention: &QUICK_ATTENTION_SHAPES,
        heuristic_matmul: true,
        sim_collectives: false,
        fit_steps: false,
    };
}

/// A simulated mesh's collectives, chained: per repetition an all-reduce, an all-gather (n to
/// `devices` x n) and a reduce-scatter back to n, over one axis of `devices`, on blocks of n.
fn collectives(devices: usize, n: usize, reps: usize) -> Result<Program, ExecError> {
    let mesh = Mesh::parse(&format!("dp={devices}")).map_err(|e| ExecError::Input(e.to_string()))?;
    let mut b = Builder::with_mesh(mesh);
    let mut x = b.input("x", &[n], DType::F32, Role::Other);
    for _ in 0..reps {
        x = b.psum(x, &["dp"]);
        x = b.all_gather(x, &["dp"], 0, true);
        x = b.psum_scatter(x, &["dp"], 0, true);
    }
    b.output(x);
    Ok(b.finish()?)
}

fn chain(
    len: usize,
    n: usize,
    op: impl Fn(&mut Builder, crate::ir::ValueId) -> crate::ir::ValueId,
) -> Result<Program, ExecError> {
    let mut b = Builder::new();
    let mut x = b.input("x", &[n], DType::F32, Role::Other);
    for _ in 0..len {
        x = op(&mut b, x);
    }
    b.output(x);
    Ok(b.finish()?)
}

/// `reps` matmuls of (batch x) (m x k) @ (k x n); batch 1 is a plain 2-D matmul.
fn dots(batch: usize, m: usize, k: usize, n: usize, reps: usize) -> Result<Program, ExecError> {
    let mut b = Builder::new();
    let lead = |dims: &[usize]| -> Vec<usize> {
        if batch > 1 {
            [&[batch], dims].concat()
        } else {
            dims.to_vec()
        }
    };
    let a = b.input("a", &lead(&[m, k]), DType::F32, Role::Other);
    let w = b.input("w", &lead(&[k, n]), DType::F32, Role::Other);
    let mut y = a;
    for _ in 0..reps {
        y = if batch > 1 {
            b.dot_general(a, w, (&[2], &[1]), (&[0], &[0]), 1.0)
        } else {
            b.matmul(a, w)
        };
    }
    b.output(y);
    Ok(b.finish()?)
}

/// Fused causal attention over q, k, v of (batch, heads, T, Dh), forward and backward (the
/// gradients of a weighted sum of its output), as a train step runs it.
fn attention(batch: usize, heads: usize, t: usize, dh: usize) -> Result<Program, ExecError> {
    let mut b = Builder::new();
    let shape = [batch, heads, t, dh];
    let qkv = ["q", "k", "v"].map(|name| b.input(name, &shape, DType::F32, Role::Other));
    let y = b.attention(qkv, 1.0 / (dh as f32).sqrt(), None);
    let w = b.input("w", &shape, DType::F32, Role::Other);
    let yw = b.mul(y, w);
    let loss = b.sum(yw, &[0, 1, 2, 3]);
    let grads = crate::autodiff::grad(&mut b, loss, &qkv).map_err(|e| ExecError::Input(e.to_string()))?;
    for g in grads {
        b.output(g);
    }
    Ok(b.finish()?)
}

fn bits(n: usize, reps: usize) -> Result<Program, ExecError> {
    let mut b = Builder::new();
    let key = b.input("key", &[2], DType::U32, Role::Other);
    let mut y = key;
    for _ in 0..reps {
        y = b.random_bits(key, &[n], RngLayout::Partitionable);
    }
    b.output(y);
    Ok(b.finish()?)
}

/// A timed matmul program: (batch, m, k, n, matmuls in the program).
type TimedDot = (usize, usize, usize, usize, usize);

/// A matmul program of `budget`: as many matmuls as its FLOPs aim at, 2 to 16.
fn timed_dot(budget: Budget, batch: usize, m: usize, k: usize, n: usize) -> TimedDot {
    let flops = (2 * batch * m * k * n) as f64;
    (batch, m, k, n, ((budget.matmul_flops / flops) as usize).clamp(2, 16))
}

/// A matmul whose work is less than 1/this of its fixed costs is below the timer's reach: its
/// rate is not fitted.
const RESOLVED_SHARE_INV: f64 = 4.0;

/// The name suffix of a measurement no fit takes.
const LEFT_OUT: &str = " (left out: below the launch cost)";

/// Seconds per FLOP, per product and per dispatch fitted to `rows` ([FLOPs, products,
/// dispatches], seconds) as a rate and two costs; where no positive rate fits (noise), the
/// best rate measured.
fn fit_batched(rows: &[([f64; 3], f64)]) -> MatmulFit {
    let [per_flop, per_product_s, fixed_s] = fit_nonnegative(rows);
    MatmulFit {
        flops: if per_flop > 0.0 {
            1.0 / per_flop
        } else {
            rows.iter().map(|(x, s)| x[0] / s).fold(0.0, f64::max)
        },
        half_flops: 0.0,
        per_product_s,
        fixed_s,
    }
}

/// Runs of each program (median) when probing whether it is work-bound.
const PROBE_RUNS: usize = 3;

/// Times a program may grow: with up to 256x per probe, enough for arrays of kilobytes on a
/// CPU adapter to reach hundreds of megabytes.
const MAX_GROWTHS: usize = 4;

/// The largest array a grown program holds (within the adapter's binding limit): 60-odd
/// microseconds of copy on an H200, and a few of them fit any GPU.
const MAX_GROWN_BYTES: u64 = 256 << 20;

/// The launch cost and the fixed submit-and-wait cost, from the two chains' milliseconds.
fn launch_costs(z: &Sizes, t_short: f64, t_long: f64) -> (f64, f64) {
    let launch_s = ((t_long - t_short) / (z.long - z.short) as f64 * 1e-3).max(1e-7);
    let step_s = (t_short * 1e-3 - z.short as f64 * launch_s).max(0.0);
    (launch_s, step_s)
}

/// Pins the context's matmul variant (when given) while it lives, then puts back the pin it
/// found: the executors it lowers keep their kernels, later ones are tuned as before.
struct PinMatmul<'a> {
    ctx: &'a GpuContext,
    before: Option<Option<Variant>>,
}

impl<'a> PinMatmul<'a> {
    fn new(ctx: &'a GpuContext, pin: Option<Variant>) -> Self {
        let before = pin.and_then(|v| {
            Tuning::with(ctx, |t| {
                let before = t.matmul_pin;
                t.matmul_pin = before.or(Some(v));
                before
            })
        });
        PinMatmul { ctx, before }
    }
}

impl Drop for PinMatmul<'_> {
    fn drop(&mut self) {
        if let Some(before) = self.before {
            Tuning::with(self.ctx, |t| t.matmul_pin = before);
        }
    }
}

/// An executor of `prog` with its inputs written and one warm-up run done: what building its
/// pipelines and tuning its matmul classes costs is paid here, not in its timed runs.
async fn prepare(ctx: &GpuContext, prog: Program) -> Result<GpuExecutor, ExecError> {
    let exec = GpuExecutor::new(ctx, prog.clone()).await?;
    for (pos, (v, _)) in prog.inputs.iter().enumerate() {
        let info = prog.info(*v);
        // All simulated devices' blocks (one block without a mesh).
        let n = prog.devices() * info.numel();
        let t = match info.dtype {
            DType::F32 => Tensor::F32((0..n).map(|i| (i % 7) as f32 * 0.01).collect()),
            // Small ids: token inputs must stay below the vocabulary.
            DType::U32 => Tensor::U32((0..n as u32).map(|i| i % 7).collect()),
        };
        exec.write_input(ctx, pos, &t)?;
    }
    // A train step's optimizer reads its update number (bias correction): the first.
    exec.set_step(ctx, 1)?;
    exec.submit(ctx);
    ctx.finish().await?;
    Ok(exec)
}

/// Each program's milliseconds over `runs` rounds; each round runs every program once, in
/// turn, each submitted and awaited alone as a train step is. Interleaved, a burst of load slows
/// one round of all of them rather than every run of one, and the median leaves that round out.
async fn time_rounds(
    ctx: &GpuContext,
    programs: &CalibrationPrograms,
    runs: usize,
) -> Result<Vec<Vec<f64>>, ExecError> {
    let mut times = vec![Vec::with_capacity(runs); programs.len()];
    for _ in 0..runs.max(1) {
        for (i, t) in times.iter_mut().enumerate() {
            t.push(programs.run(ctx, i).await?);
        }
    }
    Ok(times)
}

/// Whole one-device train steps the launch fit is made on (one and two layers at each size),
/// smaller than `bench model`'s larger sweep size and all unlike its configurations (which judge
/// the model). On a fast GPU they are launch-bound; on a CPU adapter what their many small
/// ops cost beyond a chained launch goes into the launch cost, a per-dispatch cost that larger
/// steps hardly feel. A work scale fitted to steps as large as the sweep's took up how the small
/// steps' ops were mispriced and overpriced the seed preset's size by 32-89% on lavapipe.
fn reference_steps() -> Vec<GptConfig> {
    let config = |layers, d_model, seq, batch| GptConfig {
        layers,
        d_model,
        heads: 2,
        seq,
        batch,
        vocab: 48,
        tied: false,
        dropout: 0.1,
        attention: Default::default(),
        remat: Default::default(),
        precision: Default::default(),
        moe: None,
    };
    [(32, 8, 2), (32, 16, 4), (64, 8, 4), (64, 16, 8)]
        .into_iter()
        .flat_map(|(d, seq, batch)| [1, 2].map(|layers| config(layers, d, seq, batch)))
        .collect()
}

/// The one-device train-step program of `config`, as the reference steps run it.
fn reference_program(config: &GptConfig) -> Result<Program, ExecError> {
    let options = TrainerOptions {
        config: config.clone(),
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
    Ok(crate::plan::build(&options)
        .map_err(|e| ExecError::Input(e.to_string()))?
        .step
        .program)
}

/// A reference step: its configuration, program, median milliseconds and rounds' spread.
type TimedStep = (GptConfig, Program, f64, f64);

/// Fits the profile's launch cost to whole train steps (`steps`): seconds = the model's work +
/// launches x launch_s + step_s, robustly ([`fit_launch`]: steps a burst of load slowed are left
/// out), never below the chain's launch cost.
fn fit_to_steps(profile: &mut DeviceProfile, steps: &[TimedStep], out: &mut Vec<Measurement>) {
    let rows: Vec<StepRow> = steps
        .iter()
        .map(|(_, prog, ms, _)| {
            let ops = price_ops(prog, profile, Placement::Simulated);
            let work: f64 = ops.iter().map(|o| o.work_s).sum();
            let launches: f64 = ops.iter().map(|o| o.launches as f64).sum();
            (work, launches, ms * 1e-3 - profile.step_s)
        })
        .collect();
    let fit = fit_launch(&rows, profile.launch_s);
    for ((config, _, ms, spread), outlier) in steps.iter().zip(&fit.outlier) {
        let left_out = if *outlier { " (left out: outlier)" } else { "" };
        out.push(Measurement {
            name: format!(
                "reference step {}x{} T{} B{}{left_out}",
                config.layers, config.d_model, config.seq, config.batch
            ),
            ms: *ms,
            value: ms * 1e-3,
            spread: *spread,
        });
    }
    let name = if fit.launch_s > profile.launch_s {
        "launch_s (inside a step: fitted to the reference steps)"
    } else {
        "launch_s (inside a step: the chain's; the reference steps ask no more)"
    };
    profile.launch_s = fit.launch_s;
    out.push(Measurement {
        name: name.into(),
        ms: 0.0,
        value: profile.launch_s,
        spread: 0.0,
    });
}

/// What one calibration program measures. Each program is listed with its key and its time
/// read back by the key, so a program and the code that reads its time cannot fall out of
/// step (as they could when both followed the order of a list).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Bench {
    /// The chains of tiny ops, short and long: launch and per-step overhead.
    LaunchShort,
    LaunchLong,
    Bandwidth,
    Vector,
    RandomBits,
    SimCollectives,
    /// Matmul `index` of the single (`batched: false`) or batched family.
    Dot {
        batched: bool,
        index: usize,
    },
    /// Fused attention shape `index` of the budget's.
    Attention(usize),
    /// Reference train step `index` of [`reference_steps`].
    Step(usize),
}

/// Runs every microbenchmark on `ctx` and returns the `this` profile (the CLI's calibration).
pub async fn calibrate(ctx: &GpuContext) -> Result<Calibration, ExecError> {
    calibrate_with(ctx, Budget::FULL).await
}

/// The page's calibration: the same microbenchmarks on a smaller budget.
pub async fn calibrate_quick(ctx: &GpuContext) -> Result<Calibration, ExecError> {
    calibrate_with(ctx, Budget::QUICK).await
}

/// Runs every microbenchmark on `ctx` within `budget` and returns the `this` profile. Every
/// program is built and warmed up first, then all are timed in interleaved rounds
/// (`time_rounds`).
pub async fn calibrate_with(ctx: &GpuContext, budget: Budget) -> Result<Calibration, ExecError> {
    let programs = CalibrationPrograms::prepare(ctx, budget).await?;
    let runs = time_rounds(ctx, &programs, budget.runs).await?;
    Ok(programs.fit(ctx, &runs))
}

/// The sizes of the microbenchmarks within a budget.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    /// Launch overhead and the fixed submit-and-wait cost: chains of tiny ops, short and long.
    short: usize,
    long: usize,
    /// Bandwidth: a chain of scales over 2 MiB arrays, each reading and writing it once.
    bw_n: usize,
    bw_reps: usize,
    /// Vector arithmetic: GELU (8 FLOPs per element in the cost model's count).
    gelu_n: usize,
    gelu_reps: usize,
    /// Random bits: one Threefry hash per word.
    bits_n: usize,
    bits_reps: usize,
    /// Simulated collectives: copy-and-add kernels between the device blocks of one adapter's
    /// memory, strided per device, priced by the bytes `sim_collective_bytes` counts for them.
    coll_devices: usize,
    coll_n: usize,
    coll_reps: usize,
}

impl Sizes {
    fn of(budget: Budget) -> Self {
        let sized = |n: usize| (n >> budget.shrink).max(64);
        Sizes {
            short: 4,
            long: 132,
            bw_n: sized(1 << 19),
            bw_reps: 6,
            gelu_n: sized(1 << 18),
            gelu_reps: 6,
            bits_n: sized(1 << 18),
            bits_reps: 4,
            coll_devices: 4,
            coll_n: sized(1 << 15),
            coll_reps: 2,
        }
    }

    /// Grows `bench`'s array `growth` times, or as far as its largest buffer stays within
    /// `cap` bytes: whether it grew.
    fn grow(&mut self, bench: Bench, growth: usize, cap: u64) -> bool {
        // The array and how many of it its largest buffer holds (the all-gather's devices).
        let (n, copies) = match bench {
            Bench::Bandwidth => (&mut self.bw_n, 1),
            Bench::Vector => (&mut self.gelu_n, 1),
            Bench::RandomBits => (&mut self.bits_n, 1),
            Bench::SimCollectives => (&mut self.coll_n, self.coll_devices * self.coll_devices),
            _ => return false,
        };
        let fits = |len: usize| (len * copies * 4) as u64 <= cap;
        let mut grown = *n;
        for _ in 0..growth.trailing_zeros() {
            if !fits(2 * grown) {
                break;
            }
            grown *= 2;
        }
        let changed = grown != *n;
        *n = grown;
        changed
    }
}

/// The calibration's programs, built, their inputs written and warmed up: timed in rounds by
/// [`calibrate_with`], or in the same rounds as other work (`bench model` times them beside the
/// configurations it checks, so both see the same load), then read by
/// [`CalibrationPrograms::fit`].
pub struct CalibrationPrograms {
    budget: Budget,
    sizes: Sizes,
    /// Matmuls at several shapes, single and batched: each family fitted on its own.
    families: Vec<(bool, Vec<TimedDot>)>,
    references: Vec<GptConfig>,
    programs: Vec<(Bench, Program)>,
    execs: Vec<GpuExecutor>,
    start: f64,
    prepare_seconds: f64,
}

impl CalibrationPrograms {
    /// Builds every program of `budget` on `ctx`, runs each once, and grows the ones whose
    /// work does not outweigh their fixed costs on this adapter (`grow_to_work_bound`).
    pub async fn prepare(ctx: &GpuContext, budget: Budget) -> Result<Self, ExecError> {
        let start = now_ms();
        let sizes = Sizes::of(budget);
        let single: Vec<_> = budget.single.iter().map(|&(m, k, n)| (1, m, k, n)).collect();
        let families: Vec<(bool, Vec<TimedDot>)> = [(false, &single[..]), (true, budget.batched)]
            .into_iter()
            .map(|(batched, family)| {
                let shapes = family
                    .iter()
                    .map(|&(batch, m, k, n)| timed_dot(budget, batch, m, k, n))
                    .collect();
                (batched, shapes)
            })
            .collect();
        let references: Vec<GptConfig> = if budget.fit_steps { reference_steps() } else { vec![] };
        let mut benches = vec![
            Bench::LaunchShort,
            Bench::LaunchLong,
            Bench::Bandwidth,
            Bench::Vector,
            Bench::RandomBits,
        ];
        if budget.sim_collectives {
            benches.push(Bench::SimCollectives);
        }
        for (batched, shapes) in &families {
            benches.extend((0..shapes.len()).map(|index| Bench::Dot {
                batched: *batched,
                index,
            }));
        }
        benches.extend((0..budget.attention.len()).map(Bench::Attention));
        benches.extend((0..references.len()).map(Bench::Step));
        let mut p = CalibrationPrograms {
            budget,
            sizes,
            families,
            references,
            programs: vec![],
            execs: vec![],
            start,
            prepare_seconds: 0.0,
        };
        let pin = (budget.heuristic_matmul && ctx.summary.is_cpu()).then_some(Variant::Tex16);
        let _pinned = PinMatmul::new(ctx, pin);
        for bench in benches {
            p.add(ctx, bench).await?;
        }
        p.grow_to_work_bound(ctx).await?;
        p.prepare_seconds = (now_ms() - start) * 1e-3;
        Ok(p)
    }

    /// `bench`'s program at the present sizes.
    fn program(&self, bench: Bench) -> Result<Program, ExecError> {
        let z = &self.sizes;
        match bench {
            Bench::LaunchShort => chain(z.short, 64, |b, x| b.scale(x, 1.0)),
            Bench::LaunchLong => chain(z.long, 64, |b, x| b.scale(x, 1.0)),
            Bench::Bandwidth => chain(z.bw_reps, z.bw_n, |b, x| b.scale(x, 1.0)),
            Bench::Vector => chain(z.gelu_reps, z.gelu_n, |b, x| b.gelu(x)),
            Bench::RandomBits => bits(z.bits_n, z.bits_reps),
            Bench::SimCollectives => collectives(z.coll_devices, z.coll_n, z.coll_reps),
            Bench::Dot { batched, index } => {
                let (batch, m, k, n, reps) = self.family(batched)[index];
                dots(batch, m, k, n, reps)
            }
            Bench::Attention(index) => {
                let (batch, heads, t, dh) = self.budget.attention[index];
                attention(batch, heads, t, dh)
            }
            Bench::Step(index) => reference_program(&self.references[index]),
        }
    }

    fn family(&self, batched: bool) -> &[TimedDot] {
        self.families.iter().find(|f| f.0 == batched).map_or(&[], |f| &f.1[..])
    }

    /// Builds `bench`'s program and prepares it (in place of the one it had, if any).
    async fn add(&mut self, ctx: &GpuContext, bench: Bench) -> Result<(), ExecError> {
        let prog = self.program(bench)?;
        let exec = prepare(ctx, prog.clone()).await?;
        match self.programs.iter().position(|(b, _)| *b == bench) {
            Some(i) => {
                self.programs[i].1 = prog;
                self.execs[i] = exec;
            }
            None => {
                self.programs.push((bench, prog));
                self.execs.push(exec);
            }
        }
        Ok(())
    }

    /// Median milliseconds of [`PROBE_RUNS`] runs of `bench`'s program.
    async fn probe(&self, ctx: &GpuContext, bench: Bench) -> Result<f64, ExecError> {
        let i = self
            .programs
            .iter()
            .position(|(b, _)| *b == bench)
            .expect("probed benches are built");
        let mut t = Vec::with_capacity(PROBE_RUNS);
        for _ in 0..PROBE_RUNS {
            t.push(self.run(ctx, i).await?);
        }
        Ok(crate::gpu::median(t))
    }

    /// Makes every rate's program work-bound on this adapter ([`WORK_BOUND`]): the launch cost
    /// is probed first, then each array program grows by the power of two its probe asks for
    /// ([`growth_to_work_bound`]), and each matmul family gains larger shapes (each dimension
    /// doubled) until its largest is work-bound, within [`MAX_GROWN_BYTES`]. On CPU adapters
    /// the first sizes already are; on a fast GPU they take less than a launch.
    async fn grow_to_work_bound(&mut self, ctx: &GpuContext) -> Result<(), ExecError> {
        let (t_short, t_long) = (
            self.probe(ctx, Bench::LaunchShort).await?,
            self.probe(ctx, Bench::LaunchLong).await?,
        );
        let (launch_s, step_s) = launch_costs(&self.sizes, t_short, t_long);
        let fixed = |launches: usize| step_s + launches as f64 * launch_s;
        let cap = MAX_GROWN_BYTES.min(ctx.summary.max_storage_buffer_binding_size);
        let arrays = [
            Bench::Bandwidth,
            Bench::Vector,
            Bench::RandomBits,
            Bench::SimCollectives,
        ];
        let arrays: Vec<Bench> = arrays
            .into_iter()
            .filter(|b| self.programs.iter().any(|(p, _)| p == b))
            .collect();
        for bench in arrays {
            for _ in 0..MAX_GROWTHS {
                let fixed_s = fixed(self.launches(bench));
                let work_s = self.probe(ctx, bench).await? * 1e-3 - fixed_s;
                let growth = growth_to_work_bound(work_s, fixed_s);
                if growth == 1 || !self.sizes.grow(bench, growth, cap) {
                    break;
                }
                self.add(ctx, bench).await?;
            }
        }
        for batched in [false, true] {
            for _ in 0..MAX_GROWTHS {
                let family = self.family(batched);
                let Some((index, &(batch, m, k, n, _))) = family
                    .iter()
                    .enumerate()
                    .max_by_key(|(_, &(batch, m, k, n, _))| batch * m * k * n)
                else {
                    break;
                };
                let bench = Bench::Dot { batched, index };
                let fixed_s = fixed(self.launches(bench));
                let work_s = self.probe(ctx, bench).await? * 1e-3 - fixed_s;
                let bytes = 4 * batch * (4 * m * k + 4 * k * n + 4 * m * n);
                if growth_to_work_bound(work_s, fixed_s) == 1 || bytes as u64 > cap {
                    break;
                }
                let grown = timed_dot(self.budget, batch, 2 * m, 2 * k, 2 * n);
                let family = self
                    .families
                    .iter_mut()
                    .find(|f| f.0 == batched)
                    .expect("both families");
                family.1.push(grown);
                let bench = Bench::Dot {
                    batched,
                    index: family.1.len() - 1,
                };
                self.add(ctx, bench).await?;
            }
        }
        Ok(())
    }

    /// The launches of `bench`'s program that its rate is read net of.
    fn launches(&self, bench: Bench) -> usize {
        let z = &self.sizes;
        match bench {
            Bench::LaunchShort => z.short,
            Bench::LaunchLong => z.long,
            Bench::Bandwidth => z.bw_reps,
            Bench::Vector => z.gelu_reps,
            Bench::RandomBits => z.bits_reps,
            Bench::SimCollectives => 3 * z.coll_reps,
            Bench::Dot { batched, index } => self.family(batched)[index].4,
            // As the executor lowers it: the cost model prices its launches the same way.
            Bench::Attention(_) => self.programs.iter().find(|(b, _)| *b == bench).map_or(0, |(_, prog)| {
                crate::exec::lowered(prog).iter().map(|l| l.dispatches).sum()
            }),
            // Steps are fitted with their own launch counts (`fit_to_steps`).
            Bench::Step(_) => 0,
        }
    }

    /// How many programs a round runs.
    pub fn len(&self) -> usize {
        self.execs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.execs.is_empty()
    }

    /// Runs program `i` once, submitted and awaited alone as a train step is: its milliseconds.
    pub async fn run(&self, ctx: &GpuContext, i: usize) -> Result<f64, ExecError> {
        let t0 = now_ms();
        self.execs[i].submit(ctx);
        ctx.finish().await?;
        Ok(now_ms() - t0)
    }

    /// The `this` profile from every program's timed runs (`runs[i]`: program `i`'s
    /// milliseconds, one per round): each program's median, and the spread of its rounds.
    pub fn fit(self, ctx: &GpuContext, runs: &[Vec<f64>]) -> Calibration {
        let timed: Vec<(f64, f64)> = runs
            .iter()
            .map(|t| (crate::gpu::median(t.clone()), relative_spread(t)))
            .collect();
        derive(ctx, &self, &timed)
    }
}

/// The profile from each program's (median milliseconds, spread), in `p`'s program order.
fn derive(ctx: &GpuContext, p: &CalibrationPrograms, timed: &[(f64, f64)]) -> Calibration {
    let (budget, families, references, programs) = (p.budget, &p.families, &p.references, &p.programs);
    let (start, prepare_seconds) = (p.start, p.prepare_seconds);
    let Sizes {
        bw_n,
        gelu_n,
        bits_n,
        coll_devices,
        coll_n,
        ..
    } = p.sizes;
    let spread = calibration_spread(&timed.iter().map(|t| t.1).collect::<Vec<_>>());
    let times: std::collections::HashMap<Bench, (f64, f64)> =
        programs.iter().map(|(b, _)| *b).zip(timed.iter().copied()).collect();
    // Every program read below was listed above and timed with it.
    let timing = |b: Bench| times.get(&b).copied().unwrap_or((0.0, 0.0));
    let time = |b: Bench| timing(b).0;

    let mut out = vec![];
    let mut record = |name: &str, b: Option<Bench>, value: f64| {
        let (ms, spread) = b.map_or((0.0, 0.0), timing);
        out.push(Measurement {
            name: name.into(),
            ms,
            value,
            spread,
        })
    };
    let (launch_s, step_s) = launch_costs(&p.sizes, time(Bench::LaunchShort), time(Bench::LaunchLong));
    // The array each rate was read off: grown on fast adapters (`grow_to_work_bound`).
    let bytes = |n: usize| crate::plan::human_bytes(4 * n as u64);
    record("launch_s", Some(Bench::LaunchLong), launch_s);
    record("step_s", Some(Bench::LaunchShort), step_s);
    let overhead = |bench: Bench| step_s + p.launches(bench) as f64 * launch_s;

    let t = time(Bench::Bandwidth);
    let mem_bandwidth = (p.sizes.bw_reps * 8 * bw_n) as f64 / (t * 1e-3 - overhead(Bench::Bandwidth)).max(1e-6);
    record(
        &format!("mem_bandwidth ({} per array)", bytes(bw_n)),
        Some(Bench::Bandwidth),
        mem_bandwidth,
    );

    let t = time(Bench::Vector);
    let vector_flops = (8 * gelu_n * p.sizes.gelu_reps) as f64 / (t * 1e-3 - overhead(Bench::Vector)).max(1e-6);
    record(
        &format!("vector_flops ({} per array)", bytes(gelu_n)),
        Some(Bench::Vector),
        vector_flops,
    );

    let t = time(Bench::RandomBits);
    let int_ops =
        (bits_n * p.sizes.bits_reps) as f64 * THREEFRY_INT_OPS / (t * 1e-3 - overhead(Bench::RandomBits)).max(1e-6);
    record(
        &format!("int_ops ({} per array)", bytes(bits_n)),
        Some(Bench::RandomBits),
        int_ops,
    );

    let sim_collective_bandwidth = if budget.sim_collectives {
        let t = time(Bench::SimCollectives);
        let block = size_in_bytes(&[coll_n]);
        let moved = p.sizes.coll_reps as f64
            * [
                (CollectiveKind::AllReduce, block),
                (CollectiveKind::AllGather, block * coll_devices as u64),
                (CollectiveKind::ReduceScatter, block * coll_devices as u64),
            ]
            .iter()
            .map(|&(kind, bytes)| sim_collective_bytes(kind, bytes, coll_devices, coll_devices))
            .sum::<f64>();
        let bandwidth = moved / (t * 1e-3 - overhead(Bench::SimCollectives)).max(1e-6);
        record(
            &format!("sim_collective_bandwidth ({} per device)", bytes(coll_n)),
            Some(Bench::SimCollectives),
            bandwidth,
        );
        Some(bandwidth)
    } else {
        None
    };

    // A program's time less its fixed costs, and whether the timer tells that work from them:
    // one the timer cannot says only that it costs no more, and no fit takes it.
    let net = |bench: Bench| {
        let fixed = overhead(bench);
        let work = time(bench) * 1e-3 - fixed;
        (work, work >= fixed / RESOLVED_SHARE_INV)
    };
    let left_out = |resolved: bool| if resolved { "" } else { LEFT_OUT };
    let mut fits = vec![];
    for (batched, shapes) in families {
        // (FLOPs, products, seconds per matmul, resolved).
        let mut timed_points = vec![];
        for (index, &(batch, m, k, n, reps)) in shapes.iter().enumerate() {
            let bench = Bench::Dot {
                batched: *batched,
                index,
            };
            let flops = (2 * batch * m * k * n) as f64;
            let (work, resolved) = net(bench);
            let secs = (work / reps as f64).max(1e-9);
            let shape = if batch > 1 {
                format!("{batch}x{m}x{k}x{n}")
            } else {
                format!("{m}x{k}x{n}")
            };
            record(
                &format!("matmul_{shape}{}", left_out(resolved)),
                Some(bench),
                flops / secs,
            );
            timed_points.push((flops, batch, secs, resolved));
        }
        // The fits take the resolved matmuls where there are enough of them (2 single, 3
        // batched).
        let needed = if *batched { 3 } else { 2 };
        let resolved = timed_points.iter().filter(|p| p.3).count() >= needed;
        let kept: Vec<_> = timed_points.iter().filter(|p| p.3 || !resolved).collect();
        fits.push(if *batched {
            // Many small products (attention's heads times the simulated devices) run far
            // below the rate of a few large ones.
            fit_batched(&kept.iter().map(|p| ([p.0, p.1 as f64, 1.0], p.2)).collect::<Vec<_>>())
        } else {
            let (flops, half_flops) = fit_matmul(&kept.iter().map(|p| (p.0, p.2)).collect::<Vec<_>>());
            MatmulFit {
                flops,
                half_flops,
                per_product_s: 0.0,
                fixed_s: 0.0,
            }
        });
    }
    let (single, batched) = (fits[0], fits[1]);

    // The fused attention, fitted as the batched matmuls are (many small heads run far below
    // the rate of a few large ones) on the shapes the timer resolves. Each program is one
    // forward and one backward op.
    let mut attention_rows = vec![];
    for (bench, prog) in programs {
        let Bench::Attention(index) = *bench else { continue };
        let flops: u64 = prog
            .instrs
            .iter()
            .filter(|ins| matches!(ins.op, Op::Attention { .. } | Op::AttentionGrad { .. }))
            .map(|ins| {
                let (dots, rest) = attention_flops(prog, ins);
                dots + rest
            })
            .sum();
        let (batch, heads, t, dh) = budget.attention[index];
        let (work, resolved) = net(*bench);
        let secs = work.max(1e-9);
        record(
            &format!("attention_{batch}x{heads}x{t}x{dh}{}", left_out(resolved)),
            Some(*bench),
            flops as f64 / secs,
        );
        if resolved {
            attention_rows.push(([flops as f64, 2.0 * (batch * heads) as f64, 2.0], secs));
        }
    }
    let attention = (attention_rows.len() >= 3).then(|| fit_batched(&attention_rows));

    let adapter = ctx.summary.identity();
    let mut profile = DeviceProfile {
        name: "this".into(),
        label: format!("this GPU: {adapter}"),
        matmul_flops: single.flops,
        // The sandbox's kernels compute in f32: a bf16 plan's dots run at the same rate here.
        matmul_flops_bf16: None,
        // Its peak is fitted to measured matmuls: sustained already.
        matmul_sustained: 1.0,
        matmul_tile: [1, 1, 1],
        matmul_units: 1,
        matmul_half_flops: single.half_flops,
        matmul_batched: Some(batched),
        attention,
        vector_flops,
        int_ops,
        mem_bandwidth,
        sim_collective_bandwidth,
        // Inside a step: fitted to whole steps below.
        launch_s,
        step_s,
        // WebGPU does not report the adapter's memory: the largest buffer it allows, as a
        // floor of what it holds (estimated).
        memory_bytes: ctx.summary.max_buffer_size.max(1 << 30),
        topology: Topology::Ring,
        // Several of this GPU would talk over PCIe 4.0 x16 (~25 GB/s achieved): estimated.
        link_bandwidth: 25e9,
        link_latency: 5e-6,
        scale_out: None,
        estimated: ["memory_bytes", "link_bandwidth", "link_latency"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        source: format!("microbenchmarks on {adapter}"),
    };
    let steps: Vec<TimedStep> = programs
        .iter()
        .filter_map(|(b, prog)| match *b {
            Bench::Step(index) => Some((references[index].clone(), prog.clone(), time(*b), timing(*b).1)),
            _ => None,
        })
        .collect();
    if budget.fit_steps {
        fit_to_steps(&mut profile, &steps, &mut out);
    }
    Calibration {
        adapter,
        profile,
        measurements: out,
        seconds: (now_ms() - start) * 1e-3,
        prepare_seconds,
        spread,
        made_unix_s: None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::exec::plan_instr_dot;
    use crate::kernels::matmul::class_key;

    /// The autotuner's shape classes of the matmuls `budget` times.
    fn classes(budget: Budget) -> BTreeSet<String> {
        let single = budget.single.iter().map(|&(m, k, n)| (1, m, k, n));
        let batched = budget.batched.iter().copied();
        single
            .chain(batched)
            .map(|(batch, m, k, n)| {
                let prog = dots(batch, m, k, n, 2).unwrap();
                let p = plan_instr_dot(&prog, &prog.instrs[0]).expect("a matmul program starts with its dot_general");
                class_key(&p.shape).to_string()
            })
            .collect()
    }

    #[test]
    fn the_pages_calibration_tunes_one_matmul_class_per_family() {
        let quick = classes(Budget::QUICK);
        assert_eq!(quick.len(), 2, "{quick:?}");
        assert!(quick.iter().any(|c| c.ends_with("/single")) && quick.iter().any(|c| c.ends_with("/batched")));
        // The full calibration spans more classes, from small to large products.
        assert!(classes(Budget::FULL).len() > 2);
    }
}
