//! `jax.checkpoint` (remat): a traced region whose residuals the backward pass recomputes
//! instead of holding, except the values its policy names saveable. The policies are
//! `jax.checkpoint_policies`' names and rules.
use std::ops::Range;

use super::Op;

/// Which values of a checkpointed region the backward pass may read as saved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointPolicy {
    /// `nothing_saveable`: only the region's inputs are kept; everything inside is recomputed.
    NothingSaveable,
    /// `dots_with_no_batch_dims_saveable`: the outputs of dot_generals without batch dimensions
    /// (the matmuls with weights) are kept; everything else is recomputed. Batched dots
    /// (attention's) and fused attention are recomputed.
    DotsWithNoBatchDimsSaveable,
}

impl CheckpointPolicy {
    /// The name under `jax.checkpoint_policies`.
    pub fn jax_name(self) -> &'static str {
        match self {
            CheckpointPolicy::NothingSaveable => "nothing_saveable",
            CheckpointPolicy::DotsWithNoBatchDimsSaveable => "dots_with_no_batch_dims_saveable",
        }
    }

    /// Whether the outputs of `op`, inside a region, are saved for the backward pass.
    pub fn saveable(self, op: &Op) -> bool {
        match (self, op) {
            (CheckpointPolicy::NothingSaveable, _) => false,
            (CheckpointPolicy::DotsWithNoBatchDimsSaveable, Op::DotGeneral { lhs_batch, .. }) => lhs_batch.is_empty(),
            (CheckpointPolicy::DotsWithNoBatchDimsSaveable, _) => false,
        }
    }
}

/// A checkpointed region: instructions `instrs` of the forward pass, traced inside
/// [`super::Builder::checkpoint`].
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    pub instrs: Range<usize>,
    pub policy: CheckpointPolicy,
}
