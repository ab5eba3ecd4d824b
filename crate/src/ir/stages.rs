//! Which pipeline stages run each instruction of a pipelined per-device program. Every device
//! runs the same program, and a stage's own work is the branch of a conditional on its index
//! along the stage axis (`lax.cond(axis_index("pp") == s, ...)` in a shard_map body): an
//! instruction owned by some stages runs on their devices only, and its results are zero on the
//! others. So the embedding runs on the first stage, the head on the last, and each stage's
//! forward and backward passes on that stage alone, in the order its schedule says; the
//! executors skip the work, and a model of real devices counts it as that stage's time.
use super::{Program, ValueId};

/// The most stages a pipelined program may have (an owner is a set of stages, one bit each).
pub const MAX_STAGES: usize = 64;

/// A pipelined program's stages and, per value, the stages that make it.
#[derive(Clone, Debug, PartialEq)]
pub struct StageWork {
    /// The mesh axis the stages lie along.
    pub axis: String,
    pub stages: usize,
    pub microbatches: usize,
    /// Per value (by id): the stages whose work made it.
    pub owners: Vec<Owner>,
    /// Every pass a stage runs, with its instructions (in program order): what a schedule's
    /// timeline is priced and measured from.
    pub passes: Vec<PassSpan>,
}

/// What a pipeline pass computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Pass {
    /// The forward pass of one microbatch through one chunk of a stage's blocks.
    #[serde(rename = "F")]
    Forward,
    /// Its backward pass: the input's gradient and, where the schedule does not split the
    /// backward, the weights' gradients too.
    #[serde(rename = "B")]
    Backward,
    /// The weights' gradients of a backward pass split in two (zero-bubble schedules).
    #[serde(rename = "W")]
    Weight,
}

impl Pass {
    /// The pass's letter, as the schedules' papers draw it.
    pub fn letter(self) -> char {
        match self {
            Pass::Forward => 'F',
            Pass::Backward => 'B',
            Pass::Weight => 'W',
        }
    }
}

/// One pass of one microbatch through one chunk (virtual stage) of a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Action {
    pub pass: Pass,
    pub microbatch: usize,
    pub chunk: usize,
}

/// A pass as traced: its stage and its instructions.
#[derive(Clone, Debug, PartialEq)]
pub struct PassSpan {
    pub stage: usize,
    pub action: Action,
    /// Its instructions, ascending.
    pub instrs: Vec<usize>,
}

/// The stages that compute a value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Owner {
    /// Every stage's (the optimizer, the gradients' reductions, the collectives between stages).
    #[default]
    Every,
    /// The stages in the set (bit s: stage s); the value is zero on every other stage.
    Stages(u64),
}

impl Owner {
    /// Stage `s`'s work alone.
    pub fn stage(s: usize) -> Owner {
        debug_assert!(s < MAX_STAGES, "stage {s} of at most {MAX_STAGES}");
        Owner::Stages(1 << s)
    }

    /// Whether stage `stage` does this work.
    pub fn active(self, stage: usize) -> bool {
        match self {
            Owner::Every => true,
            Owner::Stages(set) => stage < MAX_STAGES && set & (1 << stage) != 0,
        }
    }

    /// The work of both: what an instruction that reads `self`'s and `other`'s values must run
    /// on so that neither's contribution is lost (a sum of two stages' cotangents).
    pub fn join(self, other: Owner) -> Owner {
        match (self, other) {
            (Owner::Stages(a), Owner::Stages(b)) => Owner::Stages(a | b),
            _ => Owner::Every,
        }
    }

    /// Whether every stage that does `self`'s work does `other`'s too.
    pub fn within(self, other: Owner) -> bool {
        match (self, other) {
            (_, Owner::Every) => true,
            (Owner::Every, Owner::Stages(_)) => false,
            (Owner::Stages(a), Owner::Stages(b)) => a & !b == 0,
        }
    }

    /// The stages of `stages` that do this work, in order.
    pub fn members(self, stages: usize) -> Vec<usize> {
        (0..stages).filter(|&s| self.active(s)).collect()
    }
}

impl StageWork {
    /// The owner of `v` (values made before the stages were declared are everyone's).
    pub fn owner(&self, v: ValueId) -> Owner {
        self.owners.get(v.index()).copied().unwrap_or_default()
    }
}

impl Program {
    /// The stages that run instruction `i`: its results' owner. A collective runs on every
    /// device of its groups whatever its owner (a device outside the owner takes part and keeps
    /// zeros), so its operands must be there on every device.
    pub fn instr_owner(&self, i: usize) -> Owner {
        match (&self.stages, self.instrs[i].outputs.first()) {
            (Some(st), Some(o)) => st.owner(*o),
            _ => Owner::Every,
        }
    }

    /// The stage the device `device` is, in a pipelined program (None otherwise).
    pub fn stage_of(&self, device: usize) -> Option<usize> {
        let (st, mesh) = (self.stages.as_ref()?, self.mesh.as_ref()?);
        mesh.axes_index(device, &[st.axis.as_str()]).ok()
    }

    /// Whether device `device` runs instruction `i` (every device outside a pipeline).
    pub fn runs_on(&self, i: usize, device: usize) -> bool {
        self.stage_of(device).is_none_or(|s| self.instr_owner(i).active(s))
    }

    /// Per value: whether something reads it on a device outside its owner (an instruction
    /// whose stages are not all its owner's, a collective, or the program's return), so that an
    /// executor which computes it there anyway must leave zeros there.
    pub fn read_outside_owner(&self) -> Vec<bool> {
        let mut out = vec![false; self.values.len()];
        let Some(st) = &self.stages else { return out };
        for (i, ins) in self.instrs.iter().enumerate() {
            let reader = if ins.op.is_collective() {
                Owner::Every
            } else {
                self.instr_owner(i)
            };
            for v in &ins.inputs {
                if !reader.within(st.owner(*v)) {
                    out[v.index()] = true;
                }
            }
        }
        for v in &self.outputs {
            out[v.index()] |= st.owner(*v) != Owner::Every;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_join_holds_both_stages_and_every_absorbs() {
        let (a, b) = (Owner::stage(0), Owner::stage(3));
        assert_eq!(a.join(b).members(4), vec![0, 3]);
        assert_eq!(a.join(Owner::Every), Owner::Every);
        assert!(a.within(a.join(b)) && !a.join(b).within(a));
        assert!(Owner::Every.within(Owner::Every) && !Owner::Every.within(b));
        assert!(!b.active(2) && b.active(3) && !b.active(200));
    }
}
