//! Sharding pictures, as `jax.debug.visualize_array_sharding` draws them: a value's global
//! shape as a grid of blocks, each with the devices that hold it and their mesh coordinates.
//! The layout comes from the core's NamedSharding (which index ranges each device holds); the
//! page only paints it.
use std::collections::BTreeSet;

use serde::Serialize;
use shardlab::ir::Op;
use shardlab::sharding::{Mesh, NamedSharding, PartitionSpec};

/// One block of the picture: the index ranges it covers along the drawn dimensions, and the
/// devices that hold it (more than one where the value is replicated along some axis).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Block {
    /// `[start, end)` along `row_dim` (`[0, 1]` when there is no row dimension).
    pub rows: [usize; 2],
    /// `[start, end)` along `col_dim` (`[0, 1]` for a scalar).
    pub cols: [usize; 2],
    pub devices: Vec<usize>,
    /// Each device's mesh coordinates, `dp=0,tp=1`.
    pub coords: Vec<String>,
}

/// A value's picture: `row_count` × `col_count` blocks, row-major.
#[derive(Clone, Debug, Serialize)]
pub struct Picture {
    pub name: String,
    pub shape: Vec<usize>,
    /// As the page writes specs: `P('dp', None)`.
    pub spec: String,
    /// The dimensions drawn as rows and columns (a 1-D value is one row; other dimensions of a
    /// higher-rank value are whole in every block).
    pub row_dim: Option<usize>,
    pub col_dim: Option<usize>,
    pub row_count: usize,
    pub col_count: usize,
    pub blocks: Vec<Block>,
    /// Mesh axes the value is not split along: every block is held by all devices of them.
    pub replicated_over: Vec<String>,
    /// Mesh axes along which devices hold different values that are not blocks of one array
    /// (partial sums before a psum, or per-device values), from a shard_map body.
    pub unreduced_over: Vec<String>,
}

/// `P('dp', None)`: the core's `PartitionSpec('dp', None)` in the short form JAX code uses.
pub fn spec_text(spec: &PartitionSpec) -> String {
    let long = spec.to_string();
    match long.strip_prefix("PartitionSpec") {
        Some(rest) => format!("P{rest}"),
        None => long,
    }
}

