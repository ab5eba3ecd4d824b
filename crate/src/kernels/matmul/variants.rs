//! The matmul variants: what each needs from the adapter and the shape, and how each is launched.
//! Every variant handles every flag (transposes, strides, broadcast, alpha, bias, accumulate) and
//! unaligned sizes: naive and tiled by bounds checks, the others by packing the operands into
//! zero-padded layouts first (block8, block16 and the GPU variants gpu64, gpu128 and coop8: one
//! `pack` dispatch per operand; the texture variants: one
//! `pack` dispatch for both, plus a copy for an operand whose memory already is its texture's texels,
//! which for sg1 includes rows that hold K side by side; replayed every step).
use std::sync::Arc;

use super::shared::{Sharing, Source};
use super::MatmulShape;
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel, TextureCopy, Work};

/// A matmul kernel design (see shaders/matmul.wgsl, matmul_tex.wgsl and matmul_sg.wgsl).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// One output per invocation: the baseline, runs anywhere.
    Naive,
    /// 64x64 tile per workgroup through workgroup memory, 4x4 per invocation: the classic GPU kernel.
    Tiled,
    /// 8x8 register block per invocation from packed storage buffers.
    Block8,
    /// block8's buffers, a 16x16 block per invocation: twice block8's multiply-adds per value
    /// loaded, for adapters where each load is a loop over the lanes and spills cost less
    /// (SwiftShader).
    Block16,
    /// 16x16 register block per invocation from read-only rgba32float storage textures.
    Tex16,
    /// tex16's textures, a 64-row block per subgroup of 8 or 16 whose A values are shared by
    /// subgroupBroadcast: a fraction of tex16's texel loads per multiply-add.
    Sg,
    /// sg with one A and one B texel per invocation per k: a 32x32 (8 lanes) or 64x64 (16 lanes)
    /// block, a quarter (half) of sg's accumulators, more blocks for small shapes.
    Sg1,
    /// For GPUs: a 64x64 tile per workgroup of 256 staged in workgroup memory, a 4x4 register
    /// block per invocation, double-buffered along K, from block8's packed buffers.
    Gpu64,
    /// For GPUs: gpu64's design with a 128x128 tile and an 8x8 block per invocation.
    Gpu128,
    /// 8x8 f32 cooperative matrices (wgpu's experimental feature): a 32x32 block per workgroup,
    /// 16x16 per subgroup, from block8's packed buffers.
    Coop8,
}

impl Variant {
    pub const ALL: [Variant; 10] = [
        Variant::Naive,
        Variant::Tiled,
        Variant::Block8,
        Variant::Block16,
        Variant::Tex16,
        Variant::Sg,
        Variant::Sg1,
        Variant::Gpu64,
        Variant::Gpu128,
        Variant::Coop8,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Naive => "naive",
            Variant::Tiled => "tiled",
            Variant::Block8 => "block8",
            Variant::Block16 => "block16",
            Variant::Tex16 => "tex16",
            Variant::Sg => "sg",
            Variant::Sg1 => "sg1",
            Variant::Gpu64 => "gpu64",
            Variant::Gpu128 => "gpu128",
            Variant::Coop8 => "coop8",
        }
    }

    pub fn from_name(name: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == name)
    }

    /// (multiple M and N are padded to, multiple K is padded to) for the packed variants.
    fn padding(self) -> Option<(usize, usize)> {
        match self {
            Variant::Block8 => Some((8, 4)),
            Variant::Block16 => Some((16, 4)),
            Variant::Tex16 | Variant::Sg | Variant::Sg1 => Some((16, 1)),
            // Whole workgroup tiles and whole K steps: no load is bounds-checked.
            Variant::Gpu64 => Some((64, 16)),
            Variant::Gpu128 => Some((128, 8)),
            Variant::Coop8 => Some((32, 8)),
            Variant::Naive | Variant::Tiled => None,
        }
    }

    /// Rows (and columns) of C per workgroup of the variants that tile C by workgroup.
    fn workgroup_tile(self) -> Option<usize> {
        match self {
            Variant::Gpu64 => Some(64),
            Variant::Gpu128 => Some(128),
            Variant::Coop8 => Some(32),
            _ => None,
        }
    }

    /// Whether the kernel reads block8's packed storage buffers (the pack passes of matmul.wgsl).
    fn reads_packed_buffers(self) -> bool {
        matches!(
            self,
            Variant::Block8 | Variant::Block16 | Variant::Gpu64 | Variant::Gpu128 | Variant::Coop8
        )
    }

    /// Whether the kernel was designed for GPUs: on CPU adapters (a workgroup per thread, every
    /// access a loop over the lanes) the autotuner leaves it out (measured: `bench kernels`, see
    /// BENCHMARKS.md), so tuning there costs no more than before. It still runs there, where its
    /// tests check it.
    pub fn for_gpus(self) -> bool {
        matches!(self, Variant::Gpu64 | Variant::Gpu128 | Variant::Coop8)
    }

    /// Whether the kernel has `_v4` entry points that store C as vec4.
    fn stores_v4(self) -> bool {
        self.padding().is_some() && self != Variant::Coop8
    }

    fn shader(self) -> &'static str {
        match self {
            Variant::Tex16 => "matmul_tex",
            Variant::Sg | Variant::Sg1 => "matmul_sg",
            Variant::Gpu64 | Variant::Gpu128 => "matmul_gpu",
            Variant::Coop8 => "matmul_coop",
            _ => "matmul",
        }
    }

    /// The shader of the pack passes: sg and sg1 read the textures tex16's passes write, the GPU
    /// variants the buffers block8's passes write.
    fn pack_shader(self) -> &'static str {
        match self {
            Variant::Sg | Variant::Sg1 => "matmul_tex",
            v if v.reads_packed_buffers() => "matmul",
            v => v.shader(),
        }
    }

    /// Whether the kernel also reads operands from k-major textures (`Packing::KCopy`).
    fn reads_k_major(self) -> bool {
        self == Variant::Sg1
    }

    /// Whether the packed operands are textures (else storage buffers).
    fn packs_textures(self) -> bool {
        matches!(self, Variant::Tex16 | Variant::Sg | Variant::Sg1)
    }
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Variant {
    type Err = GpuError;

    /// A variant by name (`naive`, `tiled`, `block8`, `block16`, `tex16`, `sg`, `sg1`, `gpu64`,
    /// `gpu128`, `coop8`), as the CLI and tests spell it.
    fn from_str(name: &str) -> Result<Self, GpuError> {
        Variant::from_name(name).ok_or_else(|| {
            let names: Vec<&str> = Variant::ALL.iter().map(|v| v.name()).collect();
            GpuError::Invalid(format!(
                "unknown matmul variant `{name}`; the variants are {}",
                names.join(", ")
            ))
        })
    }
}

