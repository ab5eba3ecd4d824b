//! Reductions (shaders/reduce.wgsl).
use super::check::{need, vec4_ok};
use super::RowStrategy;
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};

/// Rows per chunk of a two-stage reduction: enough chunks to spread a bias gradient (few
/// outputs, B*T rows) over many invocations, few enough that stage 2 is a short loop.
pub const CHUNK: usize = 64;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    outer: u32,
    n: u32,
    inner: u32,
    chunk: u32,
    chunks: u32,
    _pad: [u32; 3],
}

fn params(outer: usize, n: usize, inner: usize) -> Params {
    Params {
        outer: outer as u32,
        n: n as u32,
        inner: inner as u32,
        chunk: CHUNK as u32,
        chunks: n.div_ceil(CHUNK) as u32,
        _pad: [0; 3],
    }
}

/// The stage-1 entry point of `strategy` (`<base>_row` or `<base>_wg`) and its grid for
/// `outputs` sums over `chunks` chunks (the `_wg` entries take 64 outputs per workgroup).
pub(crate) fn partial_entry(strategy: RowStrategy, base: &str, outputs: usize, chunks: usize) -> (String, [u32; 3]) {
    match strategy {
        RowStrategy::PerInvocation => (format!("{base}_row"), grid_1d(outputs * chunks, 64)),
        RowStrategy::PerWorkgroup => (format!("{base}_wg"), grid_1d(outputs.div_ceil(64) * chunks, 1)),
    }
}

/// Rows a column sum adds in one pass (16 chunks): an invocation per output, chunk by chunk.
/// Longer columns spread their chunks over invocations in two passes.
pub const ONE_PASS_ROWS: usize = 16 * CHUNK;

/// Dispatches of a column sum over `n` rows: one pass, or two (chunk sums, then the chunks)
/// past [`ONE_PASS_ROWS`]. The cost model counts launches with it.
pub fn stages(n: usize) -> usize {
    if n <= ONE_PASS_ROWS {
        1
    } else {
        2
    }
}

/// `out (outer, inner) = sum over n of x (outer, n, inner)`; bias gradients are
/// `sum_axis(dy, out, 1, B*T, C)`. Deterministic: rows are summed in chunks of [`CHUNK`] (in
/// order, but by `strategy` on long sums), and the chunks in order. One dispatch when n <=
/// [`ONE_PASS_ROWS`], else two. `strategy`: `None` for the adapter's choice (tests run both).
pub async fn sum_axis(
    ctx: &GpuContext,
    x: &GpuBuffer,
    out: &GpuBuffer,
    (outer, n, inner): (usize, usize, usize),
    strategy: Option<RowStrategy>,
) -> Result<Vec<Dispatch>, GpuError> {
    let k = "reduce::sum_axis";
    need(k, "x", x, outer * n * inner)?;
    need(k, "out", out, outer * inner)?;
    let p = params(outer, n, inner);
    let label = format!("sum_axis ({outer}, {n}, {inner})");
    let chunks = p.chunks as usize;
    // Four adjacent outputs per invocation where rows of x and out hold whole vec4s.
    let vec4 = inner.is_multiple_of(4) && vec4_ok(inner, &[x, out]);
    // The one-stage sum (the whole sum, or stage 2 over the chunks): its entry, slots, grid.
    let (entry, x_slot, out_slot) = if vec4 { ("sum_axis4", 3, 4) } else { ("sum_axis", 0, 1) };
    let grid = grid_1d(outer * inner / if vec4 { 4 } else { 1 }, 256);
    if stages(n) == 1 {
        let entry = if vec4 { "sum_axis_chunks4" } else { "sum_axis_chunks" };
        let grid = grid_1d(outer * inner / if vec4 { 4 } else { 1 }, 64);
        let kernel = Kernel::new("reduce", entry, label)
            .read(x_slot, "x", x)
            .write(out_slot, "out", out)
            .uniform(2, &p)
            .grid(grid);
        return Ok(vec![ctx.launch(kernel).await?]);
    }
    let strategy = RowStrategy::or_adapter(strategy, ctx, n);
    let partial = ctx.zeros(&format!("{label} partial sums"), outer * chunks * inner)?;
    let stage1 = if vec4 && strategy == RowStrategy::PerInvocation {
        Kernel::new("reduce", "sum_axis_partial_row4", format!("{label} stage 1"))
            .read(3, "x", x)
            .write(4, "partial", &partial)
            .grid(grid_1d(outer * inner / 4 * chunks, 64))
    } else {
        let (entry, grid) = partial_entry(strategy, "sum_axis_partial", outer * inner, chunks);
        Kernel::new("reduce", entry, format!("{label} stage 1"))
            .read(0, "x", x)
            .write(1, "partial", &partial)
            .grid(grid)
    };
    let stage1 = ctx.launch(stage1.uniform(2, &p)).await?;
    // Stage 2 is the one-stage sum over the chunk axis.
    let stage2 = Kernel::new("reduce", entry, format!("{label} stage 2"))
        .read_owned(x_slot, "partial", partial)
        .write(out_slot, "out", out)
        .uniform(2, &params(outer, chunks, inner))
        .grid(grid);
    Ok(vec![stage1, ctx.launch(stage2).await?])
}
