use thiserror::Error;

use crate::model::ModelError;
use crate::partition::explicit::ShardingTypeError;
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
    /// Explicit mode: an op of the typed program JAX refuses, with JAX's message and its fix
    /// (boxed: it carries the line and the fix, and every error of the crate carries a PlanError).
    #[error("{}", explicit_text(.0, Audience::Cli))]
    Explicit(Box<ShardingTypeError>),
}

impl From<ShardingTypeError> for PlanError {
    fn from(e: ShardingTypeError) -> Self {
        PlanError::Explicit(Box::new(e))
    }
}

/// A refused op in `to`'s words, its fix as the setting that writes it where there is one (a
/// spec override of the named value: the op's `out_sharding=`, or a reshard of the operand).
fn explicit_text(e: &ShardingTypeError, to: Audience) -> String {
    let fix = match (&e.fix.spec, e.fix.named) {
        (Some(spec), true) => format!(
            "{}, which {} writes",
            e.fix.code,
            Setting::Spec(e.fix.value.clone()).at(spec)
        ),
        _ => e.fix.code.clone(),
    };
    let text = format!(
        "{}: JAX raises a ShardingTypeError at `{}`: {} Fix: {fix}",
        Setting::Mode.at("explicit"),
        e.line,
        e.message
    );
    crate::setting::render(&text, to)
}

impl PlanError {
    /// The setting the error is about, where the page shows it: the refused one; the mesh for
    /// a mesh or partitioning the mesh cannot carry.
    pub fn setting(&self) -> Setting {
        match self {
            PlanError::Refused(r) => r.setting.clone(),
            PlanError::Model(e) => e.setting().cloned().unwrap_or(Setting::Mesh),
            PlanError::Sharding(_) | PlanError::Partition(_) => Setting::Mesh,
            PlanError::Explicit(e) if e.fix.named => Setting::Spec(e.fix.value.clone()),
            PlanError::Explicit(_) => Setting::Mode,
        }
    }

    /// The message in `to`'s words.
    pub fn text(&self, to: Audience) -> String {
        match self {
            PlanError::Refused(r) | PlanError::Model(ModelError::Refused(r)) => r.text(to),
            PlanError::Explicit(e) => explicit_text(e, to),
            other => other.to_string(),
        }
    }
}
