use thiserror::Error;

use crate::ir::{CheckpointPolicy, Precision};
use crate::setting::{Refusal, Setting};

/// A configuration or input the model cannot use, or a model that could not be traced.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ModelError {
    /// A setting the model cannot use; the refusal says what to change.
    #[error("{0}")]
    Refused(Refusal),
    /// Tracing failed on settings that were all checked: a bug, said as such.
    #[error("{0}")]
    Build(String),
}

impl ModelError {
    /// The setting refused (None for a failed build).
    pub fn setting(&self) -> Option<&Setting> {
        match self {
            ModelError::Refused(r) => Some(&r.setting),
            ModelError::Build(_) => None,
        }
    }
}

impl From<Refusal> for ModelError {
    fn from(r: Refusal) -> Self {
        ModelError::Refused(r)
    }
}

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
    /// How attention is traced; settings saved before the fused op existed read as fused.
    #[serde(default)]
    pub attention: Attention,
    /// Which activations of each block the backward pass recomputes (`jax.checkpoint` per
    /// block); settings saved before remat existed read as none.
    #[serde(default)]
    pub remat: Remat,
    /// The dtype policy the step is priced and exported under (the sandbox trains f32);
    /// settings saved before it existed read as f32.
    #[serde(default)]
    pub precision: Precision,
    /// A mixture-of-experts MLP in every block in place of the dense one (None: dense);
    /// settings saved before it existed read as dense.
    #[serde(default)]
    pub moe: Option<super::Moe>,
}

/// How the model traces attention. Both compute the same function and draw the same dropout
/// bits; they differ in what they hold and launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Attention {
    /// One `dot_product_attention` op: no (T, T) scores or probabilities held for the backward.
    #[default]
    Fused,
    /// dot_general, softmax_causal, dropout, dot_general: every (T, T) array in memory.
    Unfused,
}

impl Attention {
    pub const ALL: [Attention; 2] = [Attention::Fused, Attention::Unfused];

    /// The name `--attention` takes.
    pub fn name(self) -> &'static str {
        match self {
            Attention::Fused => "fused",
            Attention::Unfused => "unfused",
        }
    }
}

/// Rematerialization: each transformer block traced under `jax.checkpoint` with a policy, as
/// MaxText's `remat_policy` does, so the backward pass recomputes what the policy does not save.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Remat {
    /// No checkpoint: every residual is held from the forward to the backward pass.
    #[default]
    None,
    /// `jax.checkpoint(block, policy=nothing_saveable)`: only each block's input is held.
    Full,
    /// `jax.checkpoint(block, policy=dots_with_no_batch_dims_saveable)`: each block's input and
    /// the outputs of its weight matmuls that the recompute reads are held; the rest is recomputed.
    Dots,
}

impl Remat {
    pub const ALL: [Remat; 3] = [Remat::None, Remat::Full, Remat::Dots];

