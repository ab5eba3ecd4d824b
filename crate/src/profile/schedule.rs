//! Places a step's work in time ([`schedule`]), as XLA runs a scheduled HLO module: each device
//! has a compute stream and a communication stream; a collective starts when its operands are
//! ready on every device of its group and every member's communication stream is free.
//!
//! With overlap (XLA's latency-hiding scheduler): collectives are asynchronous start/done
//! pairs. A start is issued as soon as its operands are ready, and the first op that reads the
//! result waits for its done; in between, the compute stream runs whatever is ready, lowest
//! program position first (a list schedule), so gradient all-reduces run during the rest of
//! the backward pass and FSDP's all-gathers run ahead of the ops that use them. One collective
//! is in flight per device at a time: XLA's GPU scheduler allows one on its collective stream
//! (`kGpuAsyncStreamCollectives`), its TPU scheduler one per kind, and collectives in flight
//! together share the links that each one's alpha-beta price assumes to itself. Among those
//! ready, the one whose group became ready first starts first. What is not modelled: the
//! scheduler's memory limit (it stops hoisting all-gathers when their buffers would not fit),
//! and compute slowed by the collectives sharing its memory bandwidth.
//!
//! Without overlap every device runs its program in order and a collective blocks compute
//! until it is done: on an SPMD program the step is then the sum of every op's time.
//!
//! Waits are spans: a compute stream with nothing ready waits for the collective that will
//! release its next op. The part of a wait before that collective's group is all there is
//! `idle` (waiting for the other devices); the rest counts as `collectives`, except the part
//! covering the collective's launch, which counts as `launch`.
use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, HashMap};

use super::timeline::{DeviceTimeline, Span, SpanKind, StepWork, Task, Timeline, IDLE};
use super::Category;

/// Why a step's work cannot be placed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    #[error("device {device} ({label}): task {task} reads task {dep}, which does not come before it")]
    DependencyOrder {
        device: usize,
        label: String,
        task: usize,
        dep: usize,
    },
    #[error("collective {key} over grouping {grouping}: device {device} has no group there")]
    NoGroup { key: usize, grouping: usize, device: usize },
    #[error("collective {key}: devices {missing:?} of its group never take part in it")]
    Unmatched { key: usize, missing: Vec<usize> },
    #[error("the devices wait on each other forever: device {device} ({label}) stops before task {task}")]
    Deadlock { device: usize, label: String, task: usize },
}

/// A time, ordered (never NaN here).
#[derive(Clone, Copy, Debug, PartialEq)]
struct T(f64);

impl Eq for T {}

impl PartialOrd for T {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for T {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    ComputeDone { device: usize, task: usize },
    CollectiveDone { instance: usize },
}

/// One collective as all its group runs it.
struct Instance {
    key: usize,
    /// (device, task) of every member, in group order.
    members: Vec<(usize, usize)>,
    arrived: usize,
    /// When the last member's operands were ready.
    group_ready: f64,
    start: f64,
    /// The slowest member's figures: the collective ends when all of them are done.
    launch_s: f64,
    work_s: f64,
}

impl Instance {
    fn done(&self) -> f64 {
        self.start + self.launch_s + self.work_s
    }
}

struct Device<'a> {
    tasks: &'a [Task],
    consumers: Vec<Vec<usize>>,
    missing: Vec<u32>,
    finish: Vec<f64>,
    /// Per task: its collective instance, if it is one.
    instance: Vec<Option<usize>>,
    /// Per collective task: when its operands were ready here (it arrived).
    arrived: Vec<f64>,
    /// Compute tasks whose operands are ready (with overlap).
    ready: BinaryHeap<Reverse<usize>>,
    /// Without overlap: the next task in program order.
    next: usize,
    busy: bool,
    /// Without overlap: the collective it is blocked in.
    blocked: Option<usize>,
    idle_since: Option<f64>,
    /// End of its last compute span (or wait, without overlap).
    compute_end: f64,
    comm_free: f64,
    finished: usize,
    out: DeviceTimeline,
}

