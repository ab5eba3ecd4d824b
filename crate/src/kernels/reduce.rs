//! Reductions (shaders/reduce.wgsl).
use super::check::need;
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    outer: u32,
    n: u32,
    inner: u32,
    _pad: u32,
}

/// `out (outer, inner) = sum over n of x (outer, n, inner)`; bias gradients are
/// `sum_axis(dy, out, 1, B*T, C)`. Deterministic: each output sums its column in order.
pub async fn sum_axis(
    ctx: &GpuContext,
    x: &GpuBuffer,
    out: &GpuBuffer,
    outer: usize,
    n: usize,
    inner: usize,
) -> Result<Dispatch, GpuError> {
    let k = "reduce::sum_axis";
    need(k, "x", x, outer * n * inner)?;
    need(k, "out", out, outer * inner)?;
    let params = Params {
        outer: outer as u32,
        n: n as u32,
        inner: inner as u32,
        _pad: 0,
    };
    let kernel = Kernel::new("reduce", "sum_axis", format!("sum_axis ({outer}, {n}, {inner})"))
        .read(0, "x", x)
        .write(1, "out", out)
        .uniform(2, &params)
        .grid(grid_1d(outer * inner, 256));
    ctx.launch(kernel).await
}
