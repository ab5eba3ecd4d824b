//! Fused causal attention ([`Kernels`]: shaders/attention_fa.wgsl for GPUs, shaders/attention.wgsl
//! where those cannot run, shaders/attention_sg.wgsl for CPU adapters), with its CPU twin in
//! [`crate::reference::attention`]: q, o (heads, T, Dh) and k, v (heads, Tk, Dh) with heads
//! counting every device's B*H (heads are independent, so one launch covers all devices), lse
//! (heads, T), and the backward's rows scratch (heads, T, 2). Each device's rows sit in the
//! global sequence as its [`Blocks`] say (the whole sequence on one device; blocks of it under
//! context parallelism), and the causal mask compares those positions.
//!
//! The rows of q, k, v, o, do and the gradients may also sit in other buffers' layouts
//! ([`Layouts`]): the lowering hands them as they lie in the (B, T, 3, H, Dh) and (B, T, H, Dh)
//! arrays around the op, so no transpose copies them in or out.
//!
//! Dropout bits come as [`Dropout::Bits`], a (heads, T, Tk) array a random_bits launch made, or
//! as [`Dropout::Drawn`]: the key and the draw, from which every kernel makes the bits it needs
//! in place with the same Threefry counters, so no (T, T) array is ever held.
use super::check::{need, positive};
use super::random::{counters, Draw};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
pub use crate::reference::attention::{AttentionShape, Blocks};
use crate::rng::keep_scale;

/// The largest head dimension the kernels take: each lane keeps a few rows of Dh in registers
/// and a workgroup stages tiles of them (shaders/attention.wgsl's MAX_DH).
pub const MAX_HEAD_DIM: usize = 64;

/// The fused attention kernels hold a head's row in registers, up to [`MAX_HEAD_DIM`] wide: a
/// model whose head is wider runs attention unfused, refused at its heads otherwise.
pub fn check_head_dim(cfg: &crate::model::GptConfig) -> Result<(), crate::setting::Refusal> {
    use crate::setting::{Refusal, Setting};
    let dh = cfg.d_model / cfg.heads.max(1);
    if cfg.attention != crate::model::Attention::Fused || dh <= MAX_HEAD_DIM {
        return Ok(());
    }
    Err(Refusal::new(
        Setting::Heads,
        format!(
            "{} over {} is {dh} per head, and the fused attention kernels take at most {MAX_HEAD_DIM}: use at least {} \
             heads, or {}",
            Setting::DModel.at(cfg.d_model),
            Setting::Heads.at(cfg.heads),
            cfg.d_model.div_ceil(MAX_HEAD_DIM),
            Setting::Attention.at("unfused")
        ),
    ))
}

/// Rows per workgroup of the tiled kernels (WG) and of the flash kernels (FA_ROWS).
const WG: usize = 64;
const FA_ROWS: usize = 16;

/// How an adapter runs the op: fused kernels, or the composition through the tuned matmuls
/// with a transient (heads, T, T) scratch. Either computes the op's math and saves only o and
/// lse for the backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lowering {
    Fused(Kernels),
    Composed,
}

/// Which fused kernels run the op: the same arithmetic, shaped for different adapters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernels {
    /// shaders/attention.wgsl: WG rows per workgroup, one per invocation, tiles of the other side
    /// staged in workgroup memory: within WebGPU's default 8 storage buffers per stage.
    Tiled,
    /// shaders/attention_fa.wgsl, FlashAttention-2's shape: FA_ROWS rows per workgroup, four
    /// invocations a row, tiles of the other side in workgroup memory, the backward's dk and dv
    /// together over key blocks. For GPUs, where the adapter binds 10 storage buffers a stage.
    Flash,
    /// shaders/attention_sg.wgsl: one subgroup of `lanes` (8 or 16) rows per workgroup, the other
    /// side's rows shared by subgroupBroadcast. For CPU adapters, where a broadcast is one
    /// shuffle and each workgroup-memory read a loop over the lanes.
    Subgroup { lanes: u32, passes: Passes },
}

