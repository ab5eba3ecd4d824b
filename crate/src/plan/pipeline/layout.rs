//! Which blocks each stage holds: the model's blocks cut into `pp * v` runs in model order
//! (virtual stages), virtual stage `k` being chunk `k / pp` of stage `k % pp`. Equal stages by
//! default; `--stage-layers 5,6,6,5` gives each stage its own count (the last stage lighter, to
//! balance the head), each stage's count split evenly over its chunks. With virtual stages the
//! counts may instead be one per virtual stage, in model order: Llama 3's 126 layers on 16
//! stages of 8 chunks are `0,1,...,1,0`, the first chunk holding only the embedding and the
//! last only the head (Dubey et al. 2024, section 3.3.2).
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
    /// stage's or each virtual stage's count as `stage_layers` says (empty: equal stages). The
    /// counts must have been checked ([`check`]).
    pub fn new(layers: usize, stages: usize, chunks: usize, stage_layers: &[usize]) -> Self {
        let virtual_stages = stages * chunks;
        let lens: Vec<usize> = match stage_layers.len() {
            0 => vec![layers / virtual_stages; virtual_stages],
            n if n == virtual_stages => stage_layers.to_vec(),
            _ => (0..virtual_stages).map(|k| stage_layers[k % stages] / chunks).collect(),
        };
        let firsts = lens.iter().scan(0, |first, len| {
            let at = *first;
            *first += len;
            Some(at)
        });
        Self {
            stages,
            chunks,
            runs: firsts.zip(lens.iter().copied()).collect(),
        }
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

/// A run of this many equal counts or more is written `count*times`.
const REPEAT_FROM: usize = 4;

/// `5,6,6,5`, as `--stage-layers` takes it; a long run of one count as `count*times`
/// (Llama 3's chunks: `0,1*126,0`).
pub fn stage_layers_text(counts: &[usize]) -> String {
    let mut parts = vec![];
    let mut rest = counts;
    while let Some(&c) = rest.first() {
        let run = rest.iter().take_while(|&&n| n == c).count();
        let (take, part) = if run >= REPEAT_FROM {
            (run, format!("{c}*{run}"))
        } else {
            (1, c.to_string())
        };
        parts.push(part);
        rest = &rest[take..];
    }
    parts.join(",")
}

/// The counts `stage_layers_text` writes: `5,6,6,5` or `0,1*126,0`. Err names the entry that
/// is not a count; whether the counts fit the model and mesh is [`check`]'s.
pub fn parse_stage_layers(text: &str) -> Result<Vec<usize>, String> {
    let mut counts = vec![];
    for entry in text.split(',').map(str::trim) {
        let (count, times) = entry.split_once('*').unwrap_or((entry, "1"));
        match (count.trim().parse::<usize>(), times.trim().parse::<usize>()) {
            (Ok(c), Ok(n)) if n >= 1 && counts.len() + n <= MAX_COUNTS => counts.extend(std::iter::repeat_n(c, n)),
            _ => {
                return Err(format!(
                    "'{entry}' is no block count; give one count per stage (or per virtual stage), e.g. 5,6,6,5, \
                     with COUNT*TIMES for a run of one count, e.g. 0,1*126,0 (at most {MAX_COUNTS} counts)"
                ))
            }
        }
    }
    Ok(counts)
}

/// The most counts a list may give: one per virtual stage of the largest pipeline.
const MAX_COUNTS: usize = 1 << 16;

/// Checks a pipeline's layout and schedule settings against the model and mesh: the stage
/// counts (one per stage or per virtual stage, every stage at least one block, adding up to the
/// layers), the virtual stages (dividing every stage's blocks where the counts are per stage; a
/// schedule that runs chunks), the microbatches a schedule
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
    if stage_layers.is_empty() {
        // Equal stages: Parallelism::check refuses layers that pp does not divide.
        if cfg.layers.is_multiple_of(pp) {
            check_chunks_divide(&vec![cfg.layers / pp; pp], chunks)?;
        }
    } else {
        check_counts(cfg, par, chunks, stage_layers)?;
        if stage_layers.len() == pp {
            check_chunks_divide(stage_layers, chunks)?;
        }
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

/// Given counts: one per stage, or one per virtual stage in model order (zeros allowed there:
/// a chunk may hold only the embedding or the head), adding up to the layers, every stage
/// running at least one block.
fn check_counts(cfg: &GptConfig, par: &Parallelism, chunks: usize, stage_layers: &[usize]) -> Result<(), PlanError> {
    let pp = par.size(AxisKind::Pp);
    let text = stage_layers_text(stage_layers);
    let refuse = |why: String| Err(Refusal::at(Setting::StageLayers, &text, why).into());
    let per_chunk = chunks > 1 && stage_layers.len() == pp * chunks;
    if stage_layers.len() != pp && !per_chunk {
        let per_virtual = match chunks {
            1 => String::new(),
            v => format!(
                ", or one per virtual stage ({} with {})",
                pp * v,
                Setting::VirtualStages.at(v)
            ),
        };
        return refuse(format!(
            "lists {} stages, and {} has {pp}: give one block count per stage{per_virtual}",
            stage_layers.len(),
            Setting::Mesh.at(par.name()),
        ));
    }
    let stage_blocks: Vec<usize> = match per_chunk {
        true => {
            let layout = StageLayout::new(cfg.layers, pp, chunks, stage_layers);
            (0..pp).map(|s| layout.stage_blocks(s)).collect()
        }
        false => stage_layers.to_vec(),
    };
    if stage_blocks.contains(&0) {
        return refuse("gives a stage no blocks: every stage runs at least one".to_string());
    }
    let sum: usize = stage_layers.iter().sum();
    if sum != cfg.layers {
        return refuse(format!(
            "adds up to {sum} blocks, and the model has {}: the counts must add up to the layers",
            Setting::Layers.at(cfg.layers)
        ));
    }
    Ok(())
}

/// Virtual stages cut each stage's blocks into equal chunks: `chunks` must divide every count.
fn check_chunks_divide(per_stage: &[usize], chunks: usize) -> Result<(), PlanError> {
    if let Some((s, &n)) = per_stage.iter().enumerate().find(|(_, n)| !n.is_multiple_of(chunks)) {
        let common = per_stage.iter().fold(0, |g, &c| gcd(g, c));
        let why = format!(
            "does not divide stage {s}'s {n} blocks: each stage's blocks are cut into that many equal chunks; use \
             one of {}, or give one block count per virtual stage ({})",
            divisors(common),
            Setting::StageLayers.named()
        );
        return Err(Refusal::at(Setting::VirtualStages, chunks, why).into());
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

    #[test]
    fn counts_are_written_and_read_back_with_runs_as_count_times() {
        let llama: Vec<usize> = (0..128).map(|k| usize::from(k != 0 && k != 127)).collect();
        assert_eq!(stage_layers_text(&llama), "0,1*126,0");
        assert_eq!(stage_layers_text(&[5, 6, 6, 5]), "5,6,6,5");
        for counts in [llama, vec![5, 6, 6, 5], vec![2; 4]] {
            assert_eq!(parse_stage_layers(&stage_layers_text(&counts)).unwrap(), counts);
        }
        for bad in ["1,x", "1*0", "1*", "*2", "", "1*99999999"] {
            let e = parse_stage_layers(bad).unwrap_err();
            assert!(e.contains("is no block count") && e.contains("0,1*126,0"), "{bad}: {e}");
        }
    }

    #[test]
    fn counts_per_virtual_stage_lay_each_chunk_as_given() {
        // Llama 3's layout: 126 blocks on 16 stages of 8 one-block chunks, the first chunk
        // only embedding and the last only the head.
        let counts: Vec<usize> = (0..128).map(|k| usize::from(k != 0 && k != 127)).collect();
        let l = StageLayout::new(126, 16, 8, &counts);
        assert_eq!((l.run(0, 0), l.run(1, 0), l.run(15, 7)), ((0, 0), (0, 1), (126, 0)));
        let blocks: Vec<usize> = (0..16).map(|s| l.stage_blocks(s)).collect();
        assert_eq!(
            (blocks[0], blocks[1], blocks[14], blocks[15], l.rows()),
            (7, 8, 8, 7, 1)
        );
    }

    fn checked(layers: usize, mesh: &str, chunks: usize, counts: &[usize]) -> Result<(), String> {
        let cfg = GptConfig {
            layers,
            ..GptConfig::tiny()
        };
        let par = Parallelism::new(crate::sharding::Mesh::parse(mesh).unwrap(), Default::default(), false).unwrap();
        check(&cfg, &par, Schedule::OneFOneB, chunks, counts, 4).map_err(|e| e.to_string())
    }

    #[test]
    fn counts_per_stage_or_per_virtual_stage_pass_and_others_are_refused_naming_both() {
        assert!(checked(4, "pp=2", 2, &[2, 2]).is_ok());
        assert!(checked(4, "pp=2", 2, &[0, 2, 1, 1]).is_ok());
        let e = checked(4, "pp=2", 2, &[1, 1, 2]).unwrap_err();
        assert!(
            e.contains("one block count per stage, or one per virtual stage (4"),
            "{e}"
        );
        let e = checked(4, "pp=2", 2, &[0, 2, 0, 2]).unwrap_err();
        assert!(e.contains("gives a stage no blocks"), "{e}");
        let e = checked(4, "pp=2", 2, &[1, 2, 1, 1]).unwrap_err();
        assert!(e.contains("adds up to 5 blocks"), "{e}");
        let e = checked(6, "pp=2", 2, &[3, 3]).unwrap_err();
        assert!(e.contains("or give one block count per virtual stage"), "{e}");
    }
}