struct Sim<'a> {
    overlap: bool,
    devices: Vec<Device<'a>>,
    instances: Vec<Instance>,
    /// Instances whose group is all there and not yet started: (group ready, key, instance).
    waiting: BTreeSet<(T, usize, usize)>,
    /// Something changed that may let a waiting instance start.
    comm_dirty: bool,
    /// Devices whose compute stream may start something.
    wake: Vec<usize>,
    woken: Vec<bool>,
    events: BinaryHeap<Reverse<(T, u64, Event)>>,
    seq: u64,
}

const MS: f64 = 1e3;

fn wait_span(start: f64, end: f64, category: &'static str, launch: f64, on: Result<&Task, &'static str>) -> Span {
    Span {
        start_ms: start * MS,
        dur_ms: (end - start) * MS,
        kind: SpanKind::Wait,
        category,
        launch_ms: launch * MS,
        instr: on.ok().map(|t| t.instr),
        name: on.map_or_else(|what| what, |t| t.name),
    }
}

impl<'a> Sim<'a> {
    fn push(&mut self, at: f64, e: Event) {
        self.seq += 1;
        self.events.push(Reverse((T(at), self.seq, e)));
    }

    fn wake(&mut self, d: usize) {
        if !self.woken[d] {
            self.woken[d] = true;
            self.wake.push(d);
        }
    }

    /// Task `t` of device `d` has every operand: queue it, or (a collective, with overlap)
    /// issue its start.
    fn on_ready(&mut self, d: usize, t: usize, now: f64) {
        if !self.overlap {
            self.wake(d);
            return;
        }
        if self.devices[d].instance[t].is_some() {
            self.arrive(d, t, now);
        } else {
            self.devices[d].ready.push(Reverse(t));
            self.wake(d);
        }
    }

    fn arrive(&mut self, d: usize, t: usize, now: f64) {
        let dev = &mut self.devices[d];
        dev.arrived[t] = now;
        let i = dev.instance[t].expect("a collective");
        let inst = &mut self.instances[i];
        inst.arrived += 1;
        inst.group_ready = inst.group_ready.max(now);
        if inst.arrived == inst.members.len() {
            self.waiting.insert((T(inst.group_ready), inst.key, i));
            self.comm_dirty = true;
        }
    }

    fn finish(&mut self, d: usize, t: usize, now: f64) {
        let dev = &mut self.devices[d];
        dev.finish[t] = now;
        dev.finished += 1;
        let mut released = vec![];
        for &c in &dev.consumers[t] {
            dev.missing[c] -= 1;
            if dev.missing[c] == 0 {
                released.push(c);
            }
        }
        for c in released {
            self.on_ready(d, c, now);
        }
    }

    fn handle(&mut self, now: f64, e: Event) {
        match e {
            Event::ComputeDone { device, task } => {
                self.devices[device].busy = false;
                self.finish(device, task, now);
                self.wake(device);
            }
            Event::CollectiveDone { instance } => {
                let members = self.instances[instance].members.clone();
                for (d, t) in members {
                    self.finish(d, t, now);
                    if self.devices[d].blocked == Some(t) {
                        self.close_wait(d, self.devices[d].arrived[t], now, t);
                        let dev = &mut self.devices[d];
                        dev.blocked = None;
                        dev.next += 1;
                        dev.compute_end = now;
                    }
                    self.wake(d);
                }
                self.comm_dirty = true;
            }
        }
    }

