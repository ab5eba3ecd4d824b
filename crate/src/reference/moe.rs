//! A mixture-of-experts block's routing ops (shaders/moe.wgsl's twins): the router (softmax,
//! top-k, gates, GShard-order capacity), its gradient, and the index moves between tokens and
//! expert slots. The encodings of `places` and `owners` are [`crate::ir::moe`]'s.
use crate::ir::moe::{place_expert, place_slot};

/// The sizes of one device's routing: `groups` groups (sequences) of `seq` tokens, each
/// choosing `k` of `experts` experts, which take `capacity` choices of a group each; `width`
/// is a token row's length (the model's width) where rows move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeShape {
    pub groups: usize,
    pub seq: usize,
    pub experts: usize,
    pub k: usize,
    pub capacity: usize,
    pub width: usize,
}

impl MoeShape {
    /// The value of an empty owner: one past the last choice of a group.
    pub fn empty(&self) -> u32 {
        (self.seq * self.k) as u32
    }
}

/// The router's outputs (see [`crate::ir::Op::MoeRoute`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Routed {
    pub probs: Vec<f32>,
    pub gates: Vec<f32>,
    pub places: Vec<u32>,
    pub owners: Vec<u32>,
    pub load: Vec<f32>,
}

/// The indices of the `k` largest of `row`, largest first, ties to the lower index
/// (`jax.lax.top_k`).
pub fn top_k(row: &[f32], k: usize) -> Vec<usize> {
    let mut chosen: Vec<usize> = Vec::with_capacity(k);
    for _ in 0..k {
        let mut best: Option<usize> = None;
        for (e, &v) in row.iter().enumerate() {
            if chosen.contains(&e) {
                continue;
            }
            if best.is_none_or(|b| v > row[b]) {
                best = Some(e);
            }
        }
        chosen.extend(best);
    }
    chosen
}

/// logits (G, S, E) -> the router's outputs.
pub fn route(logits: &[f32], s: MoeShape) -> Routed {
    let MoeShape {
        groups,
        seq,
        experts: e,
        k,
        capacity: c,
        ..
    } = s;
    let mut r = Routed {
        probs: vec![0.0; groups * seq * e],
        gates: vec![0.0; groups * seq * k],
        places: vec![0; groups * seq * k],
        owners: vec![s.empty(); groups * e * c],
        load: vec![0.0; groups * 2 * e],
    };
    let mut choice = vec![0usize; seq * k];
    for g in 0..groups {
        for t in 0..seq {
            let at = (g * seq + t) * e;
            let row = &logits[at..at + e];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let sum: f32 = row.iter().map(|&v| (v - max).exp()).sum();
            for (p, &v) in r.probs[at..at + e].iter_mut().zip(row) {
                *p = (v - max).exp() / sum;
            }
            let top = top_k(row, k);
            let top_max = row[top[0]];
            let top_sum: f32 = top.iter().map(|&x| (row[x] - top_max).exp()).sum();
            for (j, &x) in top.iter().enumerate() {
                r.gates[(g * seq + t) * k + j] = (row[x] - top_max).exp() / top_sum;
                choice[t * k + j] = x;
            }
        }
        // GShard's order: every token's first choice, then every second choice, ...
        let mut count = vec![0usize; e];
        for j in 0..k {
            for t in 0..seq {
                let x = choice[t * k + j];
                let place = &mut r.places[(g * seq + t) * k + j];
                r.load[g * 2 * e + x] += 1.0;
                if count[x] < c {
                    *place = (x * c + count[x]) as u32;
                    r.owners[(g * e + x) * c + count[x]] = (t * k + j) as u32;
                    r.load[g * 2 * e + e + x] += 1.0;
                    count[x] += 1;
                } else {
                    *place = (e * c + x) as u32;
                }
            }
        }
    }
    r
}

/// (probs, gates, places, dprobs, dgates) -> dlogits: through the softmax,
/// `p * (dp - sum(p dp))`, and through the gates (a softmax over each token's chosen logits),
/// `g_j (dg_j - sum_m g_m dg_m)` at each chosen expert.
pub fn route_grad(
    probs: &[f32],
    gates: &[f32],
    places: &[u32],
    dprobs: &[f32],
    dgates: &[f32],
    s: MoeShape,
) -> Vec<f32> {
    let (e, k) = (s.experts, s.k);
    let mut dl = vec![0.0; s.groups * s.seq * e];
    for tok in 0..s.groups * s.seq {
        let (p, dp) = (&probs[tok * e..(tok + 1) * e], &dprobs[tok * e..(tok + 1) * e]);
        let dot: f32 = p.iter().zip(dp).map(|(a, b)| a * b).sum();
        for x in 0..e {
            dl[tok * e + x] = p[x] * (dp[x] - dot);
        }
        let (g, dg) = (&gates[tok * k..(tok + 1) * k], &dgates[tok * k..(tok + 1) * k]);
        let gdot: f32 = g.iter().zip(dg).map(|(a, b)| a * b).sum();
        for j in 0..k {
            let x = place_expert(places[tok * k + j], e, s.capacity);
            dl[tok * e + x] += g[j] * (dg[j] - gdot);
        }
    }
    dl
}

