//! The kernel self-test that the page (and native tests) run on whatever adapter they get:
//! (a) every `@compute` entry point of every shader becomes a pipeline, each error kept with its
//! shader and entry name (Chrome's compiler rejects some WGSL that naga accepts); (b) every kernel
//! matches its CPU twin in [`crate::reference`] on a small odd-sized input. Async throughout, so it
//! runs in the browser, where nothing may block.
use serde::Serialize;

use crate::gpu::{now_ms, AdapterSummary, Dispatch, GpuBuffer, GpuContext, GpuError};
use crate::kernels::attention::AttentionShape;
use crate::kernels::copy::Strided;
use crate::kernels::elementwise::{Binary, BinaryArgs};
use crate::kernels::embedding::EmbeddingShape;
use crate::kernels::layernorm::LayerNormShape;
use crate::kernels::matmul::Variant;
use crate::kernels::random::{Draw, KeyMode};
use crate::rng::{Block, Key, RngLayout};
use crate::{kernels, reference, shaders};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    /// Not applicable on this adapter (a shader enabling an extension it lacks).
    Skip,
}

/// One pipeline creation: `shader::entry`.
#[derive(Debug, Clone, Serialize)]
pub struct PipelineCheck {
    pub shader: String,
    pub entry: String,
    pub status: Status,
    /// The compiler's error, or why the pipeline was skipped.
    pub message: Option<String>,
}

/// One kernel run against its CPU twin.
#[derive(Debug, Clone, Serialize)]
pub struct KernelCheck {
    pub name: String,
    /// The input it ran on, e.g. `rows=5, C=33`.
    pub shape: String,
    pub status: Status,
    /// Largest |gpu - cpu| over all outputs; None when the kernel failed to run.
    pub max_abs_error: Option<f32>,
    pub tolerance: f32,
    pub message: Option<String>,
    pub ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SelfTestReport {
    pub adapter: AdapterSummary,
    pub pipelines: Vec<PipelineCheck>,
    pub kernels: Vec<KernelCheck>,
    /// No pipeline and no kernel failed.
    pub passed: bool,
    pub ms: f64,
}

impl SelfTestReport {
    /// One line per failed item, naming it and its error.
    pub fn failures(&self) -> Vec<String> {
        let pipelines = self.pipelines.iter().filter(|p| p.status == Status::Fail).map(|p| {
            format!(
                "pipeline {}::{}: {}",
                p.shader,
                p.entry,
                p.message.as_deref().unwrap_or("failed")
            )
        });
        let kernels = self.kernels.iter().filter(|k| k.status == Status::Fail).map(|k| {
            format!(
                "kernel {} ({}): {}",
                k.name,
                k.shape,
                k.message.as_deref().unwrap_or("failed")
            )
        });
        pipelines.chain(kernels).collect()
    }
}

/// What one kernel check produced: GPU output and CPU reference (several outputs concatenated),
/// compared within the case's tolerance, or bit for bit; or why the check does not apply here.
pub enum Outcome {
    Close { got: Vec<f32>, want: Vec<f32> },
    Exact { got: Vec<u32>, want: Vec<u32> },
    Skipped(String),
}

/// A collective of the self-test, run on a dp=2, tp=4 mesh over tp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    Psum,
    Pmean,
    AllGather,
    PsumScatter,
    Ppermute,
    AllToAll,
}

/// One row of the kernel table: each kernel check the self-test runs against its CPU twin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    ElementwiseAdd,
    ElementwiseMul,
    ElementwiseScale,
    Matmul(Variant),
    LayerNormForward,
    LayerNormBackward,
    GeluForward,
    GeluBackward,
    SoftmaxForward,
    SoftmaxBackward,
    /// Fused causal attention with dropout from bits, forward or backward, on the kernels the
    /// executor picks here.
    Attention {
        backward: bool,
    },
    /// The same on the flash kernels (attention_fa.wgsl, the GPUs' design), wherever they run.
    FlashAttention {
        backward: bool,
    },
    CrossEntropyForward,
    CrossEntropyBackward,
    EmbeddingForward,
    EmbeddingBackward,
    SumAxis,
    CopyTranspose,
    RandomBits(RngLayout),
    /// Dropout of the partitionable layout, forward or (regenerating the mask) backward.
    Dropout {
        backward: bool,
    },
    DropoutApply,
    Sgd,
    AdamW,
    Collective(Collective),
    /// psum of arrays packed in one arena, in place (a step's gradients).
    PsumPacked,
    AxisIndex,
}

/// Every kernel the self-test runs: add a kernel here, with its row in [`Case`]'s methods.
pub const KERNELS: &[Case] = &[
    Case::ElementwiseAdd,
    Case::ElementwiseMul,
    Case::ElementwiseScale,
    Case::Matmul(Variant::Naive),
    Case::Matmul(Variant::Tiled),
    Case::Matmul(Variant::Block8),
    Case::Matmul(Variant::Block16),
    Case::Matmul(Variant::Tex16),
    Case::Matmul(Variant::Sg),
    Case::Matmul(Variant::Sg1),
    Case::Matmul(Variant::Gpu64),
    Case::Matmul(Variant::Gpu128),
    Case::Matmul(Variant::Coop8),
    Case::LayerNormForward,
    Case::LayerNormBackward,
    Case::GeluForward,
    Case::GeluBackward,
    Case::SoftmaxForward,
    Case::SoftmaxBackward,
    Case::Attention { backward: false },
    Case::Attention { backward: true },
    Case::FlashAttention { backward: false },
    Case::FlashAttention { backward: true },
    Case::CrossEntropyForward,
    Case::CrossEntropyBackward,
    Case::EmbeddingForward,
    Case::EmbeddingBackward,
    Case::SumAxis,
    Case::CopyTranspose,
    Case::RandomBits(RngLayout::Original),
    Case::RandomBits(RngLayout::Partitionable),
    Case::Dropout { backward: false },
    Case::Dropout { backward: true },
    Case::DropoutApply,
    Case::Sgd,
    Case::AdamW,
    Case::Collective(Collective::Psum),
    Case::Collective(Collective::Pmean),
    Case::Collective(Collective::AllGather),
    Case::Collective(Collective::PsumScatter),
    Case::Collective(Collective::Ppermute),
    Case::Collective(Collective::AllToAll),
    Case::PsumPacked,
    Case::AxisIndex,
];