/// The dispatches of the subgroup backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passes {
    /// Each row's (lse, delta), dq, dk and dv, a kernel each, dk and dv each making every
    /// probability: within WebGPU's default 8 storage buffers per stage.
    Four,
    /// dq with its rows' (lse, delta), then dk with dv, each probability and dp made once per
    /// side: the kernels bind up to 10 storage buffers (`shaders::OVER_DEFAULT_STORAGE_BUFFERS`),
    /// so they run where the adapter allows that many.
    Two,
}

/// The largest (heads, T, T) scratch the composed lowering takes (16 MiB of f32 each; the
/// backward holds two); past it the fused kernels run, whose memory does not grow with T^2.
pub const COMPOSED_MAX_SCORES: usize = 1 << 22;

/// How `ctx`'s adapter runs attention of shape `s` over `blocks`: [`Tuning::attention`](super::Tuning)
/// when pinned; on CPU adapters the subgroup kernels where they can run, else the composition
/// while its scratch stays small and every device attends its whole sequence; the tiled kernels
/// elsewhere. Blocks of a sequence (context parallelism) always run fused: the composition's
/// matmuls read square, causal (T, T) scores.
pub fn lowering(ctx: &GpuContext, s: &AttentionShape, blocks: &[Blocks]) -> Lowering {
    let whole = blocks.iter().all(|b| *b == Blocks::whole(s.t));
    match super::Tuning::with(ctx, |t| t.attention).flatten() {
        // A pinned composition holds for whole sequences only.
        Some(pinned) if whole || pinned != Lowering::Composed => return pinned,
        _ => {}
    }
    let cpu = ctx.summary.is_cpu();
    match fused_kernels(ctx, s) {
        Kernels::Tiled if cpu && whole && scores_len(s) <= COMPOSED_MAX_SCORES => Lowering::Composed,
        kernels => Lowering::Fused(kernels),
    }
}

/// The fused kernels for `ctx`'s adapter and shape `s`: on CPU adapters the subgroup kernels where
/// they can run ([`designs`]), else the tiled ones, as before the flash kernels; on GPUs the flash
/// kernels where the adapter binds enough storage buffers, else the tiled ones.
pub fn fused_kernels(ctx: &GpuContext, s: &AttentionShape) -> Kernels {
    let all = designs(ctx, s);
    if ctx.summary.is_cpu() {
        return match all.last() {
            Some(&subgroup @ Kernels::Subgroup { .. }) => subgroup,
            _ => Kernels::Tiled,
        };
    }
    match all.contains(&Kernels::Flash) {
        true => Kernels::Flash,
        false => Kernels::Tiled,
    }
}

/// Every fused design `ctx`'s adapter can run for shape `s`, the one CPU adapters prefer last: the
/// tiled kernels; the flash kernels where the adapter binds enough storage buffers; the subgroup
/// kernels where the adapter has fixed subgroups of 8 or 16 lanes and Dh is a multiple of 4,
/// their backward in four passes and, where the adapter binds enough storage buffers, in two.
pub fn designs(ctx: &GpuContext, s: &AttentionShape) -> Vec<Kernels> {
    let mut all = vec![Kernels::Tiled];
    if Kernels::Flash.binds_within(ctx) {
        all.push(Kernels::Flash);
    }
    if let Some(lanes) = ctx.subgroup_lanes() {
        all.extend(
            [Passes::Four, Passes::Two]
                .map(|passes| Kernels::Subgroup { lanes, passes })
                .into_iter()
                .filter(|k| k.fits(s) && k.binds_within(ctx)),
        );
    }
    all
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
    /// the leading dims (B, H) of the global (B, H, seq, seq) bits; a row's bits sit at its
    /// query and key positions ([`Blocks`]).
    Drawn {
        key: &'a GpuBuffer,
        draw: Draw<'a>,
        seq: usize,
    },
}

/// Where the rows of one operand sit in its buffer, in f32 elements (shaders/attention_common.wgsl's
/// `row_at`): element d of row i of head h, over every device's heads, at
/// `offset + (h / item_heads) * batch + (h % item_heads) * head + i * row + d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub batch: usize,
    pub head: usize,
    pub row: usize,
    pub offset: usize,
}

impl Layout {
    /// A heads-major (heads, rows, Dh) array (with `item_heads` 1).
    pub fn heads_major(rows: usize, dh: usize) -> Layout {
        Layout {
            batch: rows * dh,
            head: 0,
            row: dh,
            offset: 0,
        }
    }

