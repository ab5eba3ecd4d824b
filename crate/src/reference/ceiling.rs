//! The adapter-ceiling kernels (shaders/ceiling.wgsl): arithmetic alone, and a plain copy.

/// Accumulators per `fma_peak` invocation (vec4 each) and rounds per loop trip.
pub const FMA_PEAK_ACCUMULATORS: usize = 16;
pub const FMA_PEAK_ROUNDS: usize = 4;

/// FLOPs of one `fma_peak` invocation per loop trip: rounds x accumulators x 4 lanes x 2.
pub const FMA_PEAK_FLOPS_PER_TRIP: f64 = (FMA_PEAK_ROUNDS * FMA_PEAK_ACCUMULATORS * 4 * 2) as f64;

/// What invocation `i` of `fma_peak` stores after `iters` loop trips: accumulator j of lane l
/// starts at (i % 64) / 64 + l / 4 + j, takes x = fma(x, m, c) rounds x iters times, and the
/// lane's 16 accumulators are summed as the kernel does: (x0 + ... + x7) + (x8 + ... + x15).
pub fn fma_peak(i: usize, iters: usize, m: f32, c: f32) -> [f32; 4] {
    let mut out = [0f32; 4];
    for (lane, o) in out.iter_mut().enumerate() {
        let x0 = (i % 64) as f32 / 64.0 + lane as f32 * 0.25;
        let chain = |j: usize| (0..iters * FMA_PEAK_ROUNDS).fold(x0 + j as f32, |x, _| x.mul_add(m, c));
        let half = |js: std::ops::Range<usize>| js.map(chain).reduce(|s, x| s + x).unwrap_or(0.0);
        *o = half(0..8) + half(8..FMA_PEAK_ACCUMULATORS);
    }
    out
}

/// `copy4`: dst = src.
pub fn copy4(src: &[f32], dst: &mut [f32]) {
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// x_k = 1 + (x_0 - 1) m^k when c = 1 - m: the closed form the twin must follow.
    #[test]
    fn fma_peak_twin_follows_the_closed_form() {
        let (m, c) = (0.999f32, 0.001f32);
        for (i, iters) in [(0usize, 0usize), (5, 1), (63, 10), (200, 50)] {
            let got = fma_peak(i, iters, m, c);
            let k = (iters * FMA_PEAK_ROUNDS) as i32;
            for (lane, g) in got.iter().enumerate() {
                let x0 = (i % 64) as f64 / 64.0 + lane as f64 * 0.25;
                let want: f64 = (0..16).map(|j| 1.0 + (x0 + j as f64 - 1.0) * (m as f64).powi(k)).sum();
                assert!(
                    (*g as f64 - want).abs() <= 1e-4 * want.abs(),
                    "i {i} iters {iters} lane {lane}: {g} vs {want}"
                );
            }
        }
    }
}
