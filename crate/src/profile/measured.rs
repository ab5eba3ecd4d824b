//! Reads a measured [`StepProfile`]: its ops with names, shapes and categories, the
//! categories and phases with their sums against the step, and the submission overhead; and
//! the same ops as a timeline on the adapter's one queue.
use super::cost::{category, Category};
use super::timeline::{DeviceTimeline, Span, SpanKind, Timeline};
use crate::exec::StepProfile;
use crate::ir::Program;

/// One measured op, for the table of the most expensive ones.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OpRow {
    pub instr: usize,
    pub op: &'static str,
    /// Operand shapes and the result's, e.g. `[64,128] x [128,512] -> [64,512]`.
    pub shape: String,
    pub category: Category,
    pub phase: &'static str,
    pub ms: f64,
    /// Of the measured step.
    pub percent: f64,
}

/// A measured step, read: every figure in ms (see [`StepProfile`] for how each is measured).
#[derive(Clone, Debug, serde::Serialize)]
pub struct MeasuredBreakdown {
    pub step_ms: f64,
    pub submit_overhead_ms: f64,
    /// Split submissions in one run of all ops.
    pub split_submissions: usize,
    /// What those submissions added beyond the ops' cost (not part of the step).
    pub split_overhead_ms: f64,
    pub phases_ms: Vec<(&'static str, f64)>,
    /// Sum of the phases plus the one submission the step pays.
    pub phases_sum_ms: f64,
    pub categories_ms: Vec<(Category, f64)>,
    /// Sum of the categories plus the one submission the step pays.
    pub categories_sum_ms: f64,
    /// Per phase, its measured time over its ops' split-measured sum; ops are scaled by it.
    pub phase_factor: [f64; 3],
    /// Every op, most expensive first.
    pub ops: Vec<OpRow>,
}

pub const PHASES: [&str; 3] = ["forward", "backward", "update"];

impl MeasuredBreakdown {
    /// (sum − step) / step, as a fraction: how far `sum` is from the measured step.
    pub fn off_by(&self, sum: f64) -> f64 {
        (sum - self.step_ms) / self.step_ms.max(f64::MIN_POSITIVE)
    }

    pub fn category_ms(&self, c: Category) -> f64 {
        self.categories_ms
            .iter()
            .find(|(k, _)| *k == c)
            .map_or(0.0, |(_, ms)| *ms)
    }
}

/// Operand shapes and the result's: `[64,128] x [128,512] -> [64,512]`.
pub(crate) fn shape_text(prog: &Program, ins: &crate::ir::Instr) -> String {
    let fmt = |v: &crate::ir::ValueId| {
        let s: Vec<String> = prog.shape(*v).iter().map(|d| d.to_string()).collect();
        format!("[{}]", s.join(","))
    };
    let ins_s: Vec<String> = ins.inputs.iter().map(fmt).collect();
    let outs: Vec<String> = ins.outputs.iter().map(fmt).collect();
    format!("{} -> {}", ins_s.join(" x "), outs.join(", "))
}

/// `profile` of a step of `prog`, read.
pub fn breakdown(prog: &Program, profile: &StepProfile) -> MeasuredBreakdown {
    let step = profile.step_ms;
    let pct = |ms: f64| 100.0 * ms / step.max(f64::MIN_POSITIVE);
    let mut ops: Vec<OpRow> = profile
        .ops
        .iter()
        .map(|o| {
            let ins = &prog.instrs[o.instr];
            OpRow {
                instr: o.instr,
                op: ins.op.name(),
                shape: shape_text(prog, ins),
                category: category(ins),
                phase: PHASES[o.phase],
                ms: o.ms,
                percent: pct(o.ms),
            }
        })
        .collect();
    let categories_ms: Vec<(Category, f64)> = Category::ALL
        .iter()
        // + 0.0: an empty f64 sum is -0.0, which would print as "-0.000".
        .map(|&c| {
            (
                c,
                ops.iter().filter(|o| o.category == c).map(|o| o.ms).sum::<f64>() + 0.0,
            )
        })
        .collect();
    ops.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    let overhead = profile.submit_overhead_ms;
    MeasuredBreakdown {
        step_ms: step,
        submit_overhead_ms: overhead,
        split_submissions: profile.split_submissions(),
        split_overhead_ms: profile.split_overhead_ms,
        phase_factor: profile.phase_factor,
        phases_ms: PHASES.iter().copied().zip(profile.phases_ms).collect(),
        phases_sum_ms: profile.phases_ms.iter().sum::<f64>() + overhead,
        categories_sum_ms: categories_ms.iter().map(|(_, ms)| ms).sum::<f64>() + overhead,
        categories_ms,
        ops,
    }
}

/// The bucket of a measured step's one submission (the page's measured bars call it so too).
pub const SUBMIT: &str = "submit";

/// `profile` of a step of `prog` as a timeline on `adapter`: one row (the simulated devices
/// share the adapter), its one submission and then every op in submission order, each lasting
/// its share of its phase's measured time. It ends at the categories' sum plus the submission,
/// which [`MeasuredBreakdown::categories_sum_ms`] compares with the measured step.
pub fn measured_timeline(prog: &Program, profile: &StepProfile, adapter: &str) -> Timeline {
    let mut at = 0.0;
    let mut compute = vec![];
    let mut push = |dur_ms: f64, kind: SpanKind, category: &'static str, instr: Option<usize>, name: &'static str| {
        compute.push(Span {
            start_ms: at,
            dur_ms,
            kind,
            category,
            launch_ms: 0.0,
            instr,
            name,
        });
        at += dur_ms;
    };
    push(profile.submit_overhead_ms, SpanKind::Submit, SUBMIT, None, "submit");
    for o in &profile.ops {
        let ins = &prog.instrs[o.instr];
        push(o.ms, SpanKind::Op, category(ins).name(), Some(o.instr), ins.op.name());
    }
    let label = match prog.devices() {
        1 => "this adapter".to_string(),
        n => format!("this adapter ({n} simulated devices)"),
    };
    Timeline {
        kind: "measured",
        device: adapter.to_string(),
        overlap: false,
        comm_stream: false,
        step_ms: at,
        devices: vec![DeviceTimeline {
            label,
            program: 0,
            compute,
            comm: vec![],
        }],
    }
}
