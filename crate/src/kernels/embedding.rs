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
    // Four columns an invocation where C allows (forward_v4).
    let kernel = if c.is_multiple_of(4) {
        Kernel::new("embedding", "forward_v4", label)
            .read(9, "table", table)
            .write(10, "out", out)
            .grid(grid_1d(n * c / 4, 256))
    } else {
        Kernel::new("embedding", "forward", label)
            .read(0, "table", table)
            .write(2, "out", out)
            .grid(grid_1d(n * c, 256))
    };
    ctx.launch(kernel.read(1, "ids", ids).uniform(5, &p)).await
}

/// The threads a CPU driver runs workgroups on: one per core (lavapipe, SwiftShader). A page
/// does not ask, and takes two.
#[cfg(not(target_arch = "wasm32"))]
fn cpu_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

#[cfg(target_arch = "wasm32")]
fn cpu_threads() -> usize {
    2
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
    // Four columns an invocation and four ids a read where C and N / D allow (backward_v4).
    let v4 = c.is_multiple_of(4) && (p.nl as usize).is_multiple_of(4);
    let owners = if v4 { c / 4 } else { c };
    // Enough invocations to fill the device, but no more: each one reads all N / D ids of its
    // device. CPU drivers run a workgroup (of 64) per thread, 8 or 16 invocations a step: one
    // workgroup per thread (on 2 cores, 128 invocations took a third of the time 512 did, which
    // took a third of 2048's); GPUs tens of thousands.
    let target: usize = if ctx.summary.is_cpu() {
        64 * cpu_threads()
    } else {
        65536
    };
    let groups = target.div_ceil(devices * owners).clamp(1, v);
    p.groups = groups as u32;
    let label = format!("embedding backward ({n}, {c}) into {v} rows{}", on_devices(devices));
    let grid = grid_1d(devices * groups * owners, 64);
    let kernel = if v4 {
        Kernel::new("embedding", "backward_v4", label)
            .read(7, "dout", dout)
            .read(6, "ids", ids)
            .write(8, "dtable", dtable)
    } else {
        Kernel::new("embedding", "backward", label)
            .read(3, "dout", dout)
            .read(1, "ids", ids)
            .write(4, "dtable", dtable)
    };
    ctx.launch(kernel.uniform(5, &p).grid(grid)).await
}
