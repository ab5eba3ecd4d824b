//! Dropout from given random bits (shaders/dropout.wgsl).
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
use crate::rng::keep_scale;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    keep: f32,
    scale: f32,
    pad: u32,
}

/// `out = keep ? x * keep_scale : 0` with keep from JAX-style random `bits` (n elements):
/// the forward of dropout, and (applied to dy with the same bits) its backward.
pub async fn apply(
    ctx: &GpuContext,
    x: &GpuBuffer,
    bits: &GpuBuffer,
    out: &GpuBuffer,
    n: usize,
    rate: f32,
) -> Result<Dispatch, GpuError> {
    if !(0.0..1.0).contains(&rate) {
        return Err(GpuError::Invalid(format!("dropout rate {rate} must be in [0, 1)")));
    }
    let params = Params {
        n: n as u32,
        keep: 1.0 - rate,
        scale: keep_scale(1.0 - rate),
        pad: 0,
    };
    let kernel = Kernel::new("dropout", "apply", format!("dropout n={n}"))
        .read(0, "x", x)
        .read(1, "bits", bits)
        .write(2, "out", out)
        .uniform(3, &params)
        .grid(grid_1d(n, 256));
    ctx.launch(kernel).await
}
