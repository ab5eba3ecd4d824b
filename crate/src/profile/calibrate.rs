//! Calibrates the `this` device profile on the local adapter with microbenchmarks, each a
//! tiny IR program run through [`GpuExecutor`] exactly as train steps run: launch overhead
//! (a chain of tiny ops at two lengths), memory bandwidth (large copies), vector arithmetic
//! (GELU), random-bit throughput (Threefry) and matmuls at several shapes (fitted to a peak
//! and a half-peak size). The CLI's calibration then fits a work scale and the launch cost to
//! four whole one-device train steps, since ops inside a step run slower than alone.
use super::collective::CollectiveKind;
use super::device::{DeviceProfile, MatmulFit, Topology};
use super::predict::{price_ops, sim_collective_bytes};
use super::work::Placement;
use super::work::THREEFRY_INT_OPS;
use crate::exec::{ExecError, GpuExecutor, Tensor};
use crate::gpu::{now_ms, GpuContext};
use crate::ir::size_in_bytes;
use crate::ir::{Builder, DType, Program, RngLayout, Role};
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
}

/// A calibrated profile with the measurements behind it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Calibration {
    pub adapter: String,
    pub profile: DeviceProfile,
    pub measurements: Vec<Measurement>,
    /// Wall time of the whole calibration, seconds.
    pub seconds: f64,
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
const BATCHED_SHAPES: [(usize, usize, usize, usize); 6] = [
    (64, 32, 16, 32),
    (64, 32, 32, 16),
    (8, 32, 16, 32),
    (8, 64, 64, 64),
    (4, 128, 64, 128),
    (2, 256, 64, 256),
];

/// How long the microbenchmarks run: the CLI's full calibration (under 20 s on lavapipe) or the
/// page's quick one (under 5 s on SwiftShader): fewer timed runs, smaller arrays, fewer FLOPs
/// per matmul program.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Timed runs per program (after one warm-up); the median is taken.
    pub runs: usize,
    /// Array sizes are divided by 2^shrink.
    pub shrink: u32,
    /// FLOPs of work each matmul program aims at.
    pub matmul_flops: f64,
    /// Every how many of the matmul shapes are timed (1: all of them; 2: every other one, still
    /// at least the three points each fit needs).
    pub shape_step: usize,
    /// Whether to fit the work scale and launch cost to four whole reference train steps
    /// (about a second on lavapipe, more with their pipelines to build): the CLI's calibration
    /// does; the page's keeps within its few seconds without.
    pub fit_steps: bool,
}