    /// Elements a buffer needs to hold `heads` heads (`item_heads` per batch item) of `rows`
    /// rows of `dh`.
    fn span(self, heads: usize, item_heads: usize, rows: usize, dh: usize) -> usize {
        let last_item = (heads - 1) / item_heads;
        let last_head = (heads - 1).min(item_heads - 1);
        self.offset + last_item * self.batch + last_head * self.head + (rows - 1) * self.row + dh
    }

    fn words(self, kernel: &str) -> Result<[u32; 4], GpuError> {
        let w = |what, n| u32_of(kernel, what, n);
        Ok([
            w("a batch stride", self.batch)?,
            w("a head stride", self.head)?,
            w("a row stride", self.row)?,
            w("an offset", self.offset)?,
        ])
    }

    /// Whether every stride and the offset are whole vec4s (the subgroup kernels load vec4s).
    fn vec4s(self) -> bool {
        [self.batch, self.head, self.row, self.offset]
            .iter()
            .all(|x| x.is_multiple_of(4))
    }
}

/// The layouts of q, k, v, o, do and the gradients, and the heads of one batch item
/// (`item_heads`) by which a head index splits into item and head. lse and the rows scratch
/// are always heads-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layouts {
    pub item_heads: usize,
    pub q: Layout,
    pub k: Layout,
    pub v: Layout,
    pub o: Layout,
    pub d_o: Layout,
    pub dq: Layout,
    pub dk: Layout,
    pub dv: Layout,
}

impl Layouts {
    /// Every operand heads-major: q, o, do (heads, T, Dh), k, v (heads, Tk, Dh).
    pub fn heads_major(s: &AttentionShape, tk: usize) -> Layouts {
        let (q, kv) = (Layout::heads_major(s.t, s.dh), Layout::heads_major(tk, s.dh));
        Layouts {
            item_heads: 1,
            q,
            k: kv,
            v: kv,
            o: q,
            d_o: q,
            dq: q,
            dk: kv,
            dv: kv,
        }
    }

    /// The layouts `given`, else heads-major; refused where an operand's buffer is too short, or
    /// where `kernels` load vec4s and a layout is not in whole vec4s.
    fn of(
        given: Option<&Layouts>,
        kname: &str,
        s: &AttentionShape,
        tk: usize,
        kernels: Option<Kernels>,
    ) -> Result<Layouts, GpuError> {
        let Some(l) = given.copied() else {
            return Ok(Layouts::heads_major(s, tk));
        };
        positive(kname, "heads of a batch item", l.item_heads)?;
        let all = [l.q, l.k, l.v, l.o, l.d_o, l.dq, l.dk, l.dv];
        if matches!(kernels, Some(Kernels::Subgroup { .. })) && !all.iter().all(|x| x.vec4s()) {
            return Err(GpuError::Invalid(format!(
                "{kname}: the subgroup kernels load whole vec4s, and the layouts {l:?} are not in multiples of 4                  elements: hand heads-major arrays"
            )));
        }
        if !s.heads.is_multiple_of(l.item_heads) {
            return Err(GpuError::Invalid(format!(
                "{kname}: {} heads are not whole batch items of {} heads",
                s.heads, l.item_heads
            )));
        }
        Ok(l)
    }

    /// Elements the buffer of each operand needs: (q, k, v, o, do, dq, dk, dv).
    fn spans(&self, s: &AttentionShape, tk: usize) -> [usize; 8] {
        let n = |l: Layout, rows| l.span(s.heads, self.item_heads, rows, s.dh);
        [
            n(self.q, s.t),
            n(self.k, tk),
            n(self.v, tk),
            n(self.o, s.t),
            n(self.d_o, s.t),
            n(self.dq, s.t),
            n(self.dk, tk),
            n(self.dv, tk),
        ]
    }
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
    tk: u32,
    rng_layout: u32,
    key_stride: u32,
    seq: u32,
    q_chunk: u32,
    k_chunk: u32,
    item_heads: u32,
    block_size: [u32; 4],
    global_stride: [u32; 4],
    q_at: [u32; 4],
    k_at: [u32; 4],
    v_at: [u32; 4],
    o_at: [u32; 4],
    do_at: [u32; 4],
    dq_at: [u32; 4],
    dk_at: [u32; 4],
    dv_at: [u32; 4],
    dv_in_dk: u32,
    pad: [u32; 3],
}

