//! The step as a timeline: a row per device, each with a compute stream and a communication
//! stream, spans coloured by category, waits as spans of their own. What a device runs is
//! [`StepWork`] (tasks with their costs and dependencies, collectives matched across devices by a
//! key); [`super::schedule`] places it; [`spmd_work`] builds it for a per-device (SPMD) program
//! priced by the cost model, the same program on every device.
//!
//! Every device's compute track covers the whole step, from 0 to the step's end, with no gap:
//! the step's fixed cost, its ops, and waits. So the sum of one device's compute spans is the
//! step, and its breakdown by category ([`Timeline::device_breakdown_ms`]) is those spans
//! summed by category.
//!
//! Devices that do different work (pipeline stages, an unbalanced causal ring) get a
//! [`StepWork`] built for them instead of [`spmd_work`]: one [`DeviceWork`] per device with its
//! own tasks (its own `Arc`, or a stage's shared by the devices of that stage), `program`
//! pointing at that device's program among the trace's sources, and per-device costs in
//! `launch_s` / `work_s`. A collective is matched across devices by its [`Exchange::key`]
//! within the group its `grouping` puts the device in: every member must carry a task with that
//! key, and it runs as long as its slowest member's figures. A point-to-point transfer between
//! two stages is a grouping of its own (`[[s, s + 1]]`, the other devices in no group of it).
//! The bubble then shows up as `idle` waits, per device.
use std::collections::BTreeMap;
use std::sync::Arc;

use super::collective::CollectiveKind;
use super::cost::{category, Category};
use super::device::DeviceProfile;
use super::price::{price_ops, LAUNCH};
use super::work::Placement;
use crate::ir::{Op, Owner, Program};
use crate::sharding::Mesh;

/// The breakdown's bucket for waiting on other devices: a collective whose group is not all
/// there yet (a pipeline's bubble), or the end of a step another device is still running.
pub const IDLE: &str = "idle";

/// One instruction's work on one device.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    /// The instruction of the device's program it runs.
    pub instr: usize,
    /// Its op, as the program prints it (`dot_general`, `psum`).
    pub name: &'static str,
    pub category: Category,
    /// Seconds of its kernel launches.
    pub launch_s: f64,
    /// Seconds of its work beyond the launches (a collective: its transfer).
    pub work_s: f64,
    /// Earlier tasks of the same device whose results it reads (indices into its tasks).
    pub deps: Vec<usize>,
    /// Set for a collective between devices: it runs on the communication stream.
    pub exchange: Option<Exchange>,
}

/// A collective as one device takes part in it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Exchange {
    pub kind: CollectiveKind,
    /// Names the same collective on every device of its group (in an SPMD program, its
    /// instruction).
    pub key: usize,
    /// Which of [`StepWork::groupings`] splits the devices into this collective's groups.
    pub grouping: usize,
}

/// What one device runs, in its program order (every dependency points backwards).
#[derive(Clone, Debug)]
pub struct DeviceWork {
    /// The row's label: the device's mesh coordinates (`dp=1, tp=0`).
    pub label: String,
    /// Which program its tasks' instructions index (0 for an SPMD program, which every device
    /// runs): a trace reads op names and shapes from it.
    pub program: usize,
    /// Shared between devices that run the same tasks at the same costs.
    pub tasks: Arc<[Task]>,
}

/// A step's work on every device.
#[derive(Clone, Debug)]
pub struct StepWork {
    pub devices: Vec<DeviceWork>,
    /// The ways collectives split the devices into groups (one per set of mesh axes the
    /// collectives use), each a list of groups of device indices, as `Mesh::axis_groups` forms them.
    pub groupings: Vec<Vec<Vec<usize>>>,
    /// Seconds of the fixed cost every device pays at the start of the step.
    pub step_s: f64,
}

