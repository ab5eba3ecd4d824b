use thiserror::Error;

/// A configuration or input the model cannot use; the message says what to change.
#[derive(Debug, Error, Clone, PartialEq)]
#[error("{0}")]
pub struct ModelError(pub String);

/// The deepest model shardlab traces. Deeper than any published GPT (GPT-3 has 96 blocks);
/// a program grows with the depth, so this bounds the time and memory of tracing one.
pub const MAX_LAYERS: usize = 1024;

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
        if self.layers > MAX_LAYERS {
            return Err(ModelError(format!(
                "--layers {} is more than shardlab traces (at most {MAX_LAYERS}): use fewer layers",
                self.layers
            )));
        }
        self.check_sizes()
    }

    /// Checks that the byte size of every tensor the model makes fits in usize (32 bits on
    /// wasm32), so no element count or byte size computed later can wrap. The largest are
    /// the ones below (random bits of the original layout have the scores' shape); the
    /// parameter count covers their sum.
    fn check_sizes(&self) -> Result<(), ModelError> {
        let (b, t, d, v, h) = (self.batch, self.seq, self.d_model, self.vocab, self.heads);
        let bytes = |dims: &[usize]| dims.iter().try_fold(4usize, |acc, &n| acc.checked_mul(n));
        let tensors: [(&str, &[usize], &str); 6] = [
            ("wte", &[v, d], "lower --vocab or --d-model"),
            ("wpe", &[t, d], "lower --seq or --d-model"),
            ("w_fc", &[d, d, 4], "lower --d-model"),
            ("logits", &[b, t, v], "lower --batch, --seq or --vocab"),
            ("attention scores", &[b, h, t, t], "lower --batch, --heads or --seq"),
            ("MLP hidden", &[b, t, d, 4], "lower --batch, --seq or --d-model"),
        ];
        for (name, dims, fix) in tensors {
            if bytes(dims).is_none() {
                return Err(ModelError(format!(
                    "{name} would have more bytes than this machine can address ({} bits): {fix}",
                    usize::BITS
                )));
            }
        }
        let params = self.param_count().and_then(|n| usize::try_from(n).ok()?.checked_mul(4));
        if params.is_none() {
            return Err(ModelError(format!(
                "the parameters would have more bytes than this machine can address ({} bits): make the model smaller \
                 (--layers, --d-model, --vocab)",
                usize::BITS
            )));
        }
        Ok(())
    }

    /// Number of parameters in closed form (u64, checked; None if it overflows): `V*d + T*d`,
    /// per block `12*d^2 + 13*d`, then `2*d`, plus `d*V` untied. Needs no parameter list, so
    /// it is cheap for any depth.
    pub fn param_count(&self) -> Option<u64> {
        let (l, d, t, v) = (
            self.layers as u64,
            self.d_model as u64,
            self.seq as u64,
            self.vocab as u64,
        );
        let embed = v.checked_mul(d)?.checked_add(t.checked_mul(d)?)?;
        let block = 12u64
            .checked_mul(d.checked_mul(d)?)?
            .checked_add(13u64.checked_mul(d)?)?;
        let head = if self.tied { 0 } else { d.checked_mul(v)? };
        embed
            .checked_add(l.checked_mul(block)?)?
            .checked_add(2u64.checked_mul(d)?)?
            .checked_add(head)
    }

    /// Number of parameters (elements); fits usize once [`GptConfig::validate`] passed.
    pub fn num_params(&self) -> usize {
        super::param_specs(self).iter().map(|p| p.numel()).sum()
    }
}

fn largest_divisor_at_most(n: usize, k: usize) -> usize {
    (1..=k.min(n)).rev().find(|d| n.is_multiple_of(*d)).unwrap_or(1)
}
