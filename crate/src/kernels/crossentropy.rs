//! Cross-entropy of logits against u32 targets (shaders/crossentropy.wgsl). A target >= V
//! is an ignored position: loss 0 and dlogits 0, never an out-of-bounds read.
use super::reduce::{launch, need, positive, RowStrategy};
use crate::gpu::{Dispatch, GpuBuffer, GpuContext, GpuError};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    v: u32,
    _pad: [u32; 2],
}

fn params(rows: usize, v: usize) -> Params {
    Params {
        rows: rows as u32,
        v: v as u32,
        _pad: [0; 2],
    }
}

/// `losses[r] = logsumexp(logits[r]) - logits[r, targets[r]]`. logits (rows, V); targets,
/// losses (rows).
pub async fn forward(
    ctx: &GpuContext,
    logits: &GpuBuffer,
    targets: &GpuBuffer,
    losses: &GpuBuffer,
    rows: usize,
    v: usize,
) -> Result<Dispatch, GpuError> {
    forward_with(ctx, RowStrategy::for_adapter(ctx, v), logits, targets, losses, rows, v).await
}

/// [`forward`] with an explicit row strategy.
pub async fn forward_with(
    ctx: &GpuContext,
    strategy: RowStrategy,
    logits: &GpuBuffer,
    targets: &GpuBuffer,
    losses: &GpuBuffer,
    rows: usize,
    v: usize,
) -> Result<Dispatch, GpuError> {
    let k = "crossentropy::forward";
    positive(k, "V", v)?;
    need(k, "logits", logits, rows * v)?;
    need(k, "targets", targets, rows)?;
    need(k, "losses", losses, rows)?;
    let (entry, grid) = strategy.entry("forward", rows);
    let label = format!("crossentropy ({rows}, {v})");
    let buffers = [(0, logits), (1, targets), (2, losses)];
    launch(ctx, "crossentropy", &entry, label, &buffers, &params(rows, v), 5, grid).await
}

/// `dlogits[r] = (softmax(logits[r]) - onehot(targets[r])) * dlosses[r]`. logits, dlogits
/// (rows, V); targets, dlosses (rows).
pub async fn backward(
    ctx: &GpuContext,
    logits: &GpuBuffer,
    targets: &GpuBuffer,
    dlosses: &GpuBuffer,
    dlogits: &GpuBuffer,
    rows: usize,
    v: usize,
) -> Result<Dispatch, GpuError> {
    backward_with(
        ctx,
        RowStrategy::for_adapter(ctx, v),
        logits,
        targets,
        dlosses,
        dlogits,
        rows,
        v,
    )
    .await
}

/// [`backward`] with an explicit row strategy.
#[allow(clippy::too_many_arguments)]
pub async fn backward_with(
    ctx: &GpuContext,
    strategy: RowStrategy,
    logits: &GpuBuffer,
    targets: &GpuBuffer,
    dlosses: &GpuBuffer,
    dlogits: &GpuBuffer,
    rows: usize,
    v: usize,
) -> Result<Dispatch, GpuError> {
    let k = "crossentropy::backward";
    positive(k, "V", v)?;
    need(k, "logits", logits, rows * v)?;
    need(k, "targets", targets, rows)?;
    need(k, "dlosses", dlosses, rows)?;
    need(k, "dlogits", dlogits, rows * v)?;
    let (entry, grid) = strategy.entry("backward", rows);
    let label = format!("crossentropy backward ({rows}, {v})");
    let buffers = [(0, logits), (1, targets), (3, dlosses), (4, dlogits)];
    launch(ctx, "crossentropy", &entry, label, &buffers, &params(rows, v), 5, grid).await
}
