//! How the row-wise kernels (layernorm, softmax, crossentropy) map rows onto invocations.
use super::Tuning;
use crate::gpu::{grid_1d, GpuContext};

/// How a row-wise kernel maps rows onto invocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowStrategy {
    /// One invocation per row, a single pass with an online max/sum. Fastest on CPU drivers
    /// (lavapipe), where barriers are coroutines; fine on GPUs for short rows.
    PerInvocation,
    /// One 256-wide workgroup per row, reducing in workgroup memory: coalesced loads and
    /// 256-way parallelism within a row, which long rows need on real GPUs.
    PerWorkgroup,
}

impl RowStrategy {
    /// The tuned choice of this adapter (`Tuning::rowwise`), else per invocation on CPU
    /// adapters and for rows of at most 64 columns (a 256-wide workgroup would idle), and per
    /// workgroup for longer rows on GPUs.
    pub fn for_adapter(ctx: &GpuContext, cols: usize) -> Self {
        let tuned = Tuning::with(ctx, |t| t.rowwise).flatten();
        match tuned {
            Some(s) => s,
            None if ctx.summary.is_cpu() || cols <= 64 => RowStrategy::PerInvocation,
            None => RowStrategy::PerWorkgroup,
        }
    }

    /// `strategy`, or the adapter's choice for rows of `cols` columns when `None`.
    pub fn or_adapter(strategy: Option<Self>, ctx: &GpuContext, cols: usize) -> Self {
        strategy.unwrap_or_else(|| Self::for_adapter(ctx, cols))
    }

    /// The entry point `<base>_row` or `<base>_wg` and its workgroup grid for `rows` rows.
    pub(crate) fn entry(self, base: &str, rows: usize) -> (String, [u32; 3]) {
        match self {
            RowStrategy::PerInvocation => (format!("{base}_row"), grid_1d(rows, 64)),
            RowStrategy::PerWorkgroup => (format!("{base}_wg"), grid_1d(rows, 1)),
        }
    }
}
