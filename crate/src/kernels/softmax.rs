//! Causal softmax of attention scores (shaders/softmax.wgsl): s, p viewed (rows, T) with
//! rows = B*H*T and the query index of row r equal to r % T.
use super::reduce::{launch, need, positive, RowStrategy};
use crate::gpu::{Dispatch, GpuBuffer, GpuContext, GpuError};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    t: u32,
    _pad: [u32; 2],
}

fn params(rows: usize, t: usize) -> Params {
    Params {
        rows: rows as u32,
        t: t as u32,
        _pad: [0; 2],
    }
}

/// `p = softmax(s)` over j <= i per row, 0 for j > i. s, p (rows, T).
pub async fn causal_forward(
    ctx: &GpuContext,
    s: &GpuBuffer,
    p: &GpuBuffer,
    rows: usize,
    t: usize,
) -> Result<Dispatch, GpuError> {
    causal_forward_with(ctx, RowStrategy::for_adapter(ctx, t), s, p, rows, t).await
}

/// [`causal_forward`] with an explicit row strategy.
pub async fn causal_forward_with(
    ctx: &GpuContext,
    strategy: RowStrategy,
    s: &GpuBuffer,
    p: &GpuBuffer,
    rows: usize,
    t: usize,
) -> Result<Dispatch, GpuError> {
    let k = "softmax::causal_forward";
    positive(k, "T", t)?;
    need(k, "s", s, rows * t)?;
    need(k, "p", p, rows * t)?;
    let (entry, grid) = strategy.entry("causal_forward", rows);
    let label = format!("causal softmax ({rows}, {t})");
    launch(
        ctx,
        "softmax",
        &entry,
        label,
        &[(0, s), (1, p)],
        &params(rows, t),
        5,
        grid,
    )
    .await
}

/// `ds = p * (dp - sum_j p*dp)`, 0 where masked. p, dp, ds (rows, T).
pub async fn causal_backward(
    ctx: &GpuContext,
    p: &GpuBuffer,
    dp: &GpuBuffer,
    ds: &GpuBuffer,
    rows: usize,
    t: usize,
) -> Result<Dispatch, GpuError> {
    causal_backward_with(ctx, RowStrategy::for_adapter(ctx, t), p, dp, ds, rows, t).await
}

/// [`causal_backward`] with an explicit row strategy.
pub async fn causal_backward_with(
    ctx: &GpuContext,
    strategy: RowStrategy,
    p: &GpuBuffer,
    dp: &GpuBuffer,
    ds: &GpuBuffer,
    rows: usize,
    t: usize,
) -> Result<Dispatch, GpuError> {
    let k = "softmax::causal_backward";
    positive(k, "T", t)?;
    need(k, "p", p, rows * t)?;
    need(k, "dp", dp, rows * t)?;
    need(k, "ds", ds, rows * t)?;
    let (entry, grid) = strategy.entry("causal_backward", rows);
    let label = format!("causal softmax backward ({rows}, {t})");
    launch(
        ctx,
        "softmax",
        &entry,
        label,
        &[(2, p), (3, dp), (4, ds)],
        &params(rows, t),
        5,
        grid,
    )
    .await
}