/// Words per device in the offsets buffer: the leading block's start (canonical rank 4), then
/// the starts of the query and key runs.
const OFFSET_WORDS: usize = 8;

/// The launch's parameters, and the words (bits or keys) and per-device offsets its kernels bind.
struct Setup<'a> {
    params: Params,
    words: &'a GpuBuffer,
    offsets: Vec<u32>,
}

fn u32_of(kernel: &str, what: &str, n: usize) -> Result<u32, GpuError> {
    u32::try_from(n).map_err(|_| GpuError::Invalid(format!("{kernel}: {what} {n} does not fit in 32 bits")))
}

fn setup<'a>(
    kernel: &str,
    s: &AttentionShape,
    blocks: &[Blocks],
    dropout: Dropout<'a>,
    stand_in: &'a GpuBuffer,
    layouts: &Layouts,
) -> Result<Setup<'a>, GpuError> {
    positive(kernel, "heads", s.heads)?;
    positive(kernel, "T", s.t)?;
    positive(kernel, "Dh", s.dh)?;
    let first = blocks
        .first()
        .ok_or_else(|| GpuError::Invalid(format!("{kernel}: no blocks given; give one per device")))?;
    let devices = blocks.len();
    let per_dev = s.heads / devices;
    let same_chunks = blocks
        .iter()
        .all(|b| b.tk == first.tk && b.q.chunk == first.q.chunk && b.kv.chunk == first.kv.chunk);
    if per_dev * devices != s.heads || !same_chunks {
        return Err(GpuError::Invalid(format!(
            "{kernel}: {devices} devices' blocks do not split {} heads evenly, or differ in their row counts",
            s.heads
        )));
    }
    positive(kernel, "Tk", first.tk)?;
    // The sequence the positions index: past every row of every block.
    let seq = blocks
        .iter()
        .flat_map(|b| [b.q.pos(s.t - 1), b.q.pos(0), b.kv.pos(first.tk - 1), b.kv.pos(0)])
        .max()
        .unwrap_or(0)
        + 1;
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
        heads: u32_of(kernel, "heads", s.heads)?,
        t: u32_of(kernel, "T", s.t)?,
        dh: s.dh as u32,
        dropout: 0,
        scale: s.scale,
        keep,
        keep_scale: keep_scale(keep),
        heads_per_dev: per_dev as u32,
        n_global: 0,
        tk: u32_of(kernel, "Tk", first.tk)?,
        rng_layout: 0,
        key_stride: 0,
        seq: u32_of(kernel, "the sequence", seq)?,
        q_chunk: u32_of(kernel, "T", first.q.chunk)?,
        k_chunk: u32_of(kernel, "Tk", first.kv.chunk)?,
        item_heads: u32_of(kernel, "heads of a batch item", layouts.item_heads)?,
        block_size: [1; 4],
        global_stride: [1; 4],
        q_at: layouts.q.words(kernel)?,
        k_at: layouts.k.words(kernel)?,
        v_at: layouts.v.words(kernel)?,
        o_at: layouts.o.words(kernel)?,
        do_at: layouts.d_o.words(kernel)?,
        dq_at: layouts.dq.words(kernel)?,
        dk_at: layouts.dk.words(kernel)?,
        dv_at: layouts.dv.words(kernel)?,
        dv_in_dk: 0,
        pad: [0; 3],
    };
    let mut words = stand_in;
    let mut offsets = vec![0u32; OFFSET_WORDS * devices];
    for (d, b) in blocks.iter().enumerate() {
        let runs = [b.q.starts[0], b.q.starts[1], b.kv.starts[0], b.kv.starts[1]];
        for (w, r) in runs.into_iter().enumerate() {
            offsets[OFFSET_WORDS * d + 4 + w] = u32_of(kernel, "a position", r)?;
        }
    }
    match (s.rate > 0.0, dropout) {
        (false, _) => {}
        (true, Dropout::None) => {
            return Err(GpuError::Invalid(format!(
                "{kernel}: dropout needs its bits or its key"
            )))
        }
        (true, Dropout::Bits(b)) => {
            need(kernel, "bits", b, s.heads * s.t * first.tk)?;
            params.dropout = 1;
            words = b;
        }
        (true, Dropout::Drawn { key, draw, seq: t }) => {
            let c = counters(kernel, key, &draw)?;
            if draw.blocks.len() != devices || c.n_block as usize != per_dev || t < seq {
                return Err(GpuError::Invalid(format!(
                    "{kernel}: {} devices' blocks of {} rows of bits do not cover {devices} devices' {per_dev} heads \
                     of a sequence of {t}",
                    draw.blocks.len(),
                    c.n_block
                )));
            }
            let n_global = u64::from(c.n_global) * (t as u64) * (t as u64);
            if n_global >= u64::from(u32::MAX) {
                return Err(GpuError::Invalid(format!(
                    "{kernel}: {n_global} dropout bits; the GPU generator indexes at most 2^32 - 2"
                )));
            }
            params = Params {
                dropout: 2,
                n_global: n_global as u32,
                rng_layout: c.rng_layout,
                key_stride: c.key_stride,
                seq: t as u32,
                block_size: c.block_size,
                global_stride: c.global_stride,
                ..params
            };
            words = key;
            for d in 0..devices {
                offsets[OFFSET_WORDS * d..OFFSET_WORDS * d + 4].copy_from_slice(&c.offsets[4 * d..4 * d + 4]);
            }
        }
    }
    Ok(Setup { params, words, offsets })
}