/// The uniform of every matmul entry point (shaders' `Params`).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    m: u32,
    n: u32,
    k: u32,
    flags: u32,
    a_si: u32,
    a_sk: u32,
    b_sk: u32,
    b_sj: u32,
    stride_a: u32,
    stride_b: u32,
    stride_c: u32,
    alpha: f32,
    mp4: u32,
    np4: u32,
    kp: u32,
    stride_bias: u32,
}

/// The uniform of a `pack` dispatch (shaders' `Pack`), one operand's.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Pack {
    rows: u32,
    k: u32,
    rows4: u32,
    kp: u32,
    sr: u32,
    sk: u32,
    stride: u32,
    /// How the texture pass packs it: 0 not at all, [`PACK_BY_VALUE`], [`PACK_K4`] (block8's
    /// passes have an entry point per mode and ignore it).
    mode: u32,
}

const PACK_BY_VALUE: u32 = 1;
const PACK_K4: u32 = 2;

/// The uniform of the texture variants' `pack` (matmul_tex.wgsl's `Packs`): both operands, A's
/// on the first `groups_a` workgroups.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Packs {
    a: Pack,
    b: Pack,
    groups_a: u32,
    items_a: u32,
    items_b: u32,
    pad: u32,
}

const FLAG_ACCUMULATE: u32 = 1;
const FLAG_BIAS: u32 = 2;
/// sg1 reads A (B) from a k-major texture (matmul_sg.wgsl's `A_K_MAJOR`, `B_K_MAJOR`).
const FLAG_K_MAJOR: [u32; 2] = [4, 8];
/// The largest K sg1 reads k-major. A block's four texel rows per lane span 4 x lanes rows of K
/// floats each: at most 128 KiB at 16 lanes here. Measured on lavapipe (16 lanes), sg1 with
/// k-major copies against sg1 with its pack: K = 128 to 512 0.68-1.0x (1.0 only where the pack
/// was one small operand); K = 768 (2048 x 768 x 768, A k-major) 1.4x, K = 1024 0.95-1.17x.
const K_MAJOR_MAX_K: usize = 512;
/// The texture size every WebGPU adapter allows (`max_texture_dimension_2d`'s default).
const MIN_TEXTURE_DIM: usize = 8192;
const TEX_FORMAT: wgpu::TextureFormat = wgpu::TextureFormat::Rgba32Float;

/// Whether this adapter can run `v` at all; the reason when not.
pub(crate) fn adapter_supports(ctx: &GpuContext, v: Variant) -> Result<(), String> {
    let limits = ctx.device.limits();
    match v {
        Variant::Naive | Variant::Block8 | Variant::Block16 => Ok(()),
        Variant::Tiled => {
            if limits.max_compute_invocations_per_workgroup < 256 || limits.max_compute_workgroup_storage_size < 8192 {
                Err("tiled needs 256 invocations and 8 KiB of workgroup memory per workgroup".into())
            } else {
                Ok(())
            }
        }
        Variant::Tex16 => {
            let f = ctx.adapter.get_texture_format_features(TEX_FORMAT);
            let needs = wgpu::TextureFormatFeatureFlags::STORAGE_READ_ONLY
                | wgpu::TextureFormatFeatureFlags::STORAGE_WRITE_ONLY;
            if f.flags.contains(needs) && f.allowed_usages.contains(wgpu::TextureUsages::STORAGE_BINDING) {
                Ok(())
            } else {
                Err("tex16 needs read-only and write-only rgba32float storage textures".into())
            }
        }
        Variant::Gpu64 | Variant::Gpu128 => {
            if limits.max_compute_invocations_per_workgroup < 256 || limits.max_compute_workgroup_storage_size < 16384 {
                Err(format!(
                    "{} needs 256 invocations and 16 KiB of workgroup memory per workgroup",
                    v.name()
                ))
            } else {
                Ok(())
            }
        }
        Variant::Coop8 => {
            if ctx.summary.cooperative_matrix {
                Ok(())
            } else {
                Err("coop8 needs cooperative matrices of 8x8 f32 (wgpu's EXPERIMENTAL_COOPERATIVE_MATRIX)".into())
            }
        }
        Variant::Sg | Variant::Sg1 => {
            let name = v.name();
            adapter_supports(ctx, Variant::Tex16).map_err(|e| format!("{name} reads tex16's textures: {e}"))?;
            ctx.subgroup_lanes()
                .map(|_| ())
                .ok_or_else(|| format!("{name} needs the subgroups feature with a subgroup size fixed at 8 or 16"))
        }
    }
}

