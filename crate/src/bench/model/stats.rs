//! What `bench model` reads off its checks: errors per block and size class, and how well the
//! predicted order of configurations matches the measured one.

/// Ranks of `v` from 1, ties sharing their mean rank.
fn ranks(v: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..v.len()).collect();
    order.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut out = vec![0.0; v.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && v[order[j + 1]] == v[order[i]] {
            j += 1;
        }
        let mean = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            out[k] = mean;
        }
        i = j + 1;
    }
    out
}

/// Spearman's rank correlation of `a` and `b` (Pearson's on their ranks, ties averaged): 1
/// when they order the items alike, -1 when reversed. None for fewer than 3 items or a
/// constant list.
pub fn spearman(a: &[f64], b: &[f64]) -> Option<f64> {
    if a.len() != b.len() || a.len() < 3 {
        return None;
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let n = ra.len() as f64;
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let (va, vb): (f64, f64) = (
        ra.iter().map(|x| (x - ma).powi(2)).sum(),
        rb.iter().map(|y| (y - mb).powi(2)).sum(),
    );
    (va > 0.0 && vb > 0.0).then(|| cov / (va * vb).sqrt())
}

/// The error of one group of checks (a block's size class).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GroupError {
    pub block: super::Block,
    pub size: &'static str,
    pub count: usize,
    /// Mean absolute percentage error.
    pub mape_pct: f64,
    /// Mean signed percentage error: positive when the model over-predicts the class (a size
    /// bias shows here).
    pub bias_pct: f64,
}

/// Mean absolute and mean signed error of `signed_pct` (each (predicted - measured) /
/// measured, in percent).
pub fn errors(signed_pct: &[f64]) -> (f64, f64) {
    let n = signed_pct.len().max(1) as f64;
    (
        signed_pct.iter().map(|e| e.abs()).sum::<f64>() / n,
        signed_pct.iter().sum::<f64>() / n,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_is_one_for_the_same_order_and_minus_one_reversed() {
        let a = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(spearman(&a, &[10.0, 20.0, 25.0, 100.0]), Some(1.0));
        assert_eq!(spearman(&a, &[4.0, 3.0, 2.0, 1.0]), Some(-1.0));
        // One swap of neighbours among five: 1 - 6 * 2 / (5 * 24) = 0.9.
        let r = spearman(&[1.0, 2.0, 3.0, 4.0, 5.0], &[1.0, 3.0, 2.0, 4.0, 5.0]).unwrap();
        assert!((r - 0.9).abs() < 1e-12, "{r}");
        assert_eq!(spearman(&a, &[1.0, 1.0, 1.0, 1.0]), None);
        assert_eq!(spearman(&a[..2], &a[..2]), None);
    }

    #[test]
    fn ties_share_their_mean_rank() {
        assert_eq!(ranks(&[5.0, 1.0, 5.0, 3.0]), vec![3.5, 1.0, 3.5, 2.0]);
    }

    #[test]
    fn errors_split_size_from_bias() {
        assert_eq!(errors(&[10.0, -10.0]), (10.0, 0.0));
        assert_eq!(errors(&[20.0, 40.0]), (30.0, 30.0));
    }
}
