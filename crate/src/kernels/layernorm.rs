//! LayerNorm over the last axis (shaders/layernorm.wgsl): eps 1e-5, biased variance.
//! One dispatch serves D simulated devices ([`LayerNormShape::devices`]): the rows of device d
//! are [d * R, (d + 1) * R), R = rows / D, with its own gamma, beta, dgamma, dbeta block (D, C).
use super::check::{need, on_devices, per_device, positive, vec4_ok};
use super::reduce::{partial_entry, CHUNK, ONE_PASS_ROWS};
use super::RowStrategy;
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
pub use crate::reference::layernorm::LayerNormShape;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    c: u32,
    rpd: u32,
    devices: u32,
    chunk: u32,
    chunks: u32,
    row_groups: u32,
    /// The forward's residual form: 1 when it normalizes x + res and writes the sum.
    residual: u32,
}

/// Checks that the rows (all devices) split evenly over the devices and C is positive.
fn params(kernel: &str, s: LayerNormShape) -> Result<Params, GpuError> {
    positive(kernel, "C", s.c)?;
    let rpd = per_device(kernel, "rows", s.rows, s.devices)?;
    Ok(Params {
        rows: s.rows as u32,
        c: s.c as u32,
        rpd: rpd as u32,
        devices: s.devices as u32,
        chunk: CHUNK as u32,
        chunks: rpd.div_ceil(CHUNK) as u32,
        row_groups: 0,
        residual: 0,
    })
}

/// The buffers of the forward: x, out (D, R, C); gamma, beta (D, C); mean, rstd (D, R).
pub struct ForwardBuffers<'a> {
    pub x: &'a GpuBuffer,
    pub gamma: &'a GpuBuffer,
    pub beta: &'a GpuBuffer,
    pub out: &'a GpuBuffer,
    pub mean: &'a GpuBuffer,
    pub rstd: &'a GpuBuffer,
    /// The residual add fused in front: the layer norm of x + `res`, the sum written to `sum`
    /// (both (D, R, C)), as the add then the layer norm compute them.
    pub residual: Option<Residual<'a>>,
}

/// The other addend of a residual add fused in front of the forward, and where the sum goes.
pub struct Residual<'a> {
    pub res: &'a GpuBuffer,
    pub sum: &'a GpuBuffer,
}

/// `out = (x - mean) * rstd * gamma + beta` per row, saving `mean` and `rstd` for the backward.
/// `strategy`: `None` for the adapter's choice (tests run both; the autotuner may pick).
pub async fn forward(
    ctx: &GpuContext,
    b: &ForwardBuffers<'_>,
    s: LayerNormShape,
    strategy: Option<RowStrategy>,
) -> Result<Dispatch, GpuError> {
    let k = "layernorm::forward";
    let mut p = params(k, s)?;
    let (rows, c, devices) = (s.rows, s.c, s.devices);
    need(k, "x", b.x, rows * c)?;
    if let Some(r) = &b.residual {
        need(k, "res", r.res, rows * c)?;
        need(k, "sum", r.sum, rows * c)?;
        p.residual = 1;
    }
    need(k, "gamma", b.gamma, devices * c)?;
    need(k, "beta", b.beta, devices * c)?;
    need(k, "out", b.out, rows * c)?;
    need(k, "mean", b.mean, rows)?;
    need(k, "rstd", b.rstd, rows)?;
    let (entry, grid) = RowStrategy::or_adapter(strategy, ctx, c).entry("forward", rows);
    let residual = if b.residual.is_some() { "residual add, " } else { "" };
    let label = format!("layernorm ({residual}{rows}, {c}){}", on_devices(devices));
    // Rows of C as vec4s (`forward_row4`) where C and the bindings allow.
    let mut bufs = vec![b.x, b.gamma, b.beta, b.out];
    bufs.extend(b.residual.iter().flat_map(|r| [r.res, r.sum]));
    let v4 = entry == "forward_row" && vec4_ok(c, &bufs);
    let (entry, [x, gamma, beta, out, res, sum]) = if v4 {
        ("forward_row4".to_string(), [15, 16, 17, 18, 23, 24])
    } else {
        (entry, [0, 1, 2, 3, 21, 22])
    };
    let kernel = Kernel::new("layernorm", entry, label)
        .read(x, "x", b.x)
        .read(gamma, "gamma", b.gamma)
        .read(beta, "beta", b.beta)
        .write(out, "out", b.out)
        .write(4, "mean", b.mean)
        .write(5, "rstd", b.rstd)
        .uniform(12, &p)
        .grid(grid);
    // Every entry point binds the residual form's buffers: stand-ins (a vec4 each) without it.
    let kernel = match &b.residual {
        Some(r) => kernel.read(res, "res", r.res).write(sum, "sum", r.sum),
        None => kernel
            .read_owned(res, "res", ctx.zeros("layernorm no residual", 4)?)
            .write_owned(sum, "sum", ctx.zeros("layernorm no sum", 4)?),
    };
    ctx.launch(kernel).await
}

