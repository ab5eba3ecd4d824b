//! A mixture-of-experts block's routing (shaders/moe.wgsl), with its CPU twin in
//! [`crate::reference::moe`]: the router and its gradient, and the index moves between token
//! rows and expert slots. One dispatch serves every simulated device: token-major arrays hold
//! the devices' groups one after another, the expert buffers (E, G, C, W) one block per device.
use super::check::{need, positive};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
pub use crate::reference::moe::MoeShape;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    groups: u32,
    seq: u32,
    experts: u32,
    k: u32,
    capacity: u32,
    width: u32,
    devices: u32,
    _pad: u32,
}

/// The sizes every launcher checks: positive, and the index arrays' largest values in 32 bits.
fn params(kernel: &str, s: MoeShape, devices: usize, rows: bool) -> Result<Params, GpuError> {
    for (what, v) in [
        ("groups", s.groups),
        ("sequence", s.seq),
        ("experts", s.experts),
        ("top_k", s.k),
        ("capacity", s.capacity),
        ("devices", devices),
    ] {
        positive(kernel, what, v)?;
    }
    if rows {
        positive(kernel, "width", s.width)?;
    }
    let u =
        |x: usize| u32::try_from(x).map_err(|_| GpuError::Invalid(format!("{kernel}: {x} does not fit in 32 bits")));
    // The encodings reach E * C + E and S * k.
    u(s.experts * (s.capacity + 1))?;
    u(devices * s.groups * s.seq * s.k.max(s.experts).max(s.width))?;
    u(devices * s.experts * s.groups * s.capacity * s.width)?;
    Ok(Params {
        groups: u(s.groups)?,
        seq: u(s.seq)?,
        experts: u(s.experts)?,
        k: u(s.k)?,
        capacity: u(s.capacity)?,
        width: u(s.width)?,
        devices: u(devices)?,
        _pad: 0,
    })
}

/// The router's buffers: the logits it reads and the five arrays it writes.
pub struct Route<'a> {
    pub logits: &'a GpuBuffer,
    pub probs: &'a GpuBuffer,
    pub gates: &'a GpuBuffer,
    pub places: &'a GpuBuffer,
    pub owners: &'a GpuBuffer,
    pub load: &'a GpuBuffer,
}

/// The router on every device's groups: one workgroup per group.
pub async fn route(ctx: &GpuContext, b: &Route<'_>, s: MoeShape, devices: usize) -> Result<Dispatch, GpuError> {
    let k = "moe::route";
    let p = params(k, s, devices, false)?;
    let groups = devices * s.groups;
    need(k, "logits", b.logits, groups * s.seq * s.experts)?;
    need(k, "probs", b.probs, groups * s.seq * s.experts)?;
    need(k, "gates", b.gates, groups * s.seq * s.k)?;
    need(k, "places", b.places, groups * s.seq * s.k)?;
    need(k, "owners", b.owners, groups * s.experts * s.capacity)?;
    need(k, "load", b.load, groups * 2 * s.experts)?;
    let label = format!(
        "moe route {groups}x({}, {}) top {} into {} slots",
        s.seq, s.experts, s.k, s.capacity
    );
    let kernel = Kernel::new("moe", "route", label)
        .read(0, "logits", b.logits)
        .write(1, "probs", b.probs)
        .write(2, "gates", b.gates)
        .write(3, "places", b.places)
        .write(4, "owners", b.owners)
        .write(5, "load", b.load)
        .uniform(6, &p)
        .grid(grid_1d(groups * 64, 64));
    ctx.launch(kernel).await
}

/// The router's gradient's buffers.
pub struct RouteGrad<'a> {
    pub probs: &'a GpuBuffer,
    pub gates: &'a GpuBuffer,
    pub places: &'a GpuBuffer,
    pub dprobs: &'a GpuBuffer,
    pub dgates: &'a GpuBuffer,
    pub dlogits: &'a GpuBuffer,
}

/// dlogits of every device's tokens: a lane per token.
pub async fn route_grad(
    ctx: &GpuContext,
    b: &RouteGrad<'_>,
    s: MoeShape,
    devices: usize,
) -> Result<Dispatch, GpuError> {
    let k = "moe::route_grad";
    let p = params(k, s, devices, false)?;
    let tokens = devices * s.groups * s.seq;
    for (what, buf, n) in [
        ("probs", b.probs, s.experts),
        ("gates", b.gates, s.k),
        ("places", b.places, s.k),
        ("dprobs", b.dprobs, s.experts),
        ("dgates", b.dgates, s.k),
        ("dlogits", b.dlogits, s.experts),
    ] {
        need(k, what, buf, tokens * n)?;
    }
    let kernel = Kernel::new(
        "moe",
        "route_grad",
        format!("moe route backward {tokens}x{}", s.experts),
    )
    .read(7, "probs", b.probs)
    .read(8, "gates", b.gates)
    .read(9, "places", b.places)
    .read(10, "dprobs", b.dprobs)
    .read(11, "dgates", b.dgates)
    .write(12, "dlogits", b.dlogits)
    .uniform(6, &p)
    .grid(grid_1d(tokens, 64));
    ctx.launch(kernel).await
}

