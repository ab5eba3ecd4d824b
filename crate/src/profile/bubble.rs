//! A pipeline's bubble: the formula's fraction of the step each stage idles, beside the
//! modelled timeline's, per stage (the first and last stages differ from it by the embedding
//! and the head; the gradients' reductions and the update fill no bubble).
use super::timeline::{Timeline, IDLE};
use crate::ir::Program;
use crate::plan::{PassTimes, PipelinePlan};

/// The bubble of a pipelined program.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PipelineBubble {
    pub stages: usize,
    pub microbatches: usize,
    /// The schedule's closed form ([`crate::plan::Schedule::bubble`], passes of equal time):
    /// (pp - 1) / (v M + pp - 1) for GPipe and 1F1B with v virtual stages, (pp - 1) /
    /// (3M + pp - 1) for ZB-H1.
    pub formula: f64,
    /// Per stage, the share of the modelled step its devices idle (their mean).
    pub modelled: Vec<f64>,
}

/// The bubble of `prog` on `timeline` (its modelled step on real devices, a row per device);
/// None for a program that is not pipelined.
pub fn pipeline_bubble(prog: &Program, timeline: &Timeline, pipeline: &PipelinePlan) -> Option<PipelineBubble> {
    let stages = prog.stages.as_ref()?;
    let mesh = prog.mesh.as_ref()?;
    let (p, m) = (stages.stages, stages.microbatches);
    let mut idle = vec![(0.0, 0usize); p];
    if timeline.devices.len() == mesh.devices() && timeline.step_ms > 0.0 {
        for d in 0..mesh.devices() {
            let s = mesh.axes_index(d, &[stages.axis.as_str()]).ok()?;
            let share = timeline.device_breakdown_ms(d).get(IDLE).copied().unwrap_or(0.0) / timeline.step_ms;
            idle[s].0 += share;
            idle[s].1 += 1;
        }
    }
    Some(PipelineBubble {
        stages: p,
        microbatches: m,
        formula: pipeline.schedule.bubble(p, m, pipeline.chunks, PassTimes::EVEN),
        modelled: idle.iter().map(|(sum, n)| sum / (*n).max(1) as f64).collect(),
    })
}
