//! CPU twins of the collectives, written the obvious way: for each device group of the mesh axes,
//! take the members' blocks and combine them as `jax.lax` defines. `x` holds every device's block
//! one after another (`[device, local...]`), and so does the result. The collectives that only
//! move data (all_gather, ppermute, all_to_all) take any element type, so u32 data (token ids,
//! random bits) moves as u32, bit for bit.
use crate::sharding::{self, Mesh, ShardingError};

/// What every collective is given: the mesh, the mesh axes it runs over (their device groups),
/// and the local shape of one device's block.
#[derive(Clone, Copy, Debug)]
pub struct CollectiveArgs<'a> {
    pub mesh: &'a Mesh,
    pub axes: &'a [&'a str],
    pub local_shape: &'a [usize],
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Device d's block of `x`, after checking that `x` holds D blocks of `local_shape`.
fn blocks<'a, T>(mesh: &Mesh, x: &'a [T], local_shape: &[usize]) -> Result<Vec<&'a [T]>, ShardingError> {
    let (devices, n) = (mesh.devices(), numel(local_shape));
    if x.len() != devices * n {
        return Err(ShardingError::Length {
            what: "x".into(),
            len: x.len(),
            expected: devices * n,
            why: format!("{devices} devices x a block of {local_shape:?}"),
        });
    }
    Ok((0..devices).map(|d| &x[d * n..(d + 1) * n]).collect())
}

/// `np.concatenate(blocks, axis)` of blocks that each have `shape`.
fn concat<T: Copy>(blocks: &[Vec<T>], shape: &[usize], axis: usize) -> Vec<T> {
    let outer = numel(&shape[..axis]);
    let chunk = numel(&shape[axis..]);
    let mut out = Vec::with_capacity(blocks.len() * numel(shape));
    for o in 0..outer {
        for b in blocks {
            out.extend_from_slice(&b[o * chunk..(o + 1) * chunk]);
        }
    }
    out
}

/// `np.split(block, parts, axis)` of a block of `shape`: `parts` equal pieces along `axis`.
fn split<T: Copy>(block: &[T], shape: &[usize], axis: usize, parts: usize) -> Vec<Vec<T>> {
    let outer = numel(&shape[..axis]);
    let row = numel(&shape[axis..]);
    let piece = row / parts;
    (0..parts)
        .map(|p| {
            (0..outer)
                .flat_map(|o| block[o * row + p * piece..o * row + (p + 1) * piece].iter().copied())
                .collect()
        })
        .collect()
}

/// The elementwise sum of the group's blocks, added in group order.
fn group_sum(group: &[usize], blocks: &[&[f32]]) -> Vec<f32> {
    let mut sum = vec![0.0f32; blocks[0].len()];
    for &m in group {
        for (s, v) in sum.iter_mut().zip(blocks[m]) {
            *s += v;
        }
    }
    sum
}

/// `jax.lax.psum(x, axes)`.
pub fn psum(c: &CollectiveArgs, x: &[f32]) -> Result<Vec<f32>, ShardingError> {
    let CollectiveArgs {
        mesh,
        axes,
        local_shape,
    } = *c;
    let blocks = blocks(mesh, x, local_shape)?;
    let n = numel(local_shape);
    let mut out = vec![0.0; x.len()];
    for group in mesh.axis_groups(axes)? {
        let sum = group_sum(&group, &blocks);
        for &d in &group {
            out[d * n..(d + 1) * n].copy_from_slice(&sum);
        }
    }
    Ok(out)
}

/// `jax.lax.psum` of many arrays in place (the twin of the packed launch): array `(start, n)` of
/// `arrays` is every device's block of `n` elements from element `start` of `arena`.
pub fn psum_packed(
    mesh: &Mesh,
    axes: &[&str],
    arena: &mut [f32],
    arrays: &[(usize, usize)],
) -> Result<(), ShardingError> {
    for &(start, n) in arrays {
        let end = start.saturating_add(mesh.devices().saturating_mul(n));
        let Some(x) = arena.get(start..end) else {
            return Err(ShardingError::Length {
                what: "arena".into(),
                len: arena.len(),
                expected: end,
                why: format!("an array of {n} elements per device from element {start}"),
            });
        };
        let c = CollectiveArgs {
            mesh,
            axes,
            local_shape: &[n],
        };
        let sum = psum(&c, x)?;
        arena[start..end].copy_from_slice(&sum);
    }
    Ok(())
}

/// `jax.lax.pmean(x, axes)`: psum / group size.
pub fn pmean(c: &CollectiveArgs, x: &[f32]) -> Result<Vec<f32>, ShardingError> {
    let g = c.mesh.axes_size(c.axes)? as f32;
    Ok(psum(c, x)?.into_iter().map(|v| v / g).collect())
}

