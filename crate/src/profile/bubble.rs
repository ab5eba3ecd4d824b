//! A pipeline's bubble: the formula's fraction of the step each stage idles, beside the
//! modelled timeline's, per stage (the first and last stages differ from it by the embedding
//! and the head; the gradients' reductions and the update fill no bubble).
use std::collections::HashMap;

use super::timeline::{Timeline, IDLE};
use crate::exec::StepProfile;
use crate::ir::{Action, Program};
use crate::plan::{PassTimes, PipelinePlan, Slot, Table};

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

/// A pipeline's bubble as measured: each pass takes the time its instructions measured in a
/// profiled step on this adapter (its stage's devices together), and the schedule's table
/// places the passes as devices of their own would run them.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MeasuredBubble {
    /// When the last pass ends, in ms.
    pub step_ms: f64,
    /// Per stage: the share of that step it idles.
    pub idle: Vec<f64>,
    /// Per stage: ms before its first pass starts (the fill) and after its last ends (the drain).
    pub fill_ms: Vec<f64>,
    pub drain_ms: Vec<f64>,
}

/// The bubble of `prog` with its passes at the times `profile` measured; None for a program
/// that is not pipelined.
pub fn measured_bubble(prog: &Program, profile: &StepProfile, pipeline: &PipelinePlan) -> Option<MeasuredBubble> {
    let stages = prog.stages.as_ref()?;
    let ms: HashMap<usize, f64> = profile.ops.iter().map(|o| (o.instr, o.ms)).collect();
    let passes: HashMap<(usize, Action), f64> = stages
        .passes
        .iter()
        .map(|p| ((p.stage, p.action), p.instrs.iter().filter_map(|i| ms.get(i)).sum()))
        .collect();
    let table = Table::new(pipeline.schedule, stages.stages, stages.microbatches, pipeline.chunks);
    let timing = table.timing(&|s, a| passes.get(&(s, *a)).copied().unwrap_or(0.0), 0.0);
    let ends = |f: fn(&Slot) -> f64, pick: fn(&[Slot]) -> Option<&Slot>| -> Vec<f64> {
        timing.slots.iter().map(|s| pick(s).map_or(0.0, f)).collect()
    };
    Some(MeasuredBubble {
        step_ms: timing.makespan,
        idle: timing.idle_fraction(),
        fill_ms: ends(|x| x.start, <[Slot]>::first),
        drain_ms: ends(|x| x.end, <[Slot]>::last)
            .into_iter()
            .map(|end| timing.makespan - end)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::OpTime;
    use crate::ir::Pass;
    use crate::model::GptConfig;
    use crate::plan::{build, DropoutKey, Parallel, Parallelism, Schedule, TrainerOptions};
    use crate::sharding::Mesh;

    /// A profile of `prog` where each pass's first instruction takes the pass's whole time, as
    /// the formula assumes: a forward one unit, a backward two (one where the weight pass is split
    /// off, which takes the other).
    fn even_profile(prog: &Program, split: bool) -> StepProfile {
        let stages = prog.stages.as_ref().unwrap();
        let ops = stages
            .passes
            .iter()
            .filter(|p| !p.instrs.is_empty())
            .map(|p| OpTime {
                instr: p.instrs[0],
                phase: 0,
                dispatches: 1,
                ms: match p.action.pass {
                    Pass::Forward | Pass::Weight => 1.0,
                    Pass::Backward if split => 1.0,
                    Pass::Backward => 2.0,
                },
                split_ms: 0.0,
                overhead_ms: 0.0,
            })
            .collect();
        StepProfile {
            step_ms: 0.0,
            submit_overhead_ms: 0.0,
            phases_ms: [0.0; 3],
            ops,
            per_dispatch: None,
            split_overhead_ms: 0.0,
            phase_factor: [1.0; 3],
            reps: 1,
        }
    }

    #[test]
    fn passes_measured_as_the_formula_assumes_idle_each_stage_its_share_filling_and_draining_in_turn() {
        let measured = |schedule| {
            let opts = TrainerOptions {
                microbatches: 4,
                schedule,
                ..TrainerOptions::new(
                    GptConfig {
                        layers: 4,
                        batch: 4,
                        ..GptConfig::tiny()
                    },
                    Parallel::ShardMap {
                        par: Parallelism::new(Mesh::parse("pp=4").unwrap(), Default::default(), false).unwrap(),
                        dropout_key: DropoutKey::Same,
                    },
                )
            };
            let prog = build(&opts).unwrap().step.program;
            measured_bubble(
                &prog,
                &even_profile(&prog, schedule == Schedule::ZbH1),
                &opts.pipeline(),
            )
            .unwrap()
        };
        for schedule in [Schedule::Gpipe, Schedule::OneFOneB] {
            let b = measured(schedule);
            let formula = schedule.bubble(4, 4, 1, PassTimes::EVEN);
            for (s, idle) in b.idle.iter().enumerate() {
                assert!(
                    (idle - formula).abs() < 1e-9,
                    "{schedule:?} stage {s}: {idle} against {formula}"
                );
            }
            // Stage s starts s forwards late, and drains pp - 1 - s backwards early.
            assert_eq!(b.fill_ms, [0.0, 1.0, 2.0, 3.0], "{schedule:?}");
            assert_eq!(b.drain_ms, [0.0, 2.0, 4.0, 6.0], "{schedule:?}");
        }
        // ZB-H1's weight passes fill the drain (the first stage, which sends no input gradient
        // back, computes its weights' in its backward).
        let (zb, one_f_one_b) = (measured(Schedule::ZbH1), measured(Schedule::OneFOneB));
        assert!(
            zb.idle[1..].iter().zip(&one_f_one_b.idle[1..]).all(|(z, o)| z < o),
            "{:?} {:?}",
            zb.idle,
            one_f_one_b.idle
        );
    }
}