impl Case {
    /// The name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Case::ElementwiseAdd => "elementwise add",
            Case::ElementwiseMul => "elementwise mul",
            Case::ElementwiseScale => "elementwise scale",
            Case::Matmul(Variant::Naive) => "matmul naive",
            Case::Matmul(Variant::Tiled) => "matmul tiled",
            Case::Matmul(Variant::Block8) => "matmul block8",
            Case::Matmul(Variant::Block16) => "matmul block16",
            Case::Matmul(Variant::Tex16) => "matmul tex16",
            Case::Matmul(Variant::Sg) => "matmul sg",
            Case::Matmul(Variant::Sg1) => "matmul sg1",
            Case::Matmul(Variant::Gpu64) => "matmul gpu64",
            Case::Matmul(Variant::Gpu128) => "matmul gpu128",
            Case::Matmul(Variant::Coop8) => "matmul coop8",
            Case::LayerNormForward => "layernorm forward",
            Case::LayerNormBackward => "layernorm backward",
            Case::GeluForward => "gelu forward",
            Case::GeluBackward => "gelu backward",
            Case::SoftmaxForward => "causal softmax forward",
            Case::SoftmaxBackward => "causal softmax backward",
            Case::Attention { backward: false } => "fused attention forward",
            Case::Attention { backward: true } => "fused attention backward",
            Case::FlashAttention { backward: false } => "flash attention forward",
            Case::FlashAttention { backward: true } => "flash attention backward",
            Case::CrossEntropyForward => "cross-entropy forward",
            Case::CrossEntropyBackward => "cross-entropy backward",
            Case::EmbeddingForward => "embedding forward",
            Case::EmbeddingBackward => "embedding backward",
            Case::SumAxis => "sum over an axis",
            Case::CopyTranspose => "strided copy (transpose)",
            Case::RandomBits(RngLayout::Original) => "random bits (original layout)",
            Case::RandomBits(RngLayout::Partitionable) => "random bits (partitionable)",
            Case::Dropout { backward: false } => "dropout forward",
            Case::Dropout { backward: true } => "dropout backward",
            Case::DropoutApply => "dropout from bits",
            Case::Sgd => "SGD update",
            Case::AdamW => "AdamW update",
            Case::Collective(Collective::Psum) => "psum",
            Case::Collective(Collective::Pmean) => "pmean",
            Case::Collective(Collective::AllGather) => "all_gather",
            Case::Collective(Collective::PsumScatter) => "psum_scatter",
            Case::Collective(Collective::Ppermute) => "ppermute",
            Case::Collective(Collective::AllToAll) => "all_to_all",
            Case::PsumPacked => "psum of packed arrays (in place)",
            Case::AxisIndex => "axis_index",
        }
    }

    /// The input it runs on.
    pub fn shape(self) -> &'static str {
        match self {
            Case::ElementwiseAdd => "n=1023, b period 31",
            Case::ElementwiseMul => "n=1023, b period 1",
            Case::ElementwiseScale | Case::Sgd => "n=1023",
            Case::Matmul(_) => MATMUL_SHAPE,
            Case::LayerNormForward | Case::LayerNormBackward => "rows=5, C=67",
            Case::GeluForward | Case::GeluBackward => "n=1023, |x| <= 8",
            Case::SoftmaxForward | Case::SoftmaxBackward => "rows=2x17, T=17",
            Case::Attention { .. } | Case::FlashAttention { .. } => "heads=3, T=17, Dh=24, dropout 0.25",
            Case::CrossEntropyForward | Case::CrossEntropyBackward => "rows=7, V=65",
            Case::EmbeddingForward | Case::EmbeddingBackward => "N=17, V=13, C=33",
            Case::SumAxis => "(3, 17, 65) over axis 1",
            Case::CopyTranspose => "(17, 33) -> (33, 17)",
            Case::RandomBits(_) => "(3, 67) u32",
            Case::Dropout { .. } => "(3, 67), rate 0.25",
            Case::DropoutApply => "n=201, rate 0.1",
            Case::AdamW => "n=1023, step 2",
            Case::PsumPacked => PACKED_SHAPE,
            Case::Collective(_) | Case::AxisIndex => COLLECTIVE_SHAPE,
        }
    }

    /// The largest absolute error that passes.
    pub fn tolerance(self) -> f32 {
        match self {
            Case::Matmul(_)
            | Case::LayerNormForward
            | Case::LayerNormBackward
            | Case::CrossEntropyForward
            | Case::Attention { .. }
            | Case::FlashAttention { .. } => 1e-4,
            Case::GeluForward
            | Case::GeluBackward
            | Case::SoftmaxForward
            | Case::SoftmaxBackward
            | Case::CrossEntropyBackward
            | Case::EmbeddingBackward
            | Case::SumAxis => 1e-5,
            Case::EmbeddingForward | Case::CopyTranspose | Case::RandomBits(_) => 0.0,
            Case::Collective(Collective::Psum | Collective::Pmean | Collective::PsumScatter) | Case::PsumPacked => 1e-6,
            Case::Collective(_) | Case::AxisIndex => 0.0,
            Case::ElementwiseAdd
            | Case::ElementwiseMul
            | Case::ElementwiseScale
            | Case::Dropout { .. }
            | Case::DropoutApply
            | Case::Sgd
            | Case::AdamW => 1e-6,
        }
    }

    /// Runs the kernel and its CPU twin.
    pub async fn check(self, ctx: &GpuContext) -> Result<Outcome, GpuError> {
        match self {
            Case::ElementwiseAdd => elementwise_binary(ctx, Binary::Add, 31).await,
            Case::ElementwiseMul => elementwise_binary(ctx, Binary::Mul, 1).await,
            Case::ElementwiseScale => elementwise_scale(ctx).await,
            Case::Matmul(v) => matmul(ctx, v).await,
            Case::LayerNormForward => layernorm_forward(ctx).await,
            Case::LayerNormBackward => layernorm_backward(ctx).await,
            Case::GeluForward => gelu_forward(ctx).await,
            Case::GeluBackward => gelu_backward(ctx).await,
            Case::SoftmaxForward => softmax_forward(ctx).await,
            Case::SoftmaxBackward => softmax_backward(ctx).await,
            Case::Attention { backward } => {
                let kernels = kernels::attention::fused_kernels(ctx, &ATTENTION);
                attention(ctx, backward, kernels).await
            }
            Case::FlashAttention { backward } => {
                let flash = kernels::attention::Kernels::Flash;
                if !kernels::attention::designs(ctx, &ATTENTION).contains(&flash) {
                    return Ok(Outcome::Skipped(
                        "this adapter does not bind the 10 storage buffers the flash kernels take".into(),
                    ));
                }
                attention(ctx, backward, flash).await
            }
            Case::CrossEntropyForward => crossentropy_forward(ctx).await,
            Case::CrossEntropyBackward => crossentropy_backward(ctx).await,
            Case::EmbeddingForward => embedding_forward(ctx).await,
            Case::EmbeddingBackward => embedding_backward(ctx).await,
            Case::SumAxis => sum_axis(ctx).await,
            Case::CopyTranspose => copy_transpose(ctx).await,
            Case::RandomBits(layout) => random_bits(ctx, layout).await,
            Case::Dropout { backward } => dropout(ctx, backward).await,
            Case::DropoutApply => dropout_apply(ctx).await,
            Case::Sgd => sgd(ctx).await,
            Case::AdamW => adamw(ctx).await,
            Case::PsumPacked => psum_packed(ctx).await,
            Case::Collective(c) => collective(ctx, c).await,
            Case::AxisIndex => axis_index(ctx).await,
        }
    }
}

