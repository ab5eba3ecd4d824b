//! Packing: which optimizer updates run as one dispatch. The parameters, gradients and moments of
//! a *group* of updates live in arenas (one buffer per role, laid out alike, each tensor a view
//! at a block boundary), so one launch of `kernels::optimizer` updates them all; an update that
//! cannot join one is a group of its own on its values' usual buffers.
//!
//! A group's dispatch runs where its last update is, so a group closes before any other
//! instruction reads what one of its updates wrote. A gradient joins its arena only when the
//! dispatch that writes it reads no other packed gradient (WebGPU forbids one buffer read and
//! written in one dispatch); disjoint written ranges of one arena are fine.
use super::fuse::Fusion;
use crate::ir::{Op, Program, ValueId};
use crate::kernels::optimizer::{Segment, UPDATE_BLOCK};

/// One dispatch's worth of updates.
pub(super) struct UpdateGroup {
    /// The update instructions, in program order; the dispatch is lowered at the last.
    pub instrs: Vec<usize>,
    /// Where each update's tensors are in the arenas (packed), or `[0, n)` of its own buffers.
    pub segments: Vec<Segment>,
    /// Whether the tensors live in arenas of `arena_len` elements.
    pub packed: bool,
    pub arena_len: usize,
}

/// The roles of an update's operands, in its input order: param, grad, m, v (SGD: param, grad).
pub(super) const ROLES: [&str; 4] = ["params", "grads", "m", "v"];

/// The groups of a program and where each packed value goes.
pub(super) struct Packing {
    pub groups: Vec<UpdateGroup>,
    /// Per value placed in an arena: (group, role, start element).
    pub placed: Vec<Option<(usize, usize, usize)>>,
}

/// The value whose buffer `v` shares (reshape and pcast alias their operand).
fn root(program: &Program, producer: &[Option<usize>], mut v: ValueId) -> ValueId {
    while let Some(i) = producer[v.index()] {
        match program.instrs[i].op {
            Op::Reshape { .. } | Op::Pcast { .. } => v = program.instrs[i].inputs[0],
            _ => break,
        }
    }
    v
}

fn is_update(op: &Op) -> bool {
    matches!(op, Op::SgdUpdate { .. } | Op::AdamWUpdate { .. })
}

fn weight_decay(op: &Op) -> f32 {
    match op {
        Op::AdamWUpdate { wd, .. } => *wd,
        _ => 0.0,
    }
}

/// Plans the groups of `program`'s updates; an arena holds at most `max_arena` elements.
pub(super) fn plan(program: &Program, fusion: &[Option<Fusion>], max_arena: usize) -> Packing {
    let devices = program.devices();
    let numel = |v: ValueId| devices * program.info(v).numel();
    let mut producer = vec![None; program.values.len()];
    for (i, ins) in program.instrs.iter().enumerate() {
        for o in &ins.outputs {
            producer[o.index()] = Some(i);
        }
    }
    let is_input = {
        let mut s = vec![false; program.values.len()];
        for (v, _) in &program.inputs {
            s[v.index()] = true;
        }
        s
    };
    // Candidates: updates whose param and moments are distinct program inputs and whose
    // gradient is computed by the program, into a buffer of its own.
    let mut claimed = vec![0usize; program.values.len()];
    let mut candidate = vec![false; program.instrs.len()];
    for (i, ins) in program.instrs.iter().enumerate() {
        if !is_update(&ins.op) {
            continue;
        }
        let g = root(program, &producer, ins.inputs[1]);
        let state_ok = ins
            .inputs
            .iter()
            .enumerate()
            .all(|(k, v)| k == 1 || is_input[v.index()]);
        if state_ok && !is_input[g.index()] && numel(g) <= max_arena {
            candidate[i] = true;
            for (k, v) in ins.inputs.iter().enumerate() {
                claimed[if k == 1 { g } else { *v }.index()] += 1;
            }
        }
    }
    let grad_of = |i: usize| root(program, &producer, program.instrs[i].inputs[1]);
    // The instructions one dispatch binds together: a fused pair's two.
    let pair_of = |j: usize| {
        if j > 0 && fusion[j - 1].is_some() {
            j - 1..j + 1
        } else if fusion[j].is_some() {
            j..j + 2
        } else {
            j..j + 1
        }
    };
    let packed_grads: Vec<bool> = {
        let mut g = vec![false; program.values.len()];
        for i in (0..program.instrs.len()).filter(|&i| candidate[i]) {
            g[grad_of(i).index()] = true;
        }
        g
    };
    for (i, c) in candidate.iter_mut().enumerate() {
        if !*c {
            continue;
        }
        let ins = &program.instrs[i];
        let g = grad_of(i);
        let shared = ins.inputs.iter().enumerate().any(|(k, v)| {
            let v = if k == 1 { g } else { *v };
            claimed[v.index()] > 1
        });
        let j = producer[g.index()].expect("a computed gradient has a producer");
        let reads_packed = pair_of(j)
            .flat_map(|j| &program.instrs[j].inputs)
            .any(|v| packed_grads[root(program, &producer, *v).index()]);
        if shared || reads_packed {
            *c = false;
        }
    }

    let mut groups: Vec<UpdateGroup> = vec![];
    let mut placed = vec![None; program.values.len()];
    // The open group: its index and the values its updates wrote.
    let mut open: Option<(usize, Vec<ValueId>)> = None;
    for (i, ins) in program.instrs.iter().enumerate() {
        let reads_written = open
            .as_ref()
            .is_some_and(|(_, w)| ins.inputs.iter().any(|v| w.contains(v)));
        if reads_written {
            open = None;
        }
        if !is_update(&ins.op) {
            continue;
        }
        let n = numel(ins.inputs[0]);
        let wd = weight_decay(&ins.op);
        if !candidate[i] {
            groups.push(UpdateGroup {
                instrs: vec![i],
                segments: vec![Segment {
                    start: 0,
                    len: n,
                    weight_decay: wd,
                }],
                packed: false,
                arena_len: 0,
            });
            continue;
        }
        let fits = |g: &UpdateGroup| {
            let same_kind = std::mem::discriminant(&program.instrs[g.instrs[0]].op) == std::mem::discriminant(&ins.op);
            same_kind && g.arena_len.next_multiple_of(UPDATE_BLOCK) + n <= max_arena
        };
        if open.as_ref().is_some_and(|(g, _)| !fits(&groups[*g])) {
            open = None;
        }
        let (g, written) = open.get_or_insert_with(|| {
            groups.push(UpdateGroup {
                instrs: vec![],
                segments: vec![],
                packed: true,
                arena_len: 0,
            });
            (groups.len() - 1, vec![])
        });
        let group = &mut groups[*g];
        let start = group.arena_len.next_multiple_of(UPDATE_BLOCK);
        group.instrs.push(i);
        group.segments.push(Segment {
            start,
            len: n,
            weight_decay: wd,
        });
        group.arena_len = start + n;
        let grad = grad_of(i);
        for (role, v) in ins.inputs.iter().enumerate() {
            let v = if role == 1 { grad } else { *v };
            placed[v.index()] = Some((*g, role, start));
        }
        written.extend(&ins.outputs);
    }
    Packing { groups, placed }
}
