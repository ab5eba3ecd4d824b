//! LayerNorm over the last axis (shaders/layernorm.wgsl): eps 1e-5, biased variance.
//! Every launcher has a `*_devices` form for D simulated devices in one dispatch: the rows of
//! device d are [d * R, (d + 1) * R), R = rows / D, with its own gamma, beta, dgamma, dbeta
//! block (D, C). The plain forms are D = 1.
use super::reduce::{launch, need, positive, RowStrategy};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    c: u32,
    rpd: u32,
    devices: u32,
}

/// Checks that `rows` (all devices) split evenly over `devices` and `c` is positive.
fn params(kernel: &str, rows: usize, c: usize, devices: usize) -> Result<Params, GpuError> {
    positive(kernel, "C", c)?;
    positive(kernel, "devices", devices)?;
    if !rows.is_multiple_of(devices) {
        return Err(GpuError::Invalid(format!(
            "{kernel}: {rows} rows do not split evenly over {devices} devices; rows counts all devices' rows \
             (devices x rows per device)"
        )));
    }
    Ok(Params {
        rows: rows as u32,
        c: c as u32,
        rpd: (rows / devices) as u32,
        devices: devices as u32,
    })
}

/// `out = (x - mean) * rstd * gamma + beta` per row, saving `mean` and `rstd` for the backward.
/// x, out (rows, C); gamma, beta (C); mean, rstd (rows).
#[allow(clippy::too_many_arguments)]
pub async fn forward(
    ctx: &GpuContext,
    x: &GpuBuffer,
    gamma: &GpuBuffer,
    beta: &GpuBuffer,
    out: &GpuBuffer,
    mean: &GpuBuffer,
    rstd: &GpuBuffer,
    rows: usize,
    c: usize,
) -> Result<Dispatch, GpuError> {
    forward_devices(ctx, x, gamma, beta, out, mean, rstd, rows, c, 1).await
}

/// [`forward`] with an explicit row strategy (tests run both; the autotuner may pick).
#[allow(clippy::too_many_arguments)]
pub async fn forward_with(
    ctx: &GpuContext,
    strategy: RowStrategy,
    x: &GpuBuffer,
    gamma: &GpuBuffer,
    beta: &GpuBuffer,
    out: &GpuBuffer,
    mean: &GpuBuffer,
    rstd: &GpuBuffer,
    rows: usize,
    c: usize,
) -> Result<Dispatch, GpuError> {
    forward_devices_with(ctx, strategy, x, gamma, beta, out, mean, rstd, rows, c, 1).await
}

/// [`forward`] on `devices` simulated devices in one dispatch: x, out (D, R, C); gamma, beta
/// (D, C); mean, rstd (D, R), with `rows` = D * R counting all devices' rows.
#[allow(clippy::too_many_arguments)]
pub async fn forward_devices(
    ctx: &GpuContext,
    x: &GpuBuffer,
    gamma: &GpuBuffer,
    beta: &GpuBuffer,
    out: &GpuBuffer,
    mean: &GpuBuffer,
    rstd: &GpuBuffer,
    rows: usize,
    c: usize,
    devices: usize,
) -> Result<Dispatch, GpuError> {
    let s = RowStrategy::for_adapter(ctx, c);
    forward_devices_with(ctx, s, x, gamma, beta, out, mean, rstd, rows, c, devices).await
}

/// [`forward_devices`] with an explicit row strategy.
#[allow(clippy::too_many_arguments)]
pub async fn forward_devices_with(
    ctx: &GpuContext,
    strategy: RowStrategy,
    x: &GpuBuffer,
    gamma: &GpuBuffer,
    beta: &GpuBuffer,
    out: &GpuBuffer,
    mean: &GpuBuffer,
    rstd: &GpuBuffer,
    rows: usize,
    c: usize,
    devices: usize,
) -> Result<Dispatch, GpuError> {
    let k = "layernorm::forward";
    let p = params(k, rows, c, devices)?;
    need(k, "x", x, rows * c)?;
    need(k, "gamma", gamma, devices * c)?;
    need(k, "beta", beta, devices * c)?;
    need(k, "out", out, rows * c)?;
    need(k, "mean", mean, rows)?;
    need(k, "rstd", rstd, rows)?;
    let (entry, grid) = strategy.entry("forward", rows);
    let label = format!("layernorm ({rows}, {c}){}", on_devices(devices));
    let buffers = [(0, x), (1, gamma), (2, beta), (3, out), (4, mean), (5, rstd)];
    launch(ctx, "layernorm", &entry, label, &buffers, &p, 12, grid).await
}

