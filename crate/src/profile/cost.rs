use crate::ir::{Instr, Op, Program};

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
        Op::SoftmaxCausal | Op::SoftmaxCausalGrad | Op::Attention { .. } | Op::AttentionGrad { .. } => {
            Category::Attention
        }
        Op::FoldIn { .. } | Op::RandomBits { .. } | Op::RandomBitsBlock { .. } | Op::Dropout { .. } => Category::Rng,
        Op::SgdUpdate { .. } | Op::AdamWUpdate { .. } => Category::Optimizer,
        op if op.is_collective() => Category::Collectives,
        Op::FoldInAxisIndex { .. } => Category::Rng,
        _ => Category::Other,
    }
}

/// FLOPs of a fused attention op, (in its dot products, in the rest), over the (query, key)
/// pairs causal attention visits (T(T+1)/2 per head), as the kernels run them: the forward's
/// score and weighted sum (2 Dh each) and the online softmax; the backward's recomputed score
/// and do.v, made twice (the dq and the dk passes) and once more for dv, and the dq, dk, dv
/// updates.
pub fn attention_flops(prog: &Program, ins: &Instr) -> (u64, u64) {
    let shape = prog.shape(ins.inputs[0]);
    let n = shape.len();
    let (t, dh) = (shape[n - 2] as u64, shape[n - 1] as u64);
    let heads: u64 = shape[..n - 2].iter().map(|&d| d as u64).product();
    let pairs = heads * t * (t + 1) / 2;
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
        Op::CrossEntropy => 4 * inp(0),
        Op::CrossEntropyGrad => 4 * inp(0),
        Op::Dropout { .. } => 2 * out(0),
        Op::SgdUpdate { .. } => 2 * out(0),
        Op::AdamWUpdate { .. } => 12 * out(0),
        Op::ScatterAdd { .. } => inp(0),
        _ => 0,
    }
}
