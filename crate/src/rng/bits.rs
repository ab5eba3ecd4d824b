//! `jax.random.bits` / `uniform` / `bernoulli` in either layout.
use super::original::original_bits_at;
use super::partitionable::partitionable_bits_at;
use super::{Block, Key, RngError};

/// Which of JAX's two Threefry bit layouts (`jax_threefry_partitionable` False / True).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RngLayout {
    /// Counters span the whole flattened global array: only the global array can be made.
    Original,
    /// Each element's bits depend on its global index only: any block can be made alone.
    Partitionable,
}

impl RngLayout {
    pub const ALL: [RngLayout; 2] = [RngLayout::Original, RngLayout::Partitionable];

    /// The name the CLI (`--rng`) and the page use.
    pub fn name(self) -> &'static str {
        match self {
            RngLayout::Original => "original",
            RngLayout::Partitionable => "partitionable",
        }
    }

    pub fn parse(name: &str) -> Option<RngLayout> {
        RngLayout::ALL.into_iter().find(|l| l.name() == name)
    }
}

/// `jax.random.bits(key, shape, uint32)`, row-major.
pub fn random_bits(key: Key, layout: RngLayout, shape: &[usize]) -> Vec<u32> {
    random_bits_block(key, layout, &Block::full(shape))
}

/// The elements of `block` of the global `bits(key, block.global_shape())`, in block order.
/// Partitionable: computes only the block. Original: each element needs the global size,
/// as [`original_bits_at`] explains; this equals slicing the global array.
pub fn random_bits_block(key: Key, layout: RngLayout, block: &Block) -> Vec<u32> {
    match layout {
        RngLayout::Original => {
            let n = block.global_numel();
            block.global_indices().map(|i| original_bits_at(key, n, i)).collect()
        }
        RngLayout::Partitionable => block.global_indices().map(|i| partitionable_bits_at(key, i)).collect(),
    }
}

/// JAX's float32 `uniform` in [0, 1) from 32 random bits: the top 23 bits become the
/// mantissa of a float in [1, 2), minus 1 (exact).
pub fn uniform_from_bits(bits: u32) -> f32 {
    f32::from_bits((bits >> 9) | 0x3f80_0000) - 1.0
}

/// `jax.random.uniform(key, shape, float32)`.
pub fn uniform(key: Key, layout: RngLayout, shape: &[usize]) -> Vec<f32> {
    random_bits(key, layout, shape)
        .into_iter()
        .map(uniform_from_bits)
        .collect()
}

/// `jax.random.bernoulli(key, p, shape)` (mode "low"): `uniform < p`.
pub fn bernoulli_keep(key: Key, layout: RngLayout, shape: &[usize], p: f32) -> Vec<bool> {
    uniform(key, layout, shape).into_iter().map(|u| u < p).collect()
}

/// The keep probability of dropout at `rate`, as flax computes it (`1.0 - rate` in double
/// precision, then float32 like JAX's weak-typed `p`).
pub fn keep_prob(rate: f32) -> Result<f32, RngError> {
    if !(0.0..=1.0).contains(&rate) {
        return Err(RngError::Rate(rate));
    }
    Ok((1.0 - rate as f64) as f32)
}

/// The factor kept values are scaled by: `1 / keep` rounded to float32. flax writes
/// `x / keep_prob`, but XLA rewrites a division by a constant into a multiplication by its
/// reciprocal, so JAX computes `x * (1 / keep_prob)`; so do we, bit for bit.
pub fn keep_scale(keep: f32) -> f32 {
    1.0 / keep
}