impl<'a> Setup<'a> {
    /// Binds the words, the offsets and the parameters.
    fn bind<'k>(&self, ctx: &GpuContext, kernel: Kernel<'k>) -> Result<Kernel<'k>, GpuError>
    where
        'a: 'k,
    {
        let kernel = kernel.read(3, "words", self.words).uniform(7, &self.params);
        Ok(kernel.read_owned(4, "offsets", ctx.upload("attention offsets", &self.offsets)?))
    }
}

impl Kernels {
    /// The shader and entry point of kernel `entry` (`forward`, `backward_dq`, ...) for a launch
    /// with dropout or without: the subgroup kernels have entry points without the Threefry code
    /// (`_nodrop`), which costs lavapipe even behind a uniform branch never taken.
    fn entry(self, entry: &str, dropout: bool) -> (&'static str, String) {
        match self {
            Kernels::Tiled => ("attention", entry.to_string()),
            Kernels::Flash => ("attention_fa", entry.to_string()),
            Kernels::Subgroup { lanes, .. } => {
                let nodrop = if dropout { "" } else { "_nodrop" };
                ("attention_sg", format!("{entry}_sg{lanes}{nodrop}"))
            }
        }
    }

    /// Rows of a head per workgroup.
    fn rows_per_group(self) -> usize {
        match self {
            Kernels::Tiled => WG,
            Kernels::Flash => FA_ROWS,
            Kernels::Subgroup { lanes, .. } => lanes as usize,
        }
    }

    /// One workgroup per group of rows (of `rows` per head) of a head; heads past 65535 fold into z.
    fn grid(self, s: &AttentionShape, rows: usize) -> [u32; 3] {
        let z = s.heads.div_ceil(65535);
        [
            rows.div_ceil(self.rows_per_group()) as u32,
            s.heads.div_ceil(z) as u32,
            z as u32,
        ]
    }

    /// Whether these kernels take shape `s`: the subgroup kernels read rows as vec4s, with entry
    /// points for subgroups of 8 and 16.
    fn fits(self, s: &AttentionShape) -> bool {
        match self {
            Kernels::Tiled | Kernels::Flash => true,
            Kernels::Subgroup { lanes, .. } => s.dh.is_multiple_of(4) && matches!(lanes, 8 | 16),
        }
    }

    /// Whether the backward is two passes: dq with each row's (lse, delta), then dk with dv.
    fn two_passes(self) -> bool {
        matches!(
            self,
            Kernels::Flash
                | Kernels::Subgroup {
                    passes: Passes::Two,
                    ..
                }
        )
    }

