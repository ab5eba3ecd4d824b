//! Collectives across simulated devices (shaders/collectives.wgsl), with `jax.lax` semantics.
//! `x` and `out` hold every device's block one after another (`[device, local...]`); each
//! collective is one dispatch for all devices, whatever their number. The device groups of the
//! collective's mesh axes go into a small storage table built here, at plan time.
use super::reduce::{launch, need};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError};
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

/// One launch of `entry` over every device's output block.
#[allow(clippy::too_many_arguments)]
async fn launch_collective(
    ctx: &GpuContext,
    entry: &str,
    label: String,
    mesh: &Mesh,
    table: &[u32],
    g: usize,
    x: &GpuBuffer,
    out: &GpuBuffer,
    in_n: usize,
    out_n: usize,
    view: View,
    mean: bool,
) -> Result<Dispatch, GpuError> {
    let devices = mesh.devices();
    let k = format!("collectives::{entry}");
    if devices
        .checked_mul(in_n.max(out_n))
        .is_none_or(|n| n > u32::MAX as usize)
    {
        return Err(GpuError::Invalid(format!(
            "{label}: {devices} devices x {} elements overflow 32-bit indices; use smaller blocks",
            in_n.max(out_n)
        )));
    }
    need(&k, "x", x, devices * in_n)?;
    need(&k, "out", out, devices * out_n)?;
    let table = ctx.upload(&format!("{label} groups"), table)?;
    let u32s = |a: [usize; 4]| a.map(|v| v as u32);
    let params = Params {
        devices: devices as u32,
        group_size: g as u32,
        in_n: in_n as u32,
        out_n: out_n as u32,
        dims: u32s(view.dims),
        strides: u32s(view.strides),
        member_dim: view.member_dim as u32,
        rank_stride: view.rank_stride as u32,
        mean: mean as u32,
        _pad: 0,
    };
    let grid = grid_1d(devices * out_n, 256);
    let mut d = launch(
        ctx,
        "collectives",
        entry,
        label,
        &[(0, x), (1, &table), (2, out)],
        &params,
        3,
        grid,
    )
    .await?;
    // The group table lives as long as the dispatch that reads it.
    d.uniforms.push(table.buffer);
    Ok(d)
}

#[allow(clippy::too_many_arguments)]
async fn reduce(
    ctx: &GpuContext,
    name: &str,
    mesh: &Mesh,
    axes: &[&str],
    x: &GpuBuffer,
    out: &GpuBuffer,
    local_shape: &[usize],
    mean: bool,
) -> Result<Dispatch, GpuError> {
    let (table, g) = group_table(mesh, axes)?;
    let n = numel(local_shape);
    let label = format!(
        "{name} over {axes:?} local {local_shape:?} on {} devices",
        mesh.devices()
    );
    launch_collective(ctx, "reduce", label, mesh, &table, g, x, out, n, n, View::flat(n), mean).await
}

/// `jax.lax.psum(x, axes)`: every device's block becomes the sum of its group's blocks, added in
/// group order. `x`, `out`: (D, local_shape...).
pub async fn psum(
    ctx: &GpuContext,
    mesh: &Mesh,
    axes: &[&str],
    x: &GpuBuffer,
    out: &GpuBuffer,
    local_shape: &[usize],
) -> Result<Dispatch, GpuError> {
    reduce(ctx, "psum", mesh, axes, x, out, local_shape, false).await
}

/// `jax.lax.pmean(x, axes)`: psum divided by the group size.
pub async fn pmean(
    ctx: &GpuContext,
    mesh: &Mesh,
    axes: &[&str],
    x: &GpuBuffer,
    out: &GpuBuffer,
    local_shape: &[usize],
) -> Result<Dispatch, GpuError> {
    reduce(ctx, "pmean", mesh, axes, x, out, local_shape, true).await
}