/// dx (rows, C), dgamma and dbeta (C, sums over rows, deterministic) from dout (rows, C) and
/// the forward's x, mean, rstd and gamma. Two dispatches: dx per row, then dgamma/dbeta per column.
#[allow(clippy::too_many_arguments)]
pub async fn backward(
    ctx: &GpuContext,
    dout: &GpuBuffer,
    x: &GpuBuffer,
    mean: &GpuBuffer,
    rstd: &GpuBuffer,
    gamma: &GpuBuffer,
    dx: &GpuBuffer,
    dgamma: &GpuBuffer,
    dbeta: &GpuBuffer,
    rows: usize,
    c: usize,
) -> Result<Vec<Dispatch>, GpuError> {
    backward_devices(ctx, dout, x, mean, rstd, gamma, dx, dgamma, dbeta, rows, c, 1).await
}

/// [`backward`] with an explicit row strategy for the dx pass.
#[allow(clippy::too_many_arguments)]
pub async fn backward_with(
    ctx: &GpuContext,
    strategy: RowStrategy,
    dout: &GpuBuffer,
    x: &GpuBuffer,
    mean: &GpuBuffer,
    rstd: &GpuBuffer,
    gamma: &GpuBuffer,
    dx: &GpuBuffer,
    dgamma: &GpuBuffer,
    dbeta: &GpuBuffer,
    rows: usize,
    c: usize,
) -> Result<Vec<Dispatch>, GpuError> {
    backward_devices_with(ctx, strategy, dout, x, mean, rstd, gamma, dx, dgamma, dbeta, rows, c, 1).await
}

/// [`backward`] on `devices` simulated devices, still two dispatches: dout, x, dx (D, R, C);
/// mean, rstd (D, R); gamma, dgamma, dbeta (D, C), each device's dgamma and dbeta summing over
/// its own R rows only. `rows` = D * R counts all devices' rows.
#[allow(clippy::too_many_arguments)]
pub async fn backward_devices(
    ctx: &GpuContext,
    dout: &GpuBuffer,
    x: &GpuBuffer,
    mean: &GpuBuffer,
    rstd: &GpuBuffer,
    gamma: &GpuBuffer,
    dx: &GpuBuffer,
    dgamma: &GpuBuffer,
    dbeta: &GpuBuffer,
    rows: usize,
    c: usize,
    devices: usize,
) -> Result<Vec<Dispatch>, GpuError> {
    let s = RowStrategy::for_adapter(ctx, c);
    backward_devices_with(ctx, s, dout, x, mean, rstd, gamma, dx, dgamma, dbeta, rows, c, devices).await
}

/// [`backward_devices`] with an explicit row strategy for the dx pass.
#[allow(clippy::too_many_arguments)]
pub async fn backward_devices_with(
    ctx: &GpuContext,
    strategy: RowStrategy,
    dout: &GpuBuffer,
    x: &GpuBuffer,
    mean: &GpuBuffer,
    rstd: &GpuBuffer,
    gamma: &GpuBuffer,
    dx: &GpuBuffer,
    dgamma: &GpuBuffer,
    dbeta: &GpuBuffer,
    rows: usize,
    c: usize,
    devices: usize,
) -> Result<Vec<Dispatch>, GpuError> {
    let k = "layernorm::backward";
    let p = params(k, rows, c, devices)?;
    need(k, "dout", dout, rows * c)?;
    need(k, "x", x, rows * c)?;
    need(k, "mean", mean, rows)?;
    need(k, "rstd", rstd, rows)?;
    need(k, "gamma", gamma, devices * c)?;
    need(k, "dx", dx, rows * c)?;
    need(k, "dgamma", dgamma, devices * c)?;
    need(k, "dbeta", dbeta, devices * c)?;
    let on = on_devices(devices);
    let (entry, grid) = strategy.entry("backward_dx", rows);
    let dx_pass = launch(
        ctx,
        "layernorm",
        &entry,
        format!("layernorm backward dx ({rows}, {c}){on}"),
        &[(6, dout), (0, x), (7, mean), (8, rstd), (1, gamma), (9, dx)],
        &p,
        12,
        grid,
    )
    .await?;
    let params_pass = launch(
        ctx,
        "layernorm",
        "backward_params",
        format!("layernorm backward dgamma dbeta ({rows}, {c}){on}"),
        &[(6, dout), (0, x), (7, mean), (8, rstd), (10, dgamma), (11, dbeta)],
        &p,
        12,
        grid_1d(devices * c, 256),
    )
    .await?;
    Ok(vec![dx_pass, params_pass])
}

/// Label suffix naming the device count when there is more than one.
fn on_devices(devices: usize) -> String {
    if devices == 1 {
        String::new()
    } else {
        format!(" on {devices} devices")
    }
}
