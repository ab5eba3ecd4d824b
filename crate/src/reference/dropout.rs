use crate::rng::uniform_from_bits;

/// `out = keep ? x / (1 - rate) : 0`, keep = uniform(bits) < 1 - rate (JAX's bernoulli).
pub fn apply(x: &[f32], bits: &[u32], rate: f32) -> Vec<f32> {
    let keep = 1.0 - rate;
    x.iter()
        .zip(bits)
        .map(|(&v, &b)| if uniform_from_bits(b) < keep { v / keep } else { 0.0 })
        .collect()
}