impl Budget {
    pub const FULL: Budget = Budget {
        runs: 5,
        shrink: 0,
        matmul_flops: 32e6,
        shape_step: 1,
        fit_steps: true,
    };
    pub const QUICK: Budget = Budget {
        runs: 2,
        shrink: 3,
        matmul_flops: 4e6,
        shape_step: 2,
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

/// Median milliseconds of `runs` runs of `prog` (after one warm-up), each submitted and
/// awaited alone, as a train step is.
async fn time_program(ctx: &GpuContext, prog: Program, runs: usize) -> Result<f64, ExecError> {
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
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let t0 = now_ms();
        exec.submit(ctx);
        ctx.finish().await?;
        times.push(now_ms() - t0);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}

/// Whole one-device train steps the fit is made on: from launch-bound to work-bound sizes, all
/// unlike `bench model`'s sweep (which judges the model).
fn reference_steps() -> [GptConfig; 4] {
    let config = |layers, d_model, seq, batch| GptConfig {
        layers,
        d_model,
        heads: 2,
        seq,
        batch,
        vocab: 48,
        tied: false,
        dropout: 0.1,
    };
    [
        config(1, 48, 16, 4),
        config(2, 48, 16, 8),
        config(1, 96, 32, 8),
        config(2, 96, 32, 16),
    ]
}

/// Fits the profile's work scale and launch cost to whole train steps. Inside a step an op runs
/// slower than its microbenchmark alone, and launches cost other than in a chain of tiny ops:
/// seconds = work_scale x (the model's work) + launches x launch_s + step_s, fitted by least
/// squares over the reference steps. Where the solution is not positive (noise), the work scale
/// alone is fitted and the chain's launch cost kept.
async fn fit_to_steps(
    ctx: &GpuContext,
    profile: &mut DeviceProfile,
    runs: usize,
    out: &mut Vec<Measurement>,
) -> Result<(), ExecError> {
    let mut rows = vec![];
    for config in reference_steps() {
        let options = TrainerOptions {
            config,
            optimizer: Optimizer::AdamW { lr: 1e-3 },
            init: Init::Formula,
            data: DataSource::Copy,
            seed: 0,
            rng_layout: RngLayout::Partitionable,
            parallel: Parallel::None,
            combine_all_reduces: false,
        };
        let prog = crate::plan::build(&options)
            .map_err(|e| ExecError::Input(e.to_string()))?
            .step
            .program;
        let ms = time_program(ctx, prog.clone(), runs).await?;
        let ops = price_ops(&prog, profile, Placement::Simulated);
        let work: f64 = ops.iter().map(|o| o.work_s).sum();
        let launches: f64 = ops.iter().map(|o| o.launches as f64).sum();
        out.push(Measurement {
            name: format!("reference step d_model {}", options.config.d_model),
            ms,
            value: ms * 1e-3,
        });
        rows.push((work, launches, ms * 1e-3 - profile.step_s));
    }
    (profile.work_scale, profile.launch_s) = fit_scale_and_launch(&rows, profile.launch_s);
    for (name, value) in [
        ("work_scale", profile.work_scale),
        ("launch_s (fitted to steps)", profile.launch_s),
    ] {
        out.push(Measurement {
            name: name.into(),
            ms: 0.0,
            value,
        });
    }
    Ok(())
}

/// Least squares of seconds = scale x work + launches x launch over (work s, launches, seconds)
/// rows. Where that has no positive solution (noise), fits the scale alone with
/// `launch_fallback`.
fn fit_scale_and_launch(rows: &[(f64, f64, f64)], launch_fallback: f64) -> (f64, f64) {
    let sum = |f: &dyn Fn(&(f64, f64, f64)) -> f64| rows.iter().map(f).sum::<f64>();
    let (ww, wl, ll) = (sum(&|r| r.0 * r.0), sum(&|r| r.0 * r.1), sum(&|r| r.1 * r.1));
    let (wt, lt) = (sum(&|r| r.0 * r.2), sum(&|r| r.1 * r.2));
    let det = ww * ll - wl * wl;
    let (scale, launch) = ((wt * ll - lt * wl) / det, (ww * lt - wl * wt) / det);
    if det != 0.0 && scale > 0.0 && launch > 0.0 && scale.is_finite() && launch.is_finite() {
        return (scale, launch);
    }
    let rest = sum(&|r| r.0 * (r.2 - r.1 * launch_fallback));
    ((rest / ww.max(f64::MIN_POSITIVE)).max(0.1), launch_fallback)
}

/// Least squares of seconds = flops / peak + fixed (the fixed start-up cost of a matmul
/// kernel beyond its launch), from (flops, seconds) pairs. Returns the peak and the size at
/// which a matmul reaches half of it (fixed x peak), the profile's form.
fn fit_matmul(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let fixed = my - slope * mx;
    let best = points.iter().map(|&(f, s)| f / s).fold(0.0, f64::max);
    if slope <= 0.0 {
        return (best, 0.0);
    }
    let peak = 1.0 / slope;
    (peak, fixed.max(0.0) * peak)
}

/// Least squares of seconds = x . coefficients, each row weighted by 1/seconds (so each shape
/// counts by its relative error), with no coefficient below 0: a negative one is dropped and
/// the rest fitted again.
fn fit_nonnegative(rows: &[([f64; 3], f64)]) -> [f64; 3] {
    let mut active = [true; 3];
    loop {
        let idx: Vec<usize> = (0..3).filter(|&i| active[i]).collect();
        let n = idx.len();
        // Normal equations of the active columns.
        let mut a = vec![vec![0.0; n + 1]; n];
        for (x, s) in rows {
            let w = 1.0 / (s * s).max(1e-30);
            for (r, &i) in idx.iter().enumerate() {
                for (c, &j) in idx.iter().enumerate() {
                    a[r][c] += w * x[i] * x[j];
                }
                a[r][n] += w * x[i] * s;
            }
        }
        // Gauss-Jordan with partial pivoting.
        for col in 0..n {
            let piv = (col..n)
                .max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))
                .unwrap_or(col);
            a.swap(col, piv);
            let d = a[col][col];
            if d.abs() < 1e-300 {
                continue;
            }
            for v in &mut a[col][col..=n] {
                *v /= d;
            }
            let pivot = a[col].clone();
            for (r, row) in a.iter_mut().enumerate() {
                if r != col {
                    let f = row[col];
                    for (x, p) in row[col..=n].iter_mut().zip(&pivot[col..=n]) {
                        *x -= f * p;
                    }
                }
            }
        }
        let mut out = [0.0; 3];
        for (r, &i) in idx.iter().enumerate() {
            out[i] = a[r][n];
        }
        match idx.iter().copied().find(|&i| out[i] < 0.0) {
            Some(i) if n > 1 => active[i] = false,
            _ => return out.map(|v| v.max(0.0)),
        }
    }
}

