//! Varying manual axes (JAX's `vma`, checked by shard_map's `check_vma`): for every value of
//! a per-device program, the mesh axes along which it may differ between devices. It lives
//! beside the values it describes, as JAX keeps vma in its core types.
use std::collections::BTreeSet;

use super::{Op, Program};

/// The varying axes of every value: inputs vary along the axes of their in_spec; collectives
/// remove (psum, per operand; all_gather) or add (psum_scatter, all_to_all, pvary, axis_index) axes;
/// every other op varies along the union of its operands' axes.
pub fn varying_axes(prog: &Program) -> Vec<BTreeSet<String>> {
    let mut vma: Vec<BTreeSet<String>> = vec![BTreeSet::new(); prog.values.len()];
    for (pos, (v, _)) in prog.inputs.iter().enumerate() {
        if let Some(spec) = prog.in_specs.get(pos) {
            vma[v.index()] = spec.mesh_axes().into_iter().map(String::from).collect();
        }
    }
    for ins in &prog.instrs {
        // A combined psum reduces each operand alone: output k varies as operand k, less `axes`.
        if let Op::Psum { axes, .. } = &ins.op {
            for (x, o) in ins.inputs.iter().zip(&ins.outputs) {
                vma[o.index()] = vma[x.index()].iter().filter(|a| !axes.contains(a)).cloned().collect();
            }
            continue;
        }
        let mut axes: BTreeSet<String> = ins.inputs.iter().flat_map(|v| vma[v.index()].iter().cloned()).collect();
        match &ins.op {
            Op::AllGather { axes: a, .. } => {
                for x in a {
                    axes.remove(x);
                }
            }
            Op::PsumScatter { axes: a, .. }
            | Op::AllToAll { axes: a, .. }
            | Op::Pvary { axes: a }
            | Op::FoldInAxisIndex { axes: a } => axes.extend(a.iter().cloned()),
            Op::Ppermute { axis, .. } => {
                axes.insert(axis.clone());
            }
            Op::ShardSlice { axes: a, .. } => axes.extend(a.iter().cloned()),
            Op::RandomBitsBlock { spec, .. } => axes.extend(spec.mesh_axes().into_iter().map(String::from)),
            _ => {}
        }
        for o in &ins.outputs {
            vma[o.index()] = axes.clone();
        }
    }
    vma
}
