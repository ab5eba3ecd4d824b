//! The adapter's ceilings (shaders/ceiling.wgsl): `fma_peak`, arithmetic with no memory traffic, and
//! `copy4`, the best storage-buffer access. `shardlab bench` reads every kernel against them.
use super::check::{need, positive, vec4_ok};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
pub use crate::reference::ceiling::FMA_PEAK_FLOPS_PER_TRIP;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    iters: u32,
    m: f32,
    c: f32,
}

/// The most `fma_peak` invocations one launch takes: 65535 workgroups of 64, unfolded, so every
/// invocation launched is one that stores and the FLOP count is exact.
pub const FMA_PEAK_MAX_INVOCATIONS: usize = 65535 * 64;

/// `invocations` (a multiple of 64) each run `iters` loop trips of `x = fma(x, m, c)` on 16 vec4
/// accumulators ([`FMA_PEAK_FLOPS_PER_TRIP`] FLOPs a trip) and store their sum, one vec4 each, in
/// `out` (at least 4 x invocations floats). The twin is `reference::ceiling::fma_peak`.
pub async fn fma_peak(
    ctx: &GpuContext,
    out: &GpuBuffer,
    invocations: usize,
    iters: usize,
    m: f32,
    c: f32,
) -> Result<Dispatch, GpuError> {
    let k = "ceiling::fma_peak";
    positive(k, "invocations", invocations)?;
    if !invocations.is_multiple_of(64) || invocations > FMA_PEAK_MAX_INVOCATIONS {
        return Err(GpuError::Invalid(format!(
            "{k}: {invocations} invocations; give a multiple of 64 up to {FMA_PEAK_MAX_INVOCATIONS}"
        )));
    }
    let iters = u32::try_from(iters)
        .map_err(|_| GpuError::Invalid(format!("{k}: {iters} loop trips is over 2^32; give fewer")))?;
    need(k, "out", out, 4 * invocations)?;
    let params = Params {
        n: invocations as u32,
        iters,
        m,
        c,
    };
    let kernel = Kernel::new("ceiling", "fma_peak", format!("fma_peak x{invocations} iters {iters}"))
        .write(1, "dst", out)
        .uniform(2, &params)
        .grid(grid_1d(invocations, 64));
    ctx.launch(kernel).await
}

/// dst = src over `n` floats (a multiple of 4), one vec4 per invocation. The twin is
/// `reference::ceiling::copy4`.
pub async fn copy4(ctx: &GpuContext, src: &GpuBuffer, dst: &GpuBuffer, n: usize) -> Result<Dispatch, GpuError> {
    let k = "ceiling::copy4";
    positive(k, "n", n)?;
    if !vec4_ok(n, &[src, dst]) {
        return Err(GpuError::Invalid(format!(
            "{k}: {n} floats from `{}` to `{}`; give a multiple of 4, both bindings starting on 16 bytes",
            src.name, dst.name
        )));
    }
    if n / 4 > u32::MAX as usize {
        return Err(GpuError::Invalid(format!(
            "{k}: {n} floats is over the index range; copy fewer"
        )));
    }
    need(k, "src", src, n)?;
    need(k, "dst", dst, n)?;
    let params = Params {
        n: (n / 4) as u32,
        iters: 0,
        m: 0.0,
        c: 0.0,
    };
    let kernel = Kernel::new("ceiling", "copy4", format!("copy4 n={n}"))
        .read(0, "src", src)
        .write(1, "dst", dst)
        .uniform(2, &params)
        .grid(grid_1d(n / 4, 256));
    ctx.launch(kernel).await
}
