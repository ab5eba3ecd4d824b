//! Causal softmax of attention scores (shaders/softmax.wgsl): s, p viewed (rows, T) with
//! rows = B*H*T and the query index of row r equal to r % T. Rows are independent, so `rows`
//! may count every device's rows.
use super::check::{need, positive};
use super::RowStrategy;
use crate::gpu::{Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};

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

/// `p = softmax(s)` over j <= i per row, 0 for j > i. s, p (rows, T). `strategy`: `None` for the
/// adapter's choice ([`RowStrategy::for_adapter`]).
pub async fn causal_forward(
    ctx: &GpuContext,
    s: &GpuBuffer,
    p: &GpuBuffer,
    rows: usize,
    t: usize,
    strategy: Option<RowStrategy>,
) -> Result<Dispatch, GpuError> {
    let k = "softmax::causal_forward";
    positive(k, "T", t)?;
    need(k, "s", s, rows * t)?;
    need(k, "p", p, rows * t)?;
    let (entry, grid) = RowStrategy::or_adapter(strategy, ctx, t).entry("causal_forward", rows);
    let kernel = Kernel::new("softmax", entry, format!("causal softmax ({rows}, {t})"))
        .read(0, "s", s)
        .write(1, "p", p)
        .uniform(5, &params(rows, t))
        .grid(grid);
    ctx.launch(kernel).await
}

/// `ds = p * (dp - sum_j p*dp)`, 0 where masked. p, dp, ds (rows, T).
pub async fn causal_backward(
    ctx: &GpuContext,
    p: &GpuBuffer,
    dp: &GpuBuffer,
    ds: &GpuBuffer,
    rows: usize,
    t: usize,
    strategy: Option<RowStrategy>,
) -> Result<Dispatch, GpuError> {
    let k = "softmax::causal_backward";
    positive(k, "T", t)?;
    need(k, "p", p, rows * t)?;
    need(k, "dp", dp, rows * t)?;
    need(k, "ds", ds, rows * t)?;
    let (entry, grid) = RowStrategy::or_adapter(strategy, ctx, t).entry("causal_backward", rows);
    let kernel = Kernel::new("softmax", entry, format!("causal softmax backward ({rows}, {t})"))
        .read(2, "p", p)
        .read(3, "dp", dp)
        .write(4, "ds", ds)
        .uniform(5, &params(rows, t))
        .grid(grid);
    ctx.launch(kernel).await
}
