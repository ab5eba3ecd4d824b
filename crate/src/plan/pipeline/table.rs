//! A schedule as the list of passes each stage runs, in its order: what Megatron-LM's
//! schedules and the zero-bubble paper's write per rank. The same table drives the program
//! (each stage's passes traced in time order, [`Table::steps`]), the timeline priced with each
//! pass's time ([`Table::timing`]), the closed forms of the bubble and of the activations a stage
//! holds, and the page's diagram.
//!
//! The model's blocks are cut into `stages * chunks` virtual stages in model order; virtual
//! stage `k` is chunk `k / stages` of stage `k % stages` (Megatron's interleaving: a stage's
//! chunks are `stages` apart). Passes wait on each other as the model's data flows: microbatch
//! j's forward on virtual stage k waits for its forward on k - 1; its backward on k for its
//! backward on k + 1 (the last virtual stage's for its own forward); a weight pass for its
//! backward.
use super::super::Schedule;
pub use crate::ir::{Action, Pass};

/// How long each pass takes, relative to each other (a forward of one chunk, its backward, its
/// weight pass). Where the backward is not split, it takes `backward + weight`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct PassTimes {
    pub forward: f64,
    pub backward: f64,
    pub weight: f64,
}

impl PassTimes {
    /// Forward, input gradient and weight gradient alike (the zero-bubble paper's assumption).
    pub const EVEN: PassTimes = PassTimes {
        forward: 1.0,
        backward: 1.0,
        weight: 1.0,
    };
}

/// A schedule for `stages` stages of `chunks` chunks each and `microbatches` microbatches:
/// each stage's passes in the order it runs them.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Table {
    pub schedule: Schedule,
    pub stages: usize,
    pub chunks: usize,
    pub microbatches: usize,
    /// Whether backward passes are split into B (input) and W (weights).
    pub split: bool,
    /// Per stage, its passes in order.
    pub order: Vec<Vec<Action>>,
}

/// A pass placed in time on its stage.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Slot {
    pub action: Action,
    pub start: f64,
    pub end: f64,
}

/// A table's passes placed in time, each stage running its passes in order, each pass starting
/// once the passes it waits on are done (plus `latency` where they ran on another stage).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Timing {
    /// Per stage, its passes in time.
    pub slots: Vec<Vec<Slot>>,
    /// When the last pass ends.
    pub makespan: f64,
}

impl Timing {
    /// Per stage, the time it runs no pass before the step ends.
    pub fn idle(&self) -> Vec<f64> {
        self.slots
            .iter()
            .map(|s| self.makespan - s.iter().map(|x| x.end - x.start).sum::<f64>())
            .collect()
    }

    /// Per stage, the share of the step it idles.
    pub fn idle_fraction(&self) -> Vec<f64> {
        self.idle()
            .iter()
            .map(|i| i / self.makespan.max(f64::MIN_POSITIVE))
            .collect()
    }
}

impl Table {
    /// The schedule's passes on each stage.
    pub fn new(schedule: Schedule, stages: usize, microbatches: usize, chunks: usize) -> Table {
        let (pp, m, v) = (stages, microbatches, chunks.max(1));
        let order = (0..pp)
            .map(|s| match schedule {
                Schedule::Gpipe => gpipe(m, v),
                Schedule::OneFOneB if v == 1 => one_f_one_b(pp, s, m),
                Schedule::OneFOneB => interleaved(pp, s, m, v),
                Schedule::ZbH1 => zb_h1(pp, s, m),
            })
            .collect();
        Table {
            schedule,
            stages: pp,
            chunks: v,
            microbatches: m,
            split: schedule == Schedule::ZbH1,
            order,
        }
    }

    /// Virtual stages: the model's blocks cut into this many runs.
    pub fn virtual_stages(&self) -> usize {
        self.stages * self.chunks
    }

    /// The stage that runs virtual stage `k`.
    pub fn stage_of(&self, k: usize) -> usize {
        k % self.stages
    }

