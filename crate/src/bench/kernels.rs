//! `shardlab bench kernels`: matmul GFLOP/s (the autotuned variant beside the naive kernel and the CPU
//! reference, measured in the same run) and GB/s of an elementwise and a softmax kernel, each beside the
//! adapter's ceilings (arithmetic alone, the best storage-buffer copy) measured in the same run;
//! and each fused attention design this adapter runs, at the `small` step's shape.
use crate::gpu::{now_ms, Dispatch, GpuBuffer, GpuContext, GpuError};
use crate::kernels::attention::{self as attn, AttentionShape, Blocks, Lowering};
use crate::kernels::ceiling::{copy4, fma_peak, FMA_PEAK_FLOPS_PER_TRIP};
use crate::kernels::elementwise::{binary, Binary, BinaryArgs};
use crate::kernels::matmul::{choose_variant, matmul, time_dispatches, MatmulShape, Variant};
use crate::kernels::softmax;
use crate::profile::Roofline;
use crate::reference;

/// The square matmul sizes of the report.
pub const MATMUL_SIZES: [usize; 3] = [256, 512, 1024];

/// The sizes measured on GPUs besides [`MATMUL_SIZES`]: the f32 goal is set at n >= 2048,
/// where a GPU's matmul is bound by its arithmetic, not its launch (CPU adapters take seconds).
pub const GPU_MATMUL_SIZES: [usize; 1] = [2048];

/// The matmul sizes `bench kernels` measures on `ctx`'s adapter.
pub fn matmul_sizes(ctx: &GpuContext) -> Vec<usize> {
    let gpu = if ctx.summary.is_cpu() {
        &[][..]
    } else {
        &GPU_MATMUL_SIZES[..]
    };
    MATMUL_SIZES.iter().chain(gpu).copied().collect()
}

/// One variant's speed at one size (`bench kernels --variants N`); serializes as
/// `{"kernel":"matmul_variant","n":..,"variant":"...","gflops":..}`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VariantBench {
    pub kernel: &'static str,
    pub n: usize,
    pub variant: &'static str,
    pub gflops: f64,
    /// Whether the autotuner picks it for this shape here.
    pub chosen: bool,
}

/// Every matmul variant this adapter supports at n x n x n, each checked against the CPU
/// reference: what the autotuner chooses among, on the benchmark's own shape.
pub async fn matmul_variants(ctx: &GpuContext, n: usize) -> Result<Vec<VariantBench>, GpuError> {
    let s = MatmulShape::new(1, n, n, n);
    let a_data = noise(n * n, 1);
    let b_data = noise(n * n, 2);
    let a = ctx.upload("bench A", &a_data)?;
    let b = ctx.upload("bench B", &b_data)?;
    let c = ctx.zeros("bench C", n * n)?;
    let mut want = vec![0f32; n * n];
    reference::matmul::matmul(&s, &a_data, &b_data, None, &mut want);
    let chosen = choose_variant(ctx, &s).await?;
    let mut rows = Vec::new();
    for v in crate::kernels::matmul::variants(ctx) {
        let d = matmul(ctx, &s, &a, &b, None, &c, Some(v)).await?;
        ctx.write(&c, &vec![0f32; n * n]);
        let ms = gpu_ms(ctx, &d, 500.0).await?;
        check_matmul(ctx, &c, &want, v, n).await?;
        rows.push(VariantBench {
            kernel: "matmul_variant",
            n,
            variant: v.name(),
            gflops: s.flops() / (ms * 1e6),
            chosen: v == chosen,
        });
    }
    Ok(rows)
}

/// One matmul row; serializes exactly as
/// `{"kernel":"matmul","n":1024,"variant":"...","gflops":..,"naive_gflops":..,"cpu_gflops":..}`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MatmulBench {
    pub kernel: &'static str,
    pub n: usize,
    /// The variant the autotuner chose for this shape on this adapter.
    pub variant: &'static str,
    pub gflops: f64,
    pub naive_gflops: f64,
    /// `reference::matmul` (matrixmultiply, one thread) on the same problem.
    pub cpu_gflops: f64,
}

/// One memory-bound kernel row: bytes read plus bytes written per run, over the run's time.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BandwidthBench {
    pub kernel: &'static str,
    /// What ran, e.g. `add n=16777216` or `causal_forward rows=4096 t=1024`.
    pub shape: String,
    pub bytes: u64,
    pub ms: f64,
    pub gbps: f64,
}

/// What this adapter gives at best, measured: every kernel's speed reads as a fraction of these.
/// Serializes as `{"kernel":"ceilings","fma_gflops":..,"copy_gbps":..}`.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Ceilings {
    pub kernel: &'static str,
    /// GFLOP/s of `fma_peak`: independent f32 FMAs in registers, no memory traffic. No matmul can
    /// pass it; a kernel's FLOPs over it are the least time its arithmetic takes here.
    pub fma_gflops: f64,
    /// GB/s (bytes read plus written) of `copy4` (64 MiB, or what one binding holds; 4 MiB on the
    /// page): the best an elementwise kernel's storage-buffer traffic gets here.
    pub copy_gbps: f64,
}