/// `jax.lax.all_gather(x, axes, axis=axis, tiled=tiled)`.
pub fn all_gather<T: Copy + Default>(
    c: &CollectiveArgs,
    x: &[T],
    axis: usize,
    tiled: bool,
) -> Result<Vec<T>, ShardingError> {
    let CollectiveArgs {
        mesh,
        axes,
        local_shape,
    } = *c;
    let blocks = blocks(mesh, x, local_shape)?;
    let groups = mesh.axis_groups(axes)?;
    let out_shape = sharding::all_gather_shape(local_shape, groups[0].len(), axis, tiled)?;
    let out_n = numel(&out_shape);
    // Stacking is concatenating blocks that have a unit dimension at `axis`.
    let mut block_shape = local_shape.to_vec();
    if !tiled {
        block_shape.insert(axis, 1);
    }
    let mut out = vec![T::default(); mesh.devices() * out_n];
    for group in groups {
        let members: Vec<Vec<T>> = group.iter().map(|&m| blocks[m].to_vec()).collect();
        let gathered = concat(&members, &block_shape, axis);
        for &d in &group {
            out[d * out_n..(d + 1) * out_n].copy_from_slice(&gathered);
        }
    }
    Ok(out)
}

/// `jax.lax.psum_scatter(x, axes, scatter_dimension=.., tiled=..)`: member j keeps chunk j of the sum.
pub fn psum_scatter(
    c: &CollectiveArgs,
    x: &[f32],
    scatter_dimension: usize,
    tiled: bool,
) -> Result<Vec<f32>, ShardingError> {
    let CollectiveArgs {
        mesh,
        axes,
        local_shape,
    } = *c;
    let blocks = blocks(mesh, x, local_shape)?;
    let groups = mesh.axis_groups(axes)?;
    let g = groups[0].len();
    let out_n = numel(&sharding::psum_scatter_shape(local_shape, g, scatter_dimension, tiled)?);
    let mut out = vec![0.0; mesh.devices() * out_n];
    for group in groups {
        let chunks = split(&group_sum(&group, &blocks), local_shape, scatter_dimension, g);
        for (j, &d) in group.iter().enumerate() {
            out[d * out_n..(d + 1) * out_n].copy_from_slice(&chunks[j]);
        }
    }
    Ok(out)
}

/// `jax.lax.ppermute(x, axes, perm)`: (source, destination) index pairs within each group;
/// devices that receive nothing get zeros.
pub fn ppermute<T: Copy + Default>(
    c: &CollectiveArgs,
    x: &[T],
    perm: &[(usize, usize)],
) -> Result<Vec<T>, ShardingError> {
    let CollectiveArgs {
        mesh,
        axes,
        local_shape,
    } = *c;
    sharding::ppermute_sources(mesh, axes, perm)?; // validates the pairs
    let blocks = blocks(mesh, x, local_shape)?;
    let n = numel(local_shape);
    let mut out = vec![T::default(); x.len()];
    for group in mesh.axis_groups(axes)? {
        for &(src, dst) in perm {
            let d = group[dst];
            out[d * n..(d + 1) * n].copy_from_slice(blocks[group[src]]);
        }
    }
    Ok(out)
}

/// `jax.lax.all_to_all(x, axes, split_axis, concat_axis, tiled=..)`: member m's block is split into
/// g chunks along `split_axis`; the member at rank r receives chunk r of every member and joins them
/// in member order along `concat_axis` (tiled: concatenated; untiled: the split dimension, of size g,
/// is dropped and the chunks are stacked as a new dimension at `concat_axis`).
pub fn all_to_all<T: Copy + Default>(
    c: &CollectiveArgs,
    x: &[T],
    split_axis: usize,
    concat_axis: usize,
    tiled: bool,
) -> Result<Vec<T>, ShardingError> {
    let CollectiveArgs {
        mesh,
        axes,
        local_shape,
    } = *c;
    let blocks = blocks(mesh, x, local_shape)?;
    let groups = mesh.axis_groups(axes)?;
    let g = groups[0].len();
    let out_n = numel(&sharding::all_to_all_shape(
        local_shape,
        g,
        split_axis,
        concat_axis,
        tiled,
    )?);
    // The shape each received chunk has when it is joined along concat_axis.
    let mut chunk_shape = local_shape.to_vec();
    if tiled {
        chunk_shape[split_axis] /= g;
    } else {
        chunk_shape.remove(split_axis);
        chunk_shape.insert(concat_axis, 1);
    }
    let mut out = vec![T::default(); mesh.devices() * out_n];
    for group in groups {
        let chunks: Vec<Vec<Vec<T>>> = group
            .iter()
            .map(|&m| split(blocks[m], local_shape, split_axis, g))
            .collect();
        for (r, &d) in group.iter().enumerate() {
            let received: Vec<Vec<T>> = chunks.iter().map(|c| c[r].clone()).collect();
            out[d * out_n..(d + 1) * out_n].copy_from_slice(&concat(&received, &chunk_shape, concat_axis));
        }
    }
    Ok(out)
}

/// `jax.lax.axis_index(axes)` of every device: its rank in its group.
pub fn axis_index(mesh: &Mesh, axes: &[&str]) -> Result<Vec<u32>, ShardingError> {
    let mut out = vec![0u32; mesh.devices()];
    for group in mesh.axis_groups(axes)? {
        for (r, &d) in group.iter().enumerate() {
            out[d] = r as u32;
        }
    }
    Ok(out)
}
