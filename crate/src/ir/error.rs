use thiserror::Error;

/// A program that cannot be built: shapes that do not fit an op, or a bad attribute.
#[derive(Debug, Error, Clone, PartialEq)]
#[error("{op}: {message}")]
pub struct IrError {
    pub op: String,
    pub message: String,
}

impl IrError {
    pub fn new(op: &str, message: impl Into<String>) -> Self {
        Self {
            op: op.to_string(),
            message: message.into(),
        }
    }
}