impl Ceilings {
    /// The ceilings as the cost model's [`Roofline`] (per second).
    pub fn roofline(&self) -> Roofline {
        Roofline {
            flops: self.fma_gflops * 1e9,
            bytes_per_s: self.copy_gbps * 1e9,
        }
    }
}

/// `fma_peak` launches this many invocations: 4096 workgroups of 64, enough to fill a large GPU.
const PEAK_INVOCATIONS: usize = 1 << 18;
/// Its x = fma(x, M, C) converges to 1; the starting values stay distinct for thousands of rounds.
const PEAK_M: f32 = 0.9999;
const PEAK_C: f32 = 1.0 - PEAK_M;

/// How long and how large [`ceilings_with`] measures.
#[derive(Clone, Copy, Debug)]
pub struct CeilingRun {
    /// `fma_peak` grows its loop trips until one run takes this long.
    pub run_ms: f64,
    /// Floats `copy4` copies.
    pub copy_floats: usize,
    /// Time each kernel is repeated for after its warm-up (2 to 10 runs; the best counts).
    pub budget_ms: f64,
}

impl CeilingRun {
    /// `bench`'s: 50 ms runs, a 64 MiB copy (or what one binding holds), a second of repeats.
    pub const BENCH: CeilingRun = CeilingRun {
        run_ms: 50.0,
        copy_floats: 1 << 24,
        budget_ms: 1000.0,
    };
    /// The page's, measured when a profiled step first asks: 20 ms runs, a 4 MiB copy.
    pub const PAGE: CeilingRun = CeilingRun {
        run_ms: 20.0,
        copy_floats: 1 << 20,
        budget_ms: 150.0,
    };
}

/// Measures [`Ceilings`] as `bench` does ([`CeilingRun::BENCH`]).
pub async fn ceilings(ctx: &GpuContext) -> Result<Ceilings, GpuError> {
    ceilings_with(ctx, CeilingRun::BENCH).await
}

/// Measures [`Ceilings`]. `fma_peak` runs once untimed, then 4, 16, 64, ... loop trips until one run
/// takes `run.run_ms` (so the launch is a small part of it on any adapter), then is timed as every
/// kernel of the report; both kernels' results are checked against their CPU twins, so a kernel the
/// driver skipped or cut short fails the benchmark instead of raising the ceiling.
pub async fn ceilings_with(ctx: &GpuContext, run: CeilingRun) -> Result<Ceilings, GpuError> {
    let out = ctx.zeros("ceiling out", 4 * PEAK_INVOCATIONS)?;
    let mut iters = 4;
    let mut peak = fma_peak(ctx, &out, PEAK_INVOCATIONS, iters, PEAK_M, PEAK_C).await?;
    // Untimed: a driver may compile the pipeline at its first dispatch (lavapipe does).
    time_dispatches(ctx, std::slice::from_ref(&peak)).await?;
    while time_dispatches(ctx, std::slice::from_ref(&peak)).await? < run.run_ms && iters < 1 << 16 {
        iters *= 4;
        peak = fma_peak(ctx, &out, PEAK_INVOCATIONS, iters, PEAK_M, PEAK_C).await?;
    }
    let peak_ms = gpu_ms(ctx, std::slice::from_ref(&peak), run.budget_ms).await?;
    let got: Vec<f32> = ctx.read(&out).await?;
    for i in (0..PEAK_INVOCATIONS)
        .step_by(PEAK_INVOCATIONS / 16)
        .chain([PEAK_INVOCATIONS - 1])
    {
        let want = reference::ceiling::fma_peak(i, iters, PEAK_M, PEAK_C);
        for (lane, w) in want.iter().enumerate() {
            let g = got[4 * i + lane];
            if !close(g, *w, 1e-4, 1e-4) {
                return Err(GpuError::Invalid(format!(
                    "bench: fma_peak invocation {i} lane {lane} after {iters} trips stored {g}, its CPU twin {w}"
                )));
            }
        }
    }
    let flops = PEAK_INVOCATIONS as f64 * iters as f64 * FMA_PEAK_FLOPS_PER_TRIP;

    let limit = (ctx.summary.max_storage_buffer_binding_size / 4) as usize;
    let n = run.copy_floats.min(limit) / 4 * 4;
    let data = noise(n, 6);
    let src = ctx.upload("ceiling src", &data)?;
    let dst = ctx.zeros("ceiling dst", n)?;
    let copy = copy4(ctx, &src, &dst, n).await?;
    let copy_ms = gpu_ms(ctx, std::slice::from_ref(&copy), run.budget_ms).await?;
    let mut want = vec![0f32; n];
    reference::ceiling::copy4(&data, &mut want);
    let got: Vec<f32> = ctx.read(&dst).await?;
    if let Some(i) = got.iter().zip(&want).position(|(g, w)| g.to_bits() != w.to_bits()) {
        return Err(GpuError::Invalid(format!(
            "bench: copy4 of {n} floats differs from its source at {i}: {} vs {}",
            got[i], want[i]
        )));
    }
    Ok(Ceilings {
        kernel: "ceilings",
        fma_gflops: flops / (peak_ms * 1e6),
        copy_gbps: (8 * n) as f64 / (copy_ms * 1e6),
    })
}