/// The buffers of the backward: dout, x, dx (D, R, C); mean, rstd (D, R); gamma, dgamma,
/// dbeta (D, C).
pub struct BackwardBuffers<'a> {
    pub dout: &'a GpuBuffer,
    pub x: &'a GpuBuffer,
    pub mean: &'a GpuBuffer,
    pub rstd: &'a GpuBuffer,
    pub gamma: &'a GpuBuffer,
    pub dx: &'a GpuBuffer,
    pub dgamma: &'a GpuBuffer,
    pub dbeta: &'a GpuBuffer,
}

/// Rows per device up to which [`backward`] is one dispatch: each device's column sums then run
/// in one invocation per column, its rows in [`CHUNK`]s one after another; longer columns spread
/// their chunks over invocations in two more dispatches.
pub const FUSED_ROWS: usize = ONE_PASS_ROWS;

/// Dispatches of [`backward`] with `rows_per_device` rows on each device: one, or dx, then
/// dgamma and dbeta in two stages past [`FUSED_ROWS`]. The cost model counts launches with it.
pub fn backward_dispatches(rows_per_device: usize) -> usize {
    if rows_per_device <= FUSED_ROWS {
        1
    } else {
        3
    }
}

/// dx, and each device's dgamma and dbeta (sums over its own R rows, deterministic), from dout
/// and the forward's x, mean, rstd and gamma. Up to [`FUSED_ROWS`] rows per device one dispatch
/// does it all: dx per row (with `strategy`) and the column sums per column, chunk by chunk.
/// Past that: dx, then dgamma/dbeta in two stages (chunks of [`CHUNK`] rows, then the chunks
/// added up), the same sums spread over more invocations.
pub async fn backward(
    ctx: &GpuContext,
    b: &BackwardBuffers<'_>,
    s: LayerNormShape,
    strategy: Option<RowStrategy>,
) -> Result<Vec<Dispatch>, GpuError> {
    let k = "layernorm::backward";
    let p = params(k, s)?;
    let (rows, c, devices) = (s.rows, s.c, s.devices);
    need(k, "dout", b.dout, rows * c)?;
    need(k, "x", b.x, rows * c)?;
    need(k, "mean", b.mean, rows)?;
    need(k, "rstd", b.rstd, rows)?;
    need(k, "gamma", b.gamma, devices * c)?;
    need(k, "dx", b.dx, rows * c)?;
    need(k, "dgamma", b.dgamma, devices * c)?;
    need(k, "dbeta", b.dbeta, devices * c)?;
    let on = on_devices(devices);
    let rows_by = RowStrategy::or_adapter(strategy, ctx, c);
    if backward_dispatches(p.rpd as usize) == 1 {
        return Ok(vec![ctx.launch(fused_backward(b, s, rows_by, p)).await?]);
    }
    let (entry, grid) = rows_by.entry("backward_dx", rows);
    let label = format!("layernorm backward dx ({rows}, {c}){on}");
    let dx_pass = if entry == "backward_dx_row" && vec4_ok(c, &[b.dout, b.x, b.gamma, b.dx]) {
        backward_inputs4(Kernel::new("layernorm", "backward_dx_row4", label), b, &p)
            .read(16, "gamma", b.gamma)
            .write(20, "dx", b.dx)
    } else {
        backward_inputs(Kernel::new("layernorm", entry, label), b, &p)
            .read(1, "gamma", b.gamma)
            .write(9, "dx", b.dx)
    }
    .grid(grid);
    let label = format!("layernorm backward dgamma dbeta ({rows}, {c}){on}");
    let chunks = p.chunks as usize;
    // Two stages (long columns): chunk sums, then the chunks added up in order.
    let strategy = RowStrategy::or_adapter(strategy, ctx, rows / devices);
    let partial = ctx.zeros(&format!("{label} partial sums"), devices * chunks * 2 * c)?;
    // Four columns per invocation in both stages where rows hold whole vec4s.
    let four = strategy == RowStrategy::PerInvocation && vec4_ok(c, &[b.dout, b.x, b.dgamma, b.dbeta]);
    let stage1 = if four {
        backward_inputs4(
            Kernel::new("layernorm", "backward_params_partial_row4", format!("{label} stage 1")),
            b,
            &p,
        )
        .write(21, "partial", &partial)
        .grid(grid_1d(devices * chunks * c / 4, 64))
    } else {
        let (entry, grid) = partial_entry(strategy, "backward_params_partial", c, devices * chunks);
        backward_inputs(Kernel::new("layernorm", entry, format!("{label} stage 1")), b, &p)
            .write(13, "partial", &partial)
            .grid(grid)
    };
    let stage1 = ctx.launch(stage1).await?;
    let (entry, slots, unit) = if four {
        ("backward_params_finish4", [22, 23, 24], 4)
    } else {
        ("backward_params_finish", [14, 10, 11], 1)
    };
    let stage2 = Kernel::new("layernorm", entry, format!("{label} stage 2"))
        .read_owned(slots[0], "partial", partial)
        .write(slots[1], "dgamma", b.dgamma)
        .write(slots[2], "dbeta", b.dbeta)
        .uniform(12, &p)
        .grid(grid_1d(devices * c / unit, 256));
    Ok(vec![ctx.launch(dx_pass).await?, stage1, ctx.launch(stage2).await?])
}

