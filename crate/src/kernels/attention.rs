//! Fused causal attention (shaders/attention.wgsl), with its CPU twin in
//! [`crate::reference::attention`]: q, k, v, o (heads, T, Dh) with heads counting every
//! device's B*H (heads are independent, so one launch covers all devices), lse (heads, T), and
//! the backward's rows scratch (heads, T, 2).
//!
//! Dropout bits come as [`Dropout::Bits`], a (heads, T, T) array a random_bits launch made, or
//! as [`Dropout::Drawn`]: the key and the draw, from which every kernel makes the bits it needs
//! in place with the same Threefry counters, so no (T, T) array is ever held.
use super::check::{need, positive};
use super::random::{counters, Draw};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
pub use crate::reference::attention::AttentionShape;
use crate::rng::keep_scale;

/// The largest head dimension the kernels take: each lane keeps a few rows of Dh in registers
/// and a workgroup stages tiles of them (shaders/attention.wgsl's MAX_DH).
pub const MAX_HEAD_DIM: usize = 64;
/// Rows per workgroup (WG): one row per invocation.
const WG: usize = 64;

/// How an adapter runs the op: the fused kernels, or the composition through the tuned matmuls
/// with a transient (heads, T, T) scratch (shaders/attention.wgsl says why CPU adapters want it).
/// Either computes the op's math and saves only o and lse for the backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lowering {
    Fused,
    Composed,
}

/// The largest (heads, T, T) scratch the composed lowering takes (16 MiB of f32 each; the
/// backward holds two); past it the fused kernels run, whose memory does not grow with T^2.
pub const COMPOSED_MAX_SCORES: usize = 1 << 22;

/// How `ctx`'s adapter runs attention of shape `s`: [`Tuning::attention`](super::Tuning) when
/// pinned; otherwise composed on CPU adapters while the scratch stays small, fused elsewhere.
pub fn lowering(ctx: &GpuContext, s: &AttentionShape) -> Lowering {
    if let Some(pinned) = super::Tuning::with(ctx, |t| t.attention).flatten() {
        return pinned;
    }
    let cpu = ctx.summary.device_type.eq_ignore_ascii_case("cpu");
    if cpu && scores_len(s) <= COMPOSED_MAX_SCORES {
        Lowering::Composed
    } else {
        Lowering::Fused
    }
}

/// Elements of the composed lowering's scratch: the (heads, T, T) scores.
pub fn scores_len(s: &AttentionShape) -> usize {
    s.heads * s.t * s.t
}

/// Where the dropout bits come from (unused when the shape's rate is 0).
#[derive(Clone, Copy)]
pub enum Dropout<'a> {
    None,
    /// Bits `(heads, T, T)` u32, made beforehand.
    Bits(&'a GpuBuffer),
    /// Drawn in the kernels: the keys (as `random_bits` takes them) and each device's block of
    /// the global (B, H, T, T) bits.
    Drawn {
        key: &'a GpuBuffer,
        draw: Draw<'a>,
    },
}

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
    heads_per_dev: u32,
    n_global: u32,
    n_block: u32,
    rng_layout: u32,
    key_stride: u32,
    block_size: [u32; 4],
    global_stride: [u32; 4],
}

/// The launch's parameters, and the words (bits or keys) and block offsets its kernels bind.
struct Setup<'a> {
    params: Params,
    words: &'a GpuBuffer,
    offsets: Option<Vec<u32>>,
}

