//! Collectives across simulated devices (shaders/collectives.wgsl), with `jax.lax` semantics.
//! `x` and `out` hold every device's block one after another (`[device, local...]`); each
//! collective is one dispatch for all devices, whatever their number. The device groups of the
//! collective's mesh axes go into a small storage table built here, at plan time. The collectives
//! that only move data (all_gather, all_to_all, ppermute) move 4-byte bit patterns, so they carry
//! f32 and u32 data alike, bit for bit.
use super::check::need;
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
pub use crate::reference::collectives::CollectiveArgs;
use crate::sharding::{self, Mesh, ShardingError};

/// A bad mesh axis, shape or permutation reaches a launcher's caller as `GpuError::Invalid`.
impl From<ShardingError> for GpuError {
    fn from(e: ShardingError) -> Self {
        GpuError::Invalid(e.to_string())
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    devices: u32,
    group_size: u32,
    in_n: u32,
    out_n: u32,
    dims: [u32; 4],
    strides: [u32; 4],
    member_dim: u32,
    rank_stride: u32,
    mean: u32,
    _pad: u32,
}

/// The output block seen as a row-major 4-D array: for output coordinates c, the source element
/// in a member's block is `dot(c, strides) + rank * rank_stride`; `member_dim` (gather) picks
/// the member.
struct View {
    dims: [usize; 4],
    strides: [usize; 4],
    member_dim: usize,
    rank_stride: usize,
}

impl View {
    /// Every element in place: psum, pmean, ppermute.
    fn flat(n: usize) -> Self {
        View {
            dims: [1, 1, 1, n],
            strides: [0, 0, 0, 1],
            member_dim: 0,
            rank_stride: 0,
        }
    }
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The shader's group table (see collectives.wgsl) and the group size.
fn group_table(mesh: &Mesh, axes: &[&str]) -> Result<(Vec<u32>, usize), ShardingError> {
    let groups = mesh.axis_groups(axes)?;
    let devices = mesh.devices();
    let g = groups[0].len();
    let mut table = vec![0u32; 3 * devices];
    for (gi, group) in groups.iter().enumerate() {
        for (rank, &d) in group.iter().enumerate() {
            table[d] = (gi * g) as u32;
            table[devices + d] = rank as u32;
            table[2 * devices + gi * g + rank] = d as u32;
        }
    }
    Ok((table, g))
}

/// One launch of a collective entry point over every device's output block.
struct Launch {
    /// `reduce` (f32 arithmetic), `gather` or `permute` (bit patterns).
    entry: &'static str,
    label: String,
    /// The group table (see collectives.wgsl) and the group size.
    table: Vec<u32>,
    g: usize,
    /// Elements of one device's input and output blocks.
    in_n: usize,
    out_n: usize,
    view: View,
    mean: bool,
}

async fn launch(
    ctx: &GpuContext,
    mesh: &Mesh,
    x: &GpuBuffer,
    out: &GpuBuffer,
    l: Launch,
) -> Result<Dispatch, GpuError> {
    let devices = mesh.devices();
    let k = format!("collectives::{}", l.entry);
    if devices
        .checked_mul(l.in_n.max(l.out_n))
        .is_none_or(|n| n > u32::MAX as usize)
    {
        return Err(GpuError::Invalid(format!(
            "{}: {devices} devices x {} elements overflow 32-bit indices; use smaller blocks",
            l.label,
            l.in_n.max(l.out_n)
        )));
    }
    need(&k, "x", x, devices * l.in_n)?;
    need(&k, "out", out, devices * l.out_n)?;
    let table = ctx.upload(&format!("{} groups", l.label), &l.table)?;
    let u32s = |a: [usize; 4]| a.map(|v| v as u32);
    let params = Params {
        devices: devices as u32,
        group_size: l.g as u32,
        in_n: l.in_n as u32,
        out_n: l.out_n as u32,
        dims: u32s(l.view.dims),
        strides: u32s(l.view.strides),
        member_dim: l.view.member_dim as u32,
        rank_stride: l.view.rank_stride as u32,
        mean: l.mean as u32,
        _pad: 0,
    };
    // f32 for the sums; u32 bit patterns for the entry points that move data.
    let (x_slot, out_slot) = if l.entry == "reduce" { (0, 2) } else { (5, 6) };
    let kernel = Kernel::new("collectives", l.entry, l.label)
        .read(x_slot, "x", x)
        .read_owned(1, "groups", table)
        .write(out_slot, "out", out)
        .uniform(3, &params)
        .grid(grid_1d(devices * l.out_n, 256));
    ctx.launch(kernel).await
}

/// psum or pmean: every element in place, summed over the group.
async fn reduce(
    ctx: &GpuContext,
    name: &str,
    c: &CollectiveArgs<'_>,
    x: &GpuBuffer,
    out: &GpuBuffer,
    mean: bool,
) -> Result<Dispatch, GpuError> {
    let CollectiveArgs {
        mesh,
        axes,
        local_shape,
    } = *c;
    let (table, g) = group_table(mesh, axes)?;
    let n = numel(local_shape);
    let label = format!(
        "{name} over {axes:?} local {local_shape:?} on {} devices",
        mesh.devices()
    );
    let l = Launch {
        entry: "reduce",
        label,
        table,
        g,
        in_n: n,
        out_n: n,
        view: View::flat(n),
        mean,
    };
    launch(ctx, mesh, x, out, l).await
}

/// `jax.lax.psum(x, axes)`: every device's block becomes the sum of its group's blocks, added in
/// group order. `x`, `out`: (D, local_shape...).
pub async fn psum(
    ctx: &GpuContext,
    c: &CollectiveArgs<'_>,
    x: &GpuBuffer,
    out: &GpuBuffer,
) -> Result<Dispatch, GpuError> {
    reduce(ctx, "psum", c, x, out, false).await
}

/// Elements one workgroup of `reduce_packed` sums (its workgroup size).
const PACKED_SPAN: usize = 256;

/// `jax.lax.psum` of many arrays in one launch, in place: array `(start, n)` of `arrays` is every
/// device's block of `n` elements (`[device, n]`) from element `start` of `arena`, and each of its
/// elements becomes its group's sum, added in group order as [`psum`] adds it (bit for bit the
/// same). The executor runs a step's gradient psums this way over the optimizer's gradient arena
/// (crate/src/exec/gpu/packing.rs): one launch where one per gradient ran.
pub async fn psum_packed(
    ctx: &GpuContext,
    mesh: &Mesh,
    axes: &[&str],
    arena: &GpuBuffer,
    arrays: &[(usize, usize)],
) -> Result<Dispatch, GpuError> {
    let k = "collectives::psum_packed";
    let (table, g) = group_table(mesh, axes)?;
    let devices = mesh.devices();
    let mut spans: Vec<[u32; 4]> = vec![];
    for &(start, n) in arrays {
        super::check::positive(k, "elements per device of an array", n)?;
        let end = devices.checked_mul(n).and_then(|x| x.checked_add(start));
        need(k, "arena", arena, end.unwrap_or(usize::MAX))?;
        if end.is_none_or(|e| e > u32::MAX as usize) {
            return Err(GpuError::Invalid(format!(
                "{k}: an array ending past element {} of the arena overflows 32-bit indices; use a smaller arena",
                u32::MAX
            )));
        }
        spans.extend(
            (0..n)
                .step_by(PACKED_SPAN)
                .map(|i| [start as u32, n as u32, i as u32, 0]),
        );
    }
    if spans.is_empty() {
        return Err(GpuError::Invalid(format!("{k}: no arrays to sum")));
    }
    let label = format!(
        "psum over {axes:?} of {} packed arrays on {devices} devices",
        arrays.len()
    );
    let table = ctx.upload(&format!("{label} groups"), &table)?;
    let span_buf = ctx.upload(&format!("{label} spans"), bytemuck::cast_slice::<[u32; 4], u32>(&spans))?;
    let mut params: Params = bytemuck::Zeroable::zeroed();
    params.devices = devices as u32;
    params.group_size = g as u32;
    params.out_n = spans.len() as u32;
    let kernel = Kernel::new("collectives", "reduce_packed", label)
        .read_owned(1, "groups", table)
        .write(2, "arena", arena)
        .uniform(3, &params)
        .read_owned(7, "spans", span_buf)
        .grid(grid_1d(spans.len() * PACKED_SPAN, PACKED_SPAN as u32));
    ctx.launch(kernel).await
}

/// `jax.lax.pmean(x, axes)`: psum divided by the group size.
pub async fn pmean(
    ctx: &GpuContext,
    c: &CollectiveArgs<'_>,
    x: &GpuBuffer,
    out: &GpuBuffer,
) -> Result<Dispatch, GpuError> {
    reduce(ctx, "pmean", c, x, out, true).await
}

/// `jax.lax.all_gather(x, axes, axis=axis, tiled=tiled)`: the group's blocks in group order,
/// concatenated along `axis` (tiled) or stacked as a new dimension at `axis`. `out`: (D, out...)
/// with the shape of [`sharding::all_gather_shape`]. Moves f32 or u32 data bit for bit.
pub async fn all_gather(
    ctx: &GpuContext,
    c: &CollectiveArgs<'_>,
    x: &GpuBuffer,
    out: &GpuBuffer,
    axis: usize,
    tiled: bool,
) -> Result<Dispatch, GpuError> {
    let CollectiveArgs {
        mesh,
        axes,
        local_shape,
    } = *c;
    let (table, g) = group_table(mesh, axes)?;
    let out_shape = sharding::all_gather_shape(local_shape, g, axis, tiled)?;
    // Tiled or not, the output is (outer, g, inner) in memory.
    let outer = numel(&local_shape[..axis]);
    let inner = numel(&local_shape[axis..]);
    let view = View {
        dims: [1, outer, g, inner],
        strides: [0, inner, 0, 1],
        member_dim: 2,
        rank_stride: 0,
    };
    let label = format!(
        "all_gather over {axes:?} axis={axis} tiled={tiled} local {local_shape:?} on {} devices",
        mesh.devices()
    );
    let l = Launch {
        entry: "gather",
        label,
        table,
        g,
        in_n: numel(local_shape),
        out_n: numel(&out_shape),
        view,
        mean: false,
    };
    launch(ctx, mesh, x, out, l).await
}

/// `jax.lax.psum_scatter(x, axes, scatter_dimension=.., tiled=..)`: the group's sum, of which
/// member j keeps chunk j along `scatter_dimension` (tiled: size/g; untiled: the dimension must
/// equal g and is removed). `out`: (D, out...) with the shape of [`sharding::psum_scatter_shape`].
pub async fn psum_scatter(
    ctx: &GpuContext,
    c: &CollectiveArgs<'_>,
    x: &GpuBuffer,
    out: &GpuBuffer,
    scatter_dimension: usize,
    tiled: bool,
) -> Result<Dispatch, GpuError> {
    let CollectiveArgs {
        mesh,
        axes,
        local_shape,
    } = *c;
    let (table, g) = group_table(mesh, axes)?;
    let out_shape = sharding::psum_scatter_shape(local_shape, g, scatter_dimension, tiled)?;
    // The input is (outer, g, inner); member j reads its chunk at rank j.
    let outer = numel(&local_shape[..scatter_dimension]);
    let inner = numel(&out_shape[scatter_dimension..]);
    let view = View {
        dims: [1, 1, outer, inner],
        strides: [0, 0, g * inner, 1],
        member_dim: 0,
        rank_stride: inner,
    };
    let label = format!(
        "psum_scatter over {axes:?} scatter_dimension={scatter_dimension} tiled={tiled} local {local_shape:?} on {} \
         devices",
        mesh.devices()
    );
    let l = Launch {
        entry: "reduce",
        label,
        table,
        g,
        in_n: numel(local_shape),
        out_n: numel(&out_shape),
        view,
        mean: false,
    };
    launch(ctx, mesh, x, out, l).await
}

/// `jax.lax.ppermute(x, axes, perm)`: (source index, destination index) pairs along `axes` within
/// each group; a device that receives nothing gets zeros. Moves f32 or u32 data bit for bit.
pub async fn ppermute(
    ctx: &GpuContext,
    c: &CollectiveArgs<'_>,
    x: &GpuBuffer,
    out: &GpuBuffer,
    perm: &[(usize, usize)],
) -> Result<Dispatch, GpuError> {
    let CollectiveArgs {
        mesh,
        axes,
        local_shape,
    } = *c;
    let sources = sharding::ppermute_sources(mesh, axes, perm)?;
    let table: Vec<u32> = sources.iter().map(|s| s.map_or(u32::MAX, |d| d as u32)).collect();
    let n = numel(local_shape);
    let label = format!(
        "ppermute over {axes:?} perm={perm:?} local {local_shape:?} on {} devices",
        mesh.devices()
    );
    let l = Launch {
        entry: "permute",
        label,
        table,
        g: 1,
        in_n: n,
        out_n: n,
        view: View::flat(n),
        mean: false,
    };
    launch(ctx, mesh, x, out, l).await
}

/// The 4-D view of a tiled all_to_all on `shape`, splitting `s` into g chunks (chunk j to member
/// j) and concatenating the received chunks along `c` in source order.
fn all_to_all_view(shape: &[usize], g: usize, s: usize, c: usize) -> View {
    let m = shape[s] / g;
    if s < c {
        // in (A, g, m*B, S_c*C) -> out (A, m*B, g, S_c*C)
        let (a, x, y) = (numel(&shape[..s]), m * numel(&shape[s + 1..c]), numel(&shape[c..]));
        View {
            dims: [a, x, g, y],
            strides: [g * x * y, y, 0, 1],
            member_dim: 2,
            rank_stride: x * y,
        }
    } else if s > c {
        // in (A, S_c*B, g, m*C) -> out (A, g, S_c*B, m*C)
        let (a, x, y) = (numel(&shape[..c]), numel(&shape[c..s]), m * numel(&shape[s + 1..]));
        View {
            dims: [a, g, x, y],
            strides: [x * g * y, 0, g * y, 1],
            member_dim: 1,
            rank_stride: y,
        }
    } else {
        // in (A, g, m*C) -> out (A, g, m*C), chunk j from member j
        let (a, y) = (numel(&shape[..s]), m * numel(&shape[s + 1..]));
        View {
            dims: [1, a, g, y],
            strides: [0, g * y, 0, 1],
            member_dim: 2,
            rank_stride: y,
        }
    }
}

/// `jax.lax.all_to_all(x, axes, split_axis, concat_axis, tiled=..)`: split `split_axis` into g
/// chunks, chunk j goes to member j, and the received chunks are concatenated along
/// `concat_axis` in source order. Untiled (as JAX defines it): `split_axis` must equal g and is
/// removed, and the sources form a new dimension at `concat_axis`. `out`: (D, out...) with the
/// shape of [`sharding::all_to_all_shape`]. Moves f32 or u32 data bit for bit.
pub async fn all_to_all(
    ctx: &GpuContext,
    c: &CollectiveArgs<'_>,
    x: &GpuBuffer,
    out: &GpuBuffer,
    split_axis: usize,
    concat_axis: usize,
    tiled: bool,
) -> Result<Dispatch, GpuError> {
    let CollectiveArgs {
        mesh,
        axes,
        local_shape,
    } = *c;
    let (table, g) = group_table(mesh, axes)?;
    let out_shape = sharding::all_to_all_shape(local_shape, g, split_axis, concat_axis, tiled)?;
    // Untiled is tiled on the shape with a unit dimension inserted for the sources (as JAX
    // lowers it); inserting and squeezing unit dimensions does not move data.
    let (mut shape, mut s, mut cat) = (local_shape.to_vec(), split_axis, concat_axis);
    if !tiled && s < cat {
        cat += 1;
        shape.insert(cat, 1);
    } else if !tiled && s > cat {
        shape.insert(cat, 1);
        s += 1;
    }
    let view = all_to_all_view(&shape, g, s, cat);
    let label = format!(
        "all_to_all over {axes:?} split_axis={split_axis} concat_axis={concat_axis} tiled={tiled} local \
         {local_shape:?} on {} devices",
        mesh.devices()
    );
    let l = Launch {
        entry: "gather",
        label,
        table,
        g,
        in_n: numel(local_shape),
        out_n: numel(&out_shape),
        view,
        mean: false,
    };
    launch(ctx, mesh, x, out, l).await
}

/// `jax.lax.axis_index(axes)` on every device, into `out`: (D,) u32.
pub async fn axis_index(ctx: &GpuContext, mesh: &Mesh, axes: &[&str], out: &GpuBuffer) -> Result<Dispatch, GpuError> {
    let (table, g) = group_table(mesh, axes)?;
    let devices = mesh.devices();
    need("collectives::axis_index", "out", out, devices)?;
    let label = format!("axis_index over {axes:?} on {devices} devices");
    let table = ctx.upload(&format!("{label} groups"), &table)?;
    let mut params: Params = bytemuck::Zeroable::zeroed();
    params.devices = devices as u32;
    params.group_size = g as u32;
    let kernel = Kernel::new("collectives", "axis_index", label)
        .read_owned(1, "groups", table)
        .write(4, "out", out)
        .uniform(3, &params)
        .grid(grid_1d(devices, 256));
    ctx.launch(kernel).await
}
