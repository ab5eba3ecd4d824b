//! Timelines as Chrome trace-event JSON (the "JSON Object Format" of the Trace Event Format),
//! which Perfetto (ui.perfetto.dev) and chrome://tracing open as they are: a process per
//! device row, a thread per stream, a complete event (`"ph": "X"`) per span with times in
//! microseconds, ops named as the program names them, their category, shapes and (in automatic
//! mode) the partitioner's reason in `args`. Process and thread ids start at 1 and are unique
//! across the file: Perfetto has merged thread 0 into thread 1, and a thread id seen under two
//! processes into one track.
use serde_json::{json, Map, Value};

use super::measured::shape_text;
use super::timeline::{Span, SpanKind, Timeline};
use super::PHASES;
use crate::ir::Program;
use crate::model::TrainStep;
use crate::plan::{Inserted, Planned};

/// Where a timeline's instructions come from, for their names, shapes and reasons.
#[derive(Clone, Copy, Debug)]
pub struct OpSource<'a> {
    pub program: &'a Program,
    /// Where the forward pass and the backward pass end (`TrainStep::forward_end`,
    /// `backward_end`), to name each op's phase.
    pub phase_ends: Option<[usize; 2]>,
    /// What the partitioner inserted and why (automatic mode).
    pub inserted: &'a [Inserted],
}

impl<'a> OpSource<'a> {
    pub fn of_step(step: &'a TrainStep) -> Self {
        Self {
            program: &step.program,
            phase_ends: Some([step.forward_end, step.backward_end]),
            inserted: &[],
        }
    }

    pub fn of_planned(planned: &'a Planned) -> Self {
        Self {
            inserted: planned.inserted.as_deref().unwrap_or(&[]),
            ..Self::of_step(&planned.step)
        }
    }

    fn phase(&self, instr: usize) -> Option<&'static str> {
        let [f, b] = self.phase_ends?;
        Some(
            PHASES[if instr < f {
                0
            } else if instr < b {
                1
            } else {
                2
            }],
        )
    }
}

/// The reserved colour names of the trace viewer's palette (chrome://tracing accepts no
/// other `cname`), nearest to the page's colour of each category; waits are grey.
fn cname(span: &Span) -> &'static str {
    if span.kind == SpanKind::Wait {
        return "grey";
    }
    match span.category {
        "matmul" => "light_memory_dump",
        "attention" => "background_memory_dump",
        "rng" => "terrible",
        "collectives" => "good",
        "optimizer" => "detailed_memory_dump",
        "launch" => "bad",
        "submit" => "grey",
        _ => "generic_work",
    }
}

/// Microseconds from milliseconds, to the nanosecond (the file stays small).
fn us(ms: f64) -> f64 {
    (ms * 1e6).round() / 1e3
}

/// A trace being written: timelines added one after another, each device row a process.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    events: Vec<Value>,
    processes: u32,
    threads: u32,
    timelines: Vec<Value>,
}

impl Trace {
    pub fn new() -> Self {
        Self::default()
    }