/// Whether `v` can run shape `s` within this adapter's limits; the reason when not.
pub(crate) fn shape_supports(ctx: &GpuContext, v: Variant, s: &MatmulShape) -> Result<(), String> {
    adapter_supports(ctx, v)?;
    let limits = ctx.device.limits();
    let max_groups = limits.max_compute_workgroups_per_dimension as usize;
    let over = |what: &str, n: usize, limit: usize| {
        Err(format!(
            "{} for {}: {what} {n} is over this adapter's limit of {limit}",
            v.name(),
            s.describe()
        ))
    };
    let groups = match v {
        Variant::Naive => [s.n.div_ceil(16), s.m.div_ceil(16), s.batch],
        Variant::Tiled => [s.n.div_ceil(64), s.m.div_ceil(64), s.batch],
        _ => [1, 1, s.batch],
    };
    for g in groups {
        if g > max_groups {
            return over("workgroups in one dimension", g, max_groups);
        }
    }
    if let Some((mn, kq)) = v.padding() {
        let (mp, np, kp) = (
            s.m.next_multiple_of(mn),
            s.n.next_multiple_of(mn),
            s.k.next_multiple_of(kq),
        );
        let (la, lb) = packed_items(s);
        if v.packs_textures() {
            let dim = limits.max_texture_dimension_2d as usize;
            let sizes = [
                ("texture width (M/4)", mp / 4),
                ("texture width (N/4)", np / 4),
                ("texture height (batch x K)", la.max(lb) * kp),
            ];
            for (what, n) in sizes {
                let n = non_power_of_two(n);
                if n > dim {
                    return over(what, n, dim);
                }
            }
        } else {
            for (name, elems) in [("packed A", la * kp * mp), ("packed B", lb * kp * np)] {
                ctx.check_size(name, elems as u64 * 4)
                    .map_err(|e| format!("{}: {e}", v.name()))?;
            }
        }
    }
    Ok(())
}

/// Packed batch items of A and B: one when the operand is broadcast.
fn packed_items(s: &MatmulShape) -> (usize, usize) {
    let l = |stride: usize| if stride == 0 { 1 } else { s.batch };
    (l(s.stride_a), l(s.stride_b))
}

/// Whether C can be written as vec4 (the `_v4` entry points).
fn store_v4(s: &MatmulShape) -> bool {
    s.n.is_multiple_of(4) && (s.batch == 1 || s.stride_c.is_multiple_of(4))
}

/// The operands of one matmul: a, b, an optional bias, and the output c.
#[derive(Clone, Copy)]
pub struct Operands<'a> {
    pub a: &'a GpuBuffer,
    pub b: &'a GpuBuffer,
    pub bias: Option<&'a GpuBuffer>,
    pub c: &'a GpuBuffer,
}

/// The dispatches of variant `v` for `s`: pack passes first (if any), then the matmul. Operands
/// copied whole into a texture take it from `sharing` where it names their contents.
pub(crate) async fn build(
    ctx: &GpuContext,
    v: Variant,
    s: &MatmulShape,
    ops: Operands<'_>,
    sharing: Option<Sharing<'_>>,
) -> Result<Vec<Dispatch>, GpuError> {
    s.check(ops.a.len, ops.b.len, ops.bias.map(|x| x.len), ops.c.len)
        .map_err(GpuError::Invalid)?;
    shape_supports(ctx, v, s).map_err(GpuError::Invalid)?;
    let v4 = store_v4(s) && v.stores_v4();
    let packing = pack_entries(v, s, ops);
    let k_major = packing.contains(&Packing::KCopy);
    let entry = match (v, v4) {
        (Variant::Naive, _) => "naive",
        (Variant::Tiled, _) => "tiled",
        (Variant::Block8, false) => "block8",
        (Variant::Block8, true) => "block8_v4",
        (Variant::Block16, false) => "block16",
        (Variant::Block16, true) => "block16_v4",
        (Variant::Tex16, false) => "tex16",
        (Variant::Tex16, true) => "tex16_v4",
        (Variant::Gpu64, false) => "gpu64",
        (Variant::Gpu64, true) => "gpu64_v4",
        (Variant::Gpu128, false) => "gpu128",
        (Variant::Gpu128, true) => "gpu128_v4",
        (Variant::Coop8, _) => "coop8",
        (Variant::Sg, v4) => match (ctx.subgroup_lanes(), v4) {
            (Some(16), false) => "sg16",
            (Some(16), true) => "sg16_v4",
            (_, false) => "sg8",
            (_, true) => "sg8_v4",
        },
        // The entry points that also read k-major textures only where an operand is one.
        (Variant::Sg1, v4) => match (ctx.subgroup_lanes(), v4, k_major) {
            (Some(16), false, false) => "sg1_16",
            (Some(16), true, false) => "sg1_16_v4",
            (_, false, false) => "sg1_8",
            (_, true, false) => "sg1_8_v4",
            (Some(16), false, true) => "sg1k_16",
            (Some(16), true, true) => "sg1k_16_v4",
            (_, false, true) => "sg1k_8",
            (_, true, true) => "sg1k_8_v4",
        },
    };
    let main = ctx.pipeline(v.shader(), entry).await?;
    let pack = match v.padding() {
        Some(_) => {
            let mut pipelines = [None, None];
            for (p, how) in pipelines.iter_mut().zip(packing) {
                if let Packing::Pass { entry, .. } = how {
                    // The texture variants pack both operands in one entry point, by mode.
                    let entry = if v.packs_textures() { "pack" } else { entry };
                    *p = Some(ctx.pipeline(v.pack_shader(), entry).await?);
                }
            }
            Some(pipelines)
        }
        None => None,
    };
    let label = format!("matmul.{} {}", v.name(), s.describe());
    // Resources are created synchronously inside one error scope, so a refusal comes back here as a value.
    let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let pipelines = Pipelines {
        entry,
        main,
        pack,
        packing,
        v4,
    };
    let planned = plan(ctx, v, s, ops, pipelines, sharing, &label);
    if let Some(e) = scope.pop().await {
        return Err(GpuError::from_wgpu(&label, e));
    }
    planned
}