    /// The backward's own kernels, as `entry` names them (the four-pass backward's first,
    /// `row_delta`, is one kernel of attention.wgsl for every design).
    fn backward_entries(self) -> &'static [&'static str] {
        match self.two_passes() {
            true => &["backward_dq_delta", "backward_dkdv"],
            false => &["backward_dq", "backward_dk", "backward_dv"],
        }
    }

    /// Whether `ctx`'s adapter binds as many storage buffers per stage as every kernel of
    /// these takes ([`crate::shaders::storage_buffers`]).
    fn binds_within(self, ctx: &GpuContext) -> bool {
        let allowed = ctx.device.limits().max_storage_buffers_per_shader_stage;
        self.backward_entries().iter().all(|e| {
            [true, false].into_iter().all(|dropout| {
                let (shader, entry) = self.entry(e, dropout);
                crate::shaders::storage_buffers(shader, &entry).is_none_or(|n| n <= allowed)
            })
        })
    }

    /// A short name of the design, as `bench kernels` prints it.
    pub fn name(self) -> String {
        match self {
            Kernels::Tiled => "tiled".into(),
            Kernels::Flash => "flash".into(),
            Kernels::Subgroup {
                lanes,
                passes: Passes::Four,
            } => format!("subgroup {lanes}"),
            Kernels::Subgroup {
                lanes,
                passes: Passes::Two,
            } => format!("subgroup {lanes}, two-pass backward"),
        }
    }

    /// Refuses a shape these kernels cannot run ([`Kernels::fits`]).
    fn check(self, kernel: &str, s: &AttentionShape) -> Result<(), GpuError> {
        if self.fits(s) {
            return Ok(());
        }
        Err(GpuError::Invalid(format!(
            "{kernel}: {self:?} takes head dimensions that are multiples of 4 and subgroups of 8 or 16 lanes, \
             not Dh {}: run the tiled kernels",
            s.dh
        )))
    }
}

/// The blocks of a launch: those given, one per device.
fn tk(blocks: &[Blocks], s: &AttentionShape) -> usize {
    blocks.first().map_or(s.t, |b| b.tk)
}

/// The forward's buffers: q, k, v in; o and lse out; where each device's rows sit.
pub struct Forward<'a> {
    pub q: &'a GpuBuffer,
    pub k: &'a GpuBuffer,
    pub v: &'a GpuBuffer,
    pub dropout: Dropout<'a>,
    pub o: &'a GpuBuffer,
    pub lse: &'a GpuBuffer,
    /// One per device (each holding heads / devices heads).
    pub blocks: &'a [Blocks],
    /// Where q, k, v and o sit; `None`: heads-major.
    pub layouts: Option<&'a Layouts>,
}

/// `(o, lse) = attention(q, k, v)`: one dispatch of `kernels`.
pub async fn forward(
    ctx: &GpuContext,
    b: &Forward<'_>,
    s: &AttentionShape,
    kernels: Kernels,
) -> Result<Dispatch, GpuError> {
    let kname = "attention::forward";
    kernels.check(kname, s)?;
    let tk = tk(b.blocks, s);
    let layouts = Layouts::of(b.layouts, kname, s, tk, Some(kernels))?;
    let setup = setup(kname, s, b.blocks, b.dropout, b.q, &layouts)?;
    let [nq, nk, nv, no, ..] = layouts.spans(s, tk);
    for (what, buf, len) in [("q", b.q, nq), ("k", b.k, nk), ("v", b.v, nv), ("o", b.o, no)] {
        need(kname, what, buf, len)?;
    }
    need(kname, "lse", b.lse, s.heads * s.t)?;
    let (shader, entry) = kernels.entry("forward", s.rate > 0.0);
    let kernel = Kernel::new(shader, entry, format!("attention ({}, {}, {})", s.heads, s.t, s.dh))
        .read(0, "q", b.q)
        .read(1, "k", b.k)
        .read(2, "v", b.v)
        .write(5, "o", b.o)
        .write(6, "lse", b.lse)
        .grid(kernels.grid(s, s.t));
    ctx.launch(setup.bind(ctx, kernel)?).await
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
    /// One per device, as the forward's.
    pub blocks: &'a [Blocks],
    /// Where q, k, v, o and do sit; `None`: heads-major.
    pub layouts: Option<&'a Layouts>,
}