fn setup<'a>(
    kernel: &str,
    s: &AttentionShape,
    dropout: Dropout<'a>,
    stand_in: &'a GpuBuffer,
) -> Result<Setup<'a>, GpuError> {
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
    let mut params = Params {
        heads: s.heads as u32,
        t: s.t as u32,
        dh: s.dh as u32,
        dropout: 0,
        scale: s.scale,
        keep,
        keep_scale: keep_scale(keep),
        heads_per_dev: s.heads as u32,
        n_global: 0,
        n_block: 0,
        rng_layout: 0,
        key_stride: 0,
        block_size: [1; 4],
        global_stride: [1; 4],
    };
    let mut words = stand_in;
    let mut offsets = None;
    match (s.rate > 0.0, dropout) {
        (false, _) => {}
        (true, Dropout::None) => {
            return Err(GpuError::Invalid(format!(
                "{kernel}: dropout needs its bits or its key"
            )))
        }
        (true, Dropout::Bits(b)) => {
            need(kernel, "bits", b, s.heads * s.t * s.t)?;
            params.dropout = 1;
            words = b;
        }
        (true, Dropout::Drawn { key, draw }) => {
            let c = counters(kernel, key, &draw)?;
            let devices = draw.blocks.len();
            let per_dev = s.heads / devices.max(1);
            if per_dev * devices != s.heads || c.n_block as usize != per_dev * s.t * s.t {
                return Err(GpuError::Invalid(format!(
                    "{kernel}: {devices} devices' blocks of {} bits do not cover {} heads of ({}, {}) probabilities",
                    c.n_block, s.heads, s.t, s.t
                )));
            }
            params = Params {
                dropout: 2,
                heads_per_dev: per_dev as u32,
                n_global: c.n_global,
                n_block: c.n_block,
                rng_layout: c.rng_layout,
                key_stride: c.key_stride,
                block_size: c.block_size,
                global_stride: c.global_stride,
                ..params
            };
            words = key;
            offsets = Some(c.offsets);
        }
    }
    Ok(Setup { params, words, offsets })
}

impl<'a> Setup<'a> {
    /// Binds the words, the offsets (a stand-in when nothing is drawn) and the parameters.
    fn bind<'k>(&self, ctx: &GpuContext, kernel: Kernel<'k>, stand_in: &'k GpuBuffer) -> Result<Kernel<'k>, GpuError>
    where
        'a: 'k,
    {
        let kernel = kernel.read(3, "words", self.words).uniform(7, &self.params);
        Ok(match &self.offsets {
            Some(o) => kernel.read_owned(4, "offsets", ctx.upload("attention dropout offsets", o)?),
            None => kernel.read(4, "offsets", stand_in),
        })
    }
}

/// One workgroup per WG rows of a head; heads past 65535 fold into z.
fn grid(s: &AttentionShape) -> [u32; 3] {
    let z = s.heads.div_ceil(65535);
    [s.t.div_ceil(WG) as u32, s.heads.div_ceil(z) as u32, z as u32]
}

/// The forward's buffers: q, k, v in; o and lse out.
pub struct Forward<'a> {
    pub q: &'a GpuBuffer,
    pub k: &'a GpuBuffer,
    pub v: &'a GpuBuffer,
    pub dropout: Dropout<'a>,
    pub o: &'a GpuBuffer,
    pub lse: &'a GpuBuffer,
}

/// `(o, lse) = attention(q, k, v)`: one dispatch.
pub async fn forward(ctx: &GpuContext, b: &Forward<'_>, s: &AttentionShape) -> Result<Dispatch, GpuError> {
    let kname = "attention::forward";
    let setup = setup(kname, s, b.dropout, b.q)?;
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
    .write(5, "o", b.o)
    .write(6, "lse", b.lse)
    .grid(grid(s));
    ctx.launch(setup.bind(ctx, kernel, b.q)?).await
}

/// The backward's buffers: the forward's inputs and outputs, the cotangent, the gradients, and
/// `rows` (heads, T, 2) scratch for each row's (lse, delta).
pub struct Backward<'a> {
    pub q: &'a GpuBuffer,
    pub k: &'a GpuBuffer,
    pub v: &'a GpuBuffer,
    pub o: &'a GpuBuffer,
    pub lse: &'a GpuBuffer,
    pub d_o: &'a GpuBuffer,
    pub dropout: Dropout<'a>,
    pub rows: &'a GpuBuffer,
    pub dq: &'a GpuBuffer,
    pub dk: &'a GpuBuffer,
    pub dv: &'a GpuBuffer,
}

/// Elements of the backward's rows scratch.
pub fn rows_len(s: &AttentionShape) -> usize {
    2 * s.heads * s.t
}