    /// The name `--remat` takes.
    pub fn name(self) -> &'static str {
        match self {
            Remat::None => "none",
            Remat::Full => "full",
            Remat::Dots => "dots",
        }
    }

    pub fn parse(name: &str) -> Option<Remat> {
        Remat::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The checkpoint policy of each block (None: no checkpoint).
    pub fn policy(self) -> Option<CheckpointPolicy> {
        match self {
            Remat::None => None,
            Remat::Full => Some(CheckpointPolicy::NothingSaveable),
            Remat::Dots => Some(CheckpointPolicy::DotsWithNoBatchDimsSaveable),
        }
    }
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
            attention: Attention::Fused,
            remat: Remat::None,
            precision: Default::default(),
            moe: None,
        }
    }

    pub fn head_dim(&self) -> usize {
        self.d_model / self.heads
    }

    /// Checks everything a program build would otherwise trip on, with a fix in each message.
    pub fn validate(&self) -> Result<(), ModelError> {
        let fields = [
            (Setting::Layers, self.layers),
            (Setting::DModel, self.d_model),
            (Setting::Heads, self.heads),
            (Setting::Seq, self.seq),
            (Setting::Batch, self.batch),
            (Setting::Vocab, self.vocab),
        ];
        for (setting, v) in fields {
            if v == 0 {
                return Err(Refusal::new(setting.clone(), format!("{} must be at least 1", setting.named())).into());
            }
        }
        if !self.d_model.is_multiple_of(self.heads) {
            return Err(Refusal::new(
                Setting::Heads,
                format!(
                    "{} is not divisible by {}: choose heads that divide d_model (e.g. {})",
                    Setting::DModel.at(self.d_model),
                    Setting::Heads.at(self.heads),
                    Setting::Heads.at(largest_divisor_at_most(self.d_model, self.heads))
                ),
            )
            .into());
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Refusal::new(
                Setting::Dropout,
                format!("{} must be in [0, 1)", Setting::Dropout.at(self.dropout)),
            )
            .into());
        }
        if self.vocab > u32::MAX as usize / 2 {
            return Err(Refusal::new(
                Setting::Vocab,
                format!("{} is too large", Setting::Vocab.at(self.vocab)),
            )
            .into());
        }
        if self.layers > MAX_LAYERS {
            return Err(Refusal::new(
                Setting::Layers,
                format!(
                    "{} is more than shardlab traces (at most {MAX_LAYERS}): use fewer layers",
                    Setting::Layers.at(self.layers)
                ),
            )
            .into());
        }
        super::moe::check(self)?;
        self.check_sizes()
    }

    /// Checks that every tensor the model makes can be indexed: its element count fits in
    /// usize (32 bits on wasm32), so no index computed later can wrap. Byte sizes are u64
    /// everywhere (`ir::size_in_bytes`, the memory plan, the cost model), so a program whose
    /// tensors exceed 4 GiB can still be planned and priced on wasm32 (the JAX report's model
    /// at batch 32 has 6.6 GB of logits); running it is refused by the memory checks. The
    /// largest tensors are the ones below (random bits of the original layout have the scores'
    /// shape); the parameter count covers their sum.
    fn check_sizes(&self) -> Result<(), ModelError> {
        check_sizes_for(self, usize::MAX as u64, usize::BITS)
    }

    /// Number of parameters in closed form (u64, checked; None if it overflows): `V*d + T*d`,
    /// per block `12*d^2 + 13*d` (with a mixture of experts, `4*d^2 + 8*d` and the MLP's
    /// `d*E + 2*E*d*F + d`), then `2*d`, plus `d*V` untied. Needs no parameter list, so it is
    /// cheap for any depth.
    pub fn param_count(&self) -> Option<u64> {
        let (l, d, t, v) = (
            self.layers as u64,
            self.d_model as u64,
            self.seq as u64,
            self.vocab as u64,
        );
        let embed = v.checked_mul(d)?.checked_add(t.checked_mul(d)?)?;
        let block = match &self.moe {
            None => 12u64
                .checked_mul(d.checked_mul(d)?)?
                .checked_add(13u64.checked_mul(d)?)?,
            Some(moe) => 4u64
                .checked_mul(d.checked_mul(d)?)?
                .checked_add(8u64.checked_mul(d)?)?
                .checked_add(moe.mlp_params(d)?)?,
        };
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

/// [`GptConfig::check_sizes`] for a machine whose usize holds at most `max_elements` (`bits`
/// wide): element counts must fit it, byte sizes only u64.
fn check_sizes_for(cfg: &GptConfig, max_elements: u64, bits: u32) -> Result<(), ModelError> {
    let (b, t, d, v, h) = (cfg.batch, cfg.seq, cfg.d_model, cfg.vocab, cfg.heads);
    let elements = |dims: &[usize]| {
        dims.iter()
            .try_fold(1u64, |acc, &n| acc.checked_mul(n as u64))
            .filter(|&n| n <= max_elements)
    };
    use Setting::{Batch, DModel, ExpertWidth, Experts, Heads, Seq, Vocab};
    if let Some(moe) = &cfg.moe {
        let (e, f, c) = (moe.experts, moe.width, moe.slots(t));
        let tensors: [(&str, &[usize], &[Setting]); 3] = [
            ("the experts' w_fc", &[e, d, f], &[Experts, ExpertWidth, DModel]),
            ("the experts' slots", &[e, b, c, d], &[Experts, Batch, Seq, DModel]),
            (
                "the experts' hidden units",
                &[e, b, c, f],
                &[Experts, Batch, Seq, ExpertWidth],
            ),
        ];
        for (name, dims, settings) in tensors {
            if elements(dims).and_then(|n| n.checked_mul(4)).is_none() {
                return Err(Refusal::new(
                    settings[0].clone(),
                    format!(
                        "{name} would have more elements than this machine can index ({bits} bits): lower {}",
                        crate::setting::one_of(settings)
                    ),
                )
                .into());
            }
        }
    }
    let tensors: [(&str, &[usize], &[Setting]); 6] = [
        ("wte", &[v, d], &[Vocab, DModel]),
        ("wpe", &[t, d], &[Seq, DModel]),
        ("w_fc", &[d, d, 4], &[DModel]),
        ("logits", &[b, t, v], &[Batch, Seq, Vocab]),
        ("attention scores", &[b, h, t, t], &[Batch, Heads, Seq]),
        ("MLP hidden", &[b, t, d, 4], &[Batch, Seq, DModel]),
    ];
    for (name, dims, settings) in tensors {
        if elements(dims).and_then(|n| n.checked_mul(4)).is_none() {
            return Err(Refusal::new(
                settings[0].clone(),
                format!(
                    "{name} would have more elements than this machine can index ({bits} bits): lower {}",
                    crate::setting::one_of(settings)
                ),
            )
            .into());
        }
    }
    if cfg
        .param_count()
        .filter(|&n| n <= max_elements)
        .and_then(|n| n.checked_mul(4))
        .is_none()
    {
        return Err(Refusal::new(
            Setting::Layers,
            format!(
                "the model would have more parameters than this machine can index ({bits} bits): make the model \
                 smaller ({})",
                [Setting::Layers, Setting::DModel, Setting::Vocab]
                    .map(|s| s.named())
                    .join(", ")
            ),
        )
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JAX report's ~400M-parameter model at its batch 32.
    fn report(batch: usize) -> GptConfig {
        GptConfig {
            layers: 24,
            d_model: 1024,
            heads: 16,
            seq: 1024,
            batch,
            vocab: 50304,
            tied: false,
            dropout: 0.1,
            attention: Default::default(),
            remat: Default::default(),
            precision: Default::default(),
            moe: None,
        }
    }

    #[test]
    fn report_model_at_batch_32_is_accepted_by_a_32_bit_build() {
        // Its logits hold 6.6 GB, more bytes than a 32-bit usize counts, but 1.65e9 elements,
        // which it indexes: byte sizes are u64, so wasm32 can plan it.
        let logits = crate::ir::size_in_bytes(&[32, 1024, 50304]);
        assert!(logits > u32::MAX as u64, "{logits}");
        assert!(check_sizes_for(&report(32), u32::MAX as u64, 32).is_ok());
    }

    #[test]
    fn tensors_with_more_elements_than_a_32_bit_usize_indexes_are_refused() {
        let e = check_sizes_for(&report(128), u32::MAX as u64, 32).unwrap_err();
        assert!(
            e.to_string().contains("logits") && e.to_string().contains("--batch"),
            "{e:?}"
        );
        assert!(check_sizes_for(&report(128), u64::MAX, 64).is_ok());
    }
}
