//! Shapes and argument checks of the collectives (`jax.lax` semantics), shared by the GPU kernels
//! and their CPU twins. Each takes the local shape of one device's block and the group size g.
use super::error::ShardingError;
use super::mesh::Mesh;

fn check_dim(op: &str, what: &str, dim: usize, limit: usize, shape: &[usize]) -> Result<(), ShardingError> {
    if dim >= limit {
        return Err(ShardingError::collective(
            op,
            format!("{what} {dim} is out of range for a local block of shape {shape:?} (valid: 0..{limit})"),
        ));
    }
    Ok(())
}

/// `all_gather(x, axes, axis, tiled)`: tiled multiplies dimension `axis` by g; untiled inserts a
/// new dimension of size g at `axis` (0..=rank).
pub fn all_gather_shape(
    local_shape: &[usize],
    g: usize,
    axis: usize,
    tiled: bool,
) -> Result<Vec<usize>, ShardingError> {
    let mut out = local_shape.to_vec();
    if tiled {
        check_dim("all_gather", "axis", axis, local_shape.len(), local_shape)?;
        out[axis] *= g;
    } else {
        check_dim("all_gather", "axis", axis, local_shape.len() + 1, local_shape)?;
        out.insert(axis, g);
    }
    Ok(out)
}

/// `psum_scatter(x, axes, scatter_dimension, tiled)`: tiled divides the dimension by g (it must be
/// divisible); untiled requires it to equal g and removes it.
pub fn psum_scatter_shape(
    local_shape: &[usize],
    g: usize,
    scatter_dimension: usize,
    tiled: bool,
) -> Result<Vec<usize>, ShardingError> {
    let op = "psum_scatter";
    check_dim(
        op,
        "scatter_dimension",
        scatter_dimension,
        local_shape.len(),
        local_shape,
    )?;
    let size = local_shape[scatter_dimension];
    let mut out = local_shape.to_vec();
    if tiled {
        if !size.is_multiple_of(g) {
            return Err(ShardingError::collective(
                op,
                format!(
                    "scatter_dimension {scatter_dimension} of size {size} is not divisible by the group size {g}; \
                     make it a multiple of {g}"
                ),
            ));
        }
        out[scatter_dimension] /= g;
    } else {
        if size != g {
            return Err(ShardingError::collective(
                op,
                format!(
                    "with tiled=false scatter_dimension {scatter_dimension} must have the group size {g}, but it has \
                     size {size}; use tiled=true to split it into {g} chunks"
                ),
            ));
        }
        out.remove(scatter_dimension);
    }
    Ok(out)
}

/// `all_to_all(x, axes, split_axis, concat_axis, tiled)`: tiled divides `split_axis` by g and
/// multiplies `concat_axis` by g; untiled requires `split_axis` to have size g, removes it, and
/// inserts a dimension of size g at `concat_axis` (a position in the shape without split_axis):
/// `np.insert(np.delete(shape, split_axis), concat_axis, g)`.
pub fn all_to_all_shape(
    local_shape: &[usize],
    g: usize,
    split_axis: usize,
    concat_axis: usize,
    tiled: bool,
) -> Result<Vec<usize>, ShardingError> {
    let op = "all_to_all";
    let rank = local_shape.len();
    check_dim(op, "split_axis", split_axis, rank, local_shape)?;
    check_dim(op, "concat_axis", concat_axis, rank, local_shape)?;
    let size = local_shape[split_axis];
    let mut out = local_shape.to_vec();
    if tiled {
        if !size.is_multiple_of(g) {
            return Err(ShardingError::collective(
                op,
                format!(
                    "split_axis {split_axis} of size {size} is not divisible by the group size {g}; make it a \
                     multiple of {g}"
                ),
            ));
        }
        out[split_axis] /= g;
        out[concat_axis] *= g;
    } else {
        if size != g {
            return Err(ShardingError::collective(
                op,
                format!(
                    "with tiled=false split_axis {split_axis} must have the group size {g}, but it has size {size}; \
                     use tiled=true to split it into {g} chunks"
                ),
            ));
        }
        out.remove(split_axis);
        out.insert(concat_axis, g);
    }
    Ok(out)
}

/// `ppermute(x, axes, perm)`: for every device, the device it receives from (None: it receives
/// nothing and gets zeros). `perm` holds (source index, destination index) pairs along `axes`
/// within each group; no two pairs may share a source or a destination.
pub fn ppermute_sources(
    mesh: &Mesh,
    axes: &[&str],
    perm: &[(usize, usize)],
) -> Result<Vec<Option<usize>>, ShardingError> {
    let op = "ppermute";
    let groups = mesh.axis_groups(axes)?;
    let g = groups[0].len();
    for (i, &(src, dst)) in perm.iter().enumerate() {
        if src >= g || dst >= g {
            return Err(ShardingError::collective(
                op,
                format!("the pair ({src}, {dst}) is out of range: indices along the axes must be below {g}"),
            ));
        }
        if let Some(&(s, d)) = perm[..i].iter().find(|(s, d)| *s == src || *d == dst) {
            let what = if s == src {
                format!("source {src}")
            } else {
                format!("destination {dst}")
            };
            return Err(ShardingError::collective(
                op,
                format!(
                    "the pairs ({s}, {d}) and ({src}, {dst}) share the {what}; each index may be a source once and a \
                     destination once"
                ),
            ));
        }
    }
    let mut sources = vec![None; mesh.devices()];
    for group in &groups {
        for &(src, dst) in perm {
            sources[group[dst]] = Some(group[src]);
        }
    }
    Ok(sources)
}
