//! Varying manual axes (JAX's `vma`, checked by shard_map's `check_vma`): for every value of
//! a per-device program, the mesh axes along which it may differ between devices. It lives
//! beside the values it describes, as JAX keeps vma in its core types.
//!
//! The rules are JAX 0.10's, each checked against JAX itself (tests/tests/all/vma_jax.rs):
//! - psum / pmean over `axes` make the result invariant along them. Each operand must vary
//!   along all of them or along none (JAX refuses a mix);
//! - all_gather, psum_scatter, all_to_all and ppermute leave the result varying along their
//!   axes, even from an invariant operand (JAX casts it to varying first). An all_gather's
//!   result is the same on every device, but JAX's type does not say so;
//! - axis_index varies along its axes, and so do the keys folded with it;
//! - pcast(to="varying") adds its axes, and is refused on a value already varying along one;
//! - every other op varies along the union of its operands' axes;
//! - in a pipelined program, a value some stages make (zero on the others, the result of a
//!   `lax.cond` on the stage's axis index) varies along the stage axis.
use std::collections::BTreeSet;

use super::{Op, Program};

/// The axes one value varies along.
pub type Axes = BTreeSet<String>;

/// An op JAX's check_vma refuses: instruction `instr`, with the reason in JAX's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmaRefusal {
    pub instr: usize,
    pub op: &'static str,
    pub why: String,
}

/// The varying axes of every value, or the first op JAX would refuse.
pub fn check_vma(prog: &Program) -> Result<Vec<Axes>, VmaRefusal> {
    walk(prog, true)
}

/// The varying axes of every value. A body JAX would refuse still gets its axes (the op's
/// refusal is [`check_vma`]'s to report), so a printed program always shows them.
pub fn varying_axes(prog: &Program) -> Vec<Axes> {
    walk(prog, false).unwrap_or_default()
}

fn walk(prog: &Program, strict: bool) -> Result<Vec<Axes>, VmaRefusal> {
    let mut vma: Vec<Axes> = vec![Axes::new(); prog.values.len()];
    for (pos, (v, _)) in prog.inputs.iter().enumerate() {
        if let Some(spec) = prog.in_specs.get(pos) {
            vma[v.index()] = spec.mesh_axes().into_iter().map(String::from).collect();
        }
    }
    for (at, ins) in prog.instrs.iter().enumerate() {
        let refuse = |why: String| VmaRefusal {
            instr: at,
            op: ins.op.name(),
            why,
        };
        // A combined psum reduces each operand alone: output k varies as operand k, less `axes`.
        if let Op::Psum { axes, .. } = &ins.op {
            for (x, o) in ins.inputs.iter().zip(&ins.outputs) {
                let (varying, invariant): (Vec<&String>, Vec<&String>) =
                    axes.iter().partition(|a| vma[x.index()].contains(*a));
                if strict && !varying.is_empty() && !invariant.is_empty() {
                    return Err(refuse(format!(
                        "its operand varies along {varying:?} but not along {invariant:?}; psum over \
                         axes it varies along, or pcast it to varying along {invariant:?} first"
                    )));
                }
                vma[o.index()] = vma[x.index()].iter().filter(|a| !axes.contains(a)).cloned().collect();
                staged(prog, *o, &mut vma[o.index()]);
            }
            continue;
        }
        // to="invarying": every device of the group holds the gathered array (as after a psum).
        if let Op::AllGather {
            axes, invarying: true, ..
        } = &ins.op
        {
            let gathered = vma[ins.inputs[0].index()]
                .iter()
                .filter(|a| !axes.contains(a))
                .cloned()
                .collect();
            vma[ins.outputs[0].index()] = gathered;
            staged(prog, ins.outputs[0], &mut vma[ins.outputs[0].index()]);
            continue;
        }
        let mut axes: Axes = ins.inputs.iter().flat_map(|v| vma[v.index()].iter().cloned()).collect();
        match &ins.op {
            Op::Pcast { axes: a } => {
                match a.iter().find(|x| axes.contains(*x)) {
                    Some(already) if strict => {
                        return Err(refuse(format!(
                            "its operand already varies along '{already}' (JAX: unsupported pcast from \
                             varying to varying); drop the pcast"
                        )))
                    }
                    _ => {}
                }
                axes.extend(a.iter().cloned());
            }
            Op::AllGather { axes: a, .. }
            | Op::PsumScatter { axes: a, .. }
            | Op::AllToAll { axes: a, .. }
            | Op::FoldInAxisIndex { axes: a, .. }
            | Op::ShardSlice { axes: a, .. } => axes.extend(a.iter().cloned()),
            Op::Ppermute { axis, .. } => {
                axes.insert(axis.clone());
            }
            Op::RandomBitsBlock { spec, seq, .. } => {
                axes.extend(spec.mesh_axes().into_iter().map(String::from));
                axes.extend(seq.axes());
            }
            // A block of the sequence is picked by the device's index: it varies along those axes.
            Op::Attention { seq, .. } | Op::AttentionGrad { seq, .. } => axes.extend(seq.axes()),
            Op::SeqTake { seq, .. } | Op::SeqPut { seq, .. } => axes.extend(seq.axes().iter().cloned()),
            _ => {}
        }
        for o in &ins.outputs {
            vma[o.index()] = axes.clone();
            staged(prog, *o, &mut vma[o.index()]);
        }
    }
    Ok(vma)
}

/// A value only some pipeline stages make varies along the stage axis.
fn staged(prog: &Program, v: super::ValueId, axes: &mut Axes) {
    if let Some(st) = &prog.stages {
        if st.owner(v) != super::Owner::Every {
            axes.insert(st.axis.clone());
        }
    }
}