    /// The virtual stage of `chunk` on `stage`.
    pub fn virtual_stage(&self, stage: usize, chunk: usize) -> usize {
        chunk * self.stages + stage
    }

    /// The passes `a` on `stage` waits for, each with its stage: at most two, held inline
    /// because a search times this for every pass of thousands of tables.
    fn waits_for(&self, stage: usize, a: Action) -> impl Iterator<Item = (usize, Action)> {
        let k = self.virtual_stage(stage, a.chunk);
        let at = |k: usize, pass| {
            let s = self.stage_of(k);
            (
                s,
                Action {
                    pass,
                    microbatch: a.microbatch,
                    chunk: k / self.stages,
                },
            )
        };
        let waits = match a.pass {
            Pass::Forward if k == 0 => [None, None],
            Pass::Forward => [Some(at(k - 1, Pass::Forward)), None],
            Pass::Backward if k + 1 == self.virtual_stages() => [Some(at(k, Pass::Forward)), None],
            Pass::Backward => [Some(at(k + 1, Pass::Backward)), Some(at(k, Pass::Forward))],
            Pass::Weight => [Some(at(k, Pass::Backward)), None],
        };
        waits.into_iter().flatten()
    }

    /// The passes placed in time with `time(stage, action)` each and `latency` between stages.
    /// Panics on an order that waits on itself (every table [`Table::new`] makes is sound).
    pub fn timing(&self, time: &dyn Fn(usize, &Action) -> f64, latency: f64) -> Timing {
        let pp = self.stages;
        let mut next = vec![0usize; pp];
        let mut free = vec![0.0f64; pp];
        // When each (stage, pass) ended, in one flat array: a search times thousands of tables.
        let index = |s: usize, a: &Action| {
            let pass = match a.pass {
                Pass::Forward => 0,
                Pass::Backward => 1,
                Pass::Weight => 2,
            };
            ((s * 3 + pass) * self.microbatches + a.microbatch) * self.chunks + a.chunk
        };
        let mut done: Vec<Option<f64>> = vec![None; pp * 3 * self.microbatches * self.chunks];
        let mut slots: Vec<Vec<Slot>> = self.order.iter().map(|o| Vec::with_capacity(o.len())).collect();
        // A pass starts when its stage is free and the passes it waits on are done, whatever
        // order the stages are visited in: each stage runs as far as its inputs allow, round
        // after round, until every pass is placed.
        let mut remaining: usize = self.order.iter().map(Vec::len).sum();
        while remaining > 0 {
            let before = remaining;
            for s in 0..pp {
                while let Some(&a) = self.order[s].get(next[s]) {
                    let mut start = Some(free[s]);
                    for (t, dep) in self.waits_for(s, a) {
                        let lag = if t == s { 0.0 } else { latency };
                        start = start.zip(done[index(t, &dep)]).map(|(at, end)| at.max(end + lag));
                    }
                    let Some(start) = start else { break };
                    let end = start + time(s, &a);
                    slots[s].push(Slot { action: a, start, end });
                    done[index(s, &a)] = Some(end);
                    free[s] = end;
                    next[s] += 1;
                    remaining -= 1;
                }
            }
            assert!(remaining < before, "a schedule's passes wait on each other in a cycle");
        }
        let makespan = slots.iter().flatten().map(|x| x.end).fold(0.0, f64::max);
        Timing { slots, makespan }
    }

    /// The passes in lockstep steps of one unit each: step t holds every pass that starts at
    /// time t when every pass takes one unit and nothing waits between stages. The program
    /// traces the passes in this order, each step's sends between stages made once at its end.
    pub fn steps(&self) -> Vec<Vec<(usize, Action)>> {
        let timing = self.timing(&|_, _: &Action| 1.0, 0.0);
        let steps = timing.makespan as usize;
        let mut out = vec![vec![]; steps];
        for (s, slots) in timing.slots.iter().enumerate() {
            for slot in slots {
                out[slot.start as usize].push((s, slot.action));
            }
        }
        out
    }