/// Runs every microbenchmark on `ctx` and returns the `this` profile (the CLI's calibration).
pub async fn calibrate(ctx: &GpuContext) -> Result<Calibration, ExecError> {
    calibrate_with(ctx, Budget::FULL).await
}

/// The page's calibration: the same microbenchmarks on a smaller budget.
pub async fn calibrate_quick(ctx: &GpuContext) -> Result<Calibration, ExecError> {
    calibrate_with(ctx, Budget::QUICK).await
}

/// Runs every microbenchmark on `ctx` within `budget` and returns the `this` profile.
pub async fn calibrate_with(ctx: &GpuContext, budget: Budget) -> Result<Calibration, ExecError> {
    let start = now_ms();
    let runs = budget.runs;
    let sized = |n: usize| (n >> budget.shrink).max(64);
    let mut out = vec![];
    let mut record = |name: &str, ms: f64, value: f64| {
        out.push(Measurement {
            name: name.into(),
            ms,
            value,
        })
    };
    // Launch overhead and the fixed submit-and-wait cost: chains of tiny ops.
    let (short, long) = (4usize, 132usize);
    let t_short = time_program(ctx, chain(short, 64, |b, x| b.scale(x, 1.0))?, runs + 2).await?;
    let t_long = time_program(ctx, chain(long, 64, |b, x| b.scale(x, 1.0))?, runs + 2).await?;
    let launch_s = ((t_long - t_short) / (long - short) as f64 * 1e-3).max(1e-7);
    let step_s = (t_short * 1e-3 - short as f64 * launch_s).max(0.0);
    record("launch_s", t_long, launch_s);
    record("step_s", t_short, step_s);
    let overhead = |launches: usize| step_s + launches as f64 * launch_s;

    // Bandwidth: a chain of scales over 2 MiB arrays, each reading and writing it once.
    let (n, reps) = (sized(1 << 19), 6usize);
    let t = time_program(ctx, chain(reps, n, |b, x| b.scale(x, 1.0))?, runs).await?;
    let mem_bandwidth = (reps * 8 * n) as f64 / (t * 1e-3 - overhead(reps)).max(1e-6);
    record("mem_bandwidth", t, mem_bandwidth);

    // Vector arithmetic: GELU (8 FLOPs per element in the cost model's count).
    let (n, reps) = (sized(1 << 18), 6usize);
    let t = time_program(ctx, chain(reps, n, |b, x| b.gelu(x))?, runs).await?;
    let vector_flops = (8 * n * reps) as f64 / (t * 1e-3 - overhead(reps)).max(1e-6);
    record("vector_flops", t, vector_flops);

    // Random bits: one Threefry hash per word.
    let (n, reps) = (sized(1 << 18), 4usize);
    let t = time_program(ctx, bits(n, reps)?, runs).await?;
    let int_ops = (n * reps) as f64 * THREEFRY_INT_OPS / (t * 1e-3 - overhead(reps)).max(1e-6);
    record("int_ops", t, int_ops);

    // Simulated collectives: copy-and-add kernels between the device blocks of one adapter's
    // memory, strided per device, priced by the bytes `sim_collective_bytes` counts for them.
    let (devices, n, reps) = (4usize, sized(1 << 15), 2usize);
    let t = time_program(ctx, collectives(devices, n, reps)?, runs).await?;
    let block = size_in_bytes(&[n]);
    let moved = reps as f64
        * [
            (CollectiveKind::AllReduce, block),
            (CollectiveKind::AllGather, block * devices as u64),
            (CollectiveKind::ReduceScatter, block * devices as u64),
        ]
        .iter()
        .map(|&(kind, bytes)| sim_collective_bytes(kind, bytes, devices, devices))
        .sum::<f64>();
    let sim_collective_bandwidth = moved / (t * 1e-3 - overhead(3 * reps)).max(1e-6);
    record("sim_collective_bandwidth", t, sim_collective_bandwidth);

    // Matmuls at several shapes, single and batched: each family fitted on its own.
    let single: Vec<_> = DOT_SHAPES.iter().map(|&(m, k, n)| (1, m, k, n)).collect();
    let mut fits = vec![];
    for (batched, family) in [(false, &single[..]), (true, &BATCHED_SHAPES[..])] {
        let mut points = vec![];
        let mut rows = vec![];
        for &(batch, m, k, nn) in family.iter().step_by(budget.shape_step.max(1)) {
            let flops = (2 * batch * m * k * nn) as f64;
            let reps = ((budget.matmul_flops / flops) as usize).clamp(2, 16);
            let t = time_program(ctx, dots(batch, m, k, nn, reps)?, runs).await?;
            let secs = ((t * 1e-3 - overhead(reps)) / reps as f64).max(1e-9);
            let name = if batch > 1 {
                format!("matmul_{batch}x{m}x{k}x{nn}")
            } else {
                format!("matmul_{m}x{k}x{nn}")
            };
            record(&name, t, flops / secs);
            points.push((flops, secs));
            rows.push(([flops, batch as f64, 1.0], secs));
        }
        fits.push(if batched {
            // Per FLOP, per product and per dispatch: many small products (attention's heads
            // times the simulated devices) run far below the rate of a few large ones.
            let [per_flop, per_product_s, fixed_s] = fit_nonnegative(&rows);
            MatmulFit {
                flops: if per_flop > 0.0 {
                    1.0 / per_flop
                } else {
                    points.iter().map(|p| p.0 / p.1).fold(0.0, f64::max)
                },
                half_flops: 0.0,
                per_product_s,
                fixed_s,
            }
        } else {
            let (flops, half_flops) = fit_matmul(&points);
            MatmulFit {
                flops,
                half_flops,
                per_product_s: 0.0,
                fixed_s: 0.0,
            }
        });
    }
    let (single, batched) = (fits[0], fits[1]);
    let adapter = format!("{} ({})", ctx.summary.name, ctx.summary.backend);
    let mut profile = DeviceProfile {
        name: "this".into(),
        label: format!("this GPU: {adapter}"),
        matmul_flops: single.flops,
        matmul_tile: [1, 1, 1],
        matmul_units: 1,
        matmul_half_flops: single.half_flops,
        matmul_batched: Some(batched),
        vector_flops,
        int_ops,
        mem_bandwidth,
        sim_collective_bandwidth: Some(sim_collective_bandwidth),
        launch_s,
        // Fitted to whole steps below.
        work_scale: 1.0,
        step_s,
        // WebGPU does not report the adapter's memory: the largest buffer it allows, as a
        // floor of what it holds (estimated).
        memory_bytes: ctx.summary.max_buffer_size.max(1 << 30),
        topology: Topology::Ring,
        // Several of this GPU would talk over PCIe 4.0 x16 (~25 GB/s achieved): estimated.
        link_bandwidth: 25e9,
        link_latency: 5e-6,
        estimated: ["memory_bytes", "link_bandwidth", "link_latency"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        source: format!("microbenchmarks on {adapter}"),
    };
    if budget.fit_steps {
        fit_to_steps(ctx, &mut profile, runs, &mut out).await?;
    }
    Ok(Calibration {
        adapter,
        profile,
        measurements: out,
        seconds: (now_ms() - start) * 1e-3,
    })
}

#[cfg(test)]
mod tests {
    use super::{fit_matmul, fit_nonnegative, fit_scale_and_launch};

    #[test]
    fn batched_fit_recovers_per_flop_per_product_and_fixed_costs() {
        let truth = [1.0 / 3e9, 1e-4, 2e-3];
        let rows: Vec<([f64; 3], f64)> = [
            (2.1e6, 64.0),
            (2.1e6, 64.0 * 2.0),
            (2.6e5, 8.0),
            (4.2e6, 8.0),
            (1.68e7, 2.0),
        ]
        .iter()
        .map(|&(f, p)| {
            let x = [f, p, 1.0];
            (x, x.iter().zip(&truth).map(|(a, b)| a * b).sum())
        })
        .collect();
        let got = fit_nonnegative(&rows);
        for (g, t) in got.iter().zip(&truth) {
            assert!((g / t - 1.0).abs() < 1e-6, "{got:?}");
        }
    }

    #[test]
    fn step_fit_recovers_work_scale_and_launch_cost() {
        // 1.5x the modelled work and 80 us per launch, from launch-bound to work-bound steps.
        let step = |work: f64, launches: f64| (work, launches, 1.5 * work + launches * 80e-6);
        let rows = [step(0.01, 120.0), step(0.05, 180.0), step(0.1, 150.0), step(0.3, 250.0)];
        let (scale, launch) = fit_scale_and_launch(&rows, 20e-6);
        assert!(
            (scale - 1.5).abs() < 1e-9 && (launch - 80e-6).abs() < 1e-12,
            "{scale} {launch}"
        );
        // One step 20% slow moves the fitted scale by less than that.
        let mut noisy = rows;
        noisy[1].2 *= 1.2;
        let (scale, _) = fit_scale_and_launch(&noisy, 20e-6);
        assert!((scale - 1.5).abs() < 0.2 * 1.5, "{scale}");
        // Noise that would need a negative launch cost: the scale alone, the launch kept.
        let (scale, launch) = fit_scale_and_launch(&[(0.01, 100.0, 0.05), (0.3, 100.0, 0.02)], 20e-6);
        assert_eq!(launch, 20e-6);
        assert!(scale > 0.0 && scale.is_finite());
    }

    #[test]
    fn matmul_fit_recovers_peak_and_half_size() {
        let (peak, half) = (10e9, 4e6);
        let points: Vec<(f64, f64)> = [1e6, 4e6, 16e6, 64e6]
            .iter()
            .map(|&f| (f, f / (peak * f / (f + half))))
            .collect();
        let (p, h) = fit_matmul(&points);
        assert!((p / peak - 1.0).abs() < 1e-6, "{p}");
        assert!((h / half - 1.0).abs() < 1e-6, "{h}");
    }
}
