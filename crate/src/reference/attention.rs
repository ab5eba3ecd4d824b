//! CPU twin of [`crate::kernels::attention`]: fused causal attention. q, k, v, o viewed
//! (heads, T, Dh) with heads = every leading index (B*H); lse and delta (heads, T); dropout
//! bits (heads, T, T) as the unfused path draws them for its probabilities.
//!
//! The forward computes what the unfused path does, in its order: scores, a two-pass softmax,
//! the dropout mask, the weighted sum of v. The backward recomputes the probabilities from the
//! log-sum-exp, as FlashAttention-2 does, and uses `delta_i = do_i . o_i` for the softmax's
//! row sum `sum_j p_ij dp_ij` (they are equal: o_i is the masked, weighted sum of v).
//!
//! Under context parallelism an op sees a block of the queries and a block of the keys
//! ([`Blocks`]): the mask compares their global positions, key j visible to query i when
//! `pos(j) <= pos(i)`. A query row that sees no key of the block gets o = 0 and lse =
//! [`NO_KEYS`], so [`combine`] gives it no weight.
use crate::ir::Runs;
use crate::rng::{keep_scale, uniform_from_bits};

/// The log-sum-exp of a row that sees no key: f32::MIN, the kernels' finite stand-in for -inf
/// (WGSL has no infinity literal), which exp() turns into a weight of 0 all the same.
pub const NO_KEYS: f32 = f32::MIN;

/// Where one device's query rows (the shape's T of them) and its `tk` key rows sit in the
/// global sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocks {
    pub tk: usize,
    pub q: Runs,
    pub kv: Runs,
}

impl Blocks {
    /// Both sides the whole sequence of `t` rows: plain causal attention.
    pub fn whole(t: usize) -> Self {
        let all = Runs {
            starts: [0, 0],
            chunk: t,
        };
        Blocks { tk: t, q: all, kv: all }
    }

    /// Whether key j is visible to query i.
    pub fn sees(&self, i: usize, j: usize) -> bool {
        self.kv.pos(j) <= self.q.pos(i)
    }
}

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
    /// The attention over q of `shape` (..., T, Dh), as [`crate::ir::Op::Attention`] has it.
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
    forward_blocks(q, k, v, bits, s, &Blocks::whole(s.t))
}

/// (q (heads, T, Dh), k, v (heads, tk, Dh)[, bits (heads, T, tk)]) -> (o, lse) of one device's
/// blocks.
pub fn forward_blocks(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    bits: Option<&[u32]>,
    s: AttentionShape,
    b: &Blocks,
) -> (Vec<f32>, Vec<f32>) {
    let (t, tk, dh) = (s.t, b.tk, s.dh);
    let mut o = vec![0.0; s.heads * t * dh];
    let mut lse = vec![0.0; s.heads * t];
    let mut p = vec![0.0; tk];
    for h in 0..s.heads {
        let qh = &q[h * t * dh..(h + 1) * t * dh];
        let kh = &k[h * tk * dh..(h + 1) * tk * dh];
        let vh = &v[h * tk * dh..(h + 1) * tk * dh];
        for i in 0..t {
            let seen: Vec<usize> = (0..tk).filter(|&j| b.sees(i, j)).collect();
            if seen.is_empty() {
                lse[h * t + i] = NO_KEYS;
                continue;
            }
            for &j in &seen {
                p[j] = s.score(qh, kh, i, j);
            }
            let max = seen.iter().fold(f32::NEG_INFINITY, |m, &j| m.max(p[j]));
            let sum: f32 = seen.iter().map(|&j| (p[j] - max).exp()).sum();
            lse[h * t + i] = max + sum.ln();
            let oi = &mut o[(h * t + i) * dh..(h * t + i + 1) * dh];
            for &j in &seen {
                let pj = (p[j] - max).exp() / sum * s.keep(bits, (h * t + i) * tk + j);
                for (od, vd) in oi.iter_mut().zip(&vh[j * dh..(j + 1) * dh]) {
                    *od += pj * vd;
                }
            }
        }
    }
    (o, lse)
}

/// Merges two partial attentions of the same query rows over disjoint keys: o1, o2
/// (rows, Dh), lse1, lse2 (rows) -> (o, lse), with lse = logaddexp(lse1, lse2) and each o
/// weighted by exp(its lse - lse). A row neither side saw keeps o = 0, lse = [`NO_KEYS`].
pub fn combine(o1: &[f32], lse1: &[f32], o2: &[f32], lse2: &[f32], dh: usize) -> (Vec<f32>, Vec<f32>) {
    let mut o = vec![0.0; o1.len()];
    let mut lse = vec![NO_KEYS; lse1.len()];
    for r in 0..lse1.len() {
        let (a, b) = (lse1[r], lse2[r]);
        if a == NO_KEYS && b == NO_KEYS {
            continue;
        }
        let m = a.max(b);
        let (ea, eb) = ((a - m).exp(), (b - m).exp());
        let l = m + (ea + eb).ln();
        let (wa, wb) = ((a - l).exp(), (b - l).exp());
        lse[r] = l;
        for d in 0..dh {
            o[r * dh + d] = wa * o1[r * dh + d] + wb * o2[r * dh + d];
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
    backward_blocks(q, k, v, saved, s, &Blocks::whole(s.t))
}

/// (q (heads, T, Dh), k, v (heads, tk, Dh), saved) -> (dq (heads, T, Dh), dk, dv (heads, tk,
/// Dh)) of one device's blocks; saved.o and saved.lse are the rows' whole attention (every
/// block combined), so each block's share is exact.
pub fn backward_blocks(q: &[f32], k: &[f32], v: &[f32], saved: &Saved, s: AttentionShape, b: &Blocks) -> [Vec<f32>; 3] {
    let (t, tk, dh) = (s.t, b.tk, s.dh);
    let (mut dq, mut dk, mut dv) = (
        vec![0.0; s.heads * t * dh],
        vec![0.0; s.heads * tk * dh],
        vec![0.0; s.heads * tk * dh],
    );
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    for h in 0..s.heads {
        let (qb, kb) = (h * t * dh, h * tk * dh);
        let qrow = |i: usize| qb + i * dh..qb + (i + 1) * dh;
        let krow = |j: usize| kb + j * dh..kb + (j + 1) * dh;
        let (qh, kh) = (&q[qb..qb + t * dh], &k[kb..kb + tk * dh]);
        for i in 0..t {
            let delta = dot(&saved.d_o[qrow(i)], &saved.o[qrow(i)]);
            let lse = saved.lse[h * t + i];
            for j in (0..tk).filter(|&j| b.sees(i, j)) {
                let p = (s.score(qh, kh, i, j) - lse).exp();
                let keep = s.keep(saved.bits, (h * t + i) * tk + j);
                let dp = keep * dot(&saved.d_o[qrow(i)], &v[krow(j)]);
                let ds = s.scale * p * (dp - delta);
                for d in 0..dh {
                    dv[kb + j * dh + d] += p * keep * saved.d_o[qb + i * dh + d];
                    dq[qb + i * dh + d] += ds * k[kb + j * dh + d];
                    dk[kb + j * dh + d] += ds * q[qb + i * dh + d];
                }
            }
        }
    }
    [dq, dk, dv]
}
