//! GELU, tanh form (shaders/gelu.wgsl).
use super::reduce::{launch, need};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    _pad: [u32; 3],
}

/// `out = GELU(x)` over `n` elements.
pub async fn forward(ctx: &GpuContext, x: &GpuBuffer, out: &GpuBuffer, n: usize) -> Result<Dispatch, GpuError> {
    need("gelu::forward", "x", x, n)?;
    need("gelu::forward", "out", out, n)?;
    let params = Params {
        n: n as u32,
        _pad: [0; 3],
    };
    launch(
        ctx,
        "gelu",
        "forward",
        format!("gelu n={n}"),
        &[(0, x), (1, out)],
        &params,
        4,
        grid_1d(n, 256),
    )
    .await
}

/// `dx = dout * GELU'(x)` over `n` elements.
pub async fn backward(
    ctx: &GpuContext,
    x: &GpuBuffer,
    dout: &GpuBuffer,
    dx: &GpuBuffer,
    n: usize,
) -> Result<Dispatch, GpuError> {
    need("gelu::backward", "x", x, n)?;
    need("gelu::backward", "dout", dout, n)?;
    need("gelu::backward", "dx", dx, n)?;
    let params = Params {
        n: n as u32,
        _pad: [0; 3],
    };
    let label = format!("gelu backward n={n}");
    launch(
        ctx,
        "gelu",
        "backward",
        label,
        &[(0, x), (2, dout), (3, dx)],
        &params,
        4,
        grid_1d(n, 256),
    )
    .await
}
