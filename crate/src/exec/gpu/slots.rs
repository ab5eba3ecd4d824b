//! Slot planning: every value of a program gets a buffer *slot*; slots are reused as soon as the
//! values in them are dead (liveness), reshapes alias their operand, and optimizer updates write
//! into their parameter's slot (donation). Capacities grow while planning; buffers are made after.
//! The tensors of a packed optimizer update (packing.rs) get pinned slots that are views into
//! their group's arenas.
use super::fuse::Fusion;
use super::packing::{self, ROLES};
use super::parts::{self, Parts};
use super::views::Views;
use crate::exec::lowering::{plan_instr_dot, plan_reduce, DotPlan, ReducePlan};
use crate::ir::{Op, Program, ValueId};
use crate::kernels::optimizer::Segment;

/// A value with no slot yet.
const NONE: usize = usize::MAX;

/// Slot assignment by liveness.
#[derive(Default)]
struct SlotPlan {
    caps: Vec<usize>,
    refs: Vec<usize>,
    pinned: Vec<bool>,
    views: Vec<Option<(usize, usize)>>,
    /// Per part of a parts buffer (parts.rs): the buffer's slot, released when the part dies.
    owner: Vec<Option<usize>>,
    names: Vec<Option<String>>,
    free: Vec<usize>,
}

impl SlotPlan {
    fn new_slot(&mut self, n: usize, pinned: bool) -> usize {
        self.caps.push(n);
        self.refs.push(1);
        self.pinned.push(pinned);
        self.views.push(None);
        self.owner.push(None);
        self.names.push(None);
        self.caps.len() - 1
    }

    /// `n` parts of `len` elements, `stride` apart, in one slot by liveness: a view each, the
    /// slot freed once every part is dead.
    fn new_parts(&mut self, n: usize, len: usize, stride: usize) -> Vec<usize> {
        let whole = self.take((n - 1) * stride + len);
        self.refs[whole] = n;
        (0..n)
            .map(|k| {
                let s = self.new_view(whole, k * stride, len);
                self.owner[s] = Some(whole);
                s
            })
            .collect()
    }

    /// A pinned slot of `n` elements from element `start` of slot `parent`.
    fn new_view(&mut self, parent: usize, start: usize, n: usize) -> usize {
        let s = self.new_slot(n, true);
        self.views[s] = Some((parent, start));
        s
    }

    /// Best fit among free slots (the smallest that holds `n`, else the largest, grown).
    fn take(&mut self, n: usize) -> usize {
        let fits = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, &s)| self.caps[s] >= n)
            .min_by_key(|(_, &s)| self.caps[s]);
        let pick = fits.or_else(|| self.free.iter().enumerate().max_by_key(|(_, &s)| self.caps[s]));
        match pick {
            Some((i, &s)) => {
                self.free.swap_remove(i);
                self.caps[s] = self.caps[s].max(n);
                self.refs[s] = 1;
                s
            }
            None => self.new_slot(n, false),
        }
    }

    fn retain(&mut self, s: usize) {
        self.refs[s] += 1;
    }

    fn release(&mut self, s: usize) {
        self.refs[s] -= 1;
        if self.refs[s] > 0 {
            return;
        }
        match self.owner[s] {
            Some(whole) => self.release(whole),
            None if !self.pinned[s] => self.free.push(s),
            None => {}
        }
    }
}

/// What one instruction needs besides its operands' slots: the decomposition of a dot_general or
/// reduce_sum (computed once, here, and lowered from), and the slots of transposed operand copies.
#[derive(Default)]
pub(super) struct Scratch {
    pub dot: Option<DotPlan>,
    pub reduce: Option<ReducePlan>,
    pub lhs: Option<usize>,
    pub rhs: Option<usize>,
    /// Attention's backward: each row's (lse, sum of do * o) (heads, T, 2), alive for its
    /// dispatches.
    pub rows: Option<usize>,
    /// On the last update of a group (packing.rs): the group's dispatch.
    pub update: Option<UpdatePlan>,
    /// On a psum with operands summed in place (packing.rs).
    pub psum: Option<PsumPlan>,
}

/// A psum some of whose operands are summed in place in a gradient arena: which ones (their
/// psum launches nothing for them), and on the run's last psum the run's one dispatch.
pub(super) struct PsumPlan {
    pub in_place: Vec<bool>,
    /// The arena's slot and the arrays summed, each (first element, elements per device).
    pub run: Option<(usize, Vec<(usize, usize)>)>,
}

/// One optimizer dispatch: its buffers' slots (param, grad, and for AdamW m, v) and the
/// segment of each update it runs.
pub(super) struct UpdatePlan {
    pub buffers: Vec<usize>,
    pub segments: Vec<Segment>,
}

/// The plan of a whole program.
pub(super) struct Slots {
    /// Elements of each slot (every device's block of the largest value it holds).
    pub caps: Vec<usize>,
    /// Per slot, for a view into an arena: the arena's slot and the view's first element.
    pub views: Vec<Option<(usize, usize)>>,
    names: Vec<Option<String>>,
    /// The slot of each value.
    pub value_slot: Vec<usize>,
    /// Per instruction.
    pub scratch: Vec<Scratch>,
    /// The values stored as parts of one buffer, and per group the slot of its first part.
    pub parts: Parts,
    pub first_part: Vec<usize>,
}