/// Runs the whole self-test: every pipeline, then every kernel of [`KERNELS`].
pub async fn run(ctx: &GpuContext) -> SelfTestReport {
    let start = now_ms();
    let mut pipelines = Vec::new();
    for (shader, src) in shaders::ALL {
        pipelines.extend(check_shader(ctx, shader, src).await);
    }
    let mut kernels = Vec::new();
    for &case in KERNELS {
        kernels.push(check_kernel(ctx, case).await);
    }
    let passed = pipelines.iter().all(|p| p.status != Status::Fail) && kernels.iter().all(|k| k.status != Status::Fail);
    SelfTestReport {
        adapter: ctx.summary.clone(),
        pipelines,
        kernels,
        passed,
        ms: now_ms() - start,
    }
}

/// A pipeline for every entry point of one shader; an extension the adapter lacks skips them.
pub async fn check_shader(ctx: &GpuContext, shader: &str, src: &str) -> Vec<PipelineCheck> {
    let entries = shaders::entry_points(src);
    let item = |entry: &str, status, message: Option<String>| PipelineCheck {
        shader: shader.to_string(),
        entry: entry.to_string(),
        status,
        message,
    };
    if entries.is_empty() {
        return vec![item("-", Status::Fail, Some("no @compute entry point found".into()))];
    }
    let missing: Vec<&str> = shaders::extensions(shader, src)
        .into_iter()
        .filter(|e| !adapter_has(ctx, e))
        .collect();
    let mut out = Vec::new();
    for entry in entries {
        if !missing.is_empty() {
            out.push(item(
                entry,
                Status::Skip,
                Some(format!("this adapter lacks {}", missing.join(", "))),
            ));
            continue;
        }
        let allowed = ctx.device.limits().max_storage_buffers_per_shader_stage;
        if let Some(needs) = shaders::storage_buffers(shader, entry).filter(|&n| n > allowed) {
            let why = format!("it binds {needs} storage buffers and this adapter allows {allowed} per stage");
            out.push(item(entry, Status::Skip, Some(why)));
            continue;
        }
        out.push(check_pipeline(ctx, shader, entry).await);
    }
    out
}

/// Creates (or finds in the cache) one pipeline, keeping its error.
pub async fn check_pipeline(ctx: &GpuContext, shader: &str, entry: &str) -> PipelineCheck {
    let result = ctx.pipeline(shader, entry).await;
    PipelineCheck {
        shader: shader.to_string(),
        entry: entry.to_string(),
        status: if result.is_ok() { Status::Pass } else { Status::Fail },
        message: result.err().map(|e| e.to_string()),
    }
}

fn adapter_has(ctx: &GpuContext, extension: &str) -> bool {
    match extension {
        "f16" => ctx.summary.shader_f16,
        "subgroups" => ctx.summary.subgroups,
        "wgpu_cooperative_matrix" => ctx.summary.cooperative_matrix,
        _ => false,
    }
}

