//! GELU, tanh form (shaders/gelu.wgsl).
use super::check::{need, vec4_ok};
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
/// `entry`, or its vec4 form (`entry4`, bindings + 10, a quarter of the invocations) where `n`
/// is a multiple of 4 and every binding starts on 16 bytes: (entry, binding shift, invocations).
fn layout(entry: &'static str, n: usize, bufs: &[&GpuBuffer]) -> (String, u32, usize) {
    if vec4_ok(n, bufs) {
        (format!("{entry}4"), 10, n / 4)
    } else {
        (entry.to_string(), 0, n)
    }
}

pub async fn forward(ctx: &GpuContext, x: &GpuBuffer, out: &GpuBuffer, n: usize) -> Result<Dispatch, GpuError> {
    need("gelu::forward", "x", x, n)?;
    need("gelu::forward", "out", out, n)?;
    let (entry, shift, invocations) = layout("forward", n, &[x, out]);
    let kernel = Kernel::new("gelu", entry, format!("gelu n={n}"))
        .read(shift, "x", x)
        .write(1 + shift, "out", out)
        .uniform(4, &params(n))
        .grid(grid_1d(invocations, 256));
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
    let (entry, shift, invocations) = layout("backward", n, &[x, dout, dx]);
    let kernel = Kernel::new("gelu", entry, format!("gelu backward n={n}"))
        .read(shift, "x", x)
        .read(2 + shift, "dout", dout)
        .write(3 + shift, "dx", dx)
        .uniform(4, &params(n))
        .grid(grid_1d(invocations, 256));
    ctx.launch(kernel).await
}