impl StepWork {
    /// One row per distinct task list (devices sharing an `Arc`: a pipeline stage's over "dp"),
    /// the lowest device of each, with every grouping cut down to those rows; and per device,
    /// its row. Devices that share tasks meet every collective together and so run the same
    /// timeline: scheduling one of them schedules all. Valid where the devices that share
    /// tasks differ only along axes whose collectives group them with each other, as the
    /// mesh's axes do for a pipeline's stages.
    pub fn classes(&self) -> (StepWork, Vec<usize>) {
        let mut reps: Vec<usize> = vec![];
        let mut of = vec![];
        for (d, dev) in self.devices.iter().enumerate() {
            match reps
                .iter()
                .position(|&r| Arc::ptr_eq(&self.devices[r].tasks, &dev.tasks))
            {
                Some(c) => of.push(c),
                None => {
                    of.push(reps.len());
                    reps.push(d);
                }
            }
        }
        let row_of = |d: usize| reps.iter().position(|&r| r == d);
        let groupings = self
            .groupings
            .iter()
            .map(|groups| {
                groups
                    .iter()
                    .map(|g| g.iter().filter_map(|&d| row_of(d)).collect::<Vec<_>>())
                    .filter(|g| !g.is_empty())
                    .collect()
            })
            .collect();
        let work = StepWork {
            devices: reps.iter().map(|&r| self.devices[r].clone()).collect(),
            groupings,
            step_s: self.step_s,
        };
        (work, of)
    }
}

/// What a span of a track is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    /// The step's fixed cost.
    Step,
    /// An instruction running (on the communication stream: a collective in flight).
    Op,
    /// The compute stream waiting: for a collective (its instruction is named), or for the
    /// other devices to end the step (no instruction).
    Wait,
    /// A measured step's one submission.
    Submit,
}

/// One span of a track, times in milliseconds from the step's start.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Span {
    pub start_ms: f64,
    pub dur_ms: f64,
    pub kind: SpanKind,
    /// The breakdown's bucket: a category's name, `launch` (the step's fixed cost), `idle`, or
    /// `submit` (measured).
    pub category: &'static str,
    /// Of `dur_ms`, the part that is launch overhead (its kernel launches; of a wait, the
    /// awaited collective's launch it did not hide); the breakdown counts it as `launch`.
    pub launch_ms: f64,
    /// The instruction it runs or waits for.
    pub instr: Option<usize>,
    /// Its op's name, or what it waits for (`psum`; `step end`).
    pub name: &'static str,
}

impl Span {
    pub fn end_ms(&self) -> f64 {
        self.start_ms + self.dur_ms
    }
}

/// One device's row.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DeviceTimeline {
    pub label: String,
    pub program: usize,
    /// Covers the whole step without a gap.
    pub compute: Vec<Span>,
    /// Collectives in flight (empty where the device has no separate communication stream).
    pub comm: Vec<Span>,
}

/// A step laid out in time, per device.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Timeline {
    /// `modelled` or `measured`.
    pub kind: &'static str,
    /// What it ran on (`4 x TPU v4`, the adapter's name).
    pub device: String,
    /// Whether asynchronous collectives overlapped later independent compute.
    pub overlap: bool,
    /// Whether its rows have a communication stream besides compute (real devices do; one
    /// adapter runs everything in one queue).
    pub comm_stream: bool,
    pub step_ms: f64,
    pub devices: Vec<DeviceTimeline>,
}

