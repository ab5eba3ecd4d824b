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
        Op::SoftmaxCausal | Op::SoftmaxCausalGrad => Category::Attention,
        Op::FoldIn { .. } | Op::RandomBits { .. } | Op::RandomBitsBlock { .. } | Op::Dropout { .. } => Category::Rng,
        Op::SgdUpdate { .. } | Op::AdamWUpdate { .. } => Category::Optimizer,
        op if op.is_collective() => Category::Collectives,
        Op::FoldInAxisIndex { .. } => Category::Rng,
        _ => Category::Other,
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
        Op::CrossEntropy => 4 * inp(0),
        Op::CrossEntropyGrad => 4 * inp(0),
        Op::Dropout { .. } => 2 * out(0),
        Op::SgdUpdate { .. } => 2 * out(0),
        Op::AdamWUpdate { .. } => 12 * out(0),
        Op::ScatterAdd { .. } => inp(0),
        _ => 0,
    }
}