/// The compiled entry points of one variant (the pack passes' for A and B), and whether C is
/// stored as vec4.
struct Pipelines {
    entry: &'static str,
    main: Arc<wgpu::ComputePipeline>,
    pack: Option<[Option<Arc<wgpu::ComputePipeline>>; 2]>,
    /// How A and B reach the matmul (`pack_entries`), which the pack pipelines were built for.
    packing: [Packing; 2],
    v4: bool,
}

/// How one operand of a packed variant reaches its matmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Packing {
    /// A pack pass (`entry`) writes the packed layout; each invocation packs `k_rows` k-rows. The
    /// texture variants run `entry` as a mode of their one pass for both operands.
    Pass { entry: &'static str, k_rows: usize },
    /// block8, block16 and the GPU variants read the operand where it is: it is already in the
    /// packed layout.
    Direct,
    /// tex16 and sg: the operand's memory already is the texture's texels, copied in whole.
    Copy,
    /// sg1: the operand's rows hold K side by side (A as stored, B transposed), copied in whole
    /// into a k-major texture, which sg1's `sg1k` entry points read.
    KCopy,
}

/// How A and B reach the matmul. block8 and block16 bind an operand directly when its memory
/// already is the packed layout, rows of K that hold its M (or N) values side by side (A
/// transposed, B as stored), with nothing to pad and its batch items back to back; tex16 and sg
/// copy such an
/// operand into their texture when its rows are whole multiples of 256 bytes (0.36 ms against a
/// 3.4 ms pack for a 1024 x 1024 operand on lavapipe). sg1 also copies the other layout, rows that
/// hold K side by side (A as stored, B transposed: a layer's input, and both operands of its
/// input gradient), into a k-major texture, when K is whole 256-byte rows and the rows need no
/// padding: on lavapipe at `small`'s shapes the pass cost 0.3 ms (512 x 128) to 1.5-2 ms (both
/// operands of a 512 x 512 x 128 input gradient), as much as the matmul. Else a pack pass: `pack_k4`
/// where a row of the operand is contiguous (A as stored, B transposed), a 4x4 block per
/// invocation from four vec4 loads; else `pack`, one texel per invocation from scalar loads. On
/// lavapipe `pack_k4` cuts tex16's transposing pack at n = 1024 from 5.9 to 3.4 ms; where a
/// texel's values are already contiguous, the stores dominate and vec4 loads gain nothing.
fn pack_entries(v: Variant, s: &MatmulShape, ops: Operands<'_>) -> [Packing; 2] {
    let (la, lb) = packed_items(s);
    let (a_si, a_sk) = s.a_strides();
    let (b_sk, b_sj) = s.b_strides();
    let stride = |x: usize, items: usize| if items == 1 { 0 } else { x };
    [
        pack_entry(v, ops.a.offset, s.m, (a_si, a_sk), (stride(s.stride_a, la), la), s.k),
        pack_entry(v, ops.b.offset, s.n, (b_sj, b_sk), (stride(s.stride_b, lb), lb), s.k),
    ]
}

