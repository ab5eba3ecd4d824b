//! Factor assignments: which mesh axes shard each factor of an op's rule, read off the
//! shardings of its tensors and written back onto them.
use super::rules::{FactorKind, OpRule};
use crate::sharding::{Mesh, PartitionSpec};

/// Per dimension, the mesh axes that shard it (major first): a PartitionSpec as a value.
pub type Dims = Vec<Vec<String>>;

/// A value's layout in the SPMD program: per-dim axes, and the axes over which devices hold
/// partial sums still to be added up (after a contraction over a sharded dimension).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Sharding {
    pub dims: Dims,
    pub partial: Vec<String>,
}

impl Sharding {
    pub fn replicated(rank: usize) -> Self {
        Self {
            dims: vec![vec![]; rank],
            partial: vec![],
        }
    }

    pub fn of_spec(spec: &PartitionSpec, rank: usize) -> Self {
        Self {
            dims: dims_of_spec(spec, rank),
            partial: vec![],
        }
    }

    /// As jax.debug.inspect_array_sharding shows it, plus `partial-sum over (...)`.
    pub fn text(&self) -> String {
        let mut s = spec_of_dims(&self.dims).to_string();
        if !self.partial.is_empty() {
            s += &format!(" partial-sum over ({})", self.partial.join(","));
        }
        s
    }
}

/// The spec's entries padded with `None` to `rank`.
pub fn dims_of_spec(spec: &PartitionSpec, rank: usize) -> Dims {
    (0..rank)
        .map(|d| spec.dim_axes(d).iter().map(|a| a.to_string()).collect())
        .collect()
}

/// The shortest PartitionSpec for `dims` (trailing `None`s dropped, as JAX prints).
pub fn spec_of_dims(dims: &[Vec<String>]) -> PartitionSpec {
    let mut entries = dims.to_vec();
    while entries.last().is_some_and(|e| e.is_empty()) {
        entries.pop();
    }
    PartitionSpec::new(entries)
}

/// The axes of every factor of one op.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    pub axes: Vec<Vec<String>>,
}

fn leading(dim: &[usize], rule: &OpRule) -> Option<usize> {
    dim.iter().copied().find(|&f| rule.sizes[f] > 1)
}

impl Assignment {
    pub fn empty(rule: &OpRule) -> Self {
        Self {
            axes: vec![vec![]; rule.sizes.len()],
        }
    }

    fn used(&self, axis: &str) -> bool {
        self.axes.iter().flatten().any(|a| a == axis)
    }

    /// Takes the sharding of a tensor whose dims are `factors`: each sharded dim shards its
    /// leading factor, unless that factor is already assigned (the first tensor wins), one of
    /// its axes is taken, or the factor's size is not a multiple of the axes' size.
    pub fn absorb(&mut self, rule: &OpRule, mesh: &Mesh, factors: &[Vec<usize>], dims: &[Vec<String>]) {
        for (d, axes) in dims.iter().enumerate() {
            if axes.is_empty() {
                continue;
            }
            let Some(f) = factors.get(d).and_then(|fs| leading(fs, rule)) else {
                continue;
            };
            if !self.axes[f].is_empty() || axes.iter().any(|a| self.used(a)) {
                continue;
            }
            let parts: usize = axes.iter().map(|a| mesh.size_of(a).unwrap_or(1)).product();
            if rule.kinds[f] == FactorKind::Pass && rule.sizes[f].is_multiple_of(parts) {
                self.axes[f] = axes.clone();
            }
        }
    }

    /// Drops what the op cannot honour: factors that need replication, and factors that are
    /// not the leading one of some dim that has them (that dim could not express the split).
    pub fn legalize(&mut self, rule: &OpRule) {
        for t in rule.tensors() {
            for dim in t {
                let lead = leading(dim, rule);
                for &f in dim {
                    if Some(f) != lead {
                        self.axes[f].clear();
                    }
                }
            }
        }
        for (f, kind) in rule.kinds.iter().enumerate() {
            if *kind == FactorKind::NeedReplication {
                self.axes[f].clear();
            }
        }
    }

    /// The dims of a tensor with `factors` under this (legal) assignment.
    pub fn project(&self, rule: &OpRule, factors: &[Vec<usize>]) -> Dims {
        factors
            .iter()
            .map(|dim| leading(dim, rule).map(|f| self.axes[f].clone()).unwrap_or_default())
            .collect()
    }

    /// Result `r`'s sharding: its dims, and partial sums over the axes of factors the operands
    /// have and it lacks (those the op sums over).
    pub fn result(&self, rule: &OpRule, r: usize) -> Sharding {
        let mut partial = vec![];
        for (f, axes) in self.axes.iter().enumerate() {
            if !axes.is_empty() && rule.in_operands(f) && !rule.in_result(r, f) {
                partial.extend(axes.iter().cloned());
            }
        }
        Sharding {
            dims: self.project(rule, &rule.results[r]),
            partial,
        }
    }
}