/// C = A @ B at n x n x n: the autotuned variant, the naive kernel and the CPU reference. Both GPU results
/// are checked against the CPU's, so a fast wrong kernel fails the benchmark instead of topping it.
pub async fn matmul_square(ctx: &GpuContext, n: usize) -> Result<MatmulBench, GpuError> {
    let s = MatmulShape::new(1, n, n, n);
    let a_data = noise(n * n, 1);
    let b_data = noise(n * n, 2);
    let a = ctx.upload("bench A", &a_data)?;
    let b = ctx.upload("bench B", &b_data)?;
    let c = ctx.zeros("bench C", n * n)?;

    let mut want = vec![0f32; n * n];
    let cpu_ms = cpu_ms(500.0, || {
        let t0 = now_ms();
        reference::matmul::matmul(&s, &a_data, &b_data, None, &mut want);
        now_ms() - t0
    });

    let variant = choose_variant(ctx, &s).await?;
    let chosen = matmul(ctx, &s, &a, &b, None, &c, Some(variant)).await?;
    let chosen_ms = gpu_ms(ctx, &chosen, 1000.0).await?;
    check_matmul(ctx, &c, &want, variant, n).await?;

    let naive = matmul(ctx, &s, &a, &b, None, &c, Some(Variant::Naive)).await?;
    ctx.write(&c, &vec![0f32; n * n]);
    let naive_ms = gpu_ms(ctx, &naive, 1000.0).await?;
    check_matmul(ctx, &c, &want, Variant::Naive, n).await?;

    let gflops = |ms: f64| s.flops() / (ms * 1e6);
    Ok(MatmulBench {
        kernel: "matmul",
        n,
        variant: variant.name(),
        gflops: gflops(chosen_ms),
        naive_gflops: gflops(naive_ms),
        cpu_gflops: gflops(cpu_ms),
    })
}

/// out = a + b over `n` floats (the largest of 16M and what one binding may hold).
pub async fn elementwise_add(ctx: &GpuContext) -> Result<BandwidthBench, GpuError> {
    let limit = (ctx.summary.max_storage_buffer_binding_size / 4) as usize;
    let n = (1usize << 24).min(limit);
    let a = ctx.upload("bench a", &noise(n, 3))?;
    let b = ctx.upload("bench b", &noise(n, 4))?;
    let out = ctx.zeros("bench out", n)?;
    let d = binary(ctx, &a, &b, &out, &BinaryArgs::new(Binary::Add, n, n, 1.0, 1.0)).await?;
    let ms = gpu_ms(ctx, std::slice::from_ref(&d), 1000.0).await?;
    Ok(bandwidth("elementwise", format!("add n={n}"), 12 * n as u64, ms))
}

/// Causal softmax of (rows, t) attention scores.
pub async fn causal_softmax(ctx: &GpuContext, rows: usize, t: usize) -> Result<BandwidthBench, GpuError> {
    let s = ctx.upload("bench scores", &noise(rows * t, 5))?;
    let p = ctx.zeros("bench probs", rows * t)?;
    let d = softmax::causal_forward(ctx, &s, &p, rows, t, None).await?;
    let ms = gpu_ms(ctx, std::slice::from_ref(&d), 1000.0).await?;
    Ok(bandwidth(
        "softmax",
        format!("causal_forward rows={rows} t={t}"),
        8 * (rows * t) as u64,
        ms,
    ))
}

/// One fused attention design: its forward and its backward (all its dispatches), each timed
/// alone.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AttentionBench {
    pub kernel: &'static str,
    /// `tiled`, `subgroup N` (N lanes), or `subgroup N, two-pass backward`.
    pub design: String,
    /// (B*H heads, T, Dh).
    pub shape: String,
    pub forward_ms: f64,
    pub backward_ms: f64,
    /// Whether the executor runs attention of this shape on this design here (else on another
    /// design, or composed through the tuned matmuls).
    pub chosen: bool,
}