/// One operand's packing (`pack_entries`): its binding's byte `offset`, its `rows` (M or N), its
/// element strides `(sr, sk)` of X[r, k], the elements between its packed batch items (0 for
/// one) and how many there are, and K.
fn pack_entry(
    v: Variant,
    offset: u64,
    rows: usize,
    (sr, sk): (usize, usize),
    (stride, items): (usize, usize),
    k: usize,
) -> Packing {
    let Some((row_pad, k_pad)) = v.padding() else {
        return Packing::Pass {
            entry: "pack",
            k_rows: 1,
        };
    };
    let aligned = offset.is_multiple_of(16) && k.is_multiple_of(4) && k.is_multiple_of(k_pad);
    // One block of memory from a texel's boundary: what a copy or a direct binding takes whole.
    let whole = offset.is_multiple_of(16) && (stride == 0 || stride == k * rows);
    // Texture rows of a copy are `rows` floats, and a buffer-to-texture copy's rows must be
    // multiples of 256 bytes.
    let copy = v.packs_textures() && whole && sr == 1 && sk == rows && rows.is_multiple_of(64);
    if copy {
        return Packing::Copy;
    }
    // A k-major texture is `rows` texels high per item and K / 4 (at most 128) wide, and its
    // copy's rows are K floats.
    let k_copy = v.reads_k_major()
        && whole
        && sk == 1
        && sr == k
        && k.is_multiple_of(64)
        && k <= K_MAJOR_MAX_K
        && rows.is_multiple_of(row_pad)
        && rows * items <= MIN_TEXTURE_DIM;
    if k_copy {
        return Packing::KCopy;
    }
    let direct = v.reads_packed_buffers() && aligned && whole && sr == 1 && sk == rows && rows.is_multiple_of(row_pad);
    if direct {
        Packing::Direct
    } else if aligned && stride.is_multiple_of(4) && sk == 1 && sr.is_multiple_of(4) {
        Packing::Pass {
            entry: "pack_k4",
            k_rows: 4,
        }
    } else {
        Packing::Pass {
            entry: "pack",
            k_rows: 1,
        }
    }
}

