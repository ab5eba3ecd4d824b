//! Reductions (shaders/reduce.wgsl), and what the row-wise kernels of the transformer
//! (layernorm, softmax, crossentropy) share: how a row is reduced on this adapter, buffer
//! checks, and building a [`Dispatch`].
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError};

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
    /// The tuned choice of this adapter (`ctx.tuning["rowwise"]` = `invocation` or `workgroup`),
    /// else per invocation on CPU adapters and for rows of at most 64 columns (a 256-wide
    /// workgroup would idle), and per workgroup for longer rows on GPUs.
    pub fn for_adapter(ctx: &GpuContext, cols: usize) -> Self {
        let tuned = ctx.tuning.lock().ok().and_then(|t| t.get("rowwise").cloned());
        match tuned.as_deref() {
            Some("invocation") => RowStrategy::PerInvocation,
            Some("workgroup") => RowStrategy::PerWorkgroup,
            _ if ctx.summary.device_type == "Cpu" || cols <= 64 => RowStrategy::PerInvocation,
            _ => RowStrategy::PerWorkgroup,
        }
    }

    /// The entry point `<base>_row` or `<base>_wg` and its workgroup grid for `rows` rows.
    pub(crate) fn entry(self, base: &str, rows: usize) -> (String, [u32; 3]) {
        match self {
            RowStrategy::PerInvocation => (format!("{base}_row"), grid_1d(rows, 64)),
            RowStrategy::PerWorkgroup => (format!("{base}_wg"), grid_1d(rows, 1)),
        }
    }
}

/// Errors unless `buf` holds at least `len` elements.
pub(crate) fn need(kernel: &str, what: &str, buf: &GpuBuffer, len: usize) -> Result<(), GpuError> {
    if buf.len < len {
        return Err(GpuError::Invalid(format!(
            "{kernel}: `{what}` (buffer `{}`) holds {} elements but the shape needs {len}; allocate it with the \
             shape's size",
            buf.name, buf.len
        )));
    }
    Ok(())
}

/// Errors when a size that must be positive is 0.
pub(crate) fn positive(kernel: &str, what: &str, v: usize) -> Result<(), GpuError> {
    if v == 0 {
        return Err(GpuError::Invalid(format!("{kernel}: {what} must be at least 1")));
    }
    Ok(())
}

/// Builds one dispatch of `shader::entry` with `buffers` at their binding numbers and `params`
/// as the uniform at `params_binding`. Refuses to bind one buffer twice: WebGPU forbids a
/// writable buffer aliasing another binding of the same dispatch.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn launch<P: bytemuck::Pod>(
    ctx: &GpuContext,
    shader: &str,
    entry: &str,
    label: String,
    buffers: &[(u32, &GpuBuffer)],
    params: &P,
    params_binding: u32,
    workgroups: [u32; 3],
) -> Result<Dispatch, GpuError> {
    for (i, (_, a)) in buffers.iter().enumerate() {
        if let Some((_, b)) = buffers[i + 1..].iter().find(|(_, b)| b.buffer == a.buffer) {
            return Err(GpuError::Invalid(format!(
                "{label}: buffer `{}` is bound twice (also as `{}`); WebGPU forbids aliasing a written buffer, \
                 pass a separate output buffer",
                a.name, b.name
            )));
        }
    }
    let pipeline = ctx.pipeline(shader, entry).await?;
    let u = ctx.uniform(&label, params);
    let mut entries: Vec<(u32, &wgpu::Buffer)> = buffers.iter().map(|(i, b)| (*i, &b.buffer)).collect();
    entries.push((params_binding, &u));
    let bind_group = ctx.bind(&label, &pipeline, &entries);
    Ok(Dispatch {
        label,
        pipeline,
        bind_group,
        workgroups,
        uniforms: vec![u],
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    outer: u32,
    n: u32,
    inner: u32,
    _pad: u32,
}

/// `out (outer, inner) = sum over n of x (outer, n, inner)`; bias gradients are
/// `sum_axis(dy, out, 1, B*T, C)`. Deterministic: each output sums its column in order.
pub async fn sum_axis(
    ctx: &GpuContext,
    x: &GpuBuffer,
    out: &GpuBuffer,
    outer: usize,
    n: usize,
    inner: usize,
) -> Result<Dispatch, GpuError> {
    let k = "reduce::sum_axis";
    need(k, "x", x, outer * n * inner)?;
    need(k, "out", out, outer * inner)?;
    let params = Params {
        outer: outer as u32,
        n: n as u32,
        inner: inner as u32,
        _pad: 0,
    };
    let label = format!("sum_axis ({outer}, {n}, {inner})");
    launch(
        ctx,
        "reduce",
        "sum_axis",
        label,
        &[(0, x), (1, out)],
        &params,
        2,
        grid_1d(outer * inner, 256),
    )
    .await
}
