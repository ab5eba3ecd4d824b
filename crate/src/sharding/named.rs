//! `NamedSharding`: a mesh and a partition spec; which block of a global array each device holds.
use std::fmt;
use std::ops::Range;

use super::error::{py_axes, ShardingError};
use super::mesh::Mesh;
use super::spec::PartitionSpec;

/// How an array is laid out over a mesh: dimension i is split over the axes of `spec` entry i
/// (the first axis major), and replicated over the mesh axes the spec does not name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NamedSharding {
    pub mesh: Mesh,
    pub spec: PartitionSpec,
}

impl NamedSharding {
    /// Checks that every axis of `spec` is a mesh axis and that none is used twice, as JAX does
    /// when a `NamedSharding` is made. Shapes are checked by [`NamedSharding::shard_shape`].
    pub fn new(mesh: Mesh, spec: PartitionSpec) -> Result<Self, ShardingError> {
        let sharding = Self { mesh, spec };
        sharding.check_axes()?;
        Ok(sharding)
    }

    fn check_axes(&self) -> Result<(), ShardingError> {
        let used = self.spec.mesh_axes();
        for (i, axis) in used.iter().enumerate() {
            self.mesh.axis_position(axis)?;
            if used[..i].contains(axis) {
                return Err(ShardingError::AxisUsedTwice {
                    axis: axis.to_string(),
                    context: self.spec.to_string(),
                });
            }
        }
        Ok(())
    }

    /// The number of blocks dimension `dim` is split into (the product of its axes' sizes).
    fn parts(&self, dim: usize) -> Result<usize, ShardingError> {
        self.spec.dim_axes(dim).iter().map(|a| self.mesh.axis_size(a)).product()
    }

    /// The shape of each device's block of an array of `global_shape`. Errors when the spec has
    /// more entries than the rank, names an unknown axis or one twice, or when a dimension is not
    /// divisible by the total size of its axes.
    pub fn shard_shape(&self, global_shape: &[usize]) -> Result<Vec<usize>, ShardingError> {
        self.check_axes()?;
        if self.spec.len() > global_shape.len() {
            return Err(ShardingError::SpecTooLong {
                spec: self.spec.to_string(),
                entries: self.spec.len(),
                rank: global_shape.len(),
                shape: global_shape.to_vec(),
            });
        }
        let mut local = Vec::with_capacity(global_shape.len());
        for (dim, &size) in global_shape.iter().enumerate() {
            let parts = self.parts(dim)?;
            if !size.is_multiple_of(parts) {
                let axes = self.spec.dim_axes(dim);
                let axes = match axes.as_slice() {
                    [one] => format!("mesh axis '{one}'"),
                    many => format!("mesh axes {}", py_axes(many)),
                };
                return Err(ShardingError::NotDivisible {
                    dim,
                    size,
                    axes,
                    axes_size: parts,
                });
            }
            local.push(size / parts);
        }
        Ok(local)
    }

    /// The block of the global array that `device` holds, one index range per dimension: JAX's
    /// `sharding.devices_indices_map(global_shape)[device]` (replicated dimensions give the full range).
    pub fn device_indices(&self, device: usize, global_shape: &[usize]) -> Result<Vec<Range<usize>>, ShardingError> {
        let local = self.shard_shape(global_shape)?;
        let mut ranges = Vec::with_capacity(local.len());
        for (dim, &len) in local.iter().enumerate() {
            let block = self.mesh.axes_index(device, &self.spec.dim_axes(dim))?;
            ranges.push(block * len..(block + 1) * len);
        }
        Ok(ranges)
    }

    /// True when devices that differ only along `axis` hold the same block: no dimension is
    /// sharded over it.
    pub fn is_replicated_along(&self, axis: &str) -> bool {
        !self.spec.uses_axis(axis)
    }

    /// The sharded layout `[device, local...]` of a row-major global array: every device's block,
    /// one after another.
    pub fn shard<T: Copy>(&self, global: &[T], global_shape: &[usize]) -> Result<Vec<T>, ShardingError> {
        check_len("the global array", global.len(), global_shape)?;
        let local = self.shard_shape(global_shape)?;
        let mut out = Vec::with_capacity(self.mesh.devices() * local.iter().product::<usize>());
        for device in 0..self.mesh.devices() {
            let ranges = self.device_indices(device, global_shape)?;
            for_each_index(&local, |idx| {
                let flat = idx
                    .iter()
                    .zip(&ranges)
                    .zip(global_shape)
                    .fold(0, |f, ((i, r), n)| f * n + r.start + i);
                out.push(global[flat]);
            });
        }
        Ok(out)
    }

    /// The global array from its sharded layout `[device, local...]`, each element read from the
    /// lowest-numbered device that holds it (replicas are assumed equal).
    pub fn unshard<T: Copy + Default>(&self, sharded: &[T], global_shape: &[usize]) -> Result<Vec<T>, ShardingError> {
        let local = self.shard_shape(global_shape)?;
        let local_len: usize = local.iter().product();
        let devices = self.mesh.devices();
        if sharded.len() != devices * local_len {
            return Err(ShardingError::Length {
                what: "the sharded array".into(),
                len: sharded.len(),
                expected: devices * local_len,
                why: format!("{devices} devices x a block of {local:?}"),
            });
        }
        let mut global = vec![T::default(); global_shape.iter().product()];
        // Highest device first, so the lowest holder writes last.
        for device in (0..devices).rev() {
            let ranges = self.device_indices(device, global_shape)?;
            let mut e = device * local_len;
            for_each_index(&local, |idx| {
                let flat = idx
                    .iter()
                    .zip(&ranges)
                    .zip(global_shape)
                    .fold(0, |f, ((i, r), n)| f * n + r.start + i);
                global[flat] = sharded[e];
                e += 1;
            });
        }
        Ok(global)
    }
}

/// `NamedSharding(mesh=Mesh('dp': 4), spec=PartitionSpec('dp',))`.
impl fmt::Display for NamedSharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NamedSharding(mesh={}, spec={})", self.mesh, self.spec)
    }
}

fn check_len(what: &str, len: usize, shape: &[usize]) -> Result<(), ShardingError> {
    let expected: usize = shape.iter().product();
    if len != expected {
        return Err(ShardingError::Length {
            what: what.into(),
            len,
            expected,
            why: format!("shape {shape:?}"),
        });
    }
    Ok(())
}

/// Calls `f` with every multi-index over `shape`, row-major (the last axis fastest).
pub(crate) fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0; shape.len()];
    loop {
        f(&idx);
        let mut k = shape.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}
