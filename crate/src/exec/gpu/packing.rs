//! Packing: which optimizer updates run as one dispatch. The parameters, gradients and moments of
//! a *group* of updates live in arenas (one buffer per role, laid out alike, each tensor a view
//! at a block boundary), so one launch of `kernels::optimizer` updates them all; an update that
//! cannot join one is a group of its own on its values' usual buffers.
//!
//! A group's dispatch runs where its last update is, so a group closes before any other
//! instruction reads what one of its updates wrote. A gradient joins its arena only when the
//! dispatch that writes it reads no other packed gradient (WebGPU forbids one buffer read and
//! written in one dispatch); disjoint written ranges of one arena are fine.
//!
//! The psums that make packed gradients (data parallelism's all-reduce of every gradient) run
//! in place: each operand is written where its sum goes, in the gradient arena, and a run of
//! consecutive psums over the same axes is one launch of `collectives::psum_packed` over those
//! ranges. The program keeps every psum; only its lowering changes.
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
/// The role of the gradients.
pub(super) const GRADS: usize = 1;

/// Consecutive psums whose operands are summed in place in one gradient arena: one dispatch,
/// lowered at the last of them.
pub(super) struct PsumRun {
    /// The psum instructions, in program order.
    pub instrs: Vec<usize>,
    /// The update group whose gradient arena holds the arrays.
    pub group: usize,
    /// Each operand summed in place: (its first element in the arena, elements per device).
    pub arrays: Vec<(usize, usize)>,
}

/// The groups of a program and where each packed value goes.
pub(super) struct Packing {
    pub groups: Vec<UpdateGroup>,
    /// Per value placed in an arena: (group, role, start element).
    pub placed: Vec<Option<(usize, usize, usize)>>,
    pub psum_runs: Vec<PsumRun>,
    /// Per value: a psum operand summed in place by its run (its psum launches nothing for it).
    pub in_place: Vec<bool>,
}

impl Packing {
    /// The run whose dispatch instruction `i` lowers (it is the run's last psum).
    pub fn run_ending_at(&self, i: usize) -> Option<&PsumRun> {
        self.psum_runs.iter().find(|r| r.instrs.last() == Some(&i))
    }

    /// The dispatches of psum instruction `i`: one per operand not summed in place, and its
    /// run's, if it ends one.
    pub fn psum_dispatches(&self, program: &Program, i: usize) -> usize {
        let ins = &program.instrs[i];
        let alone = ins.inputs.iter().filter(|v| !self.in_place[v.index()]).count();
        alone + usize::from(self.run_ending_at(i).is_some())
    }
}

