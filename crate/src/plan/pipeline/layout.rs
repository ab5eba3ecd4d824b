//! Which blocks each stage holds: the model's blocks cut into `pp * v` runs in model order
//! (virtual stages), virtual stage `k` being chunk `k / pp` of stage `k % pp`. Equal stages by
//! default; `--stage-layers 5,6,6,5` gives each stage its own count (the last stage lighter, to
//! balance the head), each stage's count split evenly over its chunks.
use super::super::parallelism::divisors;
use super::super::{Parallelism, PlanError, Schedule};
use crate::ir::MAX_STAGES;
use crate::model::GptConfig;
use crate::plan::AxisKind;
use crate::setting::{Refusal, Setting};

/// The blocks of each virtual stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageLayout {
    pub stages: usize,
    /// Chunks per stage (virtual stages per device).
    pub chunks: usize,
    /// Per virtual stage, in model order: (its first block, its blocks).
    pub runs: Vec<(usize, usize)>,
}

impl StageLayout {
    /// The layout of `layers` blocks over `stages` stages of `chunks` chunks, with each
    /// stage's count as `stage_layers` says (empty: equal stages). The counts must have been
    /// checked ([`check`]).
    pub fn new(layers: usize, stages: usize, chunks: usize, stage_layers: &[usize]) -> Self {
        let per_stage: Vec<usize> = if stage_layers.is_empty() {
            vec![layers / stages; stages]
        } else {
            stage_layers.to_vec()
        };
        let mut runs = Vec::with_capacity(stages * chunks);
        let mut first = 0;
        for k in 0..stages * chunks {
            let len = per_stage[k % stages] / chunks;
            runs.push((first, len));
            first += len;
        }
        Self { stages, chunks, runs }
    }

    /// The run of `chunk` on `stage`: (first block, blocks).
    pub fn run(&self, stage: usize, chunk: usize) -> (usize, usize) {
        self.runs[chunk * self.stages + stage]
    }

    /// The most blocks any chunk holds: the rows of each chunk's stacked parameters (a shorter
    /// chunk's missing blocks are rows of zeros).
    pub fn rows(&self) -> usize {
        self.runs.iter().map(|r| r.1).max().unwrap_or(0)
    }

    /// Blocks stage `s` holds, all its chunks together.
    pub fn stage_blocks(&self, s: usize) -> usize {
        (0..self.chunks).map(|c| self.run(s, c).1).sum()
    }
}

/// `5,6,6,5`, as `--stage-layers` takes it.
pub fn stage_layers_text(counts: &[usize]) -> String {
    counts.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
}