impl Timeline {
    /// One device's compute spans summed by category (launch parts as `launch`); they add up
    /// to the step. Every category, `launch` and `idle` is present.
    pub fn device_breakdown_ms(&self, device: usize) -> BTreeMap<&'static str, f64> {
        let mut out = empty_breakdown();
        for s in &self.devices[device].compute {
            *out.entry(s.category).or_insert(0.0) += s.dur_ms - s.launch_ms;
            *out.get_mut(LAUNCH).expect("launch bucket") += s.launch_ms;
        }
        out
    }

    /// The devices' breakdowns, averaged: what one device spends per category. It adds up to
    /// the step; on an SPMD program every device's is the same.
    pub fn breakdown_ms(&self) -> BTreeMap<&'static str, f64> {
        self.breakdown_ms_of(&vec![1; self.devices.len()])
    }

    /// [`Timeline::breakdown_ms`] where row r stands for `counts[r]` devices (a timeline of
    /// [`StepWork::classes`]' rows, before [`Timeline::by_class`] lays them out).
    pub fn breakdown_ms_of(&self, counts: &[usize]) -> BTreeMap<&'static str, f64> {
        let mut out = empty_breakdown();
        let n = counts.iter().sum::<usize>().max(1) as f64;
        for (d, &count) in counts.iter().enumerate() {
            for (k, v) in self.device_breakdown_ms(d) {
                *out.entry(k).or_insert(0.0) += v * count as f64 / n;
            }
        }
        out
    }

    /// The rows of `classes` ([`StepWork::classes`]) laid out for every device: device d gets
    /// row `of[d]`, under its own label.
    pub fn by_class(mut self, of: &[usize], labels: &[String]) -> Timeline {
        let rows = std::mem::take(&mut self.devices);
        self.devices = of
            .iter()
            .zip(labels)
            .map(|(&c, label)| DeviceTimeline {
                label: label.clone(),
                ..rows[c].clone()
            })
            .collect();
        self
    }

    /// Milliseconds of the communication stream's spans of instructions `which` picks, and the
    /// part of them the compute stream spent running ops (hidden behind compute), averaged over
    /// the devices: how much of ring attention's permutes the blocks' attention hides.
    pub fn comm_hidden_ms(&self, which: impl Fn(usize) -> bool) -> (f64, f64) {
        self.comm_hidden_ms_of(&vec![1; self.devices.len()], which)
    }

    /// [`Timeline::comm_hidden_ms`] where row r stands for `counts[r]` devices.
    pub fn comm_hidden_ms_of(&self, counts: &[usize], which: impl Fn(usize) -> bool) -> (f64, f64) {
        let (mut total, mut hidden) = (0.0, 0.0);
        for (d, &count) in self.devices.iter().zip(counts) {
            let weight = count as f64;
            let mut busy = None;
            for c in d.comm.iter().filter(|c| c.instr.is_some_and(&which)) {
                total += weight * c.dur_ms;
                let busy = busy.get_or_insert_with(|| OpTime::of(&d.compute));
                let during = busy.until(c.end_ms()) - busy.until(c.start_ms);
                // Spans that only touch differ by rounding: no overlap.
                if during > 1e-9 {
                    hidden += weight * during;
                }
            }
        }
        let n = counts.iter().sum::<usize>().max(1) as f64;
        (total / n, hidden / n)
    }

    /// Spans on every track.
    pub fn spans(&self) -> usize {
        self.devices.iter().map(|d| d.compute.len() + d.comm.len()).sum()
    }
}

/// A compute track's time spent running ops up to any moment, by binary search over its
/// spans' running sums: what a collective overlaps costs a lookup at each end, where walking
/// the spans it overlaps cost a pipeline's or an FSDP gather's long spans most of a plan.
struct OpTime<'a> {
    /// The track, in time order.
    spans: &'a [Span],
    /// `before[i]`: op milliseconds of `spans[..i]`.
    before: Vec<f64>,
}

impl<'a> OpTime<'a> {
    fn of(spans: &'a [Span]) -> Self {
        let mut before = Vec::with_capacity(spans.len() + 1);
        let mut sum = 0.0;
        before.push(sum);
        for s in spans {
            if s.kind == SpanKind::Op {
                sum += s.dur_ms;
            }
            before.push(sum);
        }
        OpTime { spans, before }
    }

    /// Op milliseconds before `t`: the spans that end by then, and the part of the one running.
    fn until(&self, t: f64) -> f64 {
        let i = self.spans.partition_point(|s| s.end_ms() <= t);
        let running = self
            .spans
            .get(i)
            .filter(|s| s.kind == SpanKind::Op && s.start_ms < t)
            .map_or(0.0, |s| t - s.start_ms);
        self.before[i] + running
    }
}

/// Every category, `launch` and `idle` at 0 ms.
pub(crate) fn empty_breakdown() -> BTreeMap<&'static str, f64> {
    let mut out: BTreeMap<&'static str, f64> = Category::ALL.iter().map(|c| (c.name(), 0.0)).collect();
    out.insert(LAUNCH, 0.0);
    out.insert(IDLE, 0.0);
    out
}

