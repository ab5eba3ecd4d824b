//! CPU twins of shaders/random.wgsl: random bits come from [`crate::rng`]; dropout of one
//! block (a device's local array; `Block::full(shape)` for a whole array).
use crate::rng::{keep_prob, keep_scale, uniform_from_bits, Block, Key, RngError, RngLayout};
pub use crate::rng::{random_bits, random_bits_block};

/// `out = keep ? x * (1 / keep_prob) : 0`, keep_prob = 1 - rate, keep = `uniform < keep_prob`
/// from the bits of `block`: flax's Dropout (`jax.random.bernoulli(key, keep_prob, shape)`,
/// `x / keep_prob`, which XLA computes with the reciprocal; see [`keep_scale`]).
pub fn dropout_forward(x: &[f32], key: Key, layout: RngLayout, block: &Block, rate: f32) -> Result<Vec<f32>, RngError> {
    if x.len() != block.numel() {
        return Err(RngError::Block(format!(
            "dropout input has {} elements, the block {:?} has {}",
            x.len(),
            block.size(),
            block.numel()
        )));
    }
    let keep = keep_prob(rate)?;
    let scale = keep_scale(keep);
    let bits = random_bits_block(key, layout, block);
    Ok(x.iter()
        .zip(bits)
        .map(|(&v, b)| if uniform_from_bits(b) < keep { v * scale } else { 0.0 })
        .collect())
}

/// `dx = keep ? dout * (1 / keep_prob) : 0`, the forward's mask regenerated from the same key.
pub fn dropout_backward(
    dout: &[f32],
    key: Key,
    layout: RngLayout,
    block: &Block,
    rate: f32,
) -> Result<Vec<f32>, RngError> {
    dropout_forward(dout, key, layout, block, rate)
}

/// The bits of element `g` of a global array of `n` elements (`jax.random.bits` in `layout`).
pub fn bits_at(key: Key, layout: RngLayout, n: u64, g: u64) -> u32 {
    match layout {
        RngLayout::Original => crate::rng::original_bits_at(key, n, g),
        RngLayout::Partitionable => crate::rng::partitionable_bits_at(key, g),
    }
}

/// The dropout bits one device's attention block reads: the global `(lead.., T, T)` bits at the
/// leading block `lead` (a block of the leading dims), the rows at global positions `q` and the
/// columns at `kv`; local shape `(lead block.., q.len(), kv.len())`. Ring attention's blocks
/// need not be rectangles of the global array (zig-zag), so the positions are listed.
pub fn attention_bits(key: Key, layout: RngLayout, lead: &Block, t: usize, q: &[usize], kv: &[usize]) -> Vec<u32> {
    let t = t as u64;
    let n = lead.global_numel() * t * t;
    let mut out = Vec::with_capacity(lead.numel() * q.len() * kv.len());
    for row in lead.global_indices() {
        for &i in q {
            for &j in kv {
                out.push(bits_at(key, layout, n, (row * t + i as u64) * t + j as u64));
            }
        }
    }
    out
}
