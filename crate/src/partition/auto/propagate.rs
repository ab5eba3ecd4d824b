//! Sharding propagation over a global program (GSPMD's pass): every value gets per-dim mesh
//! axes, moved through each op by its factor rule ([`super::rules`]).
//!
//! Conflict priority, highest first:
//! 1. fixed shardings never change: jit's `in_shardings`, the `out_shardings` given (not
//!    `None`), and `with_sharding_constraint` pins;
//! 2. a value keeps the first sharding it gets: sweeps alternate forward (results from their
//!    operands) and backward (operands from their results and sibling operands), and each only
//!    fills values still unknown;
//! 3. within one op the tensors are read in order (forward: operands then results; backward:
//!    results then operands); a factor keeps the axes of the first tensor that shards it, and a
//!    mesh axis goes to one factor only.
//!
//! Strict sweeps (a value is set only when every factor of it is seen on a known tensor of
//! the op) run to a fixpoint first, so e.g. random bits take the sharding of the dropout that
//! reads them rather than the replication of their key; then relaxed sweeps fill the rest;
//! whatever is still unknown (values no known tensor reaches) is replicated.
use std::collections::BTreeMap;

use super::assign::{dims_of_spec, Assignment, Dims};
use super::rules::{rule_of, FactorKind, OpRule};
use crate::ir::{Program, ValueId};
use crate::sharding::{Mesh, PartitionSpec};

use super::super::PartitionError;

/// The propagated sharding of every value (indexed by ValueId) and the rules of every op.
pub struct Propagation {
    pub shardings: Vec<Dims>,
    pub rules: Vec<OpRule>,
}

/// Runs propagation. `fixed` holds the pinned values (inputs, outputs, constraints).
pub fn propagate(
    prog: &Program,
    mesh: &Mesh,
    fixed: &BTreeMap<ValueId, PartitionSpec>,
) -> Result<Propagation, PartitionError> {
    let rules = (0..prog.instrs.len())
        .map(|i| rule_of(prog, i))
        .collect::<Result<Vec<_>, _>>()?;
    let mut known: Vec<Option<Dims>> = vec![None; prog.values.len()];
    for (v, spec) in fixed {
        known[v.index()] = Some(dims_of_spec(spec, prog.shape(*v).len()));
    }
    for strict in [true, false] {
        loop {
            let mut changed = false;
            // One rule per instruction, in program order.
            for (i, rule) in rules.iter().enumerate() {
                changed |= sweep_one(prog, mesh, rule, i, &mut known, true, strict);
            }
            for i in (0..prog.instrs.len()).rev() {
                changed |= sweep_one(prog, mesh, &rules[i], i, &mut known, false, strict);
            }
            if !changed {
                break;
            }
        }
    }
    let shardings = known
        .into_iter()
        .enumerate()
        .map(|(v, k)| k.unwrap_or_else(|| vec![vec![]; prog.values[v].shape.len()]))
        .collect();
    Ok(Propagation { shardings, rules })
}

/// The factor assignment of instruction `i` from the known shardings of its tensors, in the
/// priority order of the direction; legalized.
pub fn assignment(
    prog: &Program,
    mesh: &Mesh,
    rule: &OpRule,
    i: usize,
    known: &[Option<Dims>],
    forward: bool,
) -> Assignment {
    let ins = &prog.instrs[i];
    let operands = ins.inputs.iter().zip(&rule.operands);
    let results = ins.outputs.iter().zip(&rule.results);
    let order: Vec<(&ValueId, &Vec<Vec<usize>>)> = if forward {
        operands.chain(results).collect()
    } else {
        results.chain(operands).collect()
    };
    let mut a = Assignment::empty(rule);
    for (v, factors) in order {
        if let Some(dims) = &known[v.index()] {
            a.absorb(rule, mesh, factors, dims);
        }
    }
    a.legalize(rule);
    a
}

/// One op in one direction: fills its unknown results (forward) or operands (backward).
fn sweep_one(
    prog: &Program,
    mesh: &Mesh,
    rule: &OpRule,
    i: usize,
    known: &mut [Option<Dims>],
    forward: bool,
    strict: bool,
) -> bool {
    let ins = &prog.instrs[i];
    let all: Vec<(ValueId, &Vec<Vec<usize>>)> = ins
        .inputs
        .iter()
        .copied()
        .zip(&rule.operands)
        .chain(ins.outputs.iter().copied().zip(&rule.results))
        .collect();
    if all.iter().all(|(v, _)| known[v.index()].is_none()) {
        return false;
    }
    // Factors some known tensor of the op has.
    let mut seen = vec![false; rule.sizes.len()];
    for (v, factors) in &all {
        if known[v.index()].is_some() {
            factors.iter().flatten().for_each(|&f| seen[f] = true);
        }
    }
    let a = assignment(prog, mesh, rule, i, known, forward);
    let targets: Vec<(ValueId, &Vec<Vec<usize>>)> = if forward {
        ins.outputs.iter().copied().zip(&rule.results).collect()
    } else {
        ins.inputs.iter().copied().zip(&rule.operands).collect()
    };
    let mut changed = false;
    for (v, factors) in targets {
        if known[v.index()].is_some() {
            continue;
        }
        let covered = factors
            .iter()
            .flatten()
            .all(|&f| seen[f] || rule.sizes[f] == 1 || rule.kinds[f] == FactorKind::NeedReplication);
        if strict && !covered {
            continue;
        }
        known[v.index()] = Some(a.project(rule, factors));
        changed = true;
    }
    changed
}
