use thiserror::Error;

use crate::model::ModelError;
use crate::partition::PartitionError;
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
    /// A strategy that does not fit the model or mesh, or a spec override that names nothing.
    #[error("{what}: {why}")]
    Invalid { what: String, why: String },
}
