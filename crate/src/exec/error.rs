use thiserror::Error;

use crate::gpu::GpuError;
use crate::ir::IrError;
use crate::model::ModelError;
use crate::plan::{MemoryError, PlanError};

/// Why a program could not run.
#[derive(Debug, Error, Clone)]
pub enum ExecError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("invalid program: {0}")]
    Ir(#[from] IrError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("{0}")]
    Input(String),
    #[error("{op} is not supported by the {executor} executor: {why}")]
    Unsupported {
        op: String,
        executor: &'static str,
        why: String,
    },
}