fn plan(
    ctx: &GpuContext,
    v: Variant,
    s: &MatmulShape,
    ops: Operands<'_>,
    pipelines: Pipelines,
    sharing: Option<Sharing<'_>>,
    label: &str,
) -> Result<Vec<Dispatch>, GpuError> {
    let Pipelines {
        entry,
        main,
        pack,
        packing,
        v4,
    } = pipelines;
    let (a_si, a_sk) = s.a_strides();
    let (b_sk, b_sj) = s.b_strides();
    // With one batch item the strides are never used: keep them out of the u32 range checks.
    let stride = |x: usize| if s.batch == 1 { 0 } else { x as u32 };
    let (mp, np, kp) = match v.padding() {
        Some((mn, kq)) => (
            s.m.next_multiple_of(mn),
            s.n.next_multiple_of(mn),
            s.k.next_multiple_of(kq),
        ),
        None => (s.m, s.n, s.k),
    };
    let mut params = Params {
        m: s.m as u32,
        n: s.n as u32,
        k: s.k as u32,
        flags: if s.accumulate { FLAG_ACCUMULATE } else { 0 } | if ops.bias.is_some() { FLAG_BIAS } else { 0 },
        a_si: a_si as u32,
        a_sk: a_sk as u32,
        b_sk: b_sk as u32,
        b_sj: b_sj as u32,
        stride_a: stride(s.stride_a),
        stride_b: stride(s.stride_b),
        stride_c: stride(s.stride_c),
        alpha: s.alpha,
        mp4: (mp / 4) as u32,
        np4: (np / 4) as u32,
        kp: kp as u32,
        stride_bias: stride(s.stride_bias),
    };
    let c_binding = if v4 { 9 } else { 3 };

    let Some(pack) = pack else {
        let groups = match v {
            Variant::Tiled => [s.n.div_ceil(64) as u32, s.m.div_ceil(64) as u32, s.batch as u32],
            _ => [s.n.div_ceil(16) as u32, s.m.div_ceil(16) as u32, s.batch as u32],
        };
        let kernel = Kernel::new(v.shader(), entry, label)
            .read(0, "A", ops.a)
            .read(1, "B", ops.b)
            .write(3, "C", ops.c)
            .uniform(4, &params)
            .grid(groups);
        return Ok(vec![ctx.launch_with(main, with_bias(ctx, kernel, ops.bias)?)?]);
    };

    // Packed operands: A as A^T rows (K, Mp), B as rows (K, Np), per batch item unless broadcast.
    let (la, lb) = packed_items(s);
    let operands = [
        ("A", ops.a, s.m, mp, (a_si, a_sk), s.stride_a, la),
        ("B", ops.b, s.n, np, (b_sj, b_sk), s.stride_b, lb),
    ];
    let mut dispatches = Vec::with_capacity(3);
    // What the matmul reads at slots 7 and 8: textures a copy or the pack pass wrote (tex16, sg,
    // sg1), buffers pack passes wrote (block8), or the operand itself (block8, `Packing::Direct`).
    let mut views: Vec<(u32, wgpu::TextureView)> = Vec::new();
    let mut bufs: Vec<(u32, GpuBuffer)> = Vec::new();
    let mut direct: Vec<(u32, &GpuBuffer)> = Vec::new();
    // The texture variants' one pass: each operand's part of its uniform and its workgroups.
    let mut texture_pass: [(Pack, usize); 2] = [(bytemuck::Zeroable::zeroed(), 0); 2];
    for (i, (((slot, (name, src, rows, rows_p, (sr, sk), src_stride, nl)), how), pack)) in [7, 8]
        .into_iter()
        .zip(operands)
        .zip(packing)
        .zip(pack.clone())
        .enumerate()
    {
        if matches!(how, Packing::Copy | Packing::KCopy) {
            let clabel = format!("{label} copy {name}");
            // A copy's texture rows are the operand's rows: of M (N) values, or k-major of K.
            let (row, height) = match how {
                Packing::KCopy => {
                    params.flags |= FLAG_K_MAJOR[i];
                    (s.k, nl * rows)
                }
                _ => (rows, nl * s.k),
            };
            let width = row / 4;
            // Each k-step of a k-major block reads 4 x lanes texel rows side by side: with a
            // pitch of a multiple of 1 KiB they fall in a few cache sets (2048 x 768 x 3072, A
            // and B transposed: 1.7x sg1's time with its pack, 0.93x with an odd width). The
            // other layout reads along a row, where the pitch does not matter: the same width
            // for both lets one texture serve an operand read either way (shared.rs).
            let pitch = width | 1;
            let make = || texture(ctx, &clabel, pitch, height);
            let (view, texture) = match sharing.and_then(|sh| Some((sh.textures, sh.contents[i]?))) {
                Some((textures, content)) => {
                    let source = Source {
                        content,
                        buffer: src.buffer.clone(),
                        offset: src.offset,
                        bytes_per_row: (row * 4) as u32,
                        width: width as u32,
                        rows: height as u32,
                    };
                    textures.get_or_make(source, make)
                }
                None => make(),
            };
            dispatches.push(Dispatch {
                label: clabel,
                work: Work::CopyToTexture(TextureCopy {
                    buffer: src.buffer.clone(),
                    offset: src.offset,
                    bytes_per_row: (row * 4) as u32,
                    width: width as u32,
                    rows: height as u32,
                    texture,
                }),
                uniforms: Vec::new(),
            });
            views.push((slot, view));
            continue;
        }
        let (
            Packing::Pass {
                entry: pack_entry,
                k_rows,
            },
            Some(pack),
        ) = (how, pack)
        else {
            direct.push((slot, src));
            continue;
        };
        let pk = Pack {
            rows: rows as u32,
            k: s.k as u32,
            rows4: (rows_p / 4) as u32,
            kp: kp as u32,
            sr: sr as u32,
            sk: sk as u32,
            stride: if nl == 1 { 0 } else { src_stride as u32 },
            mode: if pack_entry == "pack_k4" {
                PACK_K4
            } else {
                PACK_BY_VALUE
            },
        };
        let plabel = format!("{label} pack {name}");
        let invocations = rows_p / 4 * kp.div_ceil(k_rows);
        if v.packs_textures() {
            let (view, _) = texture(ctx, &plabel, rows_p / 4, nl * kp);
            views.push((slot, view));
            texture_pass[i] = (pk, invocations.div_ceil(64));
            continue;
        }
        let mut groups = grid_1d(invocations, 64);
        groups[2] = nl as u32;
        // `pack` reads the source as f32s, `pack_k4` as vec4s.
        let kernel = Kernel::new(v.pack_shader(), pack_entry, &plabel)
            .read(if pack_entry == "pack" { 0 } else { 10 }, name, src)
            .uniform(5, &pk)
            .grid(groups);
        let dst = ctx.zeros(&plabel, nl * kp * rows_p)?; // (items, Kp, rows padded)
        dispatches.push(ctx.launch_with(pack, kernel.write(6, "packed", &dst))?);
        bufs.push((slot, dst));
    }
    if let Some(pack) = pack.iter().flatten().next().filter(|_| v.packs_textures()) {
        dispatches.push(texture_pack(ctx, pack, label, ops, &views, texture_pass, (la, lb))?);
    }
    let mut groups = match (v, ctx.subgroup_lanes()) {
        // A workgroup (one subgroup) per block of 64 rows and 8 columns per invocation.
        (Variant::Sg, Some(lanes)) => grid_1d(mp.div_ceil(64) * np.div_ceil(8 * lanes as usize), 1),
        // sg1: a block of 4 rows and 4 columns per invocation in each direction.
        (Variant::Sg1, Some(lanes)) => {
            let block = 4 * lanes as usize;
            grid_1d(mp.div_ceil(block) * np.div_ceil(block), 1)
        }
        _ => match v.workgroup_tile() {
            // A workgroup per tile of C.
            Some(tile) => grid_1d((mp / tile) * (np / tile), 1),
            None => {
                let block = v.padding().map_or(1, |p| p.0);
                grid_1d((mp / block) * (np / block), 64)
            }
        },
    };
    groups[2] = s.batch as u32;
    let mut kernel = Kernel::new(v.shader(), entry, label)
        .write(c_binding, "C", ops.c)
        .uniform(4, &params)
        .grid(groups);
    // The packed buffers live as long as the matmul's dispatch; the bind group keeps the views.
    for (slot, view) in &views {
        kernel = kernel.texture(*slot, "packed", view, false);
    }
    for (slot, buf) in bufs {
        kernel = kernel.read_owned(slot, "packed", buf);
    }
    for (slot, buf) in direct {
        kernel = kernel.read(slot, "packed", buf);
    }
    let kernel = with_bias(ctx, kernel, ops.bias)?;
    dispatches.push(ctx.launch_with(main, kernel)?);
    Ok(dispatches)
}