/// The one-dispatch backward ([`FUSED_ROWS`]): dx on the first `row_groups` workgroups (a row
/// per invocation, or per workgroup, as `strategy` says), the column sums on the rest.
fn fused_backward<'a>(b: &BackwardBuffers<'a>, s: LayerNormShape, strategy: RowStrategy, mut p: Params) -> Kernel<'a> {
    let (rows, c, devices) = (s.rows, s.c, s.devices);
    let label = format!("layernorm backward ({rows}, {c}){}", on_devices(devices));
    let four = strategy == RowStrategy::PerInvocation && vec4_ok(c, &[b.dout, b.x, b.gamma, b.dx, b.dgamma, b.dbeta]);
    let (entry, row_groups, columns, size) = match strategy {
        _ if four => ("backward_fused_row4", rows.div_ceil(64), devices * c / 4, 64),
        RowStrategy::PerInvocation => ("backward_fused_row", rows.div_ceil(64), devices * c, 64),
        RowStrategy::PerWorkgroup => ("backward_fused_wg", rows, devices * c, 256),
    };
    p.row_groups = row_groups as u32;
    let grid = grid_1d((row_groups + columns.div_ceil(size)) * size, size as u32);
    let kernel = Kernel::new("layernorm", entry, label);
    if four {
        return backward_inputs4(kernel, b, &p)
            .read(16, "gamma", b.gamma)
            .write(20, "dx", b.dx)
            .write(23, "dgamma", b.dgamma)
            .write(24, "dbeta", b.dbeta)
            .grid(grid);
    }
    backward_inputs(kernel, b, &p)
        .read(1, "gamma", b.gamma)
        .write(9, "dx", b.dx)
        .write(10, "dgamma", b.dgamma)
        .write(11, "dbeta", b.dbeta)
        .grid(grid)
}

/// The bindings both backward passes read.
/// [`backward_inputs`] for the vec4 entries, which read `dout` and `x` as vec4 arrays.
fn backward_inputs4<'a>(kernel: Kernel<'a>, b: &BackwardBuffers<'a>, p: &Params) -> Kernel<'a> {
    kernel
        .read(19, "dout", b.dout)
        .read(15, "x", b.x)
        .read(7, "mean", b.mean)
        .read(8, "rstd", b.rstd)
        .uniform(12, p)
}

fn backward_inputs<'a>(kernel: Kernel<'a>, b: &BackwardBuffers<'a>, p: &Params) -> Kernel<'a> {
    kernel
        .read(6, "dout", b.dout)
        .read(0, "x", b.x)
        .read(7, "mean", b.mean)
        .read(8, "rstd", b.rstd)
        .uniform(12, p)
}
