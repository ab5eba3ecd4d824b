//! Which pipeline stage's work each value of a pipelined per-device program is. Every device
//! runs the same program, so a stage also computes what only another stage needs (the
//! embedding, the head) and ticks in which it holds no microbatch (the bubble); the data says
//! which is which, so a model of real devices can count that time as a stage idling.
use super::ValueId;

/// A pipelined program's stages and, per value, whose work made it.
#[derive(Clone, Debug, PartialEq)]
pub struct StageWork {
    /// The mesh axis the stages lie along.
    pub axis: String,
    pub stages: usize,
    pub microbatches: usize,
    /// Per value (by id): the work that made it.
    pub owners: Vec<Owner>,
}

/// Whose work a value is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Owner {
    /// Every stage's (the optimizer, the gradients' reductions).
    #[default]
    Every,
    /// The first stage's only (the embedding).
    First,
    /// The last stage's only (the final layer norm, the head, the loss).
    Last,
    /// Stage s works on microbatch `base + per_stage * s`: real work where that is one of the
    /// step's microbatches, the bubble where it is not.
    Microbatch { base: i64, per_stage: i64 },
}

impl Owner {
    /// Whether stage `stage` of `stages` does this work for real.
    pub fn active(self, stage: usize, stages: usize, microbatches: usize) -> bool {
        match self {
            Owner::Every => true,
            Owner::First => stage == 0,
            Owner::Last => stage + 1 == stages,
            Owner::Microbatch { base, per_stage } => {
                let m = base + per_stage * stage as i64;
                (0..microbatches as i64).contains(&m)
            }
        }
    }
}

impl StageWork {
    /// The owner of `v` (values made before the stages were declared are everyone's).
    pub fn owner(&self, v: ValueId) -> Owner {
        self.owners.get(v.index()).copied().unwrap_or_default()
    }
}
