//! Embedding lookup and its scatter-add gradient (shaders/embedding.wgsl). An id >= V reads
//! zeros and its gradient is dropped: never an out-of-bounds access. The `*_devices` forms run
//! D simulated devices in one dispatch, each with its own table block; the plain forms are D = 1.
use super::reduce::{launch, need, positive};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError};

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

/// Checks the sizes shared by forward and backward: V, C, D positive and `n` (all devices'
/// ids) splitting evenly over the devices.
fn check(kernel: &str, n: usize, v: usize, c: usize, devices: usize) -> Result<(), GpuError> {
    positive(kernel, "C", c)?;
    positive(kernel, "V (table rows)", v)?;
    positive(kernel, "devices", devices)?;
    if !n.is_multiple_of(devices) {
        return Err(GpuError::Invalid(format!(
            "{kernel}: {n} ids do not split evenly over {devices} devices; n counts all devices' ids \
             (devices x ids per device)"
        )));
    }
    Ok(())
}

/// Label suffix naming the device count when there is more than one.
fn on_devices(devices: usize) -> String {
    if devices == 1 {
        String::new()
    } else {
        format!(" on {devices} devices")
    }
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
    forward_devices(ctx, table, ids, out, n, v, c, 1).await
}

/// [`forward_rows`] on `devices` simulated devices in one dispatch: table (D, V, C), ids
/// (D, N / D), out (D, N / D, C); device d looks its ids up in its own table block. `n`
/// counts all devices' ids.
#[allow(clippy::too_many_arguments)]
pub async fn forward_devices(
    ctx: &GpuContext,
    table: &GpuBuffer,
    ids: &GpuBuffer,
    out: &GpuBuffer,
    n: usize,
    v: usize,
    c: usize,
    devices: usize,
) -> Result<Dispatch, GpuError> {
    let k = "embedding::forward";
    check(k, n, v, c, devices)?;
    need(k, "table", table, devices * v * c)?;
    need(k, "ids", ids, n)?;
    need(k, "out", out, n * c)?;
    let params = Params {
        n: n as u32,
        v: v as u32,
        c: c as u32,
        groups: 1,
        nl: (n / devices) as u32,
        devices: devices as u32,
        _pad: [0; 2],
    };
    let label = format!("embedding ({n}, {c}) from {v} rows{}", on_devices(devices));
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
    backward_devices(ctx, dout, ids, dtable, n, v, c, 1).await
}

/// [`backward`] on `devices` simulated devices in one dispatch: dout (D, N / D, C), ids
/// (D, N / D), dtable (D, V, C), each device scatter-adding into its own block only. `n`
/// counts all devices' ids.
#[allow(clippy::too_many_arguments)]
pub async fn backward_devices(
    ctx: &GpuContext,
    dout: &GpuBuffer,
    ids: &GpuBuffer,
    dtable: &GpuBuffer,
    n: usize,
    v: usize,
    c: usize,
    devices: usize,
) -> Result<Dispatch, GpuError> {
    let k = "embedding::backward";
    check(k, n, v, c, devices)?;
    need(k, "dout", dout, n * c)?;
    need(k, "ids", ids, n)?;
    need(k, "dtable", dtable, devices * v * c)?;
    // Enough invocations to fill the device, but no more: each one reads all N / D ids of its
    // device. CPU drivers run few invocations at once, GPUs tens of thousands.
    let target: usize = if ctx.summary.device_type == "Cpu" { 2048 } else { 65536 };
    let groups = target.div_ceil(devices * c).clamp(1, v);
    let params = Params {
        n: n as u32,
        v: v as u32,
        c: c as u32,
        groups: groups as u32,
        nl: (n / devices) as u32,
        devices: devices as u32,
        _pad: [0; 2],
    };
    let label = format!("embedding backward ({n}, {c}) into {v} rows{}", on_devices(devices));
    let buffers = [(3, dout), (1, ids), (4, dtable)];
    launch(
        ctx,
        "embedding",
        "backward",
        label,
        &buffers,
        &params,
        5,
        grid_1d(devices * groups * c, 256),
    )
    .await
}
