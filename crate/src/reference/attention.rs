//! CPU twin of [`crate::kernels::attention`]: fused causal attention. q, k, v, o viewed
//! (heads, T, Dh) with heads = every leading index (B*H); lse and delta (heads, T); dropout
//! bits (heads, T, T) as the unfused path draws them for its probabilities.
//!
//! The forward computes what the unfused path does, in its order: scores, a two-pass softmax,
//! the dropout mask, the weighted sum of v. The backward recomputes the probabilities from the
//! log-sum-exp, as FlashAttention-2 does, and uses `delta_i = do_i . o_i` for the softmax's
//! row sum `sum_j p_ij dp_ij` (they are equal: o_i is the masked, weighted sum of v).
use crate::rng::{keep_scale, uniform_from_bits};

/// The sizes and constants of one attention op.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    /// Independent (T, Dh) problems: every leading index, every device's.
    pub heads: usize,
    pub t: usize,
    pub dh: usize,
    /// Folded into the scores: 1/sqrt(Dh).
    pub scale: f32,
    /// Dropout on the probabilities (0: none, and no bits).
    pub rate: f32,
}

impl AttentionShape {
    /// The attention over q, k, v of `shape` (..., T, Dh), as [`crate::ir::Op::Attention`] has them.
    pub fn of(shape: &[usize], scale: f32, rate: f32) -> Self {
        let n = shape.len();
        Self {
            heads: shape[..n - 2].iter().product(),
            t: shape[n - 2],
            dh: shape[n - 1],
            scale,
            rate,
        }
    }

    /// The dropout factor of probability (h, i, j): 0 if dropped, 1/keep if kept, 1 without dropout.
    fn keep(&self, bits: Option<&[u32]>, at: usize) -> f32 {
        match bits {
            Some(b) => {
                let keep = 1.0 - self.rate;
                if uniform_from_bits(b[at]) < keep {
                    keep_scale(keep)
                } else {
                    0.0
                }
            }
            None => 1.0,
        }
    }

    fn score(&self, q: &[f32], k: &[f32], i: usize, j: usize) -> f32 {
        let (qi, kj) = (&q[i * self.dh..(i + 1) * self.dh], &k[j * self.dh..(j + 1) * self.dh]);
        self.scale * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>()
    }
}

/// (q, k, v[, bits]) -> (o (heads, T, Dh), lse (heads, T)).
pub fn forward(q: &[f32], k: &[f32], v: &[f32], bits: Option<&[u32]>, s: AttentionShape) -> (Vec<f32>, Vec<f32>) {
    let (t, dh) = (s.t, s.dh);
    let mut o = vec![0.0; s.heads * t * dh];
    let mut lse = vec![0.0; s.heads * t];
    let mut p = vec![0.0; t];
    for h in 0..s.heads {
        let at = |x: &[f32]| x[h * t * dh..(h + 1) * t * dh].to_vec();
        let (qh, kh, vh) = (at(q), at(k), at(v));
        for i in 0..t {
            for (j, pj) in p.iter_mut().enumerate().take(i + 1) {
                *pj = s.score(&qh, &kh, i, j);
            }
            let max = p[..=i].iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let sum: f32 = p[..=i].iter().map(|&x| (x - max).exp()).sum();
            lse[h * t + i] = max + sum.ln();
            let oi = &mut o[(h * t + i) * dh..(h * t + i + 1) * dh];
            for j in 0..=i {
                let pj = (p[j] - max).exp() / sum * s.keep(bits, (h * t + i) * t + j);
                for (od, vd) in oi.iter_mut().zip(&vh[j * dh..(j + 1) * dh]) {
                    *od += pj * vd;
                }
            }
        }
    }
    (o, lse)
}

/// The backward's inputs besides q, k, v: the forward's o and lse, the cotangent of o, the bits.
pub struct Saved<'a> {
    pub o: &'a [f32],
    pub lse: &'a [f32],
    pub d_o: &'a [f32],
    pub bits: Option<&'a [u32]>,
}

/// (q, k, v, saved) -> (dq, dk, dv), each (heads, T, Dh).
pub fn backward(q: &[f32], k: &[f32], v: &[f32], saved: &Saved, s: AttentionShape) -> [Vec<f32>; 3] {
    let (t, dh) = (s.t, s.dh);
    let n = s.heads * t * dh;
    let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    for h in 0..s.heads {
        let base = h * t * dh;
        let row = |i: usize| base + i * dh..base + (i + 1) * dh;
        let (qh, kh) = (&q[base..base + t * dh], &k[base..base + t * dh]);
        for i in 0..t {
            let delta = dot(&saved.d_o[row(i)], &saved.o[row(i)]);
            let lse = saved.lse[h * t + i];
            for j in 0..=i {
                let p = (s.score(qh, kh, i, j) - lse).exp();
                let keep = s.keep(saved.bits, (h * t + i) * t + j);
                let dp = keep * dot(&saved.d_o[row(i)], &v[row(j)]);
                let ds = s.scale * p * (dp - delta);
                for d in 0..dh {
                    dv[base + j * dh + d] += p * keep * saved.d_o[base + i * dh + d];
                    dq[base + i * dh + d] += ds * k[base + j * dh + d];
                    dk[base + j * dh + d] += ds * q[base + i * dh + d];
                }
            }
        }
    }
    [dq, dk, dv]
}