/// The value whose buffer `v` shares (reshape and pcast alias their operand).
pub(super) fn root(program: &Program, producer: &[Option<usize>], mut v: ValueId) -> ValueId {
    while let Some(i) = producer[v.index()] {
        match program.instrs[i].op {
            Op::Reshape { .. } | Op::Pcast { .. } | Op::Reshard { .. } => v = program.instrs[i].inputs[0],
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
    let producer = program.producers();
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
    let mut in_place = vec![false; program.values.len()];
    let psum_runs = plan_psums(
        program,
        &Graph {
            producer: &producer,
            is_input: &is_input,
            pair_of: &pair_of,
        },
        &groups,
        &mut placed,
        &mut in_place,
    );
    Packing {
        groups,
        placed,
        psum_runs,
        in_place,
    }
}

/// What the psum planning reads of the program besides its instructions.
struct Graph<'a> {
    producer: &'a [Option<usize>],
    is_input: &'a [bool],
    /// The instructions one dispatch binds together with instruction j (a fused pair's two).
    pair_of: &'a dyn Fn(usize) -> std::ops::Range<usize>,
}

/// The in-place psum runs: places every psum operand that can be summed in place at its sum's
/// spot in a gradient arena (`placed`, `in_place`) and groups them into runs.
///
/// Operand x of a psum whose result is a packed gradient is summed in place when its buffer
/// holds nothing else anyone reads (the psum is the only reader of x and of what aliases it, and
/// none is a program input or output), and the dispatch that writes x reads nothing in that
/// arena. A run takes consecutive psums over the same axes into one arena, with nothing launched
/// between them (aliases, and packed updates that run at their group's last), until one reads
/// what the run summed.
fn plan_psums(
    program: &Program,
    graph: &Graph<'_>,
    groups: &[UpdateGroup],
    placed: &mut [Option<(usize, usize, usize)>],
    in_place: &mut [bool],
) -> Vec<PsumRun> {
    let roots: Vec<ValueId> = (0..program.values.len())
        .map(|v| root(program, graph.producer, ValueId(v as u32)))
        .collect();
    // Reads of each buffer (by root) by instructions other than the aliasing ones; a program
    // output counts as one more.
    let mut reads = vec![0usize; program.values.len()];
    let aliasing = |op: &Op| matches!(op, Op::Reshape { .. } | Op::Pcast { .. } | Op::Reshard { .. });
    let inputs = program
        .instrs
        .iter()
        .filter(|ins| !aliasing(&ins.op))
        .flat_map(|ins| &ins.inputs);
    for v in inputs.chain(&program.outputs) {
        reads[roots[v.index()].index()] += 1;
    }
    // Where operand k of psum `i` is summed in place: (group, start).
    let spot = |placed: &[Option<(usize, usize, usize)>], i: usize, k: usize| -> Option<(usize, usize)> {
        let ins = &program.instrs[i];
        let (x, o) = (ins.inputs[k], ins.outputs[k]);
        let (g, role, start) = placed[o.index()]?;
        let r = roots[x.index()];
        let free = !graph.is_input[r.index()] && placed[r.index()].is_none() && reads[r.index()] == 1;
        if role != GRADS || !groups[g].packed || !free {
            return None;
        }
        let writer = graph.producer[r.index()]?;
        let in_arena = |v: &ValueId| placed[roots[v.index()].index()].is_some_and(|(pg, pr, _)| (pg, pr) == (g, GRADS));
        let reads_arena = (graph.pair_of)(writer).any(|j| program.instrs[j].inputs.iter().any(in_arena));
        (!reads_arena).then_some((g, start))
    };
    // Updates that launch nothing where they are: packed ones but their group's last, which
    // runs them all (after any psum before it).
    let mut deferred = vec![false; program.instrs.len()];
    for group in groups.iter().filter(|g| g.packed) {
        for &i in group.instrs.iter().rev().skip(1) {
            deferred[i] = true;
        }
    }
    let mut runs: Vec<PsumRun> = vec![];
    // The open run: its index, axes and the buffers (roots) it sums into.
    let mut open: Option<(usize, Vec<String>, Vec<ValueId>)> = None;
    for (i, ins) in program.instrs.iter().enumerate() {
        let Op::Psum { axes, .. } = &ins.op else {
            // Automatic mode interleaves each gradient's psum with its update.
            if !deferred[i] && !aliasing(&ins.op) {
                open = None;
            }
            continue;
        };
        let mut ops: Vec<(usize, usize, usize)> = (0..ins.inputs.len())
            .filter_map(|k| spot(placed, i, k).map(|(g, start)| (k, g, start)))
            .collect();
        let Some(&(_, g, _)) = ops.first() else {
            open = None;
            continue;
        };
        // One arena per launch: operands of other groups are summed alone.
        ops.retain(|o| o.1 == g);
        let joins = open.as_ref().is_some_and(|(r, run_axes, sums)| {
            runs[*r].group == g && run_axes == axes && !ins.inputs.iter().any(|v| sums.contains(&roots[v.index()]))
        });
        if !joins {
            runs.push(PsumRun {
                instrs: vec![],
                group: g,
                arrays: vec![],
            });
            open = Some((runs.len() - 1, axes.clone(), vec![]));
        }
        let (r, _, sums) = open.as_mut().expect("opened above");
        let run = &mut runs[*r];
        run.instrs.push(i);
        for (k, _, start) in ops {
            let x = ins.inputs[k];
            placed[roots[x.index()].index()] = Some((g, GRADS, start));
            in_place[x.index()] = true;
            run.arrays.push((start, program.info(x).numel()));
            sums.push(ins.outputs[k]);
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::gpu::fuse;
    use crate::model::{param_specs, GptConfig};
    use crate::plan::{DropoutKey, Parallel, Strategy, TrainerOptions};
    use crate::sharding::Mesh;

    #[test]
    fn a_data_parallel_steps_gradient_psums_are_summed_in_place_as_one_run_in_both_modes() {
        let mesh = Mesh::parse("dp=2").unwrap();
        let cfg = GptConfig::tiny();
        let modes = [
            Parallel::Auto {
                par: Strategy::Dp.compose(&mesh.clone()).unwrap(),
                specs: vec![],
            },
            Parallel::ShardMap {
                par: Strategy::Dp.compose(&mesh).unwrap(),
                dropout_key: DropoutKey::Same,
            },
        ];
        for parallel in modes {
            let name = format!("{parallel:?}");
            let program = crate::plan::build(&TrainerOptions::new(cfg.clone(), parallel))
                .unwrap()
                .step
                .program;
            let p = plan(&program, &fuse::plan(&program), usize::MAX);
            let psums: Vec<usize> = (0..program.instrs.len())
                .filter(|&i| matches!(program.instrs[i].op, Op::Psum { .. }))
                .collect();
            // Every gradient's psum, not the loss's.
            assert_eq!(p.psum_runs.len(), 1, "{name}");
            assert_eq!(p.psum_runs[0].arrays.len(), param_specs(&cfg).len(), "{name}");
            assert_eq!(psums.len(), param_specs(&cfg).len() + 1, "{name}");
            let launches: usize = psums.iter().map(|&i| p.psum_dispatches(&program, i)).sum();
            assert_eq!(launches, 2, "{name}: the gradients' run and the loss's psum");
            // Each operand (its buffer, which a reshape shares) is written where its sum goes.
            let producer = program.producers();
            for &i in &psums {
                let ins = &program.instrs[i];
                for (x, o) in ins.inputs.iter().zip(&ins.outputs) {
                    if p.in_place[x.index()] {
                        let buffer = root(&program, &producer, *x);
                        assert_eq!(p.placed[buffer.index()], p.placed[o.index()], "{name}: psum {i}");
                    }
                }
            }
        }
    }
}
