//! Embedding lookup and its scatter-add gradient (shaders/embedding.wgsl). An id >= V reads
//! zeros and its gradient is dropped: never an out-of-bounds access. One dispatch serves D
//! simulated devices ([`EmbeddingShape::devices`]), each with its own table block.
use super::check::{need, on_devices, per_device, positive};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
pub use crate::reference::embedding::EmbeddingShape;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    v: u32,
    c: u32,
    groups: u32,
    nl: u32,
    devices: u32,
    _pad: [u32; 2],
}

/// Checks the sizes shared by forward and backward: V, C, D positive and the ids splitting
/// evenly over the devices; the params with `groups` = 1.
fn params(kernel: &str, s: EmbeddingShape) -> Result<Params, GpuError> {
    positive(kernel, "C", s.c)?;
    positive(kernel, "V (table rows)", s.v)?;
    let nl = per_device(kernel, "ids", s.n, s.devices)?;
    Ok(Params {
        n: s.n as u32,
        v: s.v as u32,
        c: s.c as u32,
        groups: 1,
        nl: nl as u32,
        devices: s.devices as u32,
        _pad: [0; 2],
    })
}

/// `out (D, N / D, C) = table[ids]`, device d looking its ids (D, N / D) up in its own block of
/// table (D, V, C). A table in a buffer larger than (D, V, C) (a reused slot) is fine: ids >= V
/// still read zeros.
pub async fn forward(
    ctx: &GpuContext,
    table: &GpuBuffer,
    ids: &GpuBuffer,
    out: &GpuBuffer,
    s: EmbeddingShape,
) -> Result<Dispatch, GpuError> {
    let k = "embedding::forward";
    let p = params(k, s)?;
    let EmbeddingShape { n, v, c, devices } = s;
    need(k, "table", table, devices * v * c)?;
    need(k, "ids", ids, n)?;
    need(k, "out", out, n * c)?;
    let label = format!("embedding ({n}, {c}) from {v} rows{}", on_devices(devices));
    let kernel = Kernel::new("embedding", "forward", label)
        .read(0, "table", table)
        .read(1, "ids", ids)
        .write(2, "out", out)
        .uniform(5, &p)
        .grid(grid_1d(n * c, 256));
    ctx.launch(kernel).await
}

/// `dtable (D, V, C)` = scatter-add of the rows of `dout (D, N / D, C)` by `ids`, each device into
/// its own block only; overwrites dtable. Deterministic (fixed summation order, no atomics).
pub async fn backward(
    ctx: &GpuContext,
    dout: &GpuBuffer,
    ids: &GpuBuffer,
    dtable: &GpuBuffer,
    s: EmbeddingShape,
) -> Result<Dispatch, GpuError> {
    let k = "embedding::backward";
    let mut p = params(k, s)?;
    let EmbeddingShape { n, v, c, devices } = s;
    need(k, "dout", dout, n * c)?;
    need(k, "ids", ids, n)?;
    need(k, "dtable", dtable, devices * v * c)?;
    // Enough invocations to fill the device, but no more: each one reads all N / D ids of its
    // device. CPU drivers run a workgroup per thread, 8 or 16 invocations a step (lavapipe:
    // 512 invocations, 8 workgroups, take a third of the time 2048 did); GPUs tens of thousands.
    let target: usize = if ctx.summary.device_type == "Cpu" { 512 } else { 65536 };
    let groups = target.div_ceil(devices * c).clamp(1, v);
    p.groups = groups as u32;
    let label = format!("embedding backward ({n}, {c}) into {v} rows{}", on_devices(devices));
    let kernel = Kernel::new("embedding", "backward", label)
        .read(3, "dout", dout)
        .read(1, "ids", ids)
        .write(4, "dtable", dtable)
        .uniform(5, &p)
        .grid(grid_1d(devices * groups * c, 64));
    ctx.launch(kernel).await
}