/// The texture variants' one pack pass: every operand that `texture_pass` gives a mode into its
/// texture (`views`, A's then B's, a copy's included: it binds both and writes those it packs).
fn texture_pack(
    ctx: &GpuContext,
    pack: &Arc<wgpu::ComputePipeline>,
    label: &str,
    ops: Operands<'_>,
    views: &[(u32, wgpu::TextureView)],
    texture_pass: [(Pack, usize); 2],
    (la, lb): (usize, usize),
) -> Result<Dispatch, GpuError> {
    let [(a, groups_a), (b, groups_b)] = texture_pass;
    let packs = Packs {
        a,
        b,
        groups_a: groups_a as u32,
        items_a: la as u32,
        items_b: lb as u32,
        pad: 0,
    };
    let mut groups = grid_1d(64 * (groups_a + groups_b), 64);
    groups[2] = la.max(lb) as u32;
    let view = |slot: u32| views.iter().find(|(s, _)| *s == slot).map(|(_, v)| v);
    let (Some(va), Some(vb)) = (view(7), view(8)) else {
        return Err(GpuError::Invalid(format!(
            "{label}: a texture operand without its texture"
        )));
    };
    let kernel = Kernel::new("matmul_tex", "pack", format!("{label} pack"))
        .read(0, "A", ops.a)
        .read(11, "B", ops.b);
    let kernel = bind_vec4(ctx, kernel, (10, "A as vec4"), &a, ops.a)?;
    let kernel = bind_vec4(ctx, kernel, (12, "B as vec4"), &b, ops.b)?;
    let kernel = kernel
        .uniform(5, &packs)
        .texture(6, "packed A", va, true)
        .texture(13, "packed B", vb, true)
        .grid(groups);
    ctx.launch_with(pack.clone(), kernel)
}

/// `kernel` with `src` bound as vec4s at `slot` where its pack reads it so (pack_k4, which needs it
/// aligned and at least a vec4 long); else a 4-element stand-in, as a vec4 binding holds 16 bytes.
fn bind_vec4<'a>(
    ctx: &GpuContext,
    kernel: Kernel<'a>,
    (slot, name): (u32, &'static str),
    pack: &Pack,
    src: &'a GpuBuffer,
) -> Result<Kernel<'a>, GpuError> {
    Ok(match pack.mode {
        PACK_K4 => kernel.read(slot, name, src),
        _ => kernel.read_owned(slot, name, ctx.zeros("matmul pack no vec4 source", 4)?),
    })
}

/// `kernel` with the bias bound. Kernels that read a bias only when flagged still bind one: without
/// a bias, a 1-element stand-in.
fn with_bias<'a>(ctx: &GpuContext, kernel: Kernel<'a>, bias: Option<&'a GpuBuffer>) -> Result<Kernel<'a>, GpuError> {
    Ok(match bias {
        Some(x) => kernel.read(2, "bias", x),
        None => kernel.read_owned(2, "bias", ctx.zeros("matmul no-bias", 1)?),
    })
}

