//! Causal softmax of attention scores: s, p viewed (rows, T), rows = B*H*T, the query of
//! row r is i = r % T, and entries j > i are masked (p = 0 there).

/// s (rows, T) -> p (rows, T).
pub fn causal_forward(s: &[f32], rows: usize, t: usize) -> Vec<f32> {
    let mut p = vec![0.0; rows * t];
    for r in 0..rows {
        let i = r % t;
        let row = &s[r * t..r * t + i + 1];
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let sum: f32 = row.iter().map(|&v| (v - max).exp()).sum();
        for j in 0..=i {
            p[r * t + j] = (row[j] - max).exp() / sum;
        }
    }
    p
}

/// p, dp (rows, T) -> ds (rows, T) = p * (dp - sum_j p*dp), 0 where masked.
pub fn causal_backward(p: &[f32], dp: &[f32], rows: usize, t: usize) -> Vec<f32> {
    let mut ds = vec![0.0; rows * t];
    for r in 0..rows {
        let i = r % t;
        let dot: f32 = (0..=i).map(|j| p[r * t + j] * dp[r * t + j]).sum();
        for j in 0..=i {
            ds[r * t + j] = p[r * t + j] * (dp[r * t + j] - dot);
        }
    }
    ds
}
