//! Elementwise kernels (shaders/elementwise.wgsl).
use super::check::{need, vec4_ok};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
pub use crate::reference::elementwise::{Binary, BinaryArgs};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    nb: u32,
    alpha: f32,
    beta: f32,
    nl: u32,
    _pad: [u32; 3],
}

/// Params of one device holding all `n` elements (`b` unused or not per device).
fn single(n: usize, nb: usize, alpha: f32, beta: f32) -> Params {
    Params {
        n: n as u32,
        nb: nb as u32,
        alpha,
        beta,
        nl: n as u32,
        _pad: [0; 3],
    }
}

/// `out = alpha*a + beta*b` or `out = alpha*a*b` on `args.devices` simulated devices in one
/// dispatch: a, out (D, n / D); b (D, nb), device d's block of `b` repeating over its own block
/// of `a`. `n` counts all devices' elements; `nb` is the period within one device and must
/// divide n / D.
pub async fn binary(
    ctx: &GpuContext,
    a: &GpuBuffer,
    b: &GpuBuffer,
    out: &GpuBuffer,
    args: &BinaryArgs,
) -> Result<Dispatch, GpuError> {
    let k = "elementwise::binary";
    let BinaryArgs {
        op,
        n,
        nb,
        alpha,
        beta,
        devices,
    } = *args;
    if devices == 0 || !n.is_multiple_of(devices) {
        return Err(GpuError::Invalid(format!(
            "{k}: {n} elements do not split evenly over {devices} devices; n counts all devices' elements \
             (devices x local size)"
        )));
    }
    let nl = n / devices;
    if nb == 0 || !nl.is_multiple_of(nb) {
        return Err(GpuError::Invalid(format!(
            "{k}: the period {nb} of `b` does not divide the {nl} elements of one device's block of `a` \
             ({n} over {devices} devices)"
        )));
    }
    need(k, "a", a, n)?;
    need(k, "b", b, devices * nb)?;
    need(k, "out", out, n)?;
    let entry = match op {
        Binary::Add => "add",
        Binary::Mul => "mul",
    };
    // Four elements per invocation where every block of four stays inside one period of `b`
    // and the bindings start on 16 bytes (the shader's add4 / mul4).
    let vec4 = vec4_ok(nb, &[a, b, out]);
    let label = if devices == 1 {
        format!("{entry} n={n}")
    } else {
        format!("{entry} n={n} devices={devices}")
    };
    let params = Params {
        nl: nl as u32,
        ..single(n, nb, alpha, beta)
    };
    let kernel = if vec4 {
        let entry = match op {
            Binary::Add => "add4",
            Binary::Mul => "mul4",
        };
        Kernel::new("elementwise", entry, label)
            .read(4, "a", a)
            .read(5, "b", b)
            .write(6, "out", out)
            .uniform(3, &params)
            .grid(grid_1d(n / 4, 256))
    } else {
        Kernel::new("elementwise", entry, label)
            .read(0, "a", a)
            .read(1, "b", b)
            .write(2, "out", out)
            .uniform(3, &params)
            .grid(grid_1d(n, 256))
    };
    ctx.launch(kernel).await
}

/// `out = alpha * a + beta`.
pub async fn scale(
    ctx: &GpuContext,
    a: &GpuBuffer,
    out: &GpuBuffer,
    n: usize,
    alpha: f32,
    beta: f32,
) -> Result<Dispatch, GpuError> {
    let kernel = Kernel::new("elementwise", "scale", format!("scale n={n}"))
        .read(0, "a", a)
        .write(2, "out", out)
        .uniform(3, &single(n, 1, alpha, beta))
        .grid(grid_1d(n, 256));
    ctx.launch(kernel).await
}

/// `out = value` on the blocks of the devices `flags` marks (one f32 per device, nonzero:
/// fill), each device holding `nl` of the `n` elements: the blocks a pipeline stage's work
/// skipped, made zero where another stage reads them.
pub async fn fill_blocks(
    ctx: &GpuContext,
    out: &GpuBuffer,
    flags: &GpuBuffer,
    (n, nl): (usize, usize),
    value: f32,
) -> Result<Dispatch, GpuError> {
    let k = "elementwise::fill_blocks";
    if nl == 0 || !n.is_multiple_of(nl) {
        return Err(GpuError::Invalid(format!(
            "{k}: {n} elements are no whole number of device blocks of {nl}"
        )));
    }
    need(k, "out", out, n)?;
    need(k, "flags", flags, n / nl)?;
    let params = Params {
        nl: nl as u32,
        ..single(n, 1, 0.0, value)
    };
    let kernel = Kernel::new(
        "elementwise",
        "fill_blocks",
        format!("fill_blocks n={n} devices={}", n / nl),
    )
    .read(1, "flags", flags)
    .write(2, "out", out)
    .uniform(3, &params)
    .grid(grid_1d(n, 256));
    ctx.launch(kernel).await
}

/// `out = value` over `n` elements.
pub async fn fill(ctx: &GpuContext, out: &GpuBuffer, n: usize, value: f32) -> Result<Dispatch, GpuError> {
    let kernel = Kernel::new("elementwise", "fill", format!("fill n={n}"))
        .write(2, "out", out)
        .uniform(3, &single(n, 1, 0.0, value))
        .grid(grid_1d(n, 256));
    ctx.launch(kernel).await
}