/// Elements of the backward's rows scratch.
pub fn rows_len(s: &AttentionShape) -> usize {
    2 * s.heads * s.t
}

/// `(dq, dk, dv)`: each row's (lse, rowsum(do * o)), then dq, dk and dv of `kernels`, four
/// dispatches; the subgroup kernels' two passes make the rows with dq, and dk with dv.
pub async fn backward(
    ctx: &GpuContext,
    b: &Backward<'_>,
    s: &AttentionShape,
    kernels: Kernels,
) -> Result<Vec<Dispatch>, GpuError> {
    let kname = "attention::backward";
    kernels.check(kname, s)?;
    let tk = tk(b.blocks, s);
    let layouts = Layouts::of(b.layouts, kname, s, tk, Some(kernels))?;
    let mut setup = setup(kname, s, b.blocks, b.dropout, b.q, &layouts)?;
    // dk and dv in one buffer (their rows interleaved in the gradient's columns) bind once, as
    // dk, in the kernel that writes both: two writable bindings of one buffer would alias.
    let dv_in_dk = b.dk.buffer == b.dv.buffer && b.dk.offset == b.dv.offset && b.dk.len == b.dv.len;
    setup.params.dv_in_dk = u32::from(dv_in_dk);
    let [nq, nk, nv, no, ndo, ndq, ndk, ndv] = layouts.spans(s, tk);
    for (what, buf, len) in [
        ("q", b.q, nq),
        ("k", b.k, nk),
        ("v", b.v, nv),
        ("o", b.o, no),
        ("do", b.d_o, ndo),
        ("dq", b.dq, ndq),
        ("dk", b.dk, ndk),
        ("dv", b.dv, ndv),
    ] {
        need(kname, what, buf, len)?;
    }
    need(kname, "lse", b.lse, s.heads * s.t)?;
    need(kname, "rows", b.rows, rows_len(s))?;
    let shape = format!("({}, {}, {})", s.heads, s.t, s.dh);
    let common = |entry: &str, label: &str, rows: usize| {
        let (shader, entry) = kernels.entry(entry, s.rate > 0.0);
        let kernel = Kernel::new(shader, entry, format!("attention backward {label} {shape}"))
            .read(0, "q", b.q)
            .read(1, "k", b.k)
            .read(9, "do", b.d_o)
            .read(11, "rows", b.rows)
            .grid(kernels.grid(s, rows));
        setup.bind(ctx, kernel)
    };
    if kernels.two_passes() {
        // dq_delta writes the rows that dkdv reads (`common` binds them for reading).
        let (shader, entry) = kernels.entry("backward_dq_delta", s.rate > 0.0);
        let dq = Kernel::new(shader, entry, format!("attention backward dq delta {shape}"))
            .read(0, "q", b.q)
            .read(1, "k", b.k)
            .read(2, "v", b.v)
            .read(8, "o", b.o)
            .read(9, "do", b.d_o)
            .read(15, "lse", b.lse)
            .write(10, "rows", b.rows)
            .write(12, "dq", b.dq)
            .grid(kernels.grid(s, s.t));
        let dkdv = common("backward_dkdv", "dk dv", tk)?
            .read(2, "v", b.v)
            .write(13, "dk", b.dk);
        let dkdv = match dv_in_dk {
            true => dkdv.write_owned(14, "dv (in dk)", ctx.zeros("attention dv stand-in", 4)?),
            false => dkdv.write(14, "dv", b.dv),
        };
        return Ok(vec![ctx.launch(setup.bind(ctx, dq)?).await?, ctx.launch(dkdv).await?]);
    }
    let mut out = vec![row_delta(ctx, b, s, &setup.params).await?];
    out.push(
        ctx.launch(
            common("backward_dq", "dq", s.t)?
                .read(2, "v", b.v)
                .write(12, "dq", b.dq),
        )
        .await?,
    );
    out.push(
        ctx.launch(common("backward_dk", "dk", tk)?.read(2, "v", b.v).write(13, "dk", b.dk))
            .await?,
    );
    // The subgroup kernels' dv shares dk's weights function, which reads v (for dp) in dk alone.
    let dv = common("backward_dv", "dv", tk)?.write(14, "dv", b.dv);
    let dv = match kernels {
        Kernels::Subgroup { .. } => dv.read(2, "v", b.v),
        Kernels::Tiled | Kernels::Flash => dv,
    };
    out.push(ctx.launch(dv).await?);
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
/// bindings dropout leaves unused; `blocks` are whole sequences ([`lowering`]).
pub async fn probs(
    ctx: &GpuContext,
    scores: &GpuBuffer,
    lse: &GpuBuffer,
    dropout: Dropout<'_>,
    q: &GpuBuffer,
    blocks: &[Blocks],
    s: &AttentionShape,
) -> Result<Dispatch, GpuError> {
    let kname = "attention::probs";
    let setup = setup(kname, s, blocks, dropout, q, &Layouts::heads_major(s, s.t))?;
    need(kname, "scores", scores, scores_len(s))?;
    need(kname, "lse", lse, s.heads * s.t)?;
    let kernel = Kernel::new(
        "attention",
        "probs",
        format!("attention probs ({}, {}, {})", s.heads, s.t, s.t),
    )
    .write(20, "scores", scores)
    .write(6, "lse", lse)
    .grid(grid_1d(s.heads * s.t, 64));
    ctx.launch(setup.bind(ctx, kernel)?).await
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
    let layouts = Layouts::of(b.op.layouts, kname, s, s.t, None)?;
    let [_, _, _, no, ndo, ..] = layouts.spans(s, s.t);
    need(kname, "o", b.op.o, no)?;
    need(kname, "do", b.op.d_o, ndo)?;
    let setup = setup(kname, s, b.op.blocks, b.op.dropout, b.op.q, &layouts)?;
    need(kname, "scores", b.scores, scores_len(s))?;
    need(kname, "dscores", b.dscores, scores_len(s))?;
    need(kname, "rows", b.op.rows, rows_len(s))?;
    let rows = row_delta(ctx, &b.op, s, &setup.params).await?;
    let kernel = Kernel::new(
        "attention",
        "probs_grad",
        format!("attention probs backward ({}, {}, {})", s.heads, s.t, s.t),
    )
    .write(20, "scores", b.scores)
    .write(21, "dscores", b.dscores)
    .read(11, "rows", b.op.rows)
    .grid(grid_1d(scores_len(s), 64));
    let grad = ctx.launch(setup.bind(ctx, kernel)?).await?;
    Ok((rows, grad))
}

/// Two partial attentions of the same rows: o_a, o_b (heads, T, Dh), lse_a, lse_b (heads, T).
pub struct Combine<'a> {
    pub o_a: &'a GpuBuffer,
    pub lse_a: &'a GpuBuffer,
    pub o_b: &'a GpuBuffer,
    pub lse_b: &'a GpuBuffer,
    pub o: &'a GpuBuffer,
    pub lse: &'a GpuBuffer,
}