async fn check_kernel(ctx: &GpuContext, case: Case) -> KernelCheck {
    let start = now_ms();
    let result = case.check(ctx).await;
    let tolerance = case.tolerance();
    let ms = now_ms() - start;
    let compare = |err: f32, n_got: usize, n_want: usize| {
        if err <= tolerance {
            (Status::Pass, Some(err), None)
        } else if n_got != n_want {
            (Status::Fail, None, Some(format!("{n_got} outputs, expected {n_want}")))
        } else {
            let msg = format!("max abs error {err:e} over tolerance {:e}", tolerance);
            (Status::Fail, Some(err), Some(msg))
        }
    };
    let (status, max_abs_error, message) = match result {
        Ok(Outcome::Close { got, want }) => compare(max_abs_error(&got, &want), got.len(), want.len()),
        Ok(Outcome::Exact { got, want }) => compare(max_abs_diff_u32(&got, &want), got.len(), want.len()),
        Ok(Outcome::Skipped(why)) => (Status::Skip, None, Some(why)),
        Err(e) => (Status::Fail, None, Some(e.to_string())),
    };
    KernelCheck {
        name: case.name().to_string(),
        shape: case.shape().to_string(),
        status,
        max_abs_error,
        tolerance,
        message,
        ms,
    }
}

/// Largest |got - want|; infinite when the lengths differ or any value is NaN or infinite
/// (unless both sides hold the same infinity), so a broken kernel can never pass.
pub fn max_abs_error(got: &[f32], want: &[f32]) -> f32 {
    if got.len() != want.len() {
        return f32::INFINITY;
    }
    got.iter().zip(want).fold(0.0f32, |worst, (&g, &w)| {
        let err = if g == w { 0.0 } else { (g - w).abs() };
        if err.is_nan() {
            f32::INFINITY
        } else {
            worst.max(err)
        }
    })
}

/// Largest |got - want| of integer outputs (random bits), as f32; infinite on a length mismatch.
pub fn max_abs_diff_u32(got: &[u32], want: &[u32]) -> f32 {
    if got.len() != want.len() {
        return f32::INFINITY;
    }
    got.iter()
        .zip(want)
        .map(|(&g, &w)| g.abs_diff(w) as f32)
        .fold(0.0, f32::max)
}