    /// Per stage, the most microbatch chunks it holds before its first backward pass and the
    /// most from the end of that pass on, when the running sums of its gradients are held
    /// too ([`Table::in_flight`] is the larger of the two).
    pub fn in_flight_around_first_backward(&self) -> Vec<(usize, usize)> {
        self.order
            .iter()
            .map(|order| {
                let (mut held, mut before, mut after, mut backed) = (0usize, 0usize, 0usize, false);
                for a in order {
                    match a.pass {
                        Pass::Forward => held += 1,
                        Pass::Backward => {
                            held -= 1;
                            backed = true;
                        }
                        Pass::Weight => {}
                    }
                    if backed {
                        after = after.max(held);
                    } else {
                        before = before.max(held);
                    }
                }
                (before, after)
            })
            .collect()
    }

    /// Per stage, the most microbatch chunks whose activations it holds at once: forwarded, not
    /// yet backed (a split backward's weight pass keeps less: the linear layers' inputs and
    /// output gradients).
    pub fn in_flight(&self) -> Vec<usize> {
        self.order
            .iter()
            .map(|order| {
                let (mut held, mut most) = (0usize, 0usize);
                for a in order {
                    match a.pass {
                        Pass::Forward => held += 1,
                        Pass::Backward => held -= 1,
                        Pass::Weight => {}
                    }
                    most = most.max(held);
                }
                most
            })
            .collect()
    }
}

impl Schedule {
    /// The fraction of a step a stage idles, in closed form, with `chunks` chunks per stage and
    /// passes of `times`: the fill and drain are `(pp - 1) / v` of one microbatch's forward and
    /// backward (Narayanan et al. 2021 for v > 1), against M of them; ZB-H1's drain runs a
    /// weight pass in each of its slots, leaving `(pp - 1) (F + B - W)` (Qi et al. 2024).
    pub fn bubble(self, stages: usize, microbatches: usize, chunks: usize, times: PassTimes) -> f64 {
        if stages <= 1 {
            return 0.0;
        }
        let (p, m, v) = (stages as f64, microbatches as f64, chunks.max(1) as f64);
        let PassTimes {
            forward: f,
            backward: b,
            weight: w,
        } = times;
        let ideal = m * (f + b + w);
        let idle = match self {
            Schedule::Gpipe | Schedule::OneFOneB => (p - 1.0) * (f + b + w) / v,
            Schedule::ZbH1 => (p - 1.0) * (f + b - w).max(0.0),
        };
        idle / (ideal + idle)
    }

    /// [`Schedule::bubble`] with passes of equal time, as a formula of pp, M and v.
    pub fn bubble_text(self, chunks: usize) -> String {
        match (self, chunks) {
            (Schedule::ZbH1, _) => "(pp-1)/(3M+pp-1)".into(),
            (_, 1) => "(pp-1)/(M+pp-1)".into(),
            (_, v) => format!("(pp-1)/({v}M+pp-1)"),
        }
    }

    /// Whether the schedule runs several chunks per stage (virtual stages).
    pub fn takes_virtual_stages(self) -> bool {
        !matches!(self, Schedule::ZbH1)
    }
}

fn forward(microbatch: usize, chunk: usize) -> Action {
    Action {
        pass: Pass::Forward,
        microbatch,
        chunk,
    }
}

fn backward(microbatch: usize, chunk: usize) -> Action {
    Action {
        pass: Pass::Backward,
        microbatch,
        chunk,
    }
}

/// GPipe (MaxText's circular pipeline with chunks): every forward, chunk by chunk, then every
/// backward in the reverse order (what autodiff of the forward loop runs).
fn gpipe(m: usize, v: usize) -> Vec<Action> {
    let forwards: Vec<Action> = (0..v).flat_map(|c| (0..m).map(move |j| forward(j, c))).collect();
    let backwards = forwards.iter().rev().map(|a| backward(a.microbatch, a.chunk));
    forwards.iter().copied().chain(backwards).collect()
}