impl Slots {
    /// The name of slot `s`: an arena's, that of the first named value it holds, else `slot<s>`.
    pub fn name(&self, program: &Program, s: usize) -> String {
        if let Some(n) = &self.names[s] {
            return n.clone();
        }
        (0..program.values.len())
            .find(|&v| self.value_slot[v] == s)
            .and_then(|v| program.values[v].name.clone())
            .unwrap_or_else(|| format!("slot{s}"))
    }
}

/// The in-place part of psum `i`, if it has one.
fn psum_plan(packing: &packing::Packing, arenas: &[Vec<usize>], program: &Program, i: usize) -> Option<PsumPlan> {
    let in_place: Vec<bool> = program.instrs[i]
        .inputs
        .iter()
        .map(|v| packing.in_place[v.index()])
        .collect();
    let run = packing.run_ending_at(i);
    if !in_place.contains(&true) && run.is_none() {
        return None;
    }
    let run = run.map(|r| (arenas[r.group][packing::GRADS], r.arrays.clone()));
    Some(PsumPlan { in_place, run })
}

/// Plans the slots of `program`: every value holds all devices' local blocks (`[device, local...]`).
/// A fused pair (`fusion`, see fuse.rs) is planned as one instruction: its outputs are taken
/// before any of its operands is released, and an intermediate it does not write gets no slot.
/// A folded transpose (`views`) is planned as a reshape: its outputs share its operand's slot;
/// gradients written into a folded concat's columns share that slot from their instruction on.
/// An arena of packed optimizer tensors holds at most `max_arena` elements.
pub(super) fn plan(program: &Program, fusion: &[Option<Fusion>], views: &Views, max_arena: usize) -> Slots {
    let mut last_use = program.last_uses();
    // Bits fused attention draws in place get no slot; their key lives while they would, as
    // the kernels read it instead.
    let drawn = program.bits_drawn_in_attention();
    for (v, i) in drawn.iter().enumerate() {
        if let Some(i) = *i {
            let key = program.instrs[i].inputs[0].index();
            last_use[key] = last_use[key].max(last_use[v]);
        }
    }
    let devices = program.devices();
    let numel = |v: ValueId| devices * program.info(v).numel();
    let mut plan = SlotPlan::default();
    let packing = packing::plan(program, fusion, max_arena);
    // Each packed group's arenas, one slot per role; the group each update instruction ends.
    let mut arenas: Vec<Vec<usize>> = vec![];
    let mut ends_group = vec![None; program.instrs.len()];
    for (g, group) in packing.groups.iter().enumerate() {
        ends_group[*group.instrs.last().expect("a group has an update")] = Some(g);
        let first = &program.instrs[group.instrs[0]];
        let roles = if group.packed { first.inputs.len() } else { 0 };
        arenas.push(
            (0..roles)
                .map(|r| {
                    let s = plan.new_slot(group.arena_len, true);
                    plan.names[s] = Some(format!("{} {} (packed {g})", first.op.name(), ROLES[r]));
                    s
                })
                .collect(),
        );
    }
    let parts = parts::plan(program, fusion, &views.quiet, &packing.placed);
    // Each group's part slots, made at its first part's allocation.
    let mut part_slots: Vec<Vec<usize>> = vec![vec![]; parts.groups.len()];
    // A value's new slot: its view if packed or a part, else by liveness (`fresh`: a new pinned
    // one).
    let mut alloc =
        |plan: &mut SlotPlan, v: ValueId, fresh: bool| match (packing.placed[v.index()], parts.of[v.index()]) {
            (Some((g, role, start)), _) => plan.new_view(arenas[g][role], start, numel(v)),
            (None, Some((g, k))) => {
                if part_slots[g].is_empty() {
                    let group = &parts.groups[g];
                    part_slots[g] = plan.new_parts(group.values.len(), group.len, group.stride);
                }
                part_slots[g][k]
            }
            (None, None) if fresh => plan.new_slot(numel(v), true),
            (None, None) => plan.take(numel(v)),
        };
    let mut value_slot = vec![NONE; program.values.len()];
    for (v, _) in &program.inputs {
        value_slot[v.index()] = alloc(&mut plan, *v, true);
    }
    // A donated output that an update does not write in place (ZeRO's all_gather of the
    // updated blocks) is written straight into its input's slot, which nothing reads any more
    // by then: the next step finds it there.
    let mut donated_to = vec![None; program.values.len()];
    for &(out, input) in &program.donations {
        donated_to[program.outputs[out].index()] = Some(program.inputs[input].0);
    }
    let mut scratch: Vec<Scratch> = Vec::with_capacity(program.instrs.len());
    let mut i = 0;
    while i < program.instrs.len() {
        let ins = &program.instrs[i];
        let group = match fusion[i] {
            Some(_) => i..i + 2,
            None => i..i + 1,
        };
        let mut sc = Scratch::default();
        match &ins.op {
            // A group's first instruction is quiet only where the transpose (or pair) is folded.
            _ if views.quiet[i] => {
                let s = value_slot[ins.inputs[0].index()];
                for o in &program.instrs[group.end - 1].outputs {
                    plan.retain(s);
                    value_slot[o.index()] = s;
                }
            }
            Op::Reshape { .. } | Op::Pcast { .. } | Op::Reshard { .. } => {
                let s = value_slot[ins.inputs[0].index()];
                plan.retain(s);
                value_slot[ins.outputs[0].index()] = s;
            }
            Op::SgdUpdate { .. } | Op::AdamWUpdate { .. } => {
                // In place: p' in p's slot (and m', v' in m's and v's).
                let srcs: &[usize] = if ins.outputs.len() == 1 { &[0] } else { &[0, 2, 3] };
                for (o, &src) in ins.outputs.iter().zip(srcs) {
                    let s = value_slot[ins.inputs[src].index()];
                    plan.retain(s);
                    value_slot[o.index()] = s;
                }
                if let Some(g) = ends_group[i] {
                    let group = &packing.groups[g];
                    let buffers = match group.packed {
                        true => arenas[g].clone(),
                        false => ins.inputs.iter().map(|v| value_slot[v.index()]).collect(),
                    };
                    sc.update = Some(UpdatePlan {
                        buffers,
                        segments: group.segments.clone(),
                    });
                }
            }
            op => {
                let (lhs_perm, rhs_perm) = match op {
                    Op::DotGeneral { .. } => {
                        let p = plan_instr_dot(program, ins).expect("a dot_general");
                        let perms = (p.lhs_perm.is_some(), p.rhs_perm.is_some());
                        sc.dot = Some(p);
                        perms
                    }
                    Op::ReduceSum { axes } => {
                        let p = plan_reduce(program.shape(ins.inputs[0]), axes);
                        let perms = (p.perm.is_some(), false);
                        sc.reduce = Some(p);
                        perms
                    }
                    _ => (false, false),
                };
                if lhs_perm {
                    sc.lhs = Some(plan.take(numel(ins.inputs[0])));
                }
                if rhs_perm {
                    sc.rhs = Some(plan.take(numel(ins.inputs[1])));
                }
                if let Op::Psum { .. } = op {
                    sc.psum = psum_plan(&packing, &arenas, program, i);
                }
                if let Op::AttentionGrad { .. } = op {
                    // (lse, delta) per row of every head.
                    sc.rows = Some(plan.take(2 * numel(ins.inputs[4])));
                }
                let keep_first = fusion[i].is_none_or(|f| f.keeps_intermediate());
                let mut place = |plan: &mut SlotPlan, value_slot: &[usize], o: ValueId| match donated_to[o.index()] {
                    Some(input) if last_use[input.index()].is_none_or(|u| u < i) => {
                        let s = value_slot[input.index()];
                        plan.retain(s);
                        s
                    }
                    _ => alloc(plan, o, false),
                };
                if let Some(y) = views.joint[i] {
                    // Gradients written into the columns a folded concat makes: one slot for all.
                    let s = plan.take(numel(y));
                    for (k, o) in ins.outputs.iter().enumerate() {
                        if k > 0 {
                            plan.retain(s);
                        }
                        value_slot[o.index()] = s;
                    }
                } else if keep_first {
                    for o in ins.outputs.iter().filter(|o| drawn[o.index()].is_none()) {
                        value_slot[o.index()] = place(&mut plan, &value_slot, *o);
                    }
                }
                for o in group.clone().skip(1).flat_map(|j| &program.instrs[j].outputs) {
                    value_slot[o.index()] = place(&mut plan, &value_slot, *o);
                }
                for s in [sc.lhs, sc.rhs, sc.rows].into_iter().flatten() {
                    plan.release(s);
                }
            }
        }
        scratch.push(sc);
        scratch.extend(group.clone().skip(1).map(|_| Scratch::default()));
        // Dead after this group: its operands' last reads, and outputs nobody reads (values
        // without a slot, a fused pair's intermediate, hold nothing to release).
        let ins_of = |j: usize| &program.instrs[j];
        let mut dead: Vec<usize> = group
            .clone()
            .flat_map(|j| &ins_of(j).inputs)
            .filter(|v| last_use[v.index()].is_some_and(|u| group.contains(&u)))
            .map(|v| v.index())
            .collect();
        dead.extend(
            group
                .clone()
                .flat_map(|j| &ins_of(j).outputs)
                .filter(|o| last_use[o.index()].is_none())
                .map(|o| o.index()),
        );
        dead.sort();
        dead.dedup();
        for v in dead {
            if value_slot[v] != NONE {
                plan.release(value_slot[v]);
            }
        }
        i = group.end;
    }
    let first_part = part_slots
        .iter()
        .map(|slots| slots.first().copied().unwrap_or(NONE))
        .collect();
    Slots {
        caps: plan.caps,
        views: plan.views,
        names: plan.names,
        value_slot,
        scratch,
        parts,
        first_part,
    }
}
