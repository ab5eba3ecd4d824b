use thiserror::Error;

/// A configuration or input the model cannot use; the message says what to change.
#[derive(Debug, Error, Clone, PartialEq)]
#[error("{0}")]
pub struct ModelError(pub String);

/// docs/MODEL.md's configuration.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GptConfig {
    pub layers: usize,
    pub d_model: usize,
    pub heads: usize,
    pub seq: usize,
    pub batch: usize,
    pub vocab: usize,
    pub tied: bool,
    pub dropout: f32,
}

#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Optimizer {
    Sgd { lr: f32 },
    AdamW { lr: f32 },
}

impl Optimizer {
    pub fn lr(&self) -> f32 {
        match *self {
            Optimizer::Sgd { lr } | Optimizer::AdamW { lr } => lr,
        }
    }

    /// Optimizer state slots per parameter (AdamW: m and v).
    pub fn slots(&self) -> usize {
        match self {
            Optimizer::Sgd { .. } => 0,
            Optimizer::AdamW { .. } => 2,
        }
    }
}

impl GptConfig {
    /// The configuration of docs/MODEL.md's tiny test model.
    pub fn tiny() -> Self {
        Self {
            layers: 1,
            d_model: 32,
            heads: 4,
            seq: 8,
            batch: 2,
            vocab: 64,
            tied: false,
            dropout: 0.0,
        }
    }

    pub fn head_dim(&self) -> usize {
        self.d_model / self.heads
    }

    /// Checks everything a program build would otherwise trip on, with a fix in each message.
    pub fn validate(&self) -> Result<(), ModelError> {
        let fields = [
            ("--layers", self.layers),
            ("--d-model", self.d_model),
            ("--heads", self.heads),
            ("--seq", self.seq),
            ("--batch", self.batch),
            ("--vocab", self.vocab),
        ];
        for (flag, v) in fields {
            if v == 0 {
                return Err(ModelError(format!("{flag} must be at least 1")));
            }
        }
        if !self.d_model.is_multiple_of(self.heads) {
            return Err(ModelError(format!(
                "--d-model {} is not divisible by --heads {}: choose heads that divide d_model (e.g. --heads {})",
                self.d_model,
                self.heads,
                largest_divisor_at_most(self.d_model, self.heads)
            )));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ModelError(format!("--dropout {} must be in [0, 1)", self.dropout)));
        }
        if self.vocab > u32::MAX as usize / 2 {
            return Err(ModelError(format!("--vocab {} is too large", self.vocab)));
        }
        Ok(())
    }

    /// Number of parameters (elements).
    pub fn num_params(&self) -> usize {
        super::param_specs(self).iter().map(|p| p.numel()).sum()
    }
}

fn largest_divisor_at_most(n: usize, k: usize) -> usize {
    (1..=k.min(n)).rev().find(|d| n.is_multiple_of(*d)).unwrap_or(1)
}
