use thiserror::Error;

use crate::model::ModelError;
use crate::partition::PartitionError;
use crate::setting::{Audience, Refusal, Setting};
use crate::sharding::ShardingError;

/// Options that cannot be planned, with what to change.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PlanError {
    #[error(transparent)]
    Partition(#[from] PartitionError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Sharding(#[from] ShardingError),
    /// A setting that does not fit the model or mesh, or a spec override that names nothing.
    #[error(transparent)]
    Refused(#[from] Refusal),
}

impl PlanError {
    /// The setting the error is about, where the page shows it: the refused one; the mesh for
    /// a mesh or partitioning the mesh cannot carry.
    pub fn setting(&self) -> Setting {
        match self {
            PlanError::Refused(r) => r.setting.clone(),
            PlanError::Model(e) => e.setting().cloned().unwrap_or(Setting::Mesh),
            PlanError::Sharding(_) | PlanError::Partition(_) => Setting::Mesh,
        }
    }

    /// The message in `to`'s words.
    pub fn text(&self, to: Audience) -> String {
        match self {
            PlanError::Refused(r) | PlanError::Model(ModelError::Refused(r)) => r.text(to),
            other => other.to_string(),
        }
    }
}
