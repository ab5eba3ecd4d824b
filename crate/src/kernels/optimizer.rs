//! Launchers of shaders/optimizer.wgsl: SGD and AdamW updates in place.
//!
//! Step-dependent scalars live in a small `hyper` storage buffer that the host rewrites each
//! step (`ctx.write(&hyper, &adamw_hyper(lr, step)?)`), so the [`Dispatch`] of every parameter
//! is built once and replayed. The layouts are [`sgd_hyper`] and [`AdamWHyper`], defined with
//! the CPU twins in [`crate::reference::optimizer`].
//!
//! One launch updates many parameters when their param, grad and moment buffers are arenas laid
//! out alike: each parameter a [`Segment`] starting on an [`UPDATE_BLOCK`] boundary (the gaps
//! hold zeros, which every update keeps at zero), so the executor needs a few dispatches per
//! step instead of one per parameter.
use super::check::vec4_ok;
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
pub use crate::reference::optimizer::{
    sgd_hyper, AdamWHyper, OptimizerError, ADAMW_B1, ADAMW_B2, ADAMW_EPS, ADAMW_HYPER_LEN, ADAMW_WEIGHT_DECAY,
    SGD_HYPER_LEN,
};

impl From<OptimizerError> for GpuError {
    fn from(e: OptimizerError) -> Self {
        GpuError::Invalid(e.to_string())
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    pad: [u32; 3],
}

/// Elements of a weight-decay block (the kernels' workgroup size): a packed parameter starts on
/// a block boundary, so every block has one weight decay. 1 KiB, a multiple of every adapter's
/// `min_storage_buffer_offset_alignment` (at most 256 bytes), so an arena's segments are also
/// bindable views.
pub const UPDATE_BLOCK: usize = 256;

/// One parameter of a packed AdamW update: `len` elements from element `start` of each buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Segment {
    /// A multiple of [`UPDATE_BLOCK`].
    pub start: usize,
    pub len: usize,
    /// [`ADAMW_WEIGHT_DECAY`] for 2-D weights, else 0.
    pub weight_decay: f32,
}

/// The weight decay of every [`UPDATE_BLOCK`] of `segments` (gaps: 0), and the elements they
/// span; refuses segments off a block boundary, unordered or overlapping.
pub fn decay_table(segments: &[Segment]) -> Result<(Vec<f32>, usize), GpuError> {
    let mut end = 0;
    let mut table = vec![];
    for s in segments {
        if s.start % UPDATE_BLOCK != 0 || s.start < end || s.len == 0 {
            return Err(GpuError::Invalid(format!(
                "packed update: segment of {} elements at {} must start on a {UPDATE_BLOCK}-element block, after the \
                 previous segment's end {end}",
                s.len, s.start
            )));
        }
        end = s.start + s.len;
        table.resize(s.start / UPDATE_BLOCK, 0.0);
        table.resize(end.div_ceil(UPDATE_BLOCK), s.weight_decay);
    }
    Ok((table, end))
}

/// `adamw_hyper(lr, step)` = `AdamWHyper::at(lr, step)?.words()`.
pub fn adamw_hyper(lr: f32, step: u32) -> Result<[f32; ADAMW_HYPER_LEN], GpuError> {
    Ok(AdamWHyper::at(lr, step)?.words())
}

fn check(what: &str, bufs: &[(&GpuBuffer, usize)]) -> Result<(), GpuError> {
    for (b, need) in bufs {
        if b.len < *need {
            return Err(GpuError::Invalid(format!(
                "{what}: buffer `{}` holds {} elements, needs {need}",
                b.name, b.len
            )));
        }
    }
    Ok(())
}

/// `param -= lr * grad` in place over n elements; hyper: [`sgd_hyper`].
pub async fn sgd(
    ctx: &GpuContext,
    param: &GpuBuffer,
    grad: &GpuBuffer,
    hyper: &GpuBuffer,
    n: usize,
) -> Result<Dispatch, GpuError> {
    check("sgd", &[(param, n), (grad, n), (hyper, SGD_HYPER_LEN)])?;
    let params = Params {
        n: n as u32,
        pad: [0; 3],
    };
    let kernel = Kernel::new("optimizer", "sgd", format!("sgd n={n}"))
        .write(0, "param", param)
        .read(1, "grad", grad)
        .read(4, "hyper", hyper)
        .uniform(5, &params)
        .grid(grid_1d(n, 256));
    ctx.launch(kernel).await
}

/// The buffers of one AdamW update, all updated in place but `grad` and `hyper`.
pub struct AdamWBuffers<'a> {
    pub param: &'a GpuBuffer,
    pub grad: &'a GpuBuffer,
    /// First moment (starts at 0).
    pub m: &'a GpuBuffer,
    /// Second moment (starts at 0).
    pub v: &'a GpuBuffer,
    /// [`AdamWHyper`] words, rewritten every step.
    pub hyper: &'a GpuBuffer,
}

/// One AdamW update in place of param and its moments m, v over every segment at once (the
/// elements between segments are zeros in all four buffers and stay zeros).
pub async fn adamw(ctx: &GpuContext, b: &AdamWBuffers<'_>, segments: &[Segment]) -> Result<Dispatch, GpuError> {
    let (table, n) = decay_table(segments)?;
    check(
        "adamw",
        &[
            (b.param, n),
            (b.grad, n),
            (b.m, n),
            (b.v, n),
            (b.hyper, ADAMW_HYPER_LEN),
        ],
    )?;
    let params = Params {
        n: n as u32,
        pad: [0; 3],
    };
    let label = match segments {
        [_] => format!("adamw n={n}"),
        _ => format!("adamw n={n} ({} parameters)", segments.len()),
    };
    let decay = ctx.upload("adamw weight decay per block", &table)?;
    // Four elements per invocation (`adamw4`) where n and every binding's start allow vec4s.
    let vec4 = vec4_ok(n, &[b.param, b.grad, b.m, b.v]);
    let (entry, shift, invocations) = if vec4 { ("adamw4", 10, n / 4) } else { ("adamw", 0, n) };
    let kernel = Kernel::new("optimizer", entry, label)
        .write(shift, "param", b.param)
        .read(1 + shift, "grad", b.grad)
        .write(2 + shift, "m", b.m)
        .write(3 + shift, "v", b.v)
        .read(4, "hyper", b.hyper)
        .uniform(5, &params)
        .read_owned(6, "decay", decay)
        .grid(grid_1d(invocations, UPDATE_BLOCK as u32));
    ctx.launch(kernel).await
}