/// An rgba32float storage texture of at least `width` x `height` texels (a pack pass's or a copy's
/// destination) and its view; the bind groups that use the view keep the texture alive.
fn texture(ctx: &GpuContext, label: &str, width: usize, height: usize) -> (wgpu::TextureView, wgpu::Texture) {
    let t = ctx.device.create_texture(&wgpu::TextureDescriptor {
        label: Some(label),
        size: wgpu::Extent3d {
            width: non_power_of_two(width) as u32,
            height: non_power_of_two(height) as u32,
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: TEX_FORMAT,
        usage: wgpu::TextureUsages::STORAGE_BINDING | wgpu::TextureUsages::COPY_DST,
        view_formats: &[],
    });
    let view = t.create_view(&wgpu::TextureViewDescriptor {
        label: Some(label),
        ..Default::default()
    });
    (view, t)
}

/// `x`, or the next size that is not a power of two. lavapipe compiles a shader once per combination of
/// "is a power of two" of each bound image's width and height (~1 s for tex16); one fixed answer keeps
/// it to one compile. The texels beyond `x` are never read.
fn non_power_of_two(x: usize) -> usize {
    let mut y = x.max(1);
    while y.is_power_of_two() {
        y += 1;
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    const K4: Packing = Packing::Pass {
        entry: "pack_k4",
        k_rows: 4,
    };
    const BY_VALUE: Packing = Packing::Pass {
        entry: "pack",
        k_rows: 1,
    };

    fn entries(v: Variant, s: &MatmulShape) -> [Packing; 2] {
        let (la, lb) = packed_items(s);
        let (a, b) = (s.a_strides(), s.b_strides());
        let stride = |x: usize, items: usize| if items == 1 { 0 } else { x };
        [
            pack_entry(v, 0, s.m, a, (stride(s.stride_a, la), la), s.k),
            pack_entry(v, 0, s.n, (b.1, b.0), (stride(s.stride_b, lb), lb), s.k),
        ]
    }

    fn shape(ta: bool, tb: bool, (m, n, k): (usize, usize, usize)) -> MatmulShape {
        MatmulShape {
            trans_a: ta,
            trans_b: tb,
            ..MatmulShape::new(3, m, n, k)
        }
    }

    #[test]
    fn packs_of_contiguous_rows_load_vec4s_and_everything_else_loads_values() {
        let s = |ta, tb| shape(ta, tb, (18, 21, 12));
        // A as stored and B transposed have contiguous rows of K; the others do not.
        assert_eq!(entries(Variant::Tex16, &s(false, false)), [K4, BY_VALUE]);
        assert_eq!(entries(Variant::Tex16, &s(true, true)), [BY_VALUE, K4]);
        assert_eq!(entries(Variant::Block8, &s(false, true)), [K4, K4]);
        // K, a batch stride or a binding offset that breaks the vec4 alignment falls back.
        let odd_k = MatmulShape::new(1, 16, 16, 9);
        assert_eq!(entries(Variant::Tex16, &odd_k), [BY_VALUE, BY_VALUE]);
        let mut odd_stride = s(false, true);
        odd_stride.stride_a += 2;
        assert_eq!(entries(Variant::Tex16, &odd_stride), [BY_VALUE, K4]);
        // A broadcast operand has one packed item: its stride does not matter.
        odd_stride.stride_a = 0;
        assert_eq!(entries(Variant::Tex16, &odd_stride), [K4, K4]);
        assert_eq!(pack_entry(Variant::Tex16, 8, 16, (12, 1), (0, 1), 12), BY_VALUE);
        assert_eq!(pack_entry(Variant::Tex16, 256, 16, (12, 1), (0, 1), 12), K4);
    }

    #[test]
    fn texture_variants_copy_operands_whose_rows_are_whole_256_byte_rows() {
        // A transposed (M = 64) and B as stored (N = 128): rows of K already hold the texels.
        let s = shape(true, false, (64, 128, 12));
        assert_eq!(entries(Variant::Tex16, &s), [Packing::Copy, Packing::Copy]);
        assert_eq!(entries(Variant::Sg, &s), [Packing::Copy, Packing::Copy]);
        // Rows that are not whole 256-byte rows (M = 48), a gap between items, an offset
        // that is not a texel's, or the other layout: packed.
        assert_eq!(entries(Variant::Tex16, &shape(true, false, (48, 128, 12)))[0], BY_VALUE);
        let mut gap = s;
        gap.stride_b += 4;
        assert_eq!(entries(Variant::Sg, &gap), [Packing::Copy, BY_VALUE]);
        assert_eq!(pack_entry(Variant::Tex16, 8, 64, (1, 64), (0, 1), 12), BY_VALUE);
        assert_eq!(entries(Variant::Tex16, &shape(false, true, (64, 128, 12))), [K4, K4]);
        // block8 binds such operands directly.
        assert_eq!(entries(Variant::Block8, &s), [Packing::Direct, Packing::Direct]);
    }

    #[test]
    fn sg1_copies_operands_whose_rows_hold_k_into_k_major_textures() {
        // A as stored and B transposed: rows of K side by side, K whole 256-byte rows.
        let s = shape(false, true, (64, 128, 64));
        assert_eq!(entries(Variant::Sg1, &s), [Packing::KCopy, Packing::KCopy]);
        // A layout both read (A transposed, B as stored) stays an ordinary copy.
        assert_eq!(
            entries(Variant::Sg1, &shape(true, false, (64, 128, 64))),
            [Packing::Copy, Packing::Copy]
        );
        // Only sg1's kernel reads k-major textures.
        assert_eq!(entries(Variant::Sg, &s), [K4, K4]);
        assert_eq!(entries(Variant::Tex16, &s), [K4, K4]);
        // K not whole 256-byte rows, rows to pad, a gap between items, an unaligned binding: packed.
        assert_eq!(entries(Variant::Sg1, &shape(false, true, (64, 128, 60))), [K4, K4]);
        assert_eq!(entries(Variant::Sg1, &shape(false, true, (60, 128, 64)))[0], K4);
        let mut gap = s;
        gap.stride_a += 4;
        assert_eq!(entries(Variant::Sg1, &gap), [K4, Packing::KCopy]);
        assert_eq!(pack_entry(Variant::Sg1, 8, 64, (64, 1), (0, 1), 64), BY_VALUE);
        // K past 512, where k-major rows cost more than the pack saves: packed.
        assert_eq!(entries(Variant::Sg1, &shape(false, true, (64, 128, 576))), [K4, K4]);
        // Taller than every adapter's textures: packed.
        assert_eq!(pack_entry(Variant::Sg1, 0, 4096, (64, 1), (4096 * 64, 3), 64), K4);
    }

    #[test]
    fn block8_reads_operands_already_in_its_layout_without_a_pack() {
        // A transposed and B as stored are rows of K holding M (N) side by side: block8's layout
        // when M (N) is a multiple of 8, K of 4, and batch items are back to back.
        let s = shape(true, false, (16, 24, 12));
        assert_eq!(entries(Variant::Block8, &s), [Packing::Direct, Packing::Direct]);
        // tex16 reads textures: always a pass.
        assert_eq!(entries(Variant::Tex16, &s), [BY_VALUE, BY_VALUE]);
        // Rows to pad, a K to pad, a gap between items or an unaligned binding: a pass.
        assert_eq!(
            entries(Variant::Block8, &shape(true, false, (18, 20, 12))),
            [BY_VALUE, BY_VALUE]
        );
        assert_eq!(
            entries(Variant::Block8, &shape(true, false, (16, 24, 10))),
            [BY_VALUE, BY_VALUE]
        );
        let mut gap = s;
        gap.stride_a += 4;
        assert_eq!(entries(Variant::Block8, &gap), [BY_VALUE, Packing::Direct]);
        gap.stride_a = 0;
        assert_eq!(entries(Variant::Block8, &gap), [Packing::Direct, Packing::Direct]);
        assert_eq!(pack_entry(Variant::Block8, 8, 16, (1, 16), (0, 1), 12), BY_VALUE);
        // block16 reads the same layout, its rows padded to 16: M = 16 binds directly, N = 24
        // is padded by a pass.
        assert_eq!(entries(Variant::Block16, &s), [Packing::Direct, BY_VALUE]);
    }
}
