//! A typed program to one per-device program: jit with every value laid out as its type says
//! (as JAX lowers explicit mode, a sharding on every op's result), its Auto axes where
//! propagation puts them.
use std::collections::BTreeMap;

use super::annotate::{Annotated, ChoiceKind};
use super::types::{explicit_only, type_text, Dims};
use crate::ir::{Op, Program, ValueId};
use crate::partition::auto::{jit_pinned, propagate, spec_of_dims, AutoProgram, Pin};
use crate::partition::PartitionError;
use crate::sharding::{AxisType, AxisTypes, Mesh, PartitionSpec};

/// jit of `a`'s program on `mesh`, its inputs laid out as `in_shardings` and its outputs as
/// `out_shardings` (their Auto axes included), every other value pinned to its type. A value
/// whose every reader only moves or adds it keeps its partial sums across the pin, so that a
/// contraction's all-reduce lands where its sum is read (a gradient resharded after its
/// `out_sharding=` becomes one reduce-scatter; microbatches' gradients one all-reduce).
pub fn lower(
    a: &Annotated,
    mesh: &Mesh,
    axis_types: &AxisTypes,
    in_shardings: &[PartitionSpec],
    out_shardings: &[PartitionSpec],
) -> Result<AutoProgram, PartitionError> {
    let prog = &a.program;
    let auto = auto_axes(prog, mesh, axis_types, in_shardings, out_shardings)?;
    let readers = readers(prog);
    let mut pins = BTreeMap::new();
    for (i, ins) in prog.instrs.iter().enumerate() {
        let chosen = a.choices.iter().find(|c| c.instr == i);
        // The outputs are laid out by out_shardings (the typed program retyped them to those).
        for o in ins.outputs.iter().filter(|o| !prog.outputs.contains(o)) {
            let mut dims = a.types[o.index()].clone();
            if let Some(auto) = &auto {
                merge_auto(mesh, prog.shape(*o), &mut dims, &auto[o.index()], axis_types);
            }
            let ty = type_text(prog.info(*o).dtype, prog.shape(*o), &a.types[o.index()]);
            let why = match chosen {
                Some(c) if c.kind == ChoiceKind::OutSharding => format!("out_sharding={} ({ty})", c.spec),
                Some(c) => format!("reshard to {} ({ty})", c.spec),
                None => format!("its type {ty}"),
            };
            let keep_partial = readers[o.index()]
                .iter()
                .all(|&r| carries_partial(prog, &prog.instrs[r], *o));
            pins.insert(
                *o,
                Pin {
                    spec: spec_of_dims(&dims),
                    keep_partial,
                    source_op: ins.op.name().to_string(),
                    why,
                },
            );
        }
    }
    let outs: Vec<Option<PartitionSpec>> = out_shardings.iter().cloned().map(Some).collect();
    let mut spmd = jit_pinned(prog, mesh, in_shardings, &outs, &pins)?;
    attribute_reductions(prog, &mut spmd);
    Ok(spmd)
}

/// A partial sum carried through transposes, reshapes, scales and adds is reduced where it is
/// read, but made by the contraction before them: the reduction is said at that line.
fn attribute_reductions(prog: &Program, spmd: &mut AutoProgram) {
    let producers = prog.producers();
    for r in spmd
        .inserted
        .iter_mut()
        .filter(|r| r.op == "psum" || r.op == "psum_scatter")
    {
        let Some(mut i) = r.source_instr else { continue };
        while matches!(
            prog.instrs[i].op,
            Op::Transpose { .. } | Op::Reshape { .. } | Op::Scale { .. } | Op::Add
        ) {
            match producers[prog.instrs[i].inputs[0].index()] {
                Some(p) => i = p,
                None => break,
            }
        }
        if Some(i) != r.source_instr {
            r.source_instr = Some(i);
            r.source_op = prog.instrs[i].op.name().to_string();
        }
    }
}

/// Whether `reader` passes a partial sum in `v` on (sums are linear): it moves it (reshard,
/// transpose, reshape, split, concatenate), scales it, or adds it to another array of its shape.
fn carries_partial(prog: &Program, reader: &crate::ir::Instr, v: ValueId) -> bool {
    match reader.op {
        // Splitting and concatenating move elements, so a sum commutes with them (zig-zag's
        // chunks of K's and V's cotangents stay partial until the reduce-scatter).
        Op::Reshard { .. }
        | Op::Transpose { .. }
        | Op::Reshape { .. }
        | Op::Scale { .. }
        | Op::Split { .. }
        | Op::Concat { .. } => true,
        Op::Add => reader.inputs.iter().all(|x| prog.shape(*x) == prog.shape(v)),
        _ => false,
    }
}

fn readers(prog: &Program) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]; prog.values.len()];
    for (i, ins) in prog.instrs.iter().enumerate() {
        for v in &ins.inputs {
            out[v.index()].push(i);
        }
    }
    out
}

/// On a mesh with Auto axes, where jit's propagation lays every value out (from the inputs and
/// outputs alone): the Auto axes of each value's layout come from it. None without Auto axes.
fn auto_axes(
    prog: &Program,
    mesh: &Mesh,
    axis_types: &AxisTypes,
    in_shardings: &[PartitionSpec],
    out_shardings: &[PartitionSpec],
) -> Result<Option<Vec<Dims>>, PartitionError> {
    if axis_types.with_type(AxisType::Auto).is_empty() {
        return Ok(None);
    }
    let mut fixed = BTreeMap::new();
    for ((v, _), s) in prog.inputs.iter().zip(in_shardings) {
        fixed.insert(*v, s.clone());
    }
    for (v, s) in prog.outputs.iter().zip(out_shardings) {
        fixed.insert(*v, s.clone());
    }
    Ok(Some(propagate(prog, mesh, &fixed)?.shardings))
}

/// `dims` (a type: Explicit axes) with the Auto axes of `propagated` added after them, on each
/// dimension where the axis is free and still divides it.
fn merge_auto(mesh: &Mesh, shape: &[usize], dims: &mut Dims, propagated: &Dims, types: &AxisTypes) {
    let explicit = explicit_only(propagated, types);
    for (d, axes) in propagated.iter().enumerate() {
        for a in axes.iter().filter(|a| !explicit[d].contains(a)) {
            let used = dims.iter().flatten().any(|x| x == a);
            let split: usize = dims[d]
                .iter()
                .chain([a])
                .map(|x| mesh.size_of(x).unwrap_or(1))
                .product();
            if !used && shape[d].is_multiple_of(split) {
                dims[d].push(a.clone());
            }
        }
    }
}
