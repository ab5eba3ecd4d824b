use crate::ir::{Instr, Op, Program, Runs};

/// The buckets of the per-category breakdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Matmul,
    Attention,
    Rng,
    Collectives,
    Optimizer,
    Other,
}

impl Category {
    pub const ALL: [Category; 6] = [
        Category::Matmul,
        Category::Attention,
        Category::Rng,
        Category::Collectives,
        Category::Optimizer,
        Category::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Category::Matmul => "matmul",
            Category::Attention => "attention",
            Category::Rng => "rng",
            Category::Collectives => "collectives",
            Category::Optimizer => "optimizer",
            Category::Other => "other",
        }
    }
}

/// The category of an instruction. Batched dot_generals (the attention scores and
/// weighted sums) and the causal softmax count as attention; other contractions as matmul.
pub fn category(ins: &Instr) -> Category {
    match &ins.op {
        Op::DotGeneral { lhs_batch, .. } if !lhs_batch.is_empty() => Category::Attention,
        Op::DotGeneral { .. } => Category::Matmul,
        Op::SoftmaxCausal
        | Op::SoftmaxCausalGrad
        | Op::Attention { .. }
        | Op::AttentionGrad { .. }
        | Op::AttentionCombine => Category::Attention,
        Op::FoldIn { .. } | Op::RandomBits { .. } | Op::RandomBitsBlock { .. } | Op::Dropout { .. } => Category::Rng,
        Op::SgdUpdate { .. } | Op::AdamWUpdate { .. } => Category::Optimizer,
        op if op.is_collective() => Category::Collectives,
        Op::FoldInAxisIndex { .. } => Category::Rng,
        _ => Category::Other,
    }
}

/// Pairs (p, q) with p in [a, a + n), q in [b, b + m) and q <= p: the keys of a run that the
/// queries of another run see.
fn pairs_seen(a: u64, n: u64, b: u64, m: u64) -> u64 {
    if n == 0 || m == 0 {
        return 0;
    }
    // For query p: min(max(p - b + 1, 0), m) keys. p < b sees none; b <= p < b + m - 1 sees
    // p - b + 1; from b + m - 1 on, all m.
    let (lo, hi) = (a, a + n); // queries [lo, hi)
    let ramp_lo = lo.max(b);
    let ramp_hi = hi.min(b + m - 1);
    let ramp = if ramp_hi > ramp_lo {
        // sum of (p - b + 1) over p in [ramp_lo, ramp_hi)
        let (x, y) = (ramp_lo - b + 1, ramp_hi - b);
        (x + y) * (y - x + 1) / 2
    } else {
        0
    };
    let full_from = lo.max(b + m - 1);
    let full = if hi > full_from { (hi - full_from) * m } else { 0 };
    ramp + full
}

/// The runs of a block of `len` rows: one or two (start, length).
fn runs_of(r: &Runs, len: usize) -> Vec<(u64, u64)> {
    let first = r.chunk.min(len);
    let mut out = vec![(r.starts[0] as u64, first as u64)];
    if len > first {
        out.push((r.starts[1] as u64, (len - first) as u64));
    }
    out
}

/// The (query, key) pairs a causal attention instruction computes on each device (one entry
/// on one device): per head, the keys of its block each query of its block sees, by their
/// global positions. On one device T(T+1)/2; under context parallelism a device's queries see
/// more keys the later they sit, so the counts differ (contiguous blocks) or agree (zig-zag).
pub fn attention_pairs(prog: &Program, ins: &Instr) -> Vec<u64> {
    let (q, k) = (prog.shape(ins.inputs[0]), prog.shape(ins.inputs[1]));
    let n = q.len();
    let heads: u64 = q[..n - 2].iter().map(|&d| d as u64).product();
    let (tq, tk) = (q[n - 2], k[n - 2]);
    let seq = match &ins.op {
        Op::Attention { seq, .. } | Op::AttentionGrad { seq, .. } => seq.clone(),
        _ => Default::default(),
    };
    let devices = prog.devices().max(1);
    // A device's blocks depend on its index along each side's axes alone: each distinct pair
    // of indices is counted once, whatever the mesh's size.
    let indices = |block: &crate::ir::SeqBlock| -> Option<Vec<usize>> {
        match prog.mesh.as_ref() {
            Some(m) if !block.axes().is_empty() => {
                let axes: Vec<&str> = block.axes().iter().map(String::as_str).collect();
                m.axes_indices(&axes).ok()
            }
            _ => Some(vec![0; devices]),
        }
    };
    let (Some(iq), Some(ik)) = (indices(&seq.q), indices(&seq.kv)) else {
        return vec![0; devices];
    };
    // Indices are dense (below each side's axes' size), so the pairs counted so far are a
    // table: a hash map's hashing was most of pricing a large mesh's attention.
    let width = ik.iter().max().map_or(1, |m| m + 1);
    let mut counted: Vec<Option<u64>> = vec![None; iq.iter().max().map_or(1, |m| m + 1) * width];
    iq.iter()
        .zip(&ik)
        .map(|(&a, &b)| {
            *counted[a * width + b].get_or_insert_with(|| {
                // A whole sequence in any order holds the same causal pairs as in order.
                let whole = |n| Runs {
                    starts: [0, 0],
                    chunk: n,
                };
                let q = seq.q.runs(a, tq).unwrap_or_else(|_| whole(tq));
                let kv = seq.kv.runs(b, tk).unwrap_or_else(|_| whole(tk));
                let mut pairs = 0;
                for (qa, na) in runs_of(&q, tq) {
                    for (kb, nk) in runs_of(&kv, tk) {
                        pairs += pairs_seen(qa, na, kb, nk);
                    }
                }
                heads * pairs
            })
        })
        .collect()
}