/// `out (D, E, G, C, W)`: each slot's owner's row of `x (D*G, S, W)`, times its gate where
/// `gates` are given; zeros where empty.
pub async fn dispatch(
    ctx: &GpuContext,
    x: &GpuBuffer,
    owners: &GpuBuffer,
    gates: Option<&GpuBuffer>,
    out: &GpuBuffer,
    s: MoeShape,
    devices: usize,
) -> Result<Dispatch, GpuError> {
    let k = "moe::dispatch";
    let p = params(k, s, devices, true)?;
    let groups = devices * s.groups;
    let n = groups * s.experts * s.capacity * s.width;
    need(k, "x", x, groups * s.seq * s.width)?;
    need(k, "owners", owners, groups * s.experts * s.capacity)?;
    need(k, "out", out, n)?;
    let label = format!(
        "moe dispatch {groups}x({}, {}) into {}x{} slots",
        s.seq, s.width, s.experts, s.capacity
    );
    let entry = if gates.is_some() { "dispatch_gated" } else { "dispatch" };
    let mut kernel = Kernel::new("moe", entry, label)
        .read(13, "x", x)
        .read(15, "owners", owners)
        .write(17, "out", out)
        .uniform(6, &p)
        .grid(grid_1d(n, 64));
    if let Some(g) = gates {
        need(k, "gates", g, groups * s.seq * s.k)?;
        kernel = kernel.read(16, "gates", g);
    }
    ctx.launch(kernel).await
}

/// `out (D*G, S, W)`: each token's sum over its kept choices of its slot's row of
/// `y (D, E, G, C, W)`, times the choice's gate where `gates` are given.
pub async fn combine(
    ctx: &GpuContext,
    y: &GpuBuffer,
    places: &GpuBuffer,
    gates: Option<&GpuBuffer>,
    out: &GpuBuffer,
    s: MoeShape,
    devices: usize,
) -> Result<Dispatch, GpuError> {
    let k = "moe::combine";
    let p = params(k, s, devices, true)?;
    let groups = devices * s.groups;
    let n = groups * s.seq * s.width;
    need(k, "y", y, groups * s.experts * s.capacity * s.width)?;
    need(k, "places", places, groups * s.seq * s.k)?;
    need(k, "out", out, n)?;
    let label = format!(
        "moe combine {}x{} slots into {groups}x({}, {})",
        s.experts, s.capacity, s.seq, s.width
    );
    let entry = if gates.is_some() { "combine_gated" } else { "combine" };
    let mut kernel = Kernel::new("moe", entry, label)
        .read(13, "y", y)
        .read(9, "places", places)
        .write(17, "out", out)
        .uniform(6, &p)
        .grid(grid_1d(n, 64));
    if let Some(g) = gates {
        need(k, "gates", g, groups * s.seq * s.k)?;
        kernel = kernel.read(16, "gates", g);
    }
    ctx.launch(kernel).await
}

/// `out (D*G, S, k)`: each kept choice's row of `a (D*G, S, W)` dotted with its slot's row of
/// `b (D, E, G, C, W)`; 0 for a dropped choice.
pub async fn gate_grad(
    ctx: &GpuContext,
    a: &GpuBuffer,
    b: &GpuBuffer,
    places: &GpuBuffer,
    out: &GpuBuffer,
    s: MoeShape,
    devices: usize,
) -> Result<Dispatch, GpuError> {
    let k = "moe::gate_grad";
    let p = params(k, s, devices, true)?;
    let groups = devices * s.groups;
    let n = groups * s.seq * s.k;
    need(k, "a", a, groups * s.seq * s.width)?;
    need(k, "b", b, groups * s.experts * s.capacity * s.width)?;
    need(k, "places", places, n)?;
    need(k, "out", out, n)?;
    let kernel = Kernel::new(
        "moe",
        "gate_grad",
        format!("moe gate gradient {groups}x({}, {})", s.seq, s.k),
    )
    .read(13, "a", a)
    .read(14, "b", b)
    .read(9, "places", places)
    .write(17, "out", out)
    .uniform(6, &p)
    .grid(grid_1d(n, 64));
    ctx.launch(kernel).await
}
