use thiserror::Error;

/// Invalid requests to the generator, each saying what to change.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum RngError {
    #[error("random block: {0}")]
    Block(String),
    #[error("dropout rate {0} is outside [0, 1]; use a rate in [0, 1) (0 turns dropout off)")]
    Rate(f32),
}