    fn metadata(&mut self, name: &str, pid: u32, tid: u32, args: Value) {
        self.events
            .push(json!({"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}));
    }

    /// Adds `timeline` under `title` (`auto dp`, `tiny`): a process per device row, named
    /// `title · row`, its compute (or, measured, queue) thread and, where it has one, its
    /// communication thread. `sources[row.program]` names the ops.
    pub fn add(&mut self, title: &str, timeline: &Timeline, sources: &[OpSource]) {
        let measured = timeline.kind == "measured";
        for row in &timeline.devices {
            self.processes += 1;
            let pid = self.processes;
            let source = sources.get(row.program);
            let name = format!("{title} · {} ({}, {})", row.label, timeline.kind, timeline.device);
            self.metadata("process_name", pid, 0, json!({ "name": name }));
            self.metadata("process_sort_index", pid, 0, json!({ "sort_index": pid }));
            let streams: [(&str, &[Span]); 2] = [
                (if measured { "queue" } else { "compute" }, &row.compute),
                ("communication", &row.comm),
            ];
            for (k, (stream, spans)) in streams.into_iter().enumerate() {
                if k == 1 && !timeline.comm_stream {
                    continue;
                }
                self.threads += 1;
                let tid = self.threads;
                self.metadata("thread_name", pid, tid, json!({ "name": stream }));
                self.metadata("thread_sort_index", pid, tid, json!({ "sort_index": k }));
                for s in spans.iter().filter(|s| s.dur_ms > 0.0) {
                    self.events.push(event(s, pid, tid, stream, source));
                }
            }
        }
        self.timelines.push(json!({
            "title": title,
            "kind": timeline.kind,
            "device": timeline.device,
            "overlap": timeline.overlap,
            "step_ms": timeline.step_ms,
            "rows": timeline.devices.len(),
        }));
    }

    /// The whole file: `{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}`.
    pub fn to_json(&self) -> Value {
        json!({
            "traceEvents": self.events,
            "displayTimeUnit": "ms",
            "otherData": {
                "generator": concat!("shardlab ", env!("CARGO_PKG_VERSION")),
                "timelines": self.timelines,
            },
        })
    }
}

/// One span as a complete event.
fn event(s: &Span, pid: u32, tid: u32, stream: &str, source: Option<&OpSource>) -> Value {
    let mut args = Map::new();
    args.insert("category".into(), s.category.into());
    args.insert("stream".into(), stream.into());
    if s.launch_ms > 0.0 {
        args.insert("launch_ms".into(), s.launch_ms.into());
    }
    let name = match s.kind {
        SpanKind::Wait => format!("wait: {}", s.name),
        _ => s.name.to_string(),
    };
    if let (Some(i), Some(src)) = (s.instr, source) {
        if let Some(ins) = src.program.instrs.get(i) {
            args.insert("instr".into(), i.into());
            if let Some(v) = ins.outputs.first() {
                let label = match &src.program.info(*v).name {
                    Some(n) => format!("{v} {n}"),
                    None => v.to_string(),
                };
                let key = if s.kind == SpanKind::Wait { "waits_for" } else { "value" };
                args.insert(key.into(), label.into());
            }
            args.insert("shapes".into(), shape_text(src.program, ins).into());
            if let Some(p) = src.phase(i) {
                args.insert("phase".into(), p.into());
            }
            if let Some(r) = src.inserted.iter().find(|r| r.instr == i) {
                let at = r.source_instr.map(|j| format!(" (#{j})")).unwrap_or_default();
                args.insert(
                    "inserted_by".into(),
                    format!("{} of {} for {}{at}: {}", r.op, r.value, r.source_op, r.rule).into(),
                );
            }
        }
    }
    json!({
        "name": name,
        "cat": s.category,
        "ph": "X",
        "ts": us(s.start_ms),
        "dur": us(s.dur_ms),
        "pid": pid,
        "tid": tid,
        "cname": cname(s),
        "args": args,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::exec::{Parallel, TrainerOptions};
    use crate::ir::RngLayout;
    use crate::model::{DataSource, GptConfig, Init, Optimizer};
    use crate::plan::Strategy;
    use crate::profile::device::tpu_v4;
    use crate::profile::predict::model_step;
    use crate::profile::work::Placement;
    use crate::sharding::Mesh;

    fn planned(mesh: &str, strategy: Strategy) -> Planned {
        crate::plan::build(&TrainerOptions {
            config: GptConfig {
                dropout: 0.1,
                ..GptConfig::tiny()
            },
            optimizer: Optimizer::AdamW { lr: 1e-3 },
            init: Init::Formula,
            data: DataSource::Copy,
            seed: 0,
            rng_layout: RngLayout::Original,
            parallel: Parallel::Auto {
                par: strategy.compose(&Mesh::parse(mesh).unwrap()).unwrap(),
                specs: vec![],
            },
            combine_all_reduces: false,
            microbatches: 1,
            cp_order: Default::default(),
            schedule: Default::default(),
            virtual_stages: 1,
            stage_layers: vec![],
        })
        .unwrap()
    }

    #[test]
    fn a_modelled_trace_has_a_process_per_device_a_thread_per_stream_and_sums_to_the_step() {
        let planned = planned("dp=2,tp=2", Strategy::DpTp);
        let prog = &planned.step.program;
        let (p, timeline) = model_step(prog, &tpu_v4(), Placement::Real, true);
        let mut trace = Trace::new();
        trace.add("auto dp_tp", &timeline, &[OpSource::of_planned(&planned)]);
        // Through text, as a viewer reads it.
        let v: Value = serde_json::from_str(&trace.to_json().to_string()).unwrap();
        assert_eq!(v["displayTimeUnit"], "ms");
        let events = v["traceEvents"].as_array().unwrap();
        let meta =
            |name: &str| -> Vec<&Value> { events.iter().filter(|e| e["ph"] == "M" && e["name"] == name).collect() };
        let processes: Vec<String> = meta("process_name")
            .iter()
            .map(|e| e["args"]["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(processes.len(), 4);
        assert!(
            processes[3].starts_with("auto dp_tp · dp=1, tp=1 (modelled, 4 x TPU v4"),
            "{processes:?}"
        );
        let threads = meta("thread_name");
        assert_eq!(threads.len(), 8);
        let tids: BTreeSet<u64> = threads.iter().map(|e| e["tid"].as_u64().unwrap()).collect();
        assert_eq!(tids.len(), 8, "thread ids are unique in the file");
        assert!(!tids.contains(&0) && meta("process_name").iter().all(|e| e["pid"].as_u64() > Some(0)));
        let stream_of: BTreeMap<u64, &str> = threads
            .iter()
            .map(|e| (e["tid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap()))
            .collect();
        let mut per_thread: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
        for e in events.iter().filter(|e| e["ph"] == "X") {
            per_thread.entry(e["tid"].as_u64().unwrap()).or_default().push(e);
            assert_eq!(e["cat"], e["args"]["category"]);
            assert!(e["dur"].as_f64().unwrap() > 0.0);
        }
        let step_us = p.step_ms * 1e3;
        for (tid, spans) in &per_thread {
            // Spans of a thread never overlap (the format nests them otherwise).
            for w in spans.windows(2) {
                let end = w[0]["ts"].as_f64().unwrap() + w[0]["dur"].as_f64().unwrap();
                assert!(
                    w[1]["ts"].as_f64().unwrap() >= end - 0.01,
                    "{tid}: {} then {}",
                    w[0],
                    w[1]
                );
            }
            if stream_of[tid] == "compute" {
                let sum: f64 = spans.iter().map(|e| e["dur"].as_f64().unwrap()).sum();
                assert!((sum - step_us).abs() < 0.01 * spans.len() as f64, "{sum} vs {step_us}");
            } else {
                assert!(spans.iter().all(|e| e["cat"] == "collectives"));
            }
        }
        // Ops as the program names them, with shapes; the partitioner's reason on what it inserted.
        let ops: Vec<&Value> = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["args"]["instr"].is_u64())
            .collect();
        for e in &ops {
            let i = e["args"]["instr"].as_u64().unwrap() as usize;
            let name = e["name"].as_str().unwrap();
            assert!(name == prog.instrs[i].op.name() || name == format!("wait: {}", prog.instrs[i].op.name()));
            assert!(e["args"]["shapes"].as_str().unwrap().contains("->"));
        }
        assert!(ops
            .iter()
            .any(|e| e["name"] == "psum" && e["args"]["inserted_by"].is_string()));
        assert!(ops.iter().any(|e| e["args"]["phase"] == "backward"));
        assert_eq!(v["otherData"]["timelines"][0]["step_ms"].as_f64(), Some(p.step_ms));
    }

    #[test]
    fn a_simulated_step_is_one_row_on_one_queue() {
        let planned = planned("dp=2", Strategy::Dp);
        let (p, timeline) = model_step(&planned.step.program, &tpu_v4(), Placement::Simulated, true);
        assert!(!p.overlap && !timeline.comm_stream);
        let mut trace = Trace::new();
        trace.add("simulated", &timeline, &[OpSource::of_planned(&planned)]);
        let v = trace.to_json();
        let threads = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .count();
        assert_eq!((timeline.devices.len(), threads), (1, 1));
        assert!((p.step_ms - p.serial_ms).abs() < 1e-9 * p.step_ms);
    }
}