/// The row label of `device` on `mesh`: its coordinates, `dp=1, tp=0`.
pub fn mesh_label(mesh: &Mesh, device: usize) -> String {
    let coords = mesh.device_coords(device).unwrap_or_default();
    mesh.axes()
        .iter()
        .zip(coords)
        .map(|((name, _), c)| format!("{name}={c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The mesh axes a collective runs over.
fn collective_axes(op: &Op) -> Vec<&str> {
    match op {
        Op::Psum { axes, .. }
        | Op::AllGather { axes, .. }
        | Op::PsumScatter { axes, .. }
        | Op::AllToAll { axes, .. } => axes.iter().map(String::as_str).collect(),
        Op::Ppermute { axis, .. } => vec![axis.as_str()],
        _ => vec![],
    }
}

/// The tasks of `prog` (a per-device program) priced on `device`: one per instruction, each
/// reading the instructions that define its operands. On real devices a collective runs on the
/// communication stream; simulated, it is one more kernel in the adapter's one queue.
fn tasks(prog: &Program, device: &DeviceProfile, placement: Placement) -> (Vec<Task>, Vec<Vec<Vec<usize>>>) {
    let mut producer = vec![usize::MAX; prog.values.len()];
    for (i, ins) in prog.instrs.iter().enumerate() {
        for v in &ins.outputs {
            producer[v.index()] = i;
        }
    }
    let mut axes_seen: Vec<Vec<&str>> = vec![];
    let mut groupings = vec![];
    let mut out = Vec::with_capacity(prog.instrs.len());
    for (op, ins) in price_ops(prog, device, placement).into_iter().zip(&prog.instrs) {
        let mut deps: Vec<usize> = ins
            .inputs
            .iter()
            .map(|v| producer[v.index()])
            .filter(|&p| p != usize::MAX)
            .collect();
        deps.sort_unstable();
        deps.dedup();
        let exchange = match (&op.collective, placement, &prog.mesh) {
            (Some((kind, _, _)), Placement::Real, Some(mesh)) => {
                let axes = collective_axes(&ins.op);
                let grouping = match axes_seen.iter().position(|a| *a == axes) {
                    Some(g) => g,
                    None => {
                        // The program's collectives name mesh axes the partitioner checked.
                        groupings.push(mesh.axis_groups(&axes).expect("a collective's axes are mesh axes"));
                        axes_seen.push(axes);
                        axes_seen.len() - 1
                    }
                };
                Some(Exchange {
                    kind: *kind,
                    key: op.instr,
                    grouping,
                })
            }
            _ => None,
        };
        out.push(Task {
            instr: op.instr,
            name: ins.op.name(),
            category: category(ins),
            launch_s: op.launch_s,
            work_s: op.work_s,
            deps,
            exchange,
        });
    }
    (out, groupings)
}

/// Per device, the share of each attention task's work it does (its (query, key) pairs over the
/// busiest device's, which the task is priced at), where context parallelism makes them differ.
fn attention_shares(prog: &Program) -> Option<Vec<Vec<(usize, f64)>>> {
    let devices = prog.devices();
    let mut shares = vec![vec![]; devices];
    let mut differ = false;
    for (i, ins) in prog.instrs.iter().enumerate() {
        if !matches!(ins.op, Op::Attention { .. } | Op::AttentionGrad { .. }) {
            continue;
        }
        let pairs = super::cost::attention_pairs(prog, ins);
        let max = pairs.iter().copied().max().unwrap_or(0).max(1) as f64;
        for (d, p) in pairs.iter().enumerate() {
            differ |= *p as f64 != max;
            shares[d].push((i, *p as f64 / max));
        }
    }
    differ.then_some(shares)
}

/// Each device's shares of its tasks' work where devices differ: a causal ring's attention
/// ([`attention_shares`]) and a mixture's expert work at the rows routed
/// ([`super::expert_shares`]).
fn work_shares(prog: &Program) -> Option<Vec<Vec<(usize, f64)>>> {
    match (attention_shares(prog), super::expert_shares(prog)) {
        (None, None) => None,
        (Some(a), None) | (None, Some(a)) => Some(a),
        (Some(mut a), Some(e)) => {
            for (mine, experts) in a.iter_mut().zip(e) {
                mine.extend(experts);
                mine.sort_by_key(|(i, _)| *i);
            }
            Some(a)
        }
    }
}

/// A device's tasks whose work it does a share of: (instruction, share).
type Shares = Vec<(usize, f64)>;

/// What makes a device's task list its own: its attention shares and its pipeline stage.
type RowKey = (Shares, Option<usize>);

/// The work of an SPMD program on `device`: on real devices, one row per mesh position, all
/// running the same tasks (shared; under context parallelism each with its own attention work,
/// its blocks' causal pairs); simulated, one row for the adapter that holds them all.
pub fn spmd_work(prog: &Program, device: &DeviceProfile, placement: Placement) -> StepWork {
    let (tasks, groupings) = tasks(prog, device, placement);
    let shares = match placement {
        Placement::Real => work_shares(prog),
        Placement::Simulated => None,
    };
    // A pipeline's stages each run their own work (the program says which stage runs what):
    // another stage's work is the stage idling (the bubble, another stage's embedding or head),
    // as on a device that ran its own stage's program.
    let stage_of = |d: usize| match (placement, &prog.stages, &prog.mesh) {
        (Placement::Real, Some(st), Some(mesh)) => mesh.axes_index(d, &[st.axis.as_str()]).ok(),
        _ => None,
    };
    let own = |mut t: Vec<Task>, shares: &[(usize, f64)], stage: Option<usize>| -> Arc<[Task]> {
        for &(i, share) in shares {
            // One task per instruction, in order.
            t[i].work_s *= share;
        }
        if let (Some(s), Some(st)) = (stage, &prog.stages) {
            for task in t.iter_mut() {
                let owner = prog.instrs[task.instr]
                    .outputs
                    .first()
                    .map_or(Owner::Every, |o| st.owner(*o));
                if !owner.active(s) {
                    task.launch_s = 0.0;
                    task.work_s = 0.0;
                }
            }
        }
        t.into()
    };
    let devices_real = match (placement, &prog.mesh) {
        (Placement::Real, Some(mesh)) => mesh.devices(),
        _ => 0,
    };
    let per_device: Option<Vec<Arc<[Task]>>> =
        (devices_real > 0 && (shares.is_some() || prog.stages.is_some())).then(|| {
            // Devices with the same shares and stage (the "dp" replicas of a ring position or a
            // stage) share one list, so the schedule runs one row for them all.
            let mut made: Vec<(RowKey, Arc<[Task]>)> = vec![];
            (0..devices_real)
                .map(|d| {
                    let (own_shares, stage) = (shares.as_ref().map_or(&[][..], |s| &s[d][..]), stage_of(d));
                    if let Some((_, t)) = made.iter().find(|(k, _)| k.1 == stage && k.0 == own_shares) {
                        return t.clone();
                    }
                    let t = own(tasks.clone(), own_shares, stage);
                    made.push(((own_shares.to_vec(), stage), t.clone()));
                    t
                })
                .collect()
        });
    // One device (no mesh): its own shares, if any, on the one list.
    let tasks: Arc<[Task]> = match (&shares, devices_real) {
        (Some(s), 0) => own(tasks, &s[0], None),
        _ => tasks.into(),
    };
    let of = |d: usize| per_device.as_ref().map_or_else(|| tasks.clone(), |p| p[d].clone());
    let devices = match (placement, &prog.mesh) {
        (Placement::Real, Some(mesh)) => (0..mesh.devices())
            .map(|d| DeviceWork {
                label: mesh_label(mesh, d),
                program: 0,
                tasks: of(d),
            })
            .collect(),
        (Placement::Real, None) => vec![DeviceWork {
            label: "device 0".into(),
            program: 0,
            tasks,
        }],
        (Placement::Simulated, _) => vec![DeviceWork {
            label: format!("one {} ({} simulated devices)", device.label, prog.devices()),
            program: 0,
            tasks,
        }],
    };
    StepWork {
        devices,
        groupings,
        step_s: device.step_s,
    }
}