/// `jax.lax.all_gather(x, axes, axis=axis, tiled=tiled)`: the group's blocks in group order,
/// concatenated along `axis` (tiled) or stacked as a new dimension at `axis`. `out`: (D, out...)
/// with the shape of [`sharding::all_gather_shape`].
#[allow(clippy::too_many_arguments)]
pub async fn all_gather(
    ctx: &GpuContext,
    mesh: &Mesh,
    axes: &[&str],
    x: &GpuBuffer,
    out: &GpuBuffer,
    local_shape: &[usize],
    axis: usize,
    tiled: bool,
) -> Result<Dispatch, GpuError> {
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
    let (in_n, out_n) = (numel(local_shape), numel(&out_shape));
    launch_collective(ctx, "gather", label, mesh, &table, g, x, out, in_n, out_n, view, false).await
}

/// `jax.lax.psum_scatter(x, axes, scatter_dimension=.., tiled=..)`: the group's sum, of which
/// member j keeps chunk j along `scatter_dimension` (tiled: size/g; untiled: the dimension must
/// equal g and is removed). `out`: (D, out...) with the shape of [`sharding::psum_scatter_shape`].
#[allow(clippy::too_many_arguments)]
pub async fn psum_scatter(
    ctx: &GpuContext,
    mesh: &Mesh,
    axes: &[&str],
    x: &GpuBuffer,
    out: &GpuBuffer,
    local_shape: &[usize],
    scatter_dimension: usize,
    tiled: bool,
) -> Result<Dispatch, GpuError> {
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
    let (in_n, out_n) = (numel(local_shape), numel(&out_shape));
    launch_collective(ctx, "reduce", label, mesh, &table, g, x, out, in_n, out_n, view, false).await
}

/// `jax.lax.ppermute(x, axes, perm)`: (source index, destination index) pairs along `axes` within
/// each group; a device that receives nothing gets zeros.
pub async fn ppermute(
    ctx: &GpuContext,
    mesh: &Mesh,
    axes: &[&str],
    x: &GpuBuffer,
    out: &GpuBuffer,
    local_shape: &[usize],
    perm: &[(usize, usize)],
) -> Result<Dispatch, GpuError> {
    let sources = sharding::ppermute_sources(mesh, axes, perm)?;
    let table: Vec<u32> = sources.iter().map(|s| s.map_or(u32::MAX, |d| d as u32)).collect();
    let n = numel(local_shape);
    let label = format!(
        "ppermute over {axes:?} perm={perm:?} local {local_shape:?} on {} devices",
        mesh.devices()
    );
    launch_collective(
        ctx,
        "permute",
        label,
        mesh,
        &table,
        1,
        x,
        out,
        n,
        n,
        View::flat(n),
        false,
    )
    .await
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
/// shape of [`sharding::all_to_all_shape`].
#[allow(clippy::too_many_arguments)]
pub async fn all_to_all(
    ctx: &GpuContext,
    mesh: &Mesh,
    axes: &[&str],
    x: &GpuBuffer,
    out: &GpuBuffer,
    local_shape: &[usize],
    split_axis: usize,
    concat_axis: usize,
    tiled: bool,
) -> Result<Dispatch, GpuError> {
    let (table, g) = group_table(mesh, axes)?;
    let out_shape = sharding::all_to_all_shape(local_shape, g, split_axis, concat_axis, tiled)?;
    // Untiled is tiled on the shape with a unit dimension inserted for the sources (as JAX
    // lowers it); inserting and squeezing unit dimensions does not move data.
    let (mut shape, mut s, mut c) = (local_shape.to_vec(), split_axis, concat_axis);
    if !tiled && s < c {
        c += 1;
        shape.insert(c, 1);
    } else if !tiled && s > c {
        shape.insert(c, 1);
        s += 1;
    }
    let view = all_to_all_view(&shape, g, s, c);
    let label = format!(
        "all_to_all over {axes:?} split_axis={split_axis} concat_axis={concat_axis} tiled={tiled} local \
         {local_shape:?} on {} devices",
        mesh.devices()
    );
    let (in_n, out_n) = (numel(local_shape), numel(&out_shape));
    launch_collective(ctx, "gather", label, mesh, &table, g, x, out, in_n, out_n, view, false).await
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
    let grid = grid_1d(devices, 256);
    let mut d = launch(
        ctx,
        "collectives",
        "axis_index",
        label,
        &[(1, &table), (4, out)],
        &params,
        3,
        grid,
    )
    .await?;
    d.uniforms.push(table.buffer);
    Ok(d)
}
