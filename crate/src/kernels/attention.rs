//! Fused causal attention (shaders/attention.wgsl), with its CPU twin in
//! [`crate::reference::attention`]: q, k, v, o (heads, T, Dh) with heads counting every
//! device's B*H (heads are independent, so one launch covers all devices), lse and delta
//! (heads, T), dropout bits (heads, T, T).
use super::check::{need, positive};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
pub use crate::reference::attention::AttentionShape;
use crate::rng::keep_scale;

/// The largest head dimension the kernels take: each lane keeps a few rows of Dh in registers
/// and a workgroup stages tiles of them (shaders/attention.wgsl's MAX_DH).
pub const MAX_HEAD_DIM: usize = 64;
/// Rows per workgroup (WG) and per staged tile (TILE).
const WG: usize = 64;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    heads: u32,
    t: u32,
    dh: u32,
    dropout: u32,
    scale: f32,
    keep: f32,
    keep_scale: f32,
    _pad: u32,
}

fn params(kernel: &str, s: &AttentionShape) -> Result<Params, GpuError> {
    positive(kernel, "heads", s.heads)?;
    positive(kernel, "T", s.t)?;
    positive(kernel, "Dh", s.dh)?;
    if s.dh > MAX_HEAD_DIM {
        return Err(GpuError::Invalid(format!(
            "{kernel}: the fused attention kernels take head dimensions up to {MAX_HEAD_DIM}, and this model's is {} \
             (d_model / heads): use more heads, or --attention unfused",
            s.dh
        )));
    }
    if !(0.0..1.0).contains(&s.rate) {
        return Err(GpuError::Invalid(format!(
            "{kernel}: dropout rate {} must be in [0, 1)",
            s.rate
        )));
    }
    let keep = 1.0 - s.rate;
    Ok(Params {
        heads: s.heads as u32,
        t: s.t as u32,
        dh: s.dh as u32,
        dropout: u32::from(s.rate > 0.0),
        scale: s.scale,
        keep,
        keep_scale: keep_scale(keep),
        _pad: 0,
    })
}

/// One workgroup per WG rows of a head; heads past 65535 fold into z.
fn grid(s: &AttentionShape) -> [u32; 3] {
    let z = s.heads.div_ceil(65535);
    [s.t.div_ceil(WG) as u32, s.heads.div_ceil(z) as u32, z as u32]
}

/// The dropout bits, or (unread without dropout) a stand-in binding.
fn bits_or<'a>(
    s: &AttentionShape,
    bits: Option<&'a GpuBuffer>,
    stand_in: &'a GpuBuffer,
) -> Result<&'a GpuBuffer, GpuError> {
    match (s.rate > 0.0, bits) {
        (true, Some(b)) => {
            need("attention", "bits", b, s.heads * s.t * s.t)?;
            Ok(b)
        }
        (true, None) => Err(GpuError::Invalid("attention: dropout needs its bits".into())),
        (false, _) => Ok(stand_in),
    }
}

/// The forward's buffers: q, k, v in; o and lse out.
pub struct Forward<'a> {
    pub q: &'a GpuBuffer,
    pub k: &'a GpuBuffer,
    pub v: &'a GpuBuffer,
    pub bits: Option<&'a GpuBuffer>,
    pub o: &'a GpuBuffer,
    pub lse: &'a GpuBuffer,
}

/// `(o, lse) = attention(q, k, v)`: one dispatch.
pub async fn forward(ctx: &GpuContext, b: &Forward<'_>, s: &AttentionShape) -> Result<Dispatch, GpuError> {
    let kname = "attention::forward";
    let p = params(kname, s)?;
    let n = s.heads * s.t * s.dh;
    for (what, buf) in [("q", b.q), ("k", b.k), ("v", b.v), ("o", b.o)] {
        need(kname, what, buf, n)?;
    }
    need(kname, "lse", b.lse, s.heads * s.t)?;
    let kernel = Kernel::new(
        "attention",
        "forward",
        format!("attention ({}, {}, {})", s.heads, s.t, s.dh),
    )
    .read(0, "q", b.q)
    .read(1, "k", b.k)
    .read(2, "v", b.v)
    .read(3, "bits", bits_or(s, b.bits, b.q)?)
    .write(4, "o", b.o)
    .write(5, "lse", b.lse)
    .uniform(6, &p)
    .grid(grid(s));
    ctx.launch(kernel).await
}

/// The backward's buffers: the forward's inputs and outputs, the cotangent, the gradients, and
/// `delta` (heads, T) scratch for the row sums.
pub struct Backward<'a> {
    pub q: &'a GpuBuffer,
    pub k: &'a GpuBuffer,
    pub v: &'a GpuBuffer,
    pub o: &'a GpuBuffer,
    pub lse: &'a GpuBuffer,
    pub d_o: &'a GpuBuffer,
    pub bits: Option<&'a GpuBuffer>,
    pub delta: &'a GpuBuffer,
    pub dq: &'a GpuBuffer,
    pub dk: &'a GpuBuffer,
    pub dv: &'a GpuBuffer,
}

/// `(dq, dk, dv)`: four dispatches (the row sums of do * o, then dq, dk and dv).
pub async fn backward(ctx: &GpuContext, b: &Backward<'_>, s: &AttentionShape) -> Result<Vec<Dispatch>, GpuError> {
    let kname = "attention::backward";
    let p = params(kname, s)?;
    let n = s.heads * s.t * s.dh;
    for (what, buf) in [
        ("q", b.q),
        ("k", b.k),
        ("v", b.v),
        ("o", b.o),
        ("do", b.d_o),
        ("dq", b.dq),
        ("dk", b.dk),
        ("dv", b.dv),
    ] {
        need(kname, what, buf, n)?;
    }
    need(kname, "lse", b.lse, s.heads * s.t)?;
    need(kname, "delta", b.delta, s.heads * s.t)?;
    let bits = bits_or(s, b.bits, b.q)?;
    let shape = format!("({}, {}, {})", s.heads, s.t, s.dh);
    let delta = Kernel::new("attention", "row_delta", format!("attention backward rows {shape}"))
        .read(7, "o", b.o)
        .read(8, "do", b.d_o)
        .write(9, "delta", b.delta)
        .uniform(6, &p)
        .grid(grid_1d(s.heads * s.t, 64));
    let mut out = vec![ctx.launch(delta).await?];
    let common = |entry: &str, label: &str| {
        Kernel::new("attention", entry, format!("attention backward {label} {shape}"))
            .read(0, "q", b.q)
            .read(1, "k", b.k)
            .read(3, "bits", bits)
            .read(8, "do", b.d_o)
            .read(10, "lse", b.lse)
            .read(11, "delta", b.delta)
            .uniform(6, &p)
            .grid(grid(s))
    };
    out.push(
        ctx.launch(common("backward_dq", "dq").read(2, "v", b.v).write(12, "dq", b.dq))
            .await?,
    );
    out.push(
        ctx.launch(common("backward_dk", "dk").read(2, "v", b.v).write(13, "dk", b.dk))
            .await?,
    );
    out.push(ctx.launch(common("backward_dv", "dv").write(14, "dv", b.dv)).await?);
    Ok(out)
}