    /// The compute stream of `d` waited from `t0` to `t1` for collective task `c`: its spans.
    fn close_wait(&mut self, d: usize, t0: f64, t1: f64, c: usize) {
        if t1 <= t0 {
            return;
        }
        let dev = &self.devices[d];
        let task = &dev.tasks[c];
        let inst = &self.instances[dev.instance[c].expect("a collective")];
        let (own, group, start, launched) = (dev.arrived[c], inst.group_ready, inst.start, inst.start + inst.launch_s);
        // Cut at every point where the reason changes; name each piece by what it waits on.
        let mut cuts: Vec<f64> = [t0, own, group, start, launched, t1]
            .into_iter()
            .filter(|&x| x >= t0 && x <= t1)
            .collect();
        cuts.sort_by(f64::total_cmp);
        cuts.dedup();
        let collectives = Category::Collectives.name();
        let mut pieces: Vec<(f64, f64, &'static str, f64)> = vec![];
        for w in cuts.windows(2) {
            let (a, b) = (w[0], w[1]);
            let mid = 0.5 * (a + b);
            let (cat, launch) = if mid >= own && mid < group {
                (IDLE, 0.0)
            } else if mid >= start && mid < launched {
                (collectives, b - a)
            } else {
                (collectives, 0.0)
            };
            match pieces.last_mut() {
                Some(p) if p.2 == cat => {
                    p.1 = b;
                    p.3 += launch;
                }
                _ => pieces.push((a, b, cat, launch)),
            }
        }
        let spans: Vec<Span> = pieces
            .into_iter()
            .map(|(a, b, cat, launch)| wait_span(a, b, cat, launch, Ok(task)))
            .collect();
        self.devices[d].out.compute.extend(spans);
    }

    fn start_compute(&mut self, d: usize, t: usize, now: f64) {
        if let Some(since) = self.devices[d].idle_since.take() {
            if now > since {
                // The op's last operand to arrive is what it waited for: a collective.
                let dev = &self.devices[d];
                let last = dev.tasks[t]
                    .deps
                    .iter()
                    .copied()
                    .max_by(|&a, &b| dev.finish[a].total_cmp(&dev.finish[b]));
                match last.filter(|&c| dev.instance[c].is_some()) {
                    Some(c) => self.close_wait(d, since, now, c),
                    None => {
                        let span = wait_span(since, now, IDLE, 0.0, Err("wait"));
                        self.devices[d].out.compute.push(span);
                    }
                }
            }
        }
        let task = &self.devices[d].tasks[t];
        let dur = task.launch_s + task.work_s;
        if dur > 0.0 {
            let span = Span {
                start_ms: now * MS,
                dur_ms: dur * MS,
                kind: SpanKind::Op,
                category: task.category.name(),
                launch_ms: task.launch_s * MS,
                instr: Some(task.instr),
                name: task.name,
            };
            self.devices[d].out.compute.push(span);
        }
        let dev = &mut self.devices[d];
        dev.busy = true;
        dev.compute_end = now + dur;
        self.push(now + dur, Event::ComputeDone { device: d, task: t });
    }

    /// Starts what can start at `now`: each woken device's next op (which, without overlap, may
    /// be a collective it arrives at), then the collectives whose groups are all there and whose
    /// members' communication streams are free.
    fn progress(&mut self, now: f64) {
        while let Some(d) = self.wake.pop() {
            self.woken[d] = false;
            let dev = &mut self.devices[d];
            if dev.busy || dev.blocked.is_some() {
                continue;
            }
            if self.overlap {
                match dev.ready.pop() {
                    Some(Reverse(t)) => self.start_compute(d, t, now),
                    None => {
                        dev.idle_since.get_or_insert(now);
                    }
                }
                continue;
            }
            let t = dev.next;
            if t == dev.tasks.len() {
                continue;
            }
            if dev.instance[t].is_some() {
                dev.blocked = Some(t);
                self.arrive(d, t, now);
            } else {
                dev.next += 1;
                self.start_compute(d, t, now);
            }
        }
        if self.comm_dirty {
            self.comm_dirty = false;
            let candidates: Vec<(T, usize, usize)> = self.waiting.iter().copied().collect();
            for entry in candidates {
                let i = entry.2;
                let free = self.instances[i]
                    .members
                    .iter()
                    .all(|&(d, _)| self.devices[d].comm_free <= now);
                if !free {
                    continue;
                }
                self.waiting.remove(&entry);
                self.instances[i].start = now;
                let inst = &self.instances[i];
                let done = inst.done();
                for &(d, t) in &inst.members {
                    let task = &self.devices[d].tasks[t];
                    let span = Span {
                        start_ms: now * MS,
                        dur_ms: (done - now) * MS,
                        kind: SpanKind::Op,
                        category: task.category.name(),
                        launch_ms: inst.launch_s * MS,
                        instr: Some(task.instr),
                        name: task.name,
                    };
                    let dev = &mut self.devices[d];
                    dev.comm_free = done;
                    dev.out.comm.push(span);
                }
                self.push(done, Event::CollectiveDone { instance: i });
            }
        }
    }
}

/// Places `work` in time, with asynchronous collectives overlapping later compute or not.
pub fn schedule(work: &StepWork, overlap: bool) -> Result<Timeline, ScheduleError> {
    let n = work.devices.len();
    // Which group of each grouping every device is in.
    let group_of: Vec<Vec<Option<usize>>> = work
        .groupings
        .iter()
        .map(|groups| {
            let mut of = vec![None; n];
            for (g, members) in groups.iter().enumerate() {
                for &d in members {
                    if d < n {
                        of[d] = Some(g);
                    }
                }
            }
            of
        })
        .collect();
    // Consumers are the same for devices that share their tasks.
    let mut consumers_of: HashMap<*const Task, Vec<Vec<usize>>> = HashMap::new();
    let mut devices = Vec::with_capacity(n);
    let mut instances: Vec<Instance> = vec![];
    let mut by_key: HashMap<(usize, usize, usize), usize> = HashMap::new();
    for (d, w) in work.devices.iter().enumerate() {
        let tasks: &[Task] = &w.tasks;
        for (t, task) in tasks.iter().enumerate() {
            if let Some(&dep) = task.deps.iter().find(|&&p| p >= t) {
                return Err(ScheduleError::DependencyOrder {
                    device: d,
                    label: w.label.clone(),
                    task: t,
                    dep,
                });
            }
        }
        let consumers = consumers_of
            .entry(tasks.as_ptr())
            .or_insert_with(|| {
                let mut c = vec![vec![]; tasks.len()];
                for (t, task) in tasks.iter().enumerate() {
                    for &p in &task.deps {
                        c[p].push(t);
                    }
                }
                c
            })
            .clone();
        let mut instance = vec![None; tasks.len()];
        for (t, task) in tasks.iter().enumerate() {
            let Some(x) = task.exchange else { continue };
            let g = group_of
                .get(x.grouping)
                .and_then(|of| of[d])
                .ok_or(ScheduleError::NoGroup {
                    key: x.key,
                    grouping: x.grouping,
                    device: d,
                })?;
            let i = *by_key.entry((x.key, x.grouping, g)).or_insert_with(|| {
                instances.push(Instance {
                    key: x.key,
                    members: vec![],
                    arrived: 0,
                    group_ready: 0.0,
                    start: 0.0,
                    launch_s: 0.0,
                    work_s: 0.0,
                });
                instances.len() - 1
            });
            let inst = &mut instances[i];
            inst.members.push((d, t));
            inst.launch_s = inst.launch_s.max(task.launch_s);
            inst.work_s = inst.work_s.max(task.work_s);
            instance[t] = Some(i);
        }
        devices.push(Device {
            tasks,
            missing: tasks.iter().map(|t| t.deps.len() as u32).collect(),
            consumers,
            finish: vec![f64::NAN; tasks.len()],
            instance,
            arrived: vec![0.0; tasks.len()],
            ready: BinaryHeap::new(),
            next: 0,
            busy: false,
            blocked: None,
            idle_since: None,
            compute_end: work.step_s,
            comm_free: work.step_s,
            finished: 0,
            out: DeviceTimeline {
                label: w.label.clone(),
                program: w.program,
                compute: vec![],
                comm: vec![],
            },
        });
    }
    // Every member of a collective's group takes part in it.
    for (&(key, grouping, g), &i) in &by_key {
        let group = &work.groupings[grouping][g];
        let present: Vec<usize> = instances[i].members.iter().map(|m| m.0).collect();
        let missing: Vec<usize> = group.iter().copied().filter(|d| !present.contains(d)).collect();
        if !missing.is_empty() {
            return Err(ScheduleError::Unmatched { key, missing });
        }
    }
    let mut sim = Sim {
        overlap,
        devices,
        instances,
        waiting: BTreeSet::new(),
        comm_dirty: false,
        wake: vec![],
        woken: vec![false; n],
        events: BinaryHeap::new(),
        seq: 0,
    };
    let start = work.step_s;
    for d in 0..n {
        if start > 0.0 {
            sim.devices[d].out.compute.push(Span {
                start_ms: 0.0,
                dur_ms: start * MS,
                kind: SpanKind::Step,
                category: super::price::LAUNCH,
                launch_ms: start * MS,
                instr: None,
                name: "step",
            });
        }
        for t in 0..sim.devices[d].tasks.len() {
            if sim.devices[d].missing[t] == 0 {
                sim.on_ready(d, t, start);
            }
        }
        sim.wake(d);
    }
    sim.progress(start);
    while let Some(Reverse((T(now), _, e))) = sim.events.pop() {
        sim.handle(now, e);
        while let Some(Reverse((T(next), _, _))) = sim.events.peek() {
            if *next != now {
                break;
            }
            let Some(Reverse((_, _, e))) = sim.events.pop() else {
                break;
            };
            sim.handle(now, e);
        }
        sim.progress(now);
    }
    for (d, dev) in sim.devices.iter().enumerate() {
        if dev.finished < dev.tasks.len() {
            let task = (0..dev.tasks.len()).find(|&t| dev.finish[t].is_nan()).unwrap_or(0);
            return Err(ScheduleError::Deadlock {
                device: d,
                label: dev.out.label.clone(),
                task,
            });
        }
    }
    let end = sim
        .devices
        .iter()
        .map(|d| d.compute_end.max(d.comm_free))
        .fold(start, f64::max);
    // Each compute stream waits out the step: for its own last collectives, then for the others.
    for d in 0..n {
        let dev = &sim.devices[d];
        let from = dev.compute_end;
        let last = (0..dev.tasks.len())
            .filter(|&t| dev.instance[t].is_some())
            .max_by(|&a, &b| dev.finish[a].total_cmp(&dev.finish[b]));
        let mut at = from;
        if let Some(c) = last {
            let done = dev.finish[c];
            if done > from {
                sim.close_wait(d, from, done, c);
                at = done;
            }
        }
        if end > at {
            let span = wait_span(at, end, IDLE, 0.0, Err("step end"));
            sim.devices[d].out.compute.push(span);
        }
    }
    Ok(Timeline {
        kind: "modelled",
        device: String::new(),
        overlap,
        comm_stream: true,
        step_ms: end * MS,
        devices: sim.devices.into_iter().map(|d| d.out).collect(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::exec::{Parallel, TrainerOptions};
    use crate::ir::RngLayout;
    use crate::plan::Strategy;
    use crate::profile::collective::CollectiveKind;
    use crate::profile::device::{h100, tpu_v4};
    use crate::profile::predict::model_step;
    use crate::profile::price::{price_ops, LAUNCH};
    use crate::profile::timeline::{DeviceWork, Exchange};
    use crate::profile::work::Placement;
    use crate::sharding::Mesh;

    fn options(strategy: Strategy, mesh: &str, auto: bool, rng_layout: RngLayout) -> TrainerOptions {
        let mesh = Mesh::parse(mesh).unwrap();
        let parallel = if auto {
            Parallel::Auto {
                par: strategy.compose(&mesh).unwrap(),
                specs: vec![],
            }
        } else {
            Parallel::ShardMap {
                par: strategy.compose(&mesh).unwrap(),
                dropout_key: crate::plan::DropoutKey::Same,
            }
        };
        TrainerOptions {
            rng_layout,
            ..TrainerOptions::new(crate::plan::Preset::Seed.config(), parallel)
        }
    }

    fn program(strategy: Strategy, mesh: &str, auto: bool) -> crate::ir::Program {
        crate::plan::build(&options(strategy, mesh, auto, RngLayout::Original))
            .unwrap()
            .step
            .program
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn every_compute_track_covers_the_step_and_sums_to_the_breakdown() {
        for (strategy, mesh) in [
            (Strategy::Dp, "dp=4"),
            (Strategy::Fsdp, "dp=4"),
            (Strategy::DpTp, "dp=2,tp=2"),
        ] {
            for auto in [true, false] {
                let prog = program(strategy, mesh, auto);
                for overlap in [true, false] {
                    let (p, t) = model_step(&prog, &tpu_v4(), Placement::Real, overlap);
                    assert_eq!(t.devices.len(), 4);
                    assert!(close(t.step_ms, p.step_ms));
                    for (d, dev) in t.devices.iter().enumerate() {
                        // Back to back from 0 to the step's end.
                        let mut at = 0.0;
                        for s in &dev.compute {
                            assert!((s.start_ms - at).abs() < 1e-9, "{strategy:?} {d}: gap before {s:?}");
                            at = s.end_ms();
                        }
                        assert!(
                            close(at, p.step_ms),
                            "{strategy:?} auto={auto} overlap={overlap}: {at} vs {}",
                            p.step_ms
                        );
                        let sum: f64 = t.device_breakdown_ms(d).values().sum();
                        assert!(close(sum, p.step_ms));
                        // The comm stream never holds two collectives at once.
                        for w in dev.comm.windows(2) {
                            assert!(w[1].start_ms >= w[0].end_ms() - 1e-9);
                        }
                    }
                    // The category sums of the spans are the breakdown.
                    let mut sums: std::collections::BTreeMap<&str, f64> = Default::default();
                    for s in &t.devices[0].compute {
                        *sums.entry(s.category).or_default() += s.dur_ms - s.launch_ms;
                        *sums.entry(LAUNCH).or_default() += s.launch_ms;
                    }
                    for (k, v) in &p.breakdown_ms {
                        assert!(close(*v, sums.get(k).copied().unwrap_or(0.0)), "{k}: {v} vs {sums:?}");
                    }
                    assert!(
                        p.breakdown_ms["idle"].abs() < 1e-9,
                        "SPMD devices never wait for each other"
                    );
                }
            }
        }
    }

    #[test]
    fn without_overlap_the_step_is_the_sum_of_every_op() {
        for (strategy, mesh) in [(Strategy::Dp, "dp=8"), (Strategy::Fsdp, "dp=4"), (Strategy::Tp, "tp=2")] {
            for auto in [true, false] {
                let prog = program(strategy, mesh, auto);
                for device in [tpu_v4(), h100()] {
                    let ops = price_ops(&prog, &device, Placement::Real);
                    let sum_ms = 1e3 * (device.step_s + ops.iter().map(|o| o.launch_s + o.work_s).sum::<f64>());
                    let (p, _) = model_step(&prog, &device, Placement::Real, false);
                    assert!(close(p.step_ms, sum_ms), "{} vs {sum_ms}", p.step_ms);
                    assert!(close(p.serial_ms, sum_ms));
                    // Category by category, as the op-by-op sum puts it.
                    let coll: f64 = 1e3
                        * ops
                            .iter()
                            .filter(|o| o.collective.is_some())
                            .map(|o| o.work_s)
                            .sum::<f64>();
                    let launch: f64 = 1e3 * (device.step_s + ops.iter().map(|o| o.launch_s).sum::<f64>());
                    assert!(close(p.breakdown_ms["collectives"], coll));
                    assert!(close(p.breakdown_ms[LAUNCH], launch));
                }
            }
        }
    }

    #[test]
    fn data_parallel_all_reduces_hide_behind_the_backward_pass() {
        for auto in [true, false] {
            for device in [tpu_v4(), h100()] {
                let prog = program(Strategy::Dp, "dp=8", auto);
                let (on, t) = model_step(&prog, &device, Placement::Real, true);
                let (off, _) = model_step(&prog, &device, Placement::Real, false);
                assert!(on.step_ms <= off.step_ms + 1e-9);
                assert!(
                    on.step_ms < off.step_ms - 1e-6,
                    "auto={auto} {}: {} vs {}",
                    device.name,
                    on.step_ms,
                    off.step_ms
                );
                assert!(on.breakdown_ms["collectives"] < off.breakdown_ms["collectives"]);
                // Some all-reduce runs while the compute stream runs an op.
                let dev = &t.devices[0];
                let busy = |at: f64| {
                    dev.compute
                        .iter()
                        .any(|s| s.kind == SpanKind::Op && s.start_ms <= at && at < s.end_ms())
                };
                assert!(dev.comm.iter().any(|c| busy(c.start_ms + 0.5 * c.dur_ms)));
            }
        }
    }

    #[test]
    fn fsdp_all_gathers_run_ahead_of_their_use() {
        let prog = program(Strategy::Fsdp, "dp=4", false);
        let (on, t) = model_step(&prog, &tpu_v4(), Placement::Real, true);
        let (off, _) = model_step(&prog, &tpu_v4(), Placement::Real, false);
        assert!(on.step_ms < off.step_ms);
        // The second all-gather is done before the compute stream first needs it.
        let dev = &t.devices[0];
        let gathers: Vec<&Span> = dev.comm.iter().filter(|s| s.name == "all_gather").collect();
        assert!(gathers.len() > 2);
        let first_wait = |instr: usize| {
            dev.compute
                .iter()
                .find(|s| s.kind == SpanKind::Wait && s.instr == Some(instr))
        };
        assert!(
            first_wait(gathers[1].instr.unwrap()).is_none(),
            "{:?}",
            dev.compute.iter().take(6).collect::<Vec<_>>()
        );
    }

    fn task(name: &'static str, work_s: f64, deps: Vec<usize>, exchange: Option<Exchange>) -> Task {
        Task {
            instr: 0,
            name,
            category: if exchange.is_some() {
                Category::Collectives
            } else {
                Category::Matmul
            },
            launch_s: 0.0,
            work_s,
            deps,
            exchange,
        }
    }

    fn psum(key: usize) -> Option<Exchange> {
        Some(Exchange {
            kind: CollectiveKind::AllReduce,
            key,
            grouping: 0,
        })
    }

    /// Two devices: compute `a` seconds, a psum of 1 s, then 1 s that reads its result.
    fn two(a: [f64; 2]) -> StepWork {
        let device = |d: usize| DeviceWork {
            label: format!("dp={d}"),
            program: 0,
            tasks: Arc::from(vec![
                task("dot_general", a[d], vec![], None),
                task("psum", 1.0, vec![0], psum(7)),
                task("dot_general", 1.0, vec![1], None),
            ]),
        };
        StepWork {
            devices: vec![device(0), device(1)],
            groupings: vec![vec![vec![0, 1]]],
            step_s: 0.0,
        }
    }

    #[test]
    fn a_collective_starts_when_its_whole_group_is_ready_and_the_early_device_idles() {
        let t = schedule(&two([1.0, 3.0]), true).unwrap();
        assert!(close(t.step_ms, 5000.0), "{}", t.step_ms);
        for d in &t.devices {
            assert_eq!(d.comm.len(), 1);
            assert!(close(d.comm[0].start_ms, 3000.0));
        }
        // Device 0 waits 2 s for device 1 (idle), then 1 s for the transfer.
        let b = t.device_breakdown_ms(0);
        assert!(close(b[IDLE], 2000.0) && close(b["collectives"], 1000.0), "{b:?}");
        let b = t.device_breakdown_ms(1);
        assert!(close(b[IDLE], 0.0) && close(b["collectives"], 1000.0), "{b:?}");
        let waits: Vec<&Span> = t.devices[0]
            .compute
            .iter()
            .filter(|s| s.kind == SpanKind::Wait)
            .collect();
        assert_eq!(
            waits.iter().map(|s| s.category).collect::<Vec<_>>(),
            [IDLE, "collectives"]
        );
        assert!(waits.iter().all(|s| s.name == "psum"));
    }

    #[test]
    fn the_device_that_ends_first_waits_out_the_step() {
        let mut w = two([1.0, 1.0]);
        // Device 1 has 2 s more to do after the psum.
        let mut tasks = w.devices[1].tasks.to_vec();
        tasks.push(task("gelu", 2.0, vec![2], None));
        w.devices[1].tasks = tasks.into();
        let t = schedule(&w, true).unwrap();
        assert!(close(t.step_ms, 5000.0));
        let last = t.devices[0].compute.last().unwrap();
        assert_eq!(
            (last.kind, last.category, last.name),
            (SpanKind::Wait, IDLE, "step end")
        );
        assert!(close(last.dur_ms, 2000.0));
    }

    #[test]
    fn a_point_to_point_transfer_is_a_group_of_two_and_the_later_stage_idles_first() {
        // Three stages: 0 sends to 1 (grouping 0: [[0, 1]]), 1 sends to 2 (grouping 1: [[1, 2]]).
        let send = |key: usize, grouping: usize| {
            Some(Exchange {
                kind: CollectiveKind::CollectivePermute,
                key,
                grouping,
            })
        };
        let ppermute = |key, grouping, deps| task("ppermute", 0.5, deps, send(key, grouping));
        let stage0 = vec![task("dot_general", 1.0, vec![], None), ppermute(1, 0, vec![0])];
        let stage1 = vec![
            ppermute(1, 0, vec![]),
            task("dot_general", 1.0, vec![0], None),
            ppermute(2, 1, vec![1]),
        ];
        let stage2 = vec![ppermute(2, 1, vec![]), task("dot_general", 1.0, vec![0], None)];
        let w = StepWork {
            devices: [stage0, stage1, stage2]
                .into_iter()
                .enumerate()
                .map(|(d, tasks)| DeviceWork {
                    label: format!("pp={d}"),
                    program: d,
                    tasks: tasks.into(),
                })
                .collect(),
            groupings: vec![vec![vec![0, 1]], vec![vec![1, 2]]],
            step_s: 0.0,
        };
        let t = schedule(&w, true).unwrap();
        // 1 s on stage 0, 0.5 s transfer, 1 s on stage 1, 0.5 s transfer, 1 s on stage 2.
        assert!(close(t.step_ms, 4000.0), "{}", t.step_ms);
        let idle = |d: usize| t.device_breakdown_ms(d)[IDLE];
        // Stage 2 waits 1.5 s for its peer to reach the second transfer, stage 0 waits out the
        // last 2.5 s, stage 1 waits 1 s for stage 0, then the end of stage 2.
        assert!(close(idle(2), 2500.0), "{}", idle(2));
        assert!(close(idle(0), 2500.0), "{}", idle(0));
        assert!(close(idle(1), 2000.0), "{}", idle(1));
        assert_eq!(t.devices[1].program, 1);
    }

    #[test]
    fn collectives_that_do_not_match_across_devices_are_refused() {
        let mut w = two([1.0, 1.0]);
        w.devices[1].tasks = Arc::from(vec![task("dot_general", 1.0, vec![], None)]);
        assert!(matches!(
            schedule(&w, true),
            Err(ScheduleError::Unmatched { key: 7, .. })
        ));
        let mut w = two([1.0, 1.0]);
        w.devices[0].tasks = Arc::from(vec![task("dot_general", 1.0, vec![0], None)]);
        assert!(matches!(
            schedule(&w, false),
            Err(ScheduleError::DependencyOrder { .. })
        ));
    }
}