/// Every fused attention design this adapter runs (the tiled kernels; the subgroup kernels
/// where the adapter has 8- or 16-lane subgroups and Dh is a multiple of 4, their backward in
/// four passes and, where the adapter binds 10 storage buffers, in two), timed on `heads`
/// heads of T rows and Dh columns, causal, without dropout.
pub async fn attention_designs(
    ctx: &GpuContext,
    heads: usize,
    t: usize,
    dh: usize,
) -> Result<Vec<AttentionBench>, GpuError> {
    let s = AttentionShape {
        heads,
        t,
        dh,
        scale: 1.0 / (dh as f32).sqrt(),
        rate: 0.0,
    };
    let n = heads * t * dh;
    let [q, k, v, d_o] = [6, 7, 8, 9].map(|seed| ctx.upload("bench attention input", &noise(n, seed)));
    let (q, k, v, d_o) = (q?, k?, v?, d_o?);
    let (o, lse) = (ctx.zeros("bench o", n)?, ctx.zeros("bench lse", heads * t)?);
    let rows = ctx.zeros("bench rows", attn::rows_len(&s))?;
    let [dq, dk, dv] = ["bench dq", "bench dk", "bench dv"].map(|name| ctx.zeros(name, n));
    let (dq, dk, dv) = (dq?, dk?, dv?);
    let whole = [Blocks::whole(t)];
    let chosen = attn::lowering(ctx, &s, &whole);
    let mut out = Vec::new();
    for kernels in attn::designs(ctx, &s) {
        let f = attn::Forward {
            q: &q,
            k: &k,
            v: &v,
            dropout: attn::Dropout::None,
            o: &o,
            lse: &lse,
            blocks: &whole,
            layouts: None,
        };
        let forward = attn::forward(ctx, &f, &s, kernels).await?;
        let b = attn::Backward {
            q: &q,
            k: &k,
            v: &v,
            o: &o,
            lse: &lse,
            d_o: &d_o,
            dropout: attn::Dropout::None,
            rows: &rows,
            dq: &dq,
            dk: &dk,
            dv: &dv,
            blocks: &whole,
            layouts: None,
        };
        let backward = attn::backward(ctx, &b, &s, kernels).await?;
        out.push(AttentionBench {
            kernel: "attention",
            design: kernels.name(),
            shape: format!("({heads}, {t}, {dh})"),
            forward_ms: gpu_ms(ctx, std::slice::from_ref(&forward), 1000.0).await?,
            backward_ms: gpu_ms(ctx, &backward, 1000.0).await?,
            chosen: chosen == Lowering::Fused(kernels),
        });
    }
    Ok(out)
}

fn bandwidth(kernel: &'static str, shape: String, bytes: u64, ms: f64) -> BandwidthBench {
    BandwidthBench {
        kernel,
        shape,
        bytes,
        ms,
        gbps: bytes as f64 / (ms * 1e6),
    }
}

/// Best time of `dispatches` after one warm-up run, over as many runs as `budget_ms` allows (2 to 10: a 2 s
/// kernel runs three times in all). The best, not the mean: on a shared machine other work only adds time.
async fn gpu_ms(ctx: &GpuContext, dispatches: &[Dispatch], budget_ms: f64) -> Result<f64, GpuError> {
    let warm = time_dispatches(ctx, dispatches).await?;
    let mut best = f64::INFINITY;
    for _ in 0..reps(budget_ms, warm) {
        best = best.min(time_dispatches(ctx, dispatches).await?);
    }
    Ok(best)
}

/// As [`gpu_ms`] for a CPU function that returns its own time.
fn cpu_ms(budget_ms: f64, mut run: impl FnMut() -> f64) -> f64 {
    let warm = run();
    (0..reps(budget_ms, warm)).map(|_| run()).fold(f64::INFINITY, f64::min)
}

fn reps(budget_ms: f64, warm_ms: f64) -> usize {
    ((budget_ms / warm_ms.max(1e-3)) as usize).clamp(2, 10)
}

pub(crate) async fn check_matmul(
    ctx: &GpuContext,
    c: &GpuBuffer,
    want: &[f32],
    variant: Variant,
    n: usize,
) -> Result<(), GpuError> {
    let got: Vec<f32> = ctx.read(c).await?;
    let bad = got.iter().zip(want).position(|(g, w)| !close(*g, *w, 1e-2, 1e-3));
    match bad {
        None => Ok(()),
        Some(i) => Err(GpuError::Invalid(format!(
            "bench: matmul variant {variant} at n={n} differs from the CPU reference at {i}: {} vs {}",
            got[i], want[i]
        ))),
    }
}

/// Deterministic values in [-1, 1) from a 32-bit LCG.
pub(crate) fn noise(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

/// |got - want| <= atol + rtol * |want|; NaN is never close.
fn close(got: f32, want: f32, atol: f32, rtol: f32) -> bool {
    (got - want).abs() <= atol + rtol * want.abs()
}