/// `dp=0,tp=1`.
pub fn coords_text(mesh: &Mesh, device: usize) -> String {
    let coords = mesh.device_coords(device).unwrap_or_default();
    mesh.axes()
        .iter()
        .zip(coords)
        .map(|((name, _), c)| format!("{name}={c}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The dimensions to draw: the sharded ones (at most two on a mesh of at most two axes), filled
/// up with the last dimensions, as visualize_array_sharding draws a 1-D or 2-D array.
fn drawn_dims(rank: usize, spec: &PartitionSpec) -> Result<(Option<usize>, Option<usize>), String> {
    let sharded: Vec<usize> = (0..rank).filter(|d| !spec.dim_axes(*d).is_empty()).collect();
    Ok(match (rank, sharded.as_slice()) {
        (0, _) => (None, None),
        (1, _) => (None, Some(0)),
        (_, []) => (Some(rank - 2), Some(rank - 1)),
        (_, [s]) if *s == rank - 1 => (Some(rank - 2), Some(*s)),
        (_, [s]) => (Some(*s), Some(rank - 1)),
        (_, [a, b]) => (Some(*a), Some(*b)),
        _ => return Err(format!("{} splits more than two dimensions", spec_text(spec))),
    })
}

/// The picture of a value of global `shape` laid out as `spec` on `mesh`.
pub fn layout(mesh: &Mesh, name: &str, shape: &[usize], spec: &PartitionSpec) -> Result<Picture, String> {
    let sharding = NamedSharding::new(mesh.clone(), spec.clone()).map_err(|e| e.to_string())?;
    sharding.shard_shape(shape).map_err(|e| e.to_string())?;
    let (row_dim, col_dim) = drawn_dims(shape.len(), spec)?;
    let mut blocks: Vec<Block> = vec![];
    for d in 0..mesh.devices() {
        let ranges = sharding.device_indices(d, shape).map_err(|e| e.to_string())?;
        let at = |dim: Option<usize>| dim.map_or([0, 1], |k| [ranges[k].start, ranges[k].end]);
        let (rows, cols) = (at(row_dim), at(col_dim));
        match blocks.iter_mut().find(|b| b.rows == rows && b.cols == cols) {
            Some(b) => {
                b.devices.push(d);
                b.coords.push(coords_text(mesh, d));
            }
            None => blocks.push(Block {
                rows,
                cols,
                devices: vec![d],
                coords: vec![coords_text(mesh, d)],
            }),
        }
    }
    blocks.sort_by_key(|b| (b.rows[0], b.cols[0]));
    let count = |pick: fn(&Block) -> usize| blocks.iter().map(pick).collect::<BTreeSet<_>>().len();
    let (row_count, col_count) = (count(|b| b.rows[0]), count(|b| b.cols[0]));
    let replicated_over = mesh
        .axes()
        .iter()
        .filter(|(a, _)| !spec.uses_axis(a))
        .map(|(a, _)| a.clone())
        .collect();
    // Written out to the value's rank (jit's canonical P('dp',) reads as P('dp', None)).
    let shown = if spec.mesh_axes().is_empty() {
        PartitionSpec::replicated()
    } else {
        PartitionSpec::new(
            (0..shape.len())
                .map(|d| spec.dim_axes(d).into_iter().map(String::from).collect())
                .collect(),
        )
    };
    Ok(Picture {
        name: name.to_string(),
        shape: shape.to_vec(),
        spec: spec_text(&shown),
        row_dim,
        col_dim,
        row_count,
        col_count,
        blocks,
        replicated_over,
        unreduced_over: vec![],
    })
}

/// The global layout of a value of a shard_map body, from its per-device shape: each dimension
/// `global / local` times smaller is split over varying mesh axes of that size (the first
/// dimension takes the first axis, in mesh order, as shard_map's strategies split batch before
/// features). Varying axes left over are `unreduced` (partial or per-device values). None where
/// the shapes do not divide.
pub fn infer_spec(
    mesh: &Mesh,
    global: &[usize],
    local: &[usize],
    varying: &BTreeSet<String>,
) -> Option<(PartitionSpec, Vec<String>)> {
    if global.len() != local.len() {
        return None;
    }
    let mut free: Vec<(String, usize)> = mesh
        .axes()
        .iter()
        .filter(|(a, _)| varying.contains(a))
        .cloned()
        .collect();
    let mut entries = vec![];
    for (&g, &l) in global.iter().zip(local) {
        if l == 0 || !g.is_multiple_of(l) {
            return None;
        }
        let factor = g / l;
        if factor == 1 {
            entries.push(vec![]);
            continue;
        }
        let axes: Vec<String> = if let Some(k) = free.iter().position(|(_, n)| *n == factor) {
            vec![free.remove(k).0]
        } else if free.iter().map(|(_, n)| n).product::<usize>() == factor && free.len() > 1 {
            free.drain(..).map(|(a, _)| a).collect()
        } else {
            return None;
        };
        entries.push(axes);
    }
    Some((PartitionSpec::new(entries), free.into_iter().map(|(a, _)| a).collect()))
}

/// A collective's mesh axes and its device groups.
pub type Groups = (Vec<String>, Vec<Vec<usize>>);

/// The device groups of a collective op (JAX's replica groups) and, for a ppermute, its
/// source → target pairs. None for an op that is not a collective.
pub fn collective_groups(mesh: &Mesh, op: &Op) -> Option<Result<Groups, String>> {
    let axes: Vec<String> = match op {
        Op::Psum { axes, .. }
        | Op::AllGather { axes, .. }
        | Op::PsumScatter { axes, .. }
        | Op::AllToAll { axes, .. } => axes.clone(),
        Op::Ppermute { axis, .. } => vec![axis.clone()],
        _ => return None,
    };
    let names: Vec<&str> = axes.iter().map(String::as_str).collect();
    Some(mesh.axis_groups(&names).map(|g| (axes, g)).map_err(|e| e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> PartitionSpec {
        PartitionSpec::parse(text).unwrap()
    }

    #[test]
    fn a_dim_split_over_dp_4_is_four_blocks_of_one_device_each() {
        let mesh = Mesh::new(&[("dp", 4)]).unwrap();
        let pic = layout(&mesh, "tokens", &[8, 16], &p("P('dp')")).unwrap();
        assert_eq!(pic.spec, "P('dp', None)");
        assert_eq!((pic.row_count, pic.col_count, pic.blocks.len()), (4, 1, 4));
        assert_eq!(pic.blocks[1].rows, [2, 4]);
        assert_eq!(pic.blocks[1].coords, vec!["dp=1"]);
        assert!(pic.replicated_over.is_empty());
    }

    #[test]
    fn a_replicated_value_is_one_block_on_every_device() {
        let mesh = Mesh::new(&[("dp", 2), ("tp", 2)]).unwrap();
        let pic = layout(&mesh, "wte", &[32, 8], &p("P()")).unwrap();
        assert_eq!(pic.blocks.len(), 1);
        assert_eq!(pic.blocks[0].devices, vec![0, 1, 2, 3]);
        assert_eq!(pic.blocks[0].coords[1], "dp=0,tp=1");
        assert_eq!(pic.replicated_over, vec!["dp", "tp"]);
        assert_eq!(pic.spec, "P()");
    }

    #[test]
    fn columns_over_tp_on_dp_by_tp_are_held_by_each_dp_row() {
        let mesh = Mesh::new(&[("dp", 2), ("tp", 2)]).unwrap();
        let pic = layout(&mesh, "w_fc", &[8, 32], &p("P(None, 'tp')")).unwrap();
        assert_eq!((pic.row_count, pic.col_count), (1, 2));
        assert_eq!(pic.blocks[0].devices, vec![0, 2]);
        assert_eq!(pic.blocks[1].cols, [16, 32]);
        assert_eq!(pic.replicated_over, vec!["dp"]);
    }

    #[test]
    fn a_higher_rank_value_draws_its_sharded_dims() {
        let mesh = Mesh::new(&[("dp", 2), ("tp", 2)]).unwrap();
        let pic = layout(&mesh, "h0.att", &[4, 2, 8, 8], &p("P('dp', 'tp')")).unwrap();
        assert_eq!((pic.row_dim, pic.col_dim), (Some(0), Some(1)));
        assert_eq!(pic.blocks.len(), 4);
        let one = layout(&Mesh::new(&[("dp", 2)]).unwrap(), "b", &[6], &p("P('dp')")).unwrap();
        assert_eq!((one.row_dim, one.col_dim, one.col_count), (None, Some(0), 2));
    }

    #[test]
    fn a_spec_the_shape_does_not_divide_is_refused() {
        let mesh = Mesh::new(&[("dp", 4)]).unwrap();
        assert!(layout(&mesh, "x", &[6, 2], &p("P('dp')")).is_err());
    }

    #[test]
    fn shard_map_layouts_are_inferred_from_local_shapes_and_varying_axes() {
        let mesh = Mesh::new(&[("dp", 2), ("tp", 2)]).unwrap();
        let both: BTreeSet<String> = ["dp", "tp"].map(String::from).into();
        let (spec, rest) = infer_spec(&mesh, &[8, 32], &[4, 16], &both).unwrap();
        assert_eq!(spec_text(&spec), "P('dp', 'tp')");
        assert!(rest.is_empty());
        // A gradient before its psum: the same shape on every device, varying along dp.
        let dp: BTreeSet<String> = ["dp".to_string()].into();
        let (spec, rest) = infer_spec(&mesh, &[8, 32], &[8, 32], &dp).unwrap();
        assert_eq!(spec_text(&spec), "P(None, None)");
        assert_eq!(rest, vec!["dp"]);
        assert!(infer_spec(&mesh, &[8, 32], &[3, 32], &dp).is_none());
    }

    #[test]
    fn an_all_reduce_over_dp_groups_the_devices_that_share_tp() {
        let mesh = Mesh::new(&[("dp", 2), ("tp", 2)]).unwrap();
        let op = Op::Psum {
            axes: vec!["dp".into()],
            group: 2,
        };
        let (axes, groups) = collective_groups(&mesh, &op).unwrap().unwrap();
        assert_eq!(axes, vec!["dp"]);
        assert_eq!(groups, vec![vec![0, 2], vec![1, 3]]);
    }
}
