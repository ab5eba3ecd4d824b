//! LayerNorm over the last axis (shaders/layernorm.wgsl): eps 1e-5, biased variance.
use super::reduce::{launch, need, positive, RowStrategy};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    c: u32,
    _pad: [u32; 2],
}

fn params(rows: usize, c: usize) -> Params {
    Params {
        rows: rows as u32,
        c: c as u32,
        _pad: [0; 2],
    }
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
    forward_with(
        ctx,
        RowStrategy::for_adapter(ctx, c),
        x,
        gamma,
        beta,
        out,
        mean,
        rstd,
        rows,
        c,
    )
    .await
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
    let k = "layernorm::forward";
    positive(k, "C", c)?;
    need(k, "x", x, rows * c)?;
    need(k, "gamma", gamma, c)?;
    need(k, "beta", beta, c)?;
    need(k, "out", out, rows * c)?;
    need(k, "mean", mean, rows)?;
    need(k, "rstd", rstd, rows)?;
    let (entry, grid) = strategy.entry("forward", rows);
    let label = format!("layernorm ({rows}, {c})");
    let buffers = [(0, x), (1, gamma), (2, beta), (3, out), (4, mean), (5, rstd)];
    launch(ctx, "layernorm", &entry, label, &buffers, &params(rows, c), 12, grid).await
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
    let s = RowStrategy::for_adapter(ctx, c);
    backward_with(ctx, s, dout, x, mean, rstd, gamma, dx, dgamma, dbeta, rows, c).await
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
    let k = "layernorm::backward";
    positive(k, "C", c)?;
    need(k, "dout", dout, rows * c)?;
    need(k, "x", x, rows * c)?;
    need(k, "mean", mean, rows)?;
    need(k, "rstd", rstd, rows)?;
    need(k, "gamma", gamma, c)?;
    need(k, "dx", dx, rows * c)?;
    need(k, "dgamma", dgamma, c)?;
    need(k, "dbeta", dbeta, c)?;
    let p = params(rows, c);
    let (entry, grid) = strategy.entry("backward_dx", rows);
    let dx_pass = launch(
        ctx,
        "layernorm",
        &entry,
        format!("layernorm backward dx ({rows}, {c})"),
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
        format!("layernorm backward dgamma dbeta ({rows}, {c})"),
        &[(6, dout), (0, x), (7, mean), (8, rstd), (10, dgamma), (11, dbeta)],
        &p,
        12,
        grid_1d(c, 256),
    )
    .await?;
    Ok(vec![dx_pass, params_pass])
}