/// Megatron's 1F1B on stage `s`: pp - s - 1 forwards, then one forward and one backward at a
/// time, then the remaining backwards.
fn one_f_one_b(pp: usize, s: usize, m: usize) -> Vec<Action> {
    let warm = (pp - s - 1).min(m);
    let mut out: Vec<Action> = (0..warm).map(|j| forward(j, 0)).collect();
    for i in 0..m - warm {
        out.push(forward(warm + i, 0));
        out.push(backward(i, 0));
    }
    out.extend((m - warm..m).map(|j| backward(j, 0)));
    out
}

/// Megatron's interleaved 1F1B on stage `s`: microbatches in groups of pp, each group through
/// chunk 0, then chunk 1, ...; backwards through the chunks in reverse. The warm-up is two
/// forwards per stage after this one and a group per extra chunk (all of it when M = pp).
/// M must be a multiple of pp ([`super::check`] refuses others).
fn interleaved(pp: usize, s: usize, m: usize, v: usize) -> Vec<Action> {
    let total = m * v;
    let nth = |k: usize, forward_pass: bool| {
        let group = k / (pp * v);
        let in_group = k % (pp * v);
        let chunk = in_group / pp;
        let microbatch = group * pp + in_group % pp;
        if forward_pass {
            forward(microbatch, chunk)
        } else {
            backward(microbatch, v - 1 - chunk)
        }
    };
    let warm = if m == pp {
        total
    } else {
        ((pp - s - 1) * 2 + (v - 1) * pp).min(total)
    };
    let mut out: Vec<Action> = (0..warm).map(|k| nth(k, true)).collect();
    for i in 0..total - warm {
        out.push(nth(warm + i, true));
        out.push(nth(i, false));
    }
    out.extend((total - warm..total).map(|k| nth(k, false)));
    out
}