/// Deterministic values in [-1, 1) (the same LCG as the integration tests' `rand_vec`).
pub fn rand_vec(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

/// Submits `dispatches` in order, then reads each of `outputs` back, concatenated.
async fn run_and_read(ctx: &GpuContext, dispatches: &[Dispatch], outputs: &[&GpuBuffer]) -> Result<Vec<f32>, GpuError> {
    if !dispatches.is_empty() {
        ctx.run(dispatches);
    }
    let mut got = Vec::new();
    for out in outputs {
        got.extend(ctx.read::<f32>(out).await?);
    }
    Ok(got)
}

// ---- kernel checks: each uploads a small input, runs the kernel, and returns (gpu, cpu) ----

/// Integer ids in 0..v from deterministic values.
fn ids(n: usize, v: usize, seed: u32) -> Vec<u32> {
    rand_vec(n, seed)
        .iter()
        .map(|x| (((x + 1.0) * 0.5 * v as f32) as usize).min(v - 1) as u32)
        .collect()
}

fn close(got: Vec<f32>, want: Vec<f32>) -> Result<Outcome, GpuError> {
    Ok(Outcome::Close { got, want })
}

async fn elementwise_binary(ctx: &GpuContext, op: Binary, nb: usize) -> Result<Outcome, GpuError> {
    let n = 1023;
    let (a, b) = (rand_vec(n, 1), rand_vec(nb, 2));
    let ga = ctx.upload("selftest a", &a)?;
    let gb = ctx.upload("selftest b", &b)?;
    let out = ctx.zeros("selftest out", n)?;
    let d = kernels::elementwise::binary(ctx, &ga, &gb, &out, &BinaryArgs::new(op, n, nb, 0.5, -2.0)).await?;
    let want = match op {
        Binary::Add => reference::elementwise::add(&a, &b, 0.5, -2.0),
        Binary::Mul => reference::elementwise::mul(&a, &b, 0.5),
    };
    close(run_and_read(ctx, &[d], &[&out]).await?, want)
}

async fn elementwise_scale(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let n = 1023;
    let a = rand_vec(n, 3);
    let ga = ctx.upload("selftest a", &a)?;
    let out = ctx.zeros("selftest out", n)?;
    let d = kernels::elementwise::scale(ctx, &ga, &out, n, -1.5, 0.25).await?;
    close(
        run_and_read(ctx, &[d], &[&out]).await?,
        reference::elementwise::scale(&a, -1.5, 0.25),
    )
}

const MATMUL_SHAPE: &str = "2 x (17, 65) @ (33, 65)^T + bias, alpha 0.5";

/// One named matmul variant on a batched, transposed, biased odd shape (skipped where the
/// adapter lacks what the variant needs).
async fn matmul(ctx: &GpuContext, variant: Variant) -> Result<Outcome, GpuError> {
    use kernels::matmul::{matmul, variants, MatmulShape};
    if !variants(ctx).contains(&variant) {
        return Ok(Outcome::Skipped(format!(
            "this adapter does not support the {variant} variant"
        )));
    }
    let s = MatmulShape {
        trans_b: true,
        alpha: 0.5,
        ..MatmulShape::new(2, 17, 33, 65)
    };
    let (a, b, bias) = (rand_vec(s.a_len(), 4), rand_vec(s.b_len(), 5), rand_vec(s.n, 6));
    let ga = ctx.upload("selftest a", &a)?;
    let gb = ctx.upload("selftest b", &b)?;
    let gbias = ctx.upload("selftest bias", &bias)?;
    let c = ctx.zeros("selftest c", s.c_len())?;
    let ds = matmul(ctx, &s, &ga, &gb, Some(&gbias), &c, Some(variant)).await?;
    let mut want = vec![0.0; s.c_len()];
    reference::matmul::matmul(&s, &a, &b, Some(&bias), &mut want);
    close(run_and_read(ctx, &ds, &[&c]).await?, want)
}

const LN: (usize, usize) = (5, 67); // (rows, C)

async fn layernorm_forward(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let (rows, c) = LN;
    let x: Vec<f32> = rand_vec(rows * c, 7).iter().map(|v| 3.0 * v + 1.0).collect();
    let (gamma, beta) = (rand_vec(c, 8), rand_vec(c, 9));
    let (out, mean, rstd) = (
        ctx.zeros("out", rows * c)?,
        ctx.zeros("mean", rows)?,
        ctx.zeros("rstd", rows)?,
    );
    let (gx, gg, gb) = (
        ctx.upload("x", &x)?,
        ctx.upload("gamma", &gamma)?,
        ctx.upload("beta", &beta)?,
    );
    let b = kernels::layernorm::ForwardBuffers {
        x: &gx,
        gamma: &gg,
        beta: &gb,
        out: &out,
        mean: &mean,
        rstd: &rstd,
        residual: None,
    };
    let shape = LayerNormShape::new(rows, c);
    let d = kernels::layernorm::forward(ctx, &b, shape, None).await?;
    let (want, want_mean, want_rstd) = reference::layernorm::forward(&x, &gamma, &beta, shape);
    let got = run_and_read(ctx, &[d], &[&out, &mean, &rstd]).await?;
    close(got, [want, want_mean, want_rstd].concat())
}

async fn layernorm_backward(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let (rows, c) = LN;
    let x = rand_vec(rows * c, 10);
    let (gamma, dout) = (rand_vec(c, 11), rand_vec(rows * c, 12));
    let shape = LayerNormShape::new(rows, c);
    let (_, mean, rstd) = reference::layernorm::forward(&x, &gamma, &vec![0.0; c], shape);
    let (want_dx, want_dg, want_db) = reference::layernorm::backward(&dout, &x, &mean, &rstd, &gamma, shape);
    let (gdout, gx, gg) = (
        ctx.upload("dout", &dout)?,
        ctx.upload("x", &x)?,
        ctx.upload("gamma", &gamma)?,
    );
    let (gmean, grstd) = (ctx.upload("mean", &mean)?, ctx.upload("rstd", &rstd)?);
    let (dx, dg, db) = (
        ctx.zeros("dx", rows * c)?,
        ctx.zeros("dgamma", c)?,
        ctx.zeros("dbeta", c)?,
    );
    let b = kernels::layernorm::BackwardBuffers {
        dout: &gdout,
        x: &gx,
        mean: &gmean,
        rstd: &grstd,
        gamma: &gg,
        dx: &dx,
        dgamma: &dg,
        dbeta: &db,
    };
    let ds = kernels::layernorm::backward(ctx, &b, shape, None).await?;
    let got = run_and_read(ctx, &ds, &[&dx, &dg, &db]).await?;
    close(got, [want_dx, want_dg, want_db].concat())
}

fn gelu_input(n: usize) -> Vec<f32> {
    rand_vec(n, 13).iter().map(|v| 8.0 * v).collect()
}

async fn gelu_forward(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let n = 1023;
    let x = gelu_input(n);
    let (gx, out) = (ctx.upload("x", &x)?, ctx.zeros("out", n)?);
    let d = kernels::gelu::forward(ctx, &gx, &out, n).await?;
    close(run_and_read(ctx, &[d], &[&out]).await?, reference::gelu::forward(&x))
}

async fn gelu_backward(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let n = 1023;
    let (x, dout) = (gelu_input(n), rand_vec(n, 14));
    let (gx, gd, dx) = (ctx.upload("x", &x)?, ctx.upload("dout", &dout)?, ctx.zeros("dx", n)?);
    let d = kernels::gelu::backward(ctx, &gx, &gd, &dx, n).await?;
    close(
        run_and_read(ctx, &[d], &[&dx]).await?,
        reference::gelu::backward(&x, &dout),
    )
}

const SOFTMAX: (usize, usize) = (2 * 17, 17); // (rows = B*H*T, T)

async fn softmax_forward(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let (rows, t) = SOFTMAX;
    let s: Vec<f32> = rand_vec(rows * t, 15).iter().map(|v| 8.0 * v).collect();
    // Stale values where the mask is must be overwritten with 0.
    let (gs, p) = (ctx.upload("s", &s)?, ctx.upload("p", &vec![9.0f32; rows * t])?);
    let d = kernels::softmax::causal_forward(ctx, &gs, &p, rows, t, None).await?;
    close(
        run_and_read(ctx, &[d], &[&p]).await?,
        reference::softmax::causal_forward(&s, rows, t),
    )
}

async fn softmax_backward(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let (rows, t) = SOFTMAX;
    let s: Vec<f32> = rand_vec(rows * t, 16).iter().map(|v| 4.0 * v).collect();
    let p = reference::softmax::causal_forward(&s, rows, t);
    let dp = rand_vec(rows * t, 17);
    let (gp, gdp, ds) = (
        ctx.upload("p", &p)?,
        ctx.upload("dp", &dp)?,
        ctx.upload("ds", &vec![9.0f32; rows * t])?,
    );
    let d = kernels::softmax::causal_backward(ctx, &gp, &gdp, &ds, rows, t, None).await?;
    close(
        run_and_read(ctx, &[d], &[&ds]).await?,
        reference::softmax::causal_backward(&p, &dp, rows, t),
    )
}

/// Past one 16-row tile of keys, a head dimension that is not a power of two.
const ATTENTION: AttentionShape = AttentionShape {
    heads: 3,
    t: 17,
    dh: 24,
    scale: 0.2,
    rate: 0.25,
};

async fn attention(
    ctx: &GpuContext,
    backward: bool,
    kernels: kernels::attention::Kernels,
) -> Result<Outcome, GpuError> {
    let s = ATTENTION;
    let n = s.heads * s.t * s.dh;
    let (q, k, v, d_o) = (rand_vec(n, 40), rand_vec(n, 41), rand_vec(n, 42), rand_vec(n, 43));
    let bits = reference::random::random_bits(Key::from_seed(5), RngLayout::Partitionable, &[s.heads, s.t, s.t]);
    let (o, lse) = reference::attention::forward(&q, &k, &v, Some(&bits), s);
    let [gq, gk, gv, gbits] = [
        ctx.upload("q", &q)?,
        ctx.upload("k", &k)?,
        ctx.upload("v", &v)?,
        ctx.upload("bits", &bits)?,
    ];
    let dropout = kernels::attention::Dropout::Bits(&gbits);
    let whole = [kernels::attention::Blocks::whole(s.t)];
    if !backward {
        let (go, glse) = (ctx.upload("o", &vec![9.0f32; n])?, ctx.zeros("lse", s.heads * s.t)?);
        let b = kernels::attention::Forward {
            q: &gq,
            k: &gk,
            v: &gv,
            dropout,
            o: &go,
            lse: &glse,
            blocks: &whole,
            layouts: None,
        };
        let d = kernels::attention::forward(ctx, &b, &s, kernels).await?;
        return close(run_and_read(ctx, &[d], &[&go, &glse]).await?, [o, lse].concat());
    }
    let saved = reference::attention::Saved {
        o: &o,
        lse: &lse,
        d_o: &d_o,
        bits: Some(&bits),
    };
    let want = reference::attention::backward(&q, &k, &v, &saved, s).concat();
    let [go, glse, gdo] = [ctx.upload("o", &o)?, ctx.upload("lse", &lse)?, ctx.upload("do", &d_o)?];
    let rows = ctx.zeros("rows", kernels::attention::rows_len(&s))?;
    let [dq, dk, dv] = [ctx.zeros("dq", n)?, ctx.zeros("dk", n)?, ctx.zeros("dv", n)?];
    let b = kernels::attention::Backward {
        q: &gq,
        k: &gk,
        v: &gv,
        o: &go,
        lse: &glse,
        d_o: &gdo,
        dropout,
        rows: &rows,
        dq: &dq,
        dk: &dk,
        dv: &dv,
        blocks: &whole,
        layouts: None,
    };
    let ds = kernels::attention::backward(ctx, &b, &s, kernels).await?;
    close(run_and_read(ctx, &ds, &[&dq, &dk, &dv]).await?, want)
}

const CE: (usize, usize) = (7, 65); // (rows, V)

fn ce_inputs() -> (Vec<f32>, Vec<u32>) {
    let (rows, v) = CE;
    (
        rand_vec(rows * v, 18).iter().map(|x| 4.0 * x).collect(),
        ids(rows, v, 19),
    )
}

async fn crossentropy_forward(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let (rows, v) = CE;
    let (logits, targets) = ce_inputs();
    let (gl, gt, losses) = (
        ctx.upload("logits", &logits)?,
        ctx.upload("targets", &targets)?,
        ctx.zeros("losses", rows)?,
    );
    let d = kernels::crossentropy::forward(ctx, &gl, &gt, &losses, rows, v, None).await?;
    let want = reference::crossentropy::forward(&logits, &targets, rows, v);
    close(run_and_read(ctx, &[d], &[&losses]).await?, want)
}

async fn crossentropy_backward(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let (rows, v) = CE;
    let (logits, targets) = ce_inputs();
    let dlosses = rand_vec(rows, 20);
    let (gl, gt, gdl) = (
        ctx.upload("logits", &logits)?,
        ctx.upload("targets", &targets)?,
        ctx.upload("dlosses", &dlosses)?,
    );
    let dlogits = ctx.zeros("dlogits", rows * v)?;
    let b = kernels::crossentropy::BackwardBuffers {
        logits: &gl,
        targets: &gt,
        dlosses: &gdl,
        dlogits: &dlogits,
    };
    let d = kernels::crossentropy::backward(ctx, &b, rows, v, None).await?;
    let want = reference::crossentropy::backward(&logits, &targets, &dlosses, rows, v);
    close(run_and_read(ctx, &[d], &[&dlogits]).await?, want)
}

const EMB: (usize, usize, usize) = (17, 13, 33); // (N, V, C)

async fn embedding_forward(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let (n, v, c) = EMB;
    let (table, id) = (rand_vec(v * c, 21), ids(n, v, 22));
    let (gtable, gids, out) = (
        ctx.upload("table", &table)?,
        ctx.upload("ids", &id)?,
        ctx.zeros("out", n * c)?,
    );
    let shape = EmbeddingShape::new(n, v, c);
    let d = kernels::embedding::forward(ctx, &gtable, &gids, &out, shape).await?;
    close(
        run_and_read(ctx, &[d], &[&out]).await?,
        reference::embedding::forward(&table, &id, shape),
    )
}

async fn embedding_backward(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let (n, v, c) = EMB;
    let (dout, id) = (rand_vec(n * c, 23), ids(n, v, 24));
    let (gdout, gids) = (ctx.upload("dout", &dout)?, ctx.upload("ids", &id)?);
    let dtable = ctx.upload("dtable", &vec![7.0f32; v * c])?; // must be overwritten, not accumulated
    let shape = EmbeddingShape::new(n, v, c);
    let d = kernels::embedding::backward(ctx, &gdout, &gids, &dtable, shape).await?;
    close(
        run_and_read(ctx, &[d], &[&dtable]).await?,
        reference::embedding::backward(&dout, &id, shape),
    )
}

async fn sum_axis(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let (outer, n, inner) = (3, 130, 65); // three chunks, the last one short
    let x = rand_vec(outer * n * inner, 25);
    let (gx, out) = (ctx.upload("x", &x)?, ctx.upload("out", &vec![7.0f32; outer * inner])?);
    let ds = kernels::reduce::sum_axis(ctx, &gx, &out, (outer, n, inner), None).await?;
    close(
        run_and_read(ctx, &ds, &[&out]).await?,
        reference::reduce::sum_axis(&x, outer, n, inner),
    )
}

async fn copy_transpose(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let (r, c) = (17, 33);
    let src = rand_vec(r * c, 26);
    let (gsrc, gdst) = (ctx.upload("src", &src)?, ctx.zeros("dst", r * c)?);
    let transpose = Strided::new(&[r, c], &[c, 1], &[1, r]);
    let d = kernels::copy::strided(ctx, &gsrc, &gdst, &transpose).await?;
    let mut want = vec![0.0; r * c];
    reference::copy::strided(&src, &mut want, &transpose);
    close(run_and_read(ctx, &[d], &[&gdst]).await?, want)
}

const RNG_SHAPE: [usize; 2] = [3, 67];

fn rng_key(ctx: &GpuContext) -> Result<(Key, GpuBuffer), GpuError> {
    let key = Key::from_seed(42).fold_in(7);
    Ok((key, ctx.upload("key", &key.0)?))
}

async fn random_bits(ctx: &GpuContext, layout: RngLayout) -> Result<Outcome, GpuError> {
    let (key, gkey) = rng_key(ctx)?;
    let block = Block::full(&RNG_SHAPE);
    let bits = ctx.zeros("bits", block.numel())?;
    let draw = Draw {
        layout,
        blocks: &[block],
        keys: KeyMode::Shared,
    };
    let d = kernels::random::random_bits(ctx, &gkey, &bits, &draw).await?;
    ctx.run(&[d]);
    let got = ctx.read::<u32>(&bits).await?;
    Ok(Outcome::Exact {
        got,
        want: reference::random::random_bits(key, layout, &RNG_SHAPE),
    })
}

/// Dropout (forward, or backward regenerating the mask) of the partitionable layout.
async fn dropout(ctx: &GpuContext, backward: bool) -> Result<Outcome, GpuError> {
    let (key, gkey) = rng_key(ctx)?;
    let (layout, rate, block) = (RngLayout::Partitionable, 0.25, Block::full(&RNG_SHAPE));
    let x = rand_vec(block.numel(), 27);
    let (gx, out) = (ctx.upload("x", &x)?, ctx.zeros("out", block.numel())?);
    let blocks = [block.clone()];
    let draw = Draw {
        layout,
        blocks: &blocks,
        keys: KeyMode::Shared,
    };
    let d = if backward {
        kernels::random::dropout_backward(ctx, &gx, &gkey, &out, &draw, rate).await?
    } else {
        kernels::random::dropout_forward(ctx, &gx, &gkey, &out, &draw, rate).await?
    };
    let want = if backward {
        reference::random::dropout_backward(&x, key, layout, &block, rate)
    } else {
        reference::random::dropout_forward(&x, key, layout, &block, rate)
    }
    .map_err(|e| GpuError::Invalid(e.to_string()))?;
    close(run_and_read(ctx, &[d], &[&out]).await?, want)
}

async fn dropout_apply(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let (n, rate) = (201, 0.1);
    let x = rand_vec(n, 28);
    let bits = reference::random::random_bits(Key::from_seed(3), RngLayout::Partitionable, &[n]);
    let (gx, gbits, out) = (ctx.upload("x", &x)?, ctx.upload("bits", &bits)?, ctx.zeros("out", n)?);
    let d = kernels::dropout::apply(ctx, &gx, &gbits, &out, n, rate).await?;
    close(
        run_and_read(ctx, &[d], &[&out]).await?,
        reference::dropout::apply(&x, &bits, rate),
    )
}

async fn sgd(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let n = 1023;
    let (mut p, g) = (rand_vec(n, 29), rand_vec(n, 30));
    let (param, grad) = (ctx.upload("param", &p)?, ctx.upload("grad", &g)?);
    let hyper = ctx.upload("hyper", &kernels::optimizer::sgd_hyper(0.1))?;
    let d = kernels::optimizer::sgd(ctx, &param, &grad, &hyper, n).await?;
    reference::optimizer::sgd(&mut p, &g, 0.1);
    close(run_and_read(ctx, &[d], &[&param]).await?, p)
}

/// Two AdamW steps (the second sees non-zero moments) of two parameters packed in one launch:
/// one with weight decay, one without, the second starting on the next block.
async fn adamw(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    use kernels::optimizer::{AdamWHyper, Segment, ADAMW_HYPER_LEN, ADAMW_WEIGHT_DECAY, UPDATE_BLOCK};
    let (n0, n1) = (1023, 300);
    let segments = [
        Segment {
            start: 0,
            len: n0,
            weight_decay: ADAMW_WEIGHT_DECAY,
        },
        Segment {
            start: n0.next_multiple_of(UPDATE_BLOCK),
            len: n1,
            weight_decay: 0.0,
        },
    ];
    let n = segments[1].start + n1;
    let mut p = rand_vec(n, 31);
    p[n0..segments[1].start].fill(0.0);
    let (mut m, mut v) = (vec![0.0; n], vec![0.0; n]);
    let (param, grad) = (ctx.upload("param", &p)?, ctx.zeros("grad", n)?);
    let (gm, gv, hyper) = (
        ctx.zeros("m", n)?,
        ctx.zeros("v", n)?,
        ctx.zeros("hyper", ADAMW_HYPER_LEN)?,
    );
    let b = kernels::optimizer::AdamWBuffers {
        param: &param,
        grad: &grad,
        m: &gm,
        v: &gv,
        hyper: &hyper,
    };
    let d = kernels::optimizer::adamw(ctx, &b, &segments).await?;
    for step in 1..=2u32 {
        let mut g = rand_vec(n, 31 + step);
        g[n0..segments[1].start].fill(0.0);
        let h = AdamWHyper::at(1e-2, step)?;
        ctx.write(&grad, &g);
        ctx.write(&hyper, &h.words());
        ctx.run(std::slice::from_ref(&d));
        for s in &segments {
            let r = s.start..s.start + s.len;
            reference::optimizer::adamw(
                &mut p[r.clone()],
                &g[r.clone()],
                &mut m[r.clone()],
                &mut v[r],
                &h,
                s.weight_decay,
            );
        }
    }
    let got = run_and_read(ctx, &[], &[&param, &gm, &gv]).await?;
    close(got, [p, m, v].concat())
}

const COLLECTIVE_SHAPE: &str = "2x4 mesh over tp, local (3, 8) on 8 devices";

/// One collective on a dp=2, tp=4 mesh over tp against its twin: all_gather, psum_scatter and
/// all_to_all along dimension 1, ppermute as a cyclic shift.
async fn collective(ctx: &GpuContext, op: Collective) -> Result<Outcome, GpuError> {
    use kernels::collectives as k;
    use reference::collectives as r;
    let mesh = crate::sharding::Mesh::new(&[("dp", 2), ("tp", 4)])?;
    let (axes, shape, perm) = (&["tp"][..], [3, 8], [(0, 1), (1, 2), (2, 3), (3, 0)]);
    let c = k::CollectiveArgs {
        mesh: &mesh,
        axes,
        local_shape: &shape,
    };
    let x = rand_vec(mesh.devices() * 24, 40);
    let want = match op {
        Collective::Psum => r::psum(&c, &x),
        Collective::Pmean => r::pmean(&c, &x),
        Collective::AllGather => r::all_gather(&c, &x, 1, true),
        Collective::PsumScatter => r::psum_scatter(&c, &x, 1, true),
        Collective::Ppermute => r::ppermute(&c, &x, &perm),
        Collective::AllToAll => r::all_to_all(&c, &x, 1, 0, true),
    }?;
    let (gx, out) = (ctx.upload("x", &x)?, ctx.zeros("out", want.len())?);
    let d = match op {
        Collective::Psum => k::psum(ctx, &c, &gx, &out).await?,
        Collective::Pmean => k::pmean(ctx, &c, &gx, &out).await?,
        Collective::AllGather => k::all_gather(ctx, &c, &gx, &out, 1, true).await?,
        Collective::PsumScatter => k::psum_scatter(ctx, &c, &gx, &out, 1, true).await?,
        Collective::Ppermute => k::ppermute(ctx, &c, &gx, &out, &perm).await?,
        Collective::AllToAll => k::all_to_all(ctx, &c, &gx, &out, 1, 0, true).await?,
    };
    close(run_and_read(ctx, &[d], &[&out]).await?, want)
}

const PACKED_SHAPE: &str = "2x4 mesh over tp, arrays of 300 and 24 per device in an arena, with gaps";

/// psum of two arrays packed in one arena, in place, on the self-test's dp=2, tp=4 mesh; the gaps
/// around them must keep their values.
async fn psum_packed(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let mesh = crate::sharding::Mesh::new(&[("dp", 2), ("tp", 4)])?;
    let axes = &["tp"][..];
    let arrays = [(5, 300), (5 + 8 * 300 + 7, 24)];
    let arena = rand_vec(arrays[1].0 + 8 * 24 + 3, 44);
    let mut want = arena.clone();
    reference::collectives::psum_packed(&mesh, axes, &mut want, &arrays)?;
    let g = ctx.upload("arena", &arena)?;
    let d = kernels::collectives::psum_packed(ctx, &mesh, axes, &g, &arrays).await?;
    close(run_and_read(ctx, &[d], &[&g]).await?, want)
}

/// `axis_index` over tp on the self-test's dp=2, tp=4 mesh.
async fn axis_index(ctx: &GpuContext) -> Result<Outcome, GpuError> {
    let mesh = crate::sharding::Mesh::new(&[("dp", 2), ("tp", 4)])?;
    let axes = &["tp"][..];
    let out = ctx.zeros("axis index", mesh.devices())?;
    let d = kernels::collectives::axis_index(ctx, &mesh, axes, &out).await?;
    ctx.run(&[d]);
    let got = ctx.read::<u32>(&out).await?;
    Ok(Outcome::Exact {
        got,
        want: reference::collectives::axis_index(&mesh, axes)?,
    })
}
