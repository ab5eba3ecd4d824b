//! Reductions.

/// x (outer, n, inner) -> out (outer, inner), the sum over n.
pub fn sum_axis(x: &[f32], outer: usize, n: usize, inner: usize) -> Vec<f32> {
    let mut out = vec![0.0; outer * inner];
    for o in 0..outer {
        for j in 0..n {
            for k in 0..inner {
                out[o * inner + k] += x[(o * n + j) * inner + k];
            }
        }
    }
    out
}
