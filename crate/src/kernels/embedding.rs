//! Embedding lookup and its scatter-add gradient (shaders/embedding.wgsl). An id >= V reads
//! zeros and its gradient is dropped: never an out-of-bounds access.
use super::reduce::{launch, need, positive};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    v: u32,
    c: u32,
    groups: u32,
}

/// `out (N, C) = table[ids]`, table (V, C) with V = table.len / c, ids (N) u32. When the
/// table lives in a buffer larger than (V, C) (a reused slot), use [`forward_rows`] so that
/// ids >= V still read zeros.
pub async fn forward(
    ctx: &GpuContext,
    table: &GpuBuffer,
    ids: &GpuBuffer,
    out: &GpuBuffer,
    n: usize,
    c: usize,
) -> Result<Dispatch, GpuError> {
    positive("embedding::forward", "C", c)?;
    forward_rows(ctx, table, ids, out, n, table.len / c, c).await
}

/// [`forward`] with the number of table rows `v` given: table (V, C).
pub async fn forward_rows(
    ctx: &GpuContext,
    table: &GpuBuffer,
    ids: &GpuBuffer,
    out: &GpuBuffer,
    n: usize,
    v: usize,
    c: usize,
) -> Result<Dispatch, GpuError> {
    let k = "embedding::forward";
    positive(k, "C", c)?;
    positive(k, "V (table rows)", v)?;
    need(k, "table", table, v * c)?;
    need(k, "ids", ids, n)?;
    need(k, "out", out, n * c)?;
    let params = Params {
        n: n as u32,
        v: v as u32,
        c: c as u32,
        groups: 1,
    };
    let label = format!("embedding ({n}, {c}) from {v} rows");
    let buffers = [(0, table), (1, ids), (2, out)];
    launch(
        ctx,
        "embedding",
        "forward",
        label,
        &buffers,
        &params,
        5,
        grid_1d(n * c, 256),
    )
    .await
}

/// `dtable (V, C)` = scatter-add of the rows of `dout (N, C)` by `ids (N)`; overwrites dtable.
/// Deterministic (fixed summation order, no atomics).
pub async fn backward(
    ctx: &GpuContext,
    dout: &GpuBuffer,
    ids: &GpuBuffer,
    dtable: &GpuBuffer,
    n: usize,
    v: usize,
    c: usize,
) -> Result<Dispatch, GpuError> {
    let k = "embedding::backward";
    positive(k, "V", v)?;
    positive(k, "C", c)?;
    need(k, "dout", dout, n * c)?;
    need(k, "ids", ids, n)?;
    need(k, "dtable", dtable, v * c)?;
    // Enough invocations to fill the device, but no more: each one reads all N ids. CPU
    // drivers run few invocations at once, GPUs tens of thousands.
    let target: usize = if ctx.summary.device_type == "Cpu" { 2048 } else { 65536 };
    let groups = target.div_ceil(c).clamp(1, v);
    let params = Params {
        n: n as u32,
        v: v as u32,
        c: c as u32,
        groups: groups as u32,
    };
    let label = format!("embedding backward ({n}, {c}) into {v} rows");
    let buffers = [(3, dout), (1, ids), (4, dtable)];
    launch(
        ctx,
        "embedding",
        "backward",
        label,
        &buffers,
        &params,
        5,
        grid_1d(groups * c, 256),
    )
    .await
}