/// `(o, lse)` of the rows' attention over both sides' keys: one dispatch.
pub async fn combine(ctx: &GpuContext, b: &Combine<'_>, s: &AttentionShape) -> Result<Dispatch, GpuError> {
    let kname = "attention::combine";
    let setup = setup(
        kname,
        s,
        &[Blocks::whole(s.t)],
        Dropout::None,
        b.o_a,
        &Layouts::heads_major(s, s.t),
    )?;
    let (n, rows) = (s.heads * s.t * s.dh, s.heads * s.t);
    for (what, buf, len) in [
        ("o_a", b.o_a, n),
        ("o_b", b.o_b, n),
        ("o", b.o, n),
        ("lse_a", b.lse_a, rows),
        ("lse_b", b.lse_b, rows),
        ("lse", b.lse, rows),
    ] {
        need(kname, what, buf, len)?;
    }
    let kernel = Kernel::new(
        "attention",
        "combine",
        format!("attention combine ({}, {}, {})", s.heads, s.t, s.dh),
    )
    .read(16, "o_a", b.o_a)
    .read(17, "lse_a", b.lse_a)
    .read(18, "o_b", b.o_b)
    .read(19, "lse_b", b.lse_b)
    .write(5, "o", b.o)
    .write(6, "lse", b.lse)
    .uniform(7, &setup.params)
    .grid(grid_1d(rows, 64));
    ctx.launch(kernel).await
}