/// FLOPs of a fused attention op, (in its dot products, in the rest), over the (query, key)
/// pairs causal attention visits (T(T+1)/2 per head on one device; the busiest device's under
/// context parallelism: the step waits for it), as the kernels run them: the forward's
/// score and weighted sum (2 Dh each) and the online softmax; the backward's recomputed score
/// and do.v, made twice (the dq and the dk passes) and once more for dv, and the dq, dk, dv
/// updates.
pub fn attention_flops(prog: &Program, ins: &Instr) -> (u64, u64) {
    let pairs = attention_pairs(prog, ins).into_iter().max().unwrap_or(0);
    attention_flops_of(prog, ins, pairs)
}

/// [`attention_flops`] of `pairs` (query, key) pairs.
pub fn attention_flops_of(prog: &Program, ins: &Instr, pairs: u64) -> (u64, u64) {
    let shape = prog.shape(ins.inputs[0]);
    let dh = shape[shape.len() - 1] as u64;
    match ins.op {
        Op::AttentionGrad { .. } => (pairs * 16 * dh, pairs * 10),
        _ => (pairs * 4 * dh, pairs * 6),
    }
}

/// Floating-point operations of one instruction (multiply-add = 2), as a cost model counts
/// them: contractions dominate; elementwise ops count a few per element.
pub fn instr_flops(prog: &Program, ins: &Instr) -> u64 {
    let out = |k: usize| prog.info(ins.outputs[k]).numel() as u64;
    let inp = |k: usize| prog.info(ins.inputs[k]).numel() as u64;
    match &ins.op {
        Op::DotGeneral { lhs_contract, .. } => {
            let lhs = prog.shape(ins.inputs[0]);
            let k: u64 = lhs_contract.iter().map(|&d| lhs[d] as u64).product();
            2 * out(0) * k
        }
        Op::Add | Op::Sub | Op::Mul | Op::Scale { .. } => out(0),
        Op::ReduceSum { .. } => inp(0),
        Op::Gelu => 8 * out(0),
        Op::GeluGrad => 12 * out(0),
        Op::LayerNorm => 8 * inp(0),
        Op::LayerNormGrad => 12 * inp(1),
        Op::SoftmaxCausal => 5 * out(0),
        Op::SoftmaxCausalGrad => 4 * out(0),
        Op::Attention { .. } | Op::AttentionGrad { .. } => {
            let (dots, rest) = attention_flops(prog, ins);
            dots + rest
        }
        // Per row two exponentials, a logarithm and a max; per element a weighted sum.
        Op::AttentionCombine => 3 * out(0) + 8 * out(1),
        Op::CrossEntropy => 4 * inp(0),
        Op::CrossEntropyGrad => 4 * inp(0),
        Op::Dropout { .. } => 2 * out(0),
        Op::SgdUpdate { .. } => 2 * out(0),
        Op::AdamWUpdate { .. } => 12 * out(0),
        Op::ScatterAdd { .. } => inp(0),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::pairs_seen;

    #[test]
    fn pairs_seen_counts_every_key_at_or_before_each_query() {
        for (a, n, b, m) in [
            (0, 8, 0, 8),
            (4, 4, 0, 4),
            (0, 4, 4, 4),
            (3, 5, 2, 7),
            (10, 3, 0, 2),
            (0, 1, 5, 3),
        ] {
            let brute = (a..a + n)
                .map(|p| (b..b + m).filter(|q| *q <= p).count() as u64)
                .sum::<u64>();
            assert_eq!(pairs_seen(a, n, b, m), brute, "{a} {n} {b} {m}");
        }
    }
}
