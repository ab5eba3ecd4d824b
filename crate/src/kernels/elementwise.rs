use super::reduce::need;
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError};

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

/// Which elementwise kernel of shaders/elementwise.wgsl.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    /// out = alpha * a + beta * b[i % nb]
    Add,
    /// out = alpha * a * b[i % nb]
    Mul,
}

/// `out = alpha*a + beta*b` or `out = alpha*a*b`, `b` repeating with period `nb`.
/// a, out (n); b (nb). [`binary_devices`] with one device.
#[allow(clippy::too_many_arguments)]
pub async fn binary(
    ctx: &GpuContext,
    op: Binary,
    a: &GpuBuffer,
    b: &GpuBuffer,
    out: &GpuBuffer,
    n: usize,
    nb: usize,
    alpha: f32,
    beta: f32,
) -> Result<Dispatch, GpuError> {
    binary_devices(ctx, op, a, b, out, n, nb, alpha, beta, 1).await
}

/// [`binary`] on `devices` simulated devices in one dispatch: a, out (D, n / D); b (D, nb),
/// device d's block of `b` repeating over its own block of `a`. `n` counts all devices'
/// elements; `nb` is the period within one device and must divide n / D.
#[allow(clippy::too_many_arguments)]
pub async fn binary_devices(
    ctx: &GpuContext,
    op: Binary,
    a: &GpuBuffer,
    b: &GpuBuffer,
    out: &GpuBuffer,
    n: usize,
    nb: usize,
    alpha: f32,
    beta: f32,
    devices: usize,
) -> Result<Dispatch, GpuError> {
    let k = "elementwise::binary";
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
    let pipeline = ctx.pipeline("elementwise", entry).await?;
    let label = if devices == 1 {
        format!("{entry} n={n}")
    } else {
        format!("{entry} n={n} devices={devices}")
    };
    let params = Params {
        nl: nl as u32,
        ..single(n, nb, alpha, beta)
    };
    let u = ctx.uniform(&label, &params);
    let bind_group = ctx.bind(
        &label,
        &pipeline,
        &[(0, &a.buffer), (1, &b.buffer), (2, &out.buffer), (3, &u)],
    );
    Ok(Dispatch {
        label,
        pipeline,
        bind_group,
        workgroups: grid_1d(n, 256),
        uniforms: vec![u],
    })
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
    let pipeline = ctx.pipeline("elementwise", "scale").await?;
    let label = format!("scale n={n}");
    let params = single(n, 1, alpha, beta);
    let u = ctx.uniform(&label, &params);
    let bind_group = ctx.bind(&label, &pipeline, &[(0, &a.buffer), (2, &out.buffer), (3, &u)]);
    Ok(Dispatch {
        label,
        pipeline,
        bind_group,
        workgroups: grid_1d(n, 256),
        uniforms: vec![u],
    })
}

/// `out = value` over `n` elements.
pub async fn fill(ctx: &GpuContext, out: &GpuBuffer, n: usize, value: f32) -> Result<Dispatch, GpuError> {
    let pipeline = ctx.pipeline("elementwise", "fill").await?;
    let label = format!("fill n={n}");
    let params = single(n, 1, 0.0, value);
    let u = ctx.uniform(&label, &params);
    let bind_group = ctx.bind(&label, &pipeline, &[(2, &out.buffer), (3, &u)]);
    Ok(Dispatch {
        label,
        pipeline,
        bind_group,
        workgroups: grid_1d(n, 256),
        uniforms: vec![u],
    })
}
