//! Cross-entropy of logits (rows, V) against targets (rows). A target >= V is an ignored
//! position: loss 0 and dlogits 0.

/// (max, sum of exp(x - max)) of a row: logsumexp = max + ln(sum), without overflow.
fn max_sum(row: &[f32]) -> (f32, f32) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    (max, row.iter().map(|&v| (v - max).exp()).sum())
}

/// `losses[r] = logsumexp(logits[r]) - logits[r, targets[r]]`
pub fn forward(logits: &[f32], targets: &[u32], rows: usize, v: usize) -> Vec<f32> {
    (0..rows)
        .map(|r| {
            let row = &logits[r * v..(r + 1) * v];
            let t = targets[r] as usize;
            if t >= v {
                return 0.0;
            }
            let (max, sum) = max_sum(row);
            max + sum.ln() - row[t]
        })
        .collect()
}

/// `dlogits[r] = (softmax(logits[r]) - onehot(targets[r])) * dlosses[r]`
pub fn backward(logits: &[f32], targets: &[u32], dlosses: &[f32], rows: usize, v: usize) -> Vec<f32> {
    let mut dlogits = vec![0.0; rows * v];
    for r in 0..rows {
        let row = &logits[r * v..(r + 1) * v];
        let t = targets[r] as usize;
        if t >= v {
            continue;
        }
        let (max, sum) = max_sum(row);
        for j in 0..v {
            let onehot = if j == t { 1.0 } else { 0.0 };
            dlogits[r * v + j] = ((row[j] - max).exp() / sum - onehot) * dlosses[r];
        }
    }
    dlogits
}
