use crate::rng::{keep_scale, uniform_from_bits};

/// `out = keep ? x * (1/keep) : 0`, keep = uniform(bits) < 1 - rate (JAX's bernoulli), with
/// 1/keep rounded to f32 first, as XLA compiles flax's `x / keep_prob`.
pub fn apply(x: &[f32], bits: &[u32], rate: f32) -> Vec<f32> {
    let keep = 1.0 - rate;
    let scale = keep_scale(keep);
    x.iter()
        .zip(bits)
        .map(|(&v, &b)| if uniform_from_bits(b) < keep { v * scale } else { 0.0 })
        .collect()
}
