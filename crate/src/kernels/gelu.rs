//! GELU, tanh form (shaders/gelu.wgsl).
use super::check::need;
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    _pad: [u32; 3],
}

fn params(n: usize) -> Params {
    Params {
        n: n as u32,
        _pad: [0; 3],
    }
}

/// `out = GELU(x)` over `n` elements.
pub async fn forward(ctx: &GpuContext, x: &GpuBuffer, out: &GpuBuffer, n: usize) -> Result<Dispatch, GpuError> {
    need("gelu::forward", "x", x, n)?;
    need("gelu::forward", "out", out, n)?;
    let kernel = Kernel::new("gelu", "forward", format!("gelu n={n}"))
        .read(0, "x", x)
        .write(1, "out", out)
        .uniform(4, &params(n))
        .grid(grid_1d(n, 256));
    ctx.launch(kernel).await
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
    let kernel = Kernel::new("gelu", "backward", format!("gelu backward n={n}"))
        .read(0, "x", x)
        .read(2, "dout", dout)
        .write(3, "dx", dx)
        .uniform(4, &params(n))
        .grid(grid_1d(n, 256));
    ctx.launch(kernel).await
}