/// x (G, S, D) -> (E, G, C, D): each slot's owner's row (times its gate), zeros where empty.
pub fn dispatch(x: &[f32], owners: &[u32], gates: Option<&[f32]>, s: MoeShape) -> Vec<f32> {
    let MoeShape {
        groups,
        seq,
        experts: e,
        k,
        capacity: c,
        width: d,
    } = s;
    let mut out = vec![0.0; e * groups * c * d];
    for x_ in 0..e {
        for g in 0..groups {
            for slot in 0..c {
                let o = owners[(g * e + x_) * c + slot];
                if o >= s.empty() {
                    continue;
                }
                let (t, j) = (o as usize / k, o as usize % k);
                let gate = gates.map_or(1.0, |gs| gs[(g * seq + t) * k + j]);
                let src = &x[(g * seq + t) * d..(g * seq + t + 1) * d];
                let dst = ((x_ * groups + g) * c + slot) * d;
                for (o, v) in out[dst..dst + d].iter_mut().zip(src) {
                    *o = v * gate;
                }
            }
        }
    }
    out
}

/// y (E, G, C, D) -> (G, S, D): each token's sum over its kept choices, in choice order, of
/// its slot's row times the choice's gate (1 without gates).
pub fn combine(y: &[f32], places: &[u32], gates: Option<&[f32]>, s: MoeShape) -> Vec<f32> {
    let MoeShape {
        groups,
        seq,
        experts: e,
        k,
        capacity: c,
        width: d,
    } = s;
    let mut out = vec![0.0; groups * seq * d];
    for g in 0..groups {
        for t in 0..seq {
            let dst = (g * seq + t) * d;
            for j in 0..k {
                let at = (g * seq + t) * k + j;
                let Some((x, slot)) = place_slot(places[at], e, c) else {
                    continue;
                };
                let gate = gates.map_or(1.0, |gs| gs[at]);
                let src = ((x * groups + g) * c + slot) * d;
                for i in 0..d {
                    out[dst + i] += y[src + i] * gate;
                }
            }
        }
    }
    out
}

/// a (G, S, D), b (E, G, C, D) -> (G, S, k): each kept choice's row of `a` dotted with its
/// slot's row of `b`; 0 for a dropped choice.
pub fn gate_grad(a: &[f32], b: &[f32], places: &[u32], s: MoeShape) -> Vec<f32> {
    let MoeShape {
        groups,
        seq,
        experts: e,
        k,
        capacity: c,
        width: d,
    } = s;
    let mut out = vec![0.0; groups * seq * k];
    for g in 0..groups {
        for t in 0..seq {
            for j in 0..k {
                let at = (g * seq + t) * k + j;
                if let Some((x, slot)) = place_slot(places[at], e, c) {
                    let (ra, rb) = ((g * seq + t) * d, ((x * groups + g) * c + slot) * d);
                    out[at] = (0..d).map(|i| a[ra + i] * b[rb + i]).sum();
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(seq: usize, experts: usize, k: usize, capacity: usize) -> MoeShape {
        MoeShape {
            groups: 1,
            seq,
            experts,
            k,
            capacity,
            width: 1,
        }
    }

    #[test]
    fn top_k_takes_the_largest_first_and_breaks_ties_to_the_lower_index() {
        assert_eq!(top_k(&[0.1, 0.5, 0.5, 0.2], 3), vec![1, 2, 3]);
    }

    #[test]
    fn first_choices_take_slots_before_any_second_choice_and_the_rest_are_dropped() {
        // Three tokens, all preferring expert 0 then 1; experts hold 2 choices each.
        let logits = [3.0, 2.0, 0.0, 3.0, 2.0, 0.0, 3.0, 2.0, 0.0];
        let r = route(&logits, shape(3, 3, 2, 2));
        let (e, c) = (3, 2);
        let kept = |p: u32| place_slot(p, e, c);
        // Tokens 0 and 1 keep their first choice; token 2's is dropped. The second choices
        // (expert 1) fill in sequence order: tokens 0 and 1 again.
        assert_eq!(kept(r.places[0]), Some((0, 0)));
        assert_eq!(kept(r.places[2]), Some((0, 1)));
        assert_eq!(kept(r.places[4]), None);
        assert_eq!(place_expert(r.places[4], e, c), 0);
        assert_eq!(kept(r.places[1]), Some((1, 0)));
        assert_eq!(kept(r.places[5]), None);
        assert_eq!(r.owners[..2], [0, 2]);
        assert_eq!(r.load, vec![3.0, 3.0, 0.0, 2.0, 2.0, 0.0]);
        // Each token's gates are the softmax of its two chosen logits.
        let g0 = 1.0 / (1.0 + (-1.0f32).exp());
        assert!((r.gates[0] - g0).abs() < 1e-6 && (r.gates[1] - (1.0 - g0)).abs() < 1e-6);
    }

    #[test]
    fn dispatch_and_combine_are_each_others_transpose() {
        let s = MoeShape {
            width: 2,
            ..shape(3, 3, 2, 2)
        };
        let logits = [0.3, 2.0, -1.0, 1.0, 0.5, 0.7, -0.2, 0.1, 0.9];
        let r = route(&logits, s);
        let x: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
        let y: Vec<f32> = (0..3 * 2 * 2).map(|i| (i as f32 * 0.37).sin()).collect();
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f32>();
        let dx = dispatch(&x, &r.owners, Some(&r.gates), s);
        let cy = combine(&y, &r.places, Some(&r.gates), s);
        assert!((dot(&dx, &y) - dot(&x, &cy)).abs() < 1e-5);
    }
}
