//! shard_map's `check_vma`: every collective accepts its operand's varying axes
//! ([`crate::ir::check_vma`]), and no out_spec claims replication along an axis its value
//! varies over.
use super::PartitionError;
use crate::ir::{check_vma, Program};

/// shard_map's `check_vma`: JAX's rules for each op, then every output must vary only along
/// axes its out_spec names.
pub fn check_out_specs(prog: &Program) -> Result<(), PartitionError> {
    let name = |v: crate::ir::ValueId| prog.info(v).name.clone().unwrap_or_else(|| v.to_string());
    let vma = check_vma(prog).map_err(|r| PartitionError::VmaOp {
        instr: r.instr,
        op: r.op.to_string(),
        value: prog.instrs[r.instr]
            .inputs
            .first()
            .map(|&v| name(v))
            .unwrap_or_default(),
        why: r.why,
    })?;
    for (k, v) in prog.outputs.iter().enumerate() {
        let Some(spec) = prog.out_specs.get(k) else { continue };
        let allowed = spec.mesh_axes();
        if let Some(axis) = vma[v.index()].iter().find(|a| !allowed.contains(&a.as_str())) {
            return Err(PartitionError::Vma {
                output: k,
                value: name(*v),
                axis: axis.clone(),
                spec: spec.to_string(),
            });
        }
    }
    Ok(())
}