/// `(dq, dk, dv)`: four dispatches (each row's (lse, rowsum(do * o)), then dq, dk and dv).
pub async fn backward(ctx: &GpuContext, b: &Backward<'_>, s: &AttentionShape) -> Result<Vec<Dispatch>, GpuError> {
    let kname = "attention::backward";
    let setup = setup(kname, s, b.dropout, b.q)?;
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
    need(kname, "rows", b.rows, rows_len(s))?;
    let shape = format!("({}, {}, {})", s.heads, s.t, s.dh);
    let mut out = vec![row_delta(ctx, b, s, &setup.params).await?];
    let common = |entry: &str, label: &str| {
        let kernel = Kernel::new("attention", entry, format!("attention backward {label} {shape}"))
            .read(0, "q", b.q)
            .read(1, "k", b.k)
            .read(9, "do", b.d_o)
            .read(11, "rows", b.rows)
            .grid(grid(s));
        setup.bind(ctx, kernel, b.q)
    };
    out.push(
        ctx.launch(common("backward_dq", "dq")?.read(2, "v", b.v).write(12, "dq", b.dq))
            .await?,
    );
    out.push(
        ctx.launch(common("backward_dk", "dk")?.read(2, "v", b.v).write(13, "dk", b.dk))
            .await?,
    );
    out.push(ctx.launch(common("backward_dv", "dv")?.write(14, "dv", b.dv)).await?);
    Ok(out)
}

/// Each row's (lse, rowsum(do * o)) into `b.rows`: the backward's first dispatch either way.
async fn row_delta(
    ctx: &GpuContext,
    b: &Backward<'_>,
    s: &AttentionShape,
    params: &Params,
) -> Result<Dispatch, GpuError> {
    let shape = format!("({}, {}, {})", s.heads, s.t, s.dh);
    let rows = Kernel::new("attention", "row_delta", format!("attention backward rows {shape}"))
        .read(8, "o", b.o)
        .read(9, "do", b.d_o)
        .read(15, "lse", b.lse)
        .write(10, "rows", b.rows)
        .uniform(7, params)
        .grid(grid_1d(s.heads * s.t, 64));
    ctx.launch(rows).await
}

/// The composed forward's middle dispatch: `scores` (scale q k^T, heads x T x T) becomes the
/// kept probabilities in place, and `lse` each row's log-sum-exp. `q` stands in for the
/// bindings dropout leaves unused.
pub async fn probs(
    ctx: &GpuContext,
    scores: &GpuBuffer,
    lse: &GpuBuffer,
    dropout: Dropout<'_>,
    q: &GpuBuffer,
    s: &AttentionShape,
) -> Result<Dispatch, GpuError> {
    let kname = "attention::probs";
    let setup = setup(kname, s, dropout, q)?;
    need(kname, "scores", scores, scores_len(s))?;
    need(kname, "lse", lse, s.heads * s.t)?;
    let kernel = Kernel::new(
        "attention",
        "probs",
        format!("attention probs ({}, {}, {})", s.heads, s.t, s.t),
    )
    .write(16, "scores", scores)
    .write(6, "lse", lse)
    .grid(grid_1d(s.heads * s.t, 64));
    ctx.launch(setup.bind(ctx, kernel, q)?).await
}

/// The composed backward's buffers: the op's, and its two (heads, T, T) scratch arrays.
pub struct ComposedBackward<'a> {
    pub op: Backward<'a>,
    /// Holds scale q k^T, then the kept probabilities.
    pub scores: &'a GpuBuffer,
    /// Holds do v^T, then ds.
    pub dscores: &'a GpuBuffer,
}

/// The composed backward's first two dispatches: each row's (lse, delta), then, once
/// `scores` holds scale q k^T and `dscores` holds do v^T (the caller's matmuls, between the
/// two), the kept probabilities and ds in their place. Returns (rows, probs_grad).
pub async fn composed_backward(
    ctx: &GpuContext,
    b: &ComposedBackward<'_>,
    s: &AttentionShape,
) -> Result<(Dispatch, Dispatch), GpuError> {
    let kname = "attention::probs_grad";
    let setup = setup(kname, s, b.op.dropout, b.op.q)?;
    need(kname, "scores", b.scores, scores_len(s))?;
    need(kname, "dscores", b.dscores, scores_len(s))?;
    need(kname, "rows", b.op.rows, rows_len(s))?;
    let rows = row_delta(ctx, &b.op, s, &setup.params).await?;
    let kernel = Kernel::new(
        "attention",
        "probs_grad",
        format!("attention probs backward ({}, {}, {})", s.heads, s.t, s.t),
    )
    .write(16, "scores", b.scores)
    .write(17, "dscores", b.dscores)
    .read(11, "rows", b.op.rows)
    .grid(grid_1d(scores_len(s), 64));
    let grad = ctx.launch(setup.bind(ctx, kernel, b.op.q)?).await?;
    Ok((rows, grad))
}
