use thiserror::Error;

/// Options that cannot be exported; the message says what to change.
#[derive(Debug, Error, Clone, PartialEq)]
#[error("cannot export: {0}")]
pub struct ExportError(pub String);
