//! shard_map's `check_vma`: an out_spec may not claim replication along an axis its value
//! varies over ([`crate::ir::varying_axes`]).
use super::PartitionError;
use crate::ir::{varying_axes, Program};

/// shard_map's `check_vma`: every output must vary only along axes its out_spec names.
pub fn check_out_specs(prog: &Program) -> Result<(), PartitionError> {
    let vma = varying_axes(prog);
    for (k, v) in prog.outputs.iter().enumerate() {
        let Some(spec) = prog.out_specs.get(k) else { continue };
        let allowed = spec.mesh_axes();
        if let Some(axis) = vma[v.index()].iter().find(|a| !allowed.contains(&a.as_str())) {
            return Err(PartitionError::Vma {
                output: k,
                value: prog.info(*v).name.clone().unwrap_or_else(|| v.to_string()),
                axis: axis.clone(),
                spec: spec.to_string(),
            });
        }
    }
    Ok(())
}
