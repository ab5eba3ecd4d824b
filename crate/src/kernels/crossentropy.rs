//! Cross-entropy of logits against u32 targets (shaders/crossentropy.wgsl). A target >= V
//! is an ignored position: loss 0 and dlogits 0, never an out-of-bounds read. Rows are
//! independent, so `rows` may count every device's rows.
use super::check::{need, positive};
use super::RowStrategy;
use crate::gpu::{Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};

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

/// The entry point of kernel `base` (`forward`, `backward`), its grid, and whether it reads rows
/// as vec4s: a row per invocation four columns at a time (`*_row4`) where V is a multiple of 4.
fn entry(
    ctx: &GpuContext,
    strategy: Option<RowStrategy>,
    base: &str,
    rows: usize,
    v: usize,
) -> (String, [u32; 3], bool) {
    let strategy = RowStrategy::or_adapter(strategy, ctx, v);
    let (entry, grid) = strategy.entry(base, rows);
    if strategy == RowStrategy::PerInvocation && v.is_multiple_of(4) {
        (format!("{entry}4"), grid, true)
    } else {
        (entry, grid, false)
    }
}

/// `losses[r] = logsumexp(logits[r]) - logits[r, targets[r]]`. logits (rows, V); targets,
/// losses (rows). `strategy`: `None` for the adapter's choice.
pub async fn forward(
    ctx: &GpuContext,
    logits: &GpuBuffer,
    targets: &GpuBuffer,
    losses: &GpuBuffer,
    rows: usize,
    v: usize,
    strategy: Option<RowStrategy>,
) -> Result<Dispatch, GpuError> {
    let k = "crossentropy::forward";
    positive(k, "V", v)?;
    need(k, "logits", logits, rows * v)?;
    need(k, "targets", targets, rows)?;
    need(k, "losses", losses, rows)?;
    let (entry, grid, by_fours) = entry(ctx, strategy, "forward", rows, v);
    let kernel = Kernel::new("crossentropy", entry, format!("crossentropy ({rows}, {v})"))
        .read(if by_fours { 6 } else { 0 }, "logits", logits)
        .read(1, "targets", targets)
        .write(2, "losses", losses)
        .uniform(5, &params(rows, v))
        .grid(grid);
    ctx.launch(kernel).await
}

/// The buffers of the backward: logits (rows, V) and targets (rows) of the forward, the
/// incoming dlosses (rows), and the output dlogits (rows, V).
pub struct BackwardBuffers<'a> {
    pub logits: &'a GpuBuffer,
    pub targets: &'a GpuBuffer,
    pub dlosses: &'a GpuBuffer,
    pub dlogits: &'a GpuBuffer,
}

/// `dlogits[r] = (softmax(logits[r]) - onehot(targets[r])) * dlosses[r]`.
pub async fn backward(
    ctx: &GpuContext,
    b: &BackwardBuffers<'_>,
    rows: usize,
    v: usize,
    strategy: Option<RowStrategy>,
) -> Result<Dispatch, GpuError> {
    let k = "crossentropy::backward";
    positive(k, "V", v)?;
    need(k, "logits", b.logits, rows * v)?;
    need(k, "targets", b.targets, rows)?;
    need(k, "dlosses", b.dlosses, rows)?;
    need(k, "dlogits", b.dlogits, rows * v)?;
    let (entry, grid, by_fours) = entry(ctx, strategy, "backward", rows, v);
    let kernel = Kernel::new("crossentropy", entry, format!("crossentropy backward ({rows}, {v})"))
        .read(if by_fours { 6 } else { 0 }, "logits", b.logits)
        .read(1, "targets", b.targets)
        .read(3, "dlosses", b.dlosses)
        .write(if by_fours { 7 } else { 4 }, "dlogits", b.dlogits)
        .uniform(5, &params(rows, v))
        .grid(grid);
    ctx.launch(kernel).await
}
