//! The all-reduce combiner (XLA's AllReduceCombiner): independent psums over the same axes
//! become one psum with several operands, so a step pays the all-reduce latency once
//! instead of once per gradient.
use std::collections::BTreeSet;

use super::auto::AutoProgram;
use crate::ir::{Instr, Op, Program, ValueId};

/// psums over one set of axes whose operands are all computed, waiting to be combined.
struct Group {
    id: usize,
    axes: Vec<String>,
    group: usize,
    inputs: Vec<ValueId>,
    outputs: Vec<ValueId>,
    /// Old instruction indices merged into it.
    from: Vec<usize>,
}

/// The scan's state: the new instruction list, pending groups, and the instructions held
/// back because they read (maybe through other held ones) a pending group's results.
struct Scan {
    instrs: Vec<Instr>,
    position: Vec<usize>,
    groups: Vec<Group>,
    next_id: usize,
    /// (old index, the pending groups it depends on), in program order.
    held: Vec<(usize, BTreeSet<usize>)>,
    /// Per value: the pending groups it depends on (empty: computable now).
    waits: Vec<BTreeSet<usize>>,
}

impl Scan {
    /// Emits the pending groups in `ids`, then every held instruction that waited only on
    /// them (in order: what a held instruction reads was held before it, on fewer groups).
    fn flush(&mut self, prog: &Program, ids: &BTreeSet<usize>) {
        let (done, keep): (Vec<Group>, Vec<Group>) = std::mem::take(&mut self.groups)
            .into_iter()
            .partition(|g| ids.contains(&g.id));
        self.groups = keep;
        for g in done {
            for i in g.from {
                self.position[i] = self.instrs.len();
            }
            self.instrs.push(Instr {
                op: Op::Psum {
                    axes: g.axes,
                    group: g.group,
                },
                inputs: g.inputs,
                outputs: g.outputs,
            });
        }
        for w in self.waits.iter_mut().filter(|w| !w.is_empty()) {
            w.retain(|id| !ids.contains(id));
        }
        let mut still = vec![];
        for (i, mut on) in std::mem::take(&mut self.held) {
            on.retain(|id| !ids.contains(id));
            if on.is_empty() {
                self.position[i] = self.instrs.len();
                self.instrs.push(prog.instrs[i].clone());
            } else {
                still.push((i, on));
            }
        }
        self.held = still;
    }
}

/// [`combine_all_reduces`] with, for every old instruction, its index in the new program (a
/// psum maps to the combined psum that carries it).
pub fn combine_all_reduces_mapped(prog: &Program) -> (Program, Vec<usize>) {
    let mut s = Scan {
        instrs: Vec::with_capacity(prog.instrs.len()),
        position: vec![0; prog.instrs.len()],
        groups: vec![],
        next_id: 0,
        held: vec![],
        waits: vec![BTreeSet::new(); prog.values.len()],
    };
    for (i, ins) in prog.instrs.iter().enumerate() {
        let mut on: BTreeSet<usize> = ins
            .inputs
            .iter()
            .flat_map(|v| s.waits[v.index()].iter().copied())
            .collect();
        let Op::Psum { axes, group } = &ins.op else {
            if on.is_empty() {
                s.position[i] = s.instrs.len();
                s.instrs.push(ins.clone());
            } else {
                for o in &ins.outputs {
                    s.waits[o.index()] = on.clone();
                }
                s.held.push((i, on));
            }
            continue;
        };
        // A psum reading pending results needs those groups (and what was held on them) first.
        if !on.is_empty() {
            s.flush(prog, &on);
            on.clear();
        }
        let at = match s.groups.iter().position(|g| g.axes == *axes) {
            Some(at) => at,
            None => {
                s.next_id += 1;
                s.groups.push(Group {
                    id: s.next_id,
                    axes: axes.clone(),
                    group: *group,
                    inputs: vec![],
                    outputs: vec![],
                    from: vec![],
                });
                s.groups.len() - 1
            }
        };
        let g = &mut s.groups[at];
        g.inputs.extend(&ins.inputs);
        g.outputs.extend(&ins.outputs);
        g.from.push(i);
        let id = g.id;
        for o in &ins.outputs {
            s.waits[o.index()] = BTreeSet::from([id]);
        }
    }
    let all: BTreeSet<usize> = s.groups.iter().map(|g| g.id).collect();
    s.flush(prog, &all);
    debug_assert!(s.held.is_empty());
    let mut out = prog.clone();
    out.instrs = s.instrs;
    let mut recomputed: Vec<usize> = prog.recomputed.iter().map(|&i| s.position[i]).collect();
    recomputed.sort_unstable();
    recomputed.dedup();
    out.recomputed = recomputed;
    (out, s.position)
}

/// Merges independent all-reduces, as XLA's AllReduceCombiner: scanning in order, a psum
/// whose operands are computed joins the pending group of its axes; instructions that read a
/// pending result are held back (after it) rather than ending the group; a psum that reads
/// one emits the groups it needs, then what was held on them, and starts a new group. The
/// rest is emitted at the end. Values, names, inputs, outputs and donations are unchanged:
/// only the instruction list is reordered and psums merged.
pub fn combine_all_reduces(prog: &Program) -> Program {
    combine_all_reduces_mapped(prog).0
}

/// Where each old index starts in the new program: the first new instruction that comes
/// from an old one at or after it (phase boundaries of a train step). `position` is
/// [`combine_all_reduces_mapped`]'s map; the result has one more entry, for the old end.
pub fn combined_starts(position: &[usize], new_len: usize) -> Vec<usize> {
    let mut out = vec![new_len; position.len() + 1];
    for i in (0..position.len()).rev() {
        out[i] = out[i + 1].min(position[i]);
    }
    out
}

/// jit's result with its all-reduces combined: inserted-op records point at the combined
/// psum, and `instr_starts` at the new instruction indices.
pub fn combine_auto_program(auto: &AutoProgram) -> AutoProgram {
    let (program, position) = combine_all_reduces_mapped(&auto.program);
    let at = combined_starts(&position, program.instrs.len());
    let mut inserted = auto.inserted.clone();
    for r in &mut inserted {
        r.instr = position.get(r.instr).copied().unwrap_or(r.instr);
    }
    AutoProgram {
        instr_starts: auto.instr_starts.iter().map(|&s| at[s.min(position.len())]).collect(),
        program,
        inserted,
        global_shardings: auto.global_shardings.clone(),
    }
}
