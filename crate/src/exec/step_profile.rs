//! A per-op profile measured by wall clock with split submissions, truthful on every adapter
//! (timestamp queries are missing on some and far too low on lavapipe and SwiftShader).
//!
//! After the real step (one submission, as every step runs), its state is copied on the GPU;
//! then, `reps` times: the whole step in one submission, each phase alone, and each
//! instruction's dispatches alone, once and twice over in one submission, the state put back
//! after each run of the update. Every split submission pays a per-submit overhead: a
//! phase's is measured on its own (an empty submission, awaited) and taken off; an op's
//! cost is the difference between its two-copy and one-copy submissions, and what its
//! one-copy submission cost beyond that is its overhead, reported apart. That difference runs
//! the second copy on warm caches and comes out about 10% low on lavapipe, so each phase's
//! measured time is shared out over its ops in proportion to it (the factor is reported).
//! So the parts add up to the step, which pays one submission.
use super::gpu::GpuExecutor;
use super::ExecError;
use crate::gpu::{median, GpuContext};
use crate::model::TrainStep;

/// Split runs of each measurement; their medians are reported.
pub const REPS: usize = 5;
/// Empty submissions timed for the overhead.
const OVERHEAD_REPS: usize = 21;

/// One instruction's dispatches, submitted alone.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OpTime {
    /// Index into the program's instructions.
    pub instr: usize,
    /// 0 forward, 1 backward, 2 update.
    pub phase: usize,
    pub dispatches: usize,
    /// Its share of its phase's measured time: `split_ms` times the phase's factor.
    pub ms: f64,
    /// Its dispatches' cost measured alone: wall time of two copies in one submission less
    /// one copy (medians), at least 0.
    pub split_ms: f64,
    /// Wall time of one copy submitted alone (median) less `split_ms`: what submitting it
    /// alone added.
    pub overhead_ms: f64,
}

/// Where one step's time went, measured by wall clock (see the module docs).
#[derive(Clone, Debug, serde::Serialize)]
pub struct StepProfile {
    /// Wall time of the whole step's dispatches in one submission, awaited (median): the
    /// step the parts add up to. It includes one submission overhead.
    pub step_ms: f64,
    /// Wall time of one empty submission, awaited (median): the step pays it once; every
    /// phase submitted alone pays it too and has it taken off.
    pub submit_overhead_ms: f64,
    /// Forward, backward and update, each submitted alone, less one submission overhead.
    pub phases_ms: [f64; 3],
    /// Every instruction with dispatches, in program order.
    pub ops: Vec<OpTime>,
    /// The forward and backward ops as (instruction, ms), as the page reads them (the
    /// update phase counts as optimizer there). Always present on the GPU.
    pub per_dispatch: Option<Vec<(usize, f64)>>,
    /// What the ops' split submissions added beyond their cost, all ops together: not part
    /// of the step.
    pub split_overhead_ms: f64,
    /// Per phase, its measured time over the sum of its ops' `split_ms`: how far the split
    /// measurement is from the phase's (1 where a phase has no op time).
    pub phase_factor: [f64; 3],
    /// Split runs behind each median.
    pub reps: usize,
}

impl StepProfile {
    /// Submissions one split run of all ops makes.
    pub fn split_submissions(&self) -> usize {
        self.ops.len()
    }
}

/// Profiles the step `exec` has just run (its loss already read): leaves the parameters and
/// optimizer state exactly as that step left them. `reps` split runs of each measurement (at
/// least one; [`REPS`] for a benchmark): fewer are quicker and noisier, a look at the categories.
pub async fn measure(
    ctx: &GpuContext,
    exec: &GpuExecutor,
    step: &TrainStep,
    reps: usize,
) -> Result<StepProfile, ExecError> {
    let reps = reps.max(1);
    let all = exec.dispatches();
    let instrs = exec.dispatch_instrs();
    let first_at = |instr: usize| instrs.iter().position(|&i| i >= instr).unwrap_or(instrs.len());
    let bounds = [0, first_at(step.forward_end), first_at(step.backward_end), all.len()];
    // Runs of one instruction's dispatches: [start, end) into `all`.
    let mut groups: Vec<(usize, usize)> = vec![];
    for (d, &i) in instrs.iter().enumerate() {
        match groups.last_mut() {
            Some((s, e)) if instrs[*s] == i && *e == d => *e = d + 1,
            _ => groups.push((d, d + 1)),
        }
    }
    let saved = exec.save_state(ctx)?;
    // Warm replay: forward and backward write no parameters.
    ctx.run(&all[..bounds[2]]);
    ctx.finish().await?;
    // Timed next to the phases too: under load every submission costs more.
    let mut empty = vec![ctx.submit_overhead_ms(OVERHEAD_REPS).await?];
    let mut step_t = vec![];
    let mut phase_t = vec![vec![]; 3];
    let mut op_t = vec![vec![]; groups.len()];
    let mut op_t2 = vec![vec![]; groups.len()];
    for _ in 0..reps {
        step_t.push(ctx.run_awaited_ms(all).await?);
        exec.restore_state(ctx, &saved);
        for p in 0..3 {
            phase_t[p].push(ctx.run_awaited_ms(&all[bounds[p]..bounds[p + 1]]).await?);
            empty.push(ctx.run_awaited_ms(&[]).await?);
        }
        exec.restore_state(ctx, &saved);
        for (g, &(s, e)) in groups.iter().enumerate() {
            op_t[g].push(ctx.run_awaited_ms(&all[s..e]).await?);
            op_t2[g].push(ctx.run_repeated_awaited_ms(&all[s..e], 2).await?);
        }
        exec.restore_state(ctx, &saved);
    }
    ctx.finish().await?;
    let overhead = median(empty);
    let mut ops: Vec<OpTime> = groups
        .iter()
        .zip(op_t.into_iter().zip(op_t2))
        .map(|(&(s, e), (t1, t2))| {
            let (one, two) = (median(t1), median(t2));
            let ms = (two - one).max(0.0);
            OpTime {
                instr: instrs[s],
                phase: (0..3).rev().find(|&p| s >= bounds[p]).unwrap_or(0),
                dispatches: e - s,
                ms,
                split_ms: ms,
                overhead_ms: one - ms,
            }
        })
        .collect();
    let mut phases_ms = [0.0; 3];
    for (p, t) in phase_t.into_iter().enumerate() {
        phases_ms[p] = (median(t) - overhead).max(0.0);
    }
    let mut phase_factor = [1.0; 3];
    for (p, factor) in phase_factor.iter_mut().enumerate() {
        let split: f64 = ops.iter().filter(|o| o.phase == p).map(|o| o.split_ms).sum();
        if split > 0.0 {
            *factor = phases_ms[p] / split;
        }
    }
    for o in &mut ops {
        o.ms = o.split_ms * phase_factor[o.phase];
    }
    let per_dispatch = Some(ops.iter().filter(|o| o.phase < 2).map(|o| (o.instr, o.ms)).collect());
    Ok(StepProfile {
        step_ms: median(step_t),
        submit_overhead_ms: overhead,
        phases_ms,
        split_overhead_ms: ops.iter().map(|o| o.overhead_ms).sum(),
        ops,
        per_dispatch,
        phase_factor,
        reps,
    })
}