/// Checks a pipeline's layout and schedule settings against the model and mesh: the stage
/// counts (one per stage, each at least one block, adding up to the layers), the virtual stages
/// (dividing every stage's blocks; a schedule that runs chunks), the microbatches a schedule
/// needs. `stage_layers` empty: equal stages, which [`Parallelism::check`] checks.
pub fn check(
    cfg: &GptConfig,
    par: &Parallelism,
    schedule: Schedule,
    chunks: usize,
    stage_layers: &[usize],
    microbatches: usize,
) -> Result<(), PlanError> {
    let pp_mesh = |n: usize| Setting::MeshAxis("pp".into()).at(n);
    if !par.is_pipeline() {
        if chunks != 1 {
            let why = format!(
                "gives each pipeline stage several chunks of blocks, and {} has no 'pp' axis: add one (e.g. {})",
                Setting::Mesh.at(par.name()),
                pp_mesh(2)
            );
            return Err(Refusal::at(Setting::VirtualStages, chunks, why).into());
        }
        if !stage_layers.is_empty() {
            let why = format!(
                "gives each pipeline stage its blocks, and {} has no 'pp' axis: add one (e.g. {})",
                Setting::Mesh.at(par.name()),
                pp_mesh(stage_layers.len())
            );
            return Err(Refusal::at(Setting::StageLayers, stage_layers_text(stage_layers), why).into());
        }
        return Ok(());
    }
    let pp = par.size(AxisKind::Pp);
    if pp > MAX_STAGES {
        let why = format!("is more stages than a pipeline here may have ({MAX_STAGES}): use fewer");
        return Err(Refusal::new(Setting::MeshAxis("pp".into()), format!("{} {why}", pp_mesh(pp))).into());
    }
    if chunks == 0 {
        let why = "gives each stage no chunk of blocks: use 1 (one run of blocks per stage) or more".to_string();
        return Err(Refusal::at(Setting::VirtualStages, 0, why).into());
    }
    if chunks > 1 && !schedule.takes_virtual_stages() {
        let why = format!(
            "runs one chunk per stage ({} splits each backward within one; its V-shaped two-chunk form, ZB-V, is \
             not here): use {}, or {} or {} with virtual stages",
            Setting::Schedule.at(schedule.name()),
            Setting::VirtualStages.at(1),
            Setting::Schedule.at(Schedule::OneFOneB.name()),
            Setting::Schedule.at(Schedule::Gpipe.name()),
        );
        return Err(Refusal::at(Setting::VirtualStages, chunks, why).into());
    }
    let counts: Vec<usize> = if stage_layers.is_empty() {
        // Equal stages: Parallelism::check refuses layers that pp does not divide.
        if !cfg.layers.is_multiple_of(pp) {
            return Ok(());
        }
        vec![cfg.layers / pp; pp]
    } else {
        let text = stage_layers_text(stage_layers);
        if stage_layers.len() != pp {
            let why = format!(
                "lists {} stages, and {} has {}: give one block count per stage",
                stage_layers.len(),
                Setting::Mesh.at(par.name()),
                pp_mesh(pp)
            );
            return Err(Refusal::at(Setting::StageLayers, text, why).into());
        }
        if stage_layers.contains(&0) {
            let why = "gives a stage no blocks: every stage runs at least one".to_string();
            return Err(Refusal::at(Setting::StageLayers, text, why).into());
        }
        let sum: usize = stage_layers.iter().sum();
        if sum != cfg.layers {
            let why = format!(
                "adds up to {sum} blocks, and the model has {}: the counts must add up to the layers",
                Setting::Layers.at(cfg.layers)
            );
            return Err(Refusal::at(Setting::StageLayers, text, why).into());
        }
        stage_layers.to_vec()
    };
    if let Some((s, &n)) = counts.iter().enumerate().find(|(_, n)| !n.is_multiple_of(chunks)) {
        let common = counts.iter().fold(0, |g, &c| gcd(g, c));
        let why = format!(
            "does not divide stage {s}'s {n} blocks: each stage's blocks are cut into that many equal chunks; use \
             one of {}",
            divisors(common)
        );
        return Err(Refusal::at(Setting::VirtualStages, chunks, why).into());
    }
    if schedule == Schedule::OneFOneB && chunks > 1 && !microbatches.is_multiple_of(pp) {
        let why = format!(
            "is no multiple of {}: interleaved 1F1B runs the microbatches through each chunk in groups of pp, as \
             Megatron-LM does; use a multiple of {pp}, or {}",
            pp_mesh(pp),
            Setting::VirtualStages.at(1)
        );
        return Err(Refusal::at(Setting::Microbatches, microbatches, why).into());
    }
    Ok(())
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_stages_interleave_the_runs_over_the_stages() {
        let l = StageLayout::new(8, 2, 2, &[]);
        // Virtual stages 0..4 hold blocks 0-1, 2-3, 4-5, 6-7; stage 0 holds chunks 0 and 2.
        assert_eq!(l.runs, vec![(0, 2), (2, 2), (4, 2), (6, 2)]);
        assert_eq!((l.run(0, 1), l.run(1, 0)), ((4, 2), (2, 2)));
        let uneven = StageLayout::new(22, 4, 1, &[5, 6, 6, 5]);
        assert_eq!(uneven.runs, vec![(0, 5), (5, 6), (11, 6), (17, 5)]);
        assert_eq!((uneven.rows(), uneven.stage_blocks(3)), (6, 5));
    }
}