/// ZB-H1 on stage `s` (the zero-bubble authors' handcrafted schedule): pp - s - 1 forwards;
/// then s forward-and-input-backward pairs whose weight passes wait; then forward, backward and
/// weight (the oldest waiting one) at a time; then backward and weight; then the s weight
/// passes left, in the slots where 1F1B's stage idles at the end.
fn zb_h1(pp: usize, s: usize, m: usize) -> Vec<Action> {
    let mut out = vec![];
    let (mut f, mut b, mut w) = (0, 0, 0);
    let weight = |j: usize| Action {
        pass: Pass::Weight,
        microbatch: j,
        chunk: 0,
    };
    for _ in 0..(pp - s - 1).min(m) {
        out.push(forward(f, 0));
        f += 1;
    }
    for _ in 0..s {
        if f == m {
            break;
        }
        out.extend([forward(f, 0), backward(b, 0)]);
        f += 1;
        b += 1;
    }
    while f < m {
        out.extend([forward(f, 0), backward(b, 0), weight(w)]);
        f += 1;
        b += 1;
        w += 1;
    }
    while b < m {
        out.extend([backward(b, 0), weight(w)]);
        b += 1;
        w += 1;
    }
    out.extend((w..m).map(weight));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(order: &[Action], pass: Pass) -> usize {
        order.iter().filter(|a| a.pass == pass).count()
    }

    #[test]
    fn every_stage_runs_each_microbatch_chunk_once_per_pass() {
        for (schedule, v) in [
            (Schedule::Gpipe, 1),
            (Schedule::Gpipe, 2),
            (Schedule::OneFOneB, 1),
            (Schedule::OneFOneB, 2),
            (Schedule::ZbH1, 1),
        ] {
            for (pp, m) in [(2, 4), (4, 4), (4, 8), (3, 6)] {
                let t = Table::new(schedule, pp, m, v);
                for order in &t.order {
                    assert_eq!(count(order, Pass::Forward), m * v, "{schedule:?} v={v} pp={pp} M={m}");
                    assert_eq!(count(order, Pass::Backward), m * v);
                    assert_eq!(count(order, Pass::Weight), if t.split { m * v } else { 0 });
                }
                // Sound: it places every pass.
                let timing = t.timing(&|_, _: &Action| 1.0, 0.0);
                assert_eq!(
                    timing.slots.iter().map(Vec::len).sum::<usize>(),
                    t.order.iter().map(Vec::len).sum::<usize>()
                );
            }
        }
    }

    #[test]
    fn one_f_one_b_warms_up_with_pp_minus_s_minus_one_forwards_and_holds_at_most_pp() {
        let t = Table::new(Schedule::OneFOneB, 4, 8, 1);
        for (s, order) in t.order.iter().enumerate() {
            let warm = order.iter().take_while(|a| a.pass == Pass::Forward).count();
            // The warm-up, then the forward of the first forward-backward pair.
            assert_eq!(warm, 4 - s - 1 + 1, "stage {s}");
        }
        assert_eq!(t.in_flight(), vec![4, 3, 2, 1]);
        assert_eq!(Table::new(Schedule::Gpipe, 4, 8, 1).in_flight(), vec![8; 4]);
        assert_eq!(Table::new(Schedule::ZbH1, 4, 8, 1).in_flight(), vec![4, 3, 2, 1]);
    }

    #[test]
    fn unit_passes_idle_as_the_closed_forms_say() {
        // Forward and backward of one unit each: the step is M + pp - 1 pairs of them.
        let even = |_: usize, _: Pass| 1.0;
        for (schedule, pp, m, v) in [
            (Schedule::Gpipe, 4, 8, 1),
            (Schedule::OneFOneB, 4, 8, 1),
            (Schedule::OneFOneB, 4, 8, 2),
            (Schedule::OneFOneB, 2, 4, 2),
            (Schedule::Gpipe, 4, 8, 2),
            (Schedule::ZbH1, 4, 8, 1),
            (Schedule::ZbH1, 2, 6, 1),
        ] {
            let t = Table::new(schedule, pp, m, v);
            // A chunk's pass is 1/v of a stage's: the step's work stays M (F + B + W).
            let chunk = |s: usize, a: &Action| {
                let full = if !t.split && a.pass == Pass::Backward {
                    2.0
                } else {
                    even(s, a.pass)
                };
                full / v as f64
            };
            let timing = t.timing(&chunk, 0.0);
            let want = schedule.bubble(pp, m, v, PassTimes::EVEN);
            for (s, got) in timing.idle_fraction().iter().enumerate() {
                assert!(
                    (got - want).abs() < 1e-9,
                    "{schedule:?} pp={pp} M={m} v={v} stage {s}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn zb_h1_defers_s_weight_passes_to_the_end_of_stage_s() {
        let t = Table::new(Schedule::ZbH1, 4, 8, 1);
        for (s, order) in t.order.iter().enumerate() {
            let tail = order.iter().rev().take_while(|a| a.pass == Pass::Weight).count();
            // The last backward's own weight pass, and the s deferred ones.
            assert_eq!(tail, s + 1, "stage {s}");
        }
    }

    #[test]
    fn the_lockstep_steps_hold_each_stage_once_and_keep_its_order() {
        let t = Table::new(Schedule::OneFOneB, 4, 8, 2);
        let steps = t.steps();
        let mut seen = vec![vec![]; 4];
        for step in &steps {
            let mut stages: Vec<usize> = step.iter().map(|(s, _)| *s).collect();
            stages.dedup();
            assert_eq!(stages.len(), step.len(), "one pass per stage per step");
            for &(s, a) in step {
                seen[s].push(a);
            }
        }
        assert_eq!(seen, t.order);
    }
}
