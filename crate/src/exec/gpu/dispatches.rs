//! What the lowering runs for each instruction, read off the program alone (no adapter): the
//! pairs it fuses (fuse.rs's plan, the one the lowering takes), the transposes folded into
//! fused attention (views.rs, as on an adapter that runs the fused kernels), the constants and
//! unread values that launch nothing (consts.rs) and the dispatches of each instruction, per
//! `lower.rs`, with the optimizer updates and gradient psums packed as
//! `packing.rs` plans them. The cost model prices launches and memory traffic with it, so
//! a fused pair is one launch there too. A matmul counts its kernel alone: some tuned
//! variants add pack passes, which the adapter's autotuner decides at run time.
use super::consts::{self, Fold};
use super::fuse::{plan, Fusion};
use super::packing;
use super::parts;
use super::views;
use crate::exec::lowering::{plan_instr_dot, plan_reduce};
use crate::ir::{Instr, Op, Program};
use crate::kernels::{layernorm, reduce};

/// How the lowering runs one instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lowered {
    /// Dispatches issued for it: for the first of a fused pair, the pair's; 0 for the second
    /// of a pair and for ops that only rename memory.
    pub dispatches: usize,
    /// The fusion it starts with the next instruction.
    pub fuses: Option<Fusion>,
    /// Whether it runs inside the previous instruction's fused kernel.
    pub fused_into_previous: bool,
    /// Whether it is a transpose (or a fused transpose and split) that the fused attention
    /// kernels read or write in place: it launches nothing and its outputs share its operand's
    /// buffer.
    pub folded: bool,
    /// Whether it launches nothing because its value is a constant that only other constants
    /// are made from, or nothing reads it (consts.rs).
    pub skipped: bool,
    /// Of a psum, the elements per device of its operands summed in place over a gradient
    /// arena (`reduce_packed`: each element read and written once per device, where a psum
    /// alone reads every group member's for each device's result); 0 otherwise.
    pub summed_in_place: usize,
}

/// The arena limit the packing is planned with when no adapter is at hand: WebGPU's default
/// maxStorageBufferBindingSize (128 MiB) in f32 elements, what the page gets.
const DEFAULT_MAX_ARENA: usize = (128 << 20) / 4;

/// Every instruction of `program` as the GPU lowering runs it, in program order.
pub fn lowered(program: &Program) -> Vec<Lowered> {
    let fusion = plan(program);
    // The fused kernels take every whole-sequence attention's operands in place.
    let whole = |i: usize| match &program.instrs[i].op {
        Op::Attention { seq, .. } | Op::AttentionGrad { seq, .. } => seq.is_whole(),
        _ => false,
    };
    let views = views::plan(program, &fusion, &whole);
    let folds = consts::plan(program, &fusion, &views.quiet);
    let drawn = program.bits_drawn_in_attention();
    // Optimizer updates packed into one dispatch run it at their group's last instruction, and
    // so do gradient psums summed in place at their run's last.
    let packing = packing::plan(program, &fusion, DEFAULT_MAX_ARENA);
    let mut packed_dispatches = vec![None; program.instrs.len()];
    for group in &packing.groups {
        for &i in &group.instrs {
            packed_dispatches[i] = Some(0);
        }
        if let Some(&last) = group.instrs.last() {
            packed_dispatches[last] = Some(1);
        }
    }
    for run in &packing.psum_runs {
        for &i in &run.instrs {
            packed_dispatches[i] = Some(packing.psum_dispatches(program, i));
        }
    }
    // A split into parts of one buffer, or a concat of them, is one copy; else one per part.
    let parts = parts::plan(program, &fusion, &views.quiet, &packing.placed);
    let copies = |values: &[crate::ir::ValueId]| {
        if parts.group_of(values).is_some() {
            1
        } else {
            values.len()
        }
    };
    (0..program.instrs.len())
        .map(|i| {
            let fused_into_previous = i > 0 && fusion[i - 1].is_some();
            let ins = &program.instrs[i];
            let dispatches = match fusion[i] {
                _ if fused_into_previous || views.quiet[i] || folds[i] == Fold::Skip => 0,
                // Bits fused attention draws in its own kernels.
                _ if ins.outputs.first().is_some_and(|o| drawn[o.index()].is_some()) => 0,
                Some(Fusion::DotTransposed | Fusion::DotBias { .. }) => operand_copies(program, ins) + 1,
                Some(Fusion::TransposeSplit) => copies(&program.instrs[i + 1].outputs),
                Some(Fusion::ConcatTransposed) => copies(&ins.inputs),
                Some(_) => 1,
                None => match ins.op {
                    Op::Split { .. } => copies(&ins.outputs),
                    Op::Concat { .. } => copies(&ins.inputs),
                    _ => packed_dispatches[i].unwrap_or_else(|| dispatches(program, ins)),
                },
            };
            let summed_in_place = match ins.op {
                Op::Psum { .. } => ins
                    .inputs
                    .iter()
                    .filter(|v| packing.in_place[v.index()])
                    .map(|v| crate::ir::numel(program.shape(*v)))
                    .sum(),
                _ => 0,
            };
            Lowered {
                dispatches,
                fuses: fusion[i],
                fused_into_previous,
                folded: views.quiet[i],
                skipped: folds[i] == Fold::Skip,
                summed_in_place,
            }
        })
        .collect()
}

/// Transposed copies a dot_general makes of its operands before the matmul.
fn operand_copies(program: &Program, ins: &Instr) -> usize {
    plan_instr_dot(program, ins).map_or(0, |p| {
        usize::from(p.lhs_perm.is_some()) + usize::from(p.rhs_perm.is_some())
    })
}

/// The dispatches of an instruction lowered alone (`Lowering::instr`).
fn dispatches(program: &Program, ins: &Instr) -> usize {
    match &ins.op {
        Op::Reshape { .. } | Op::Pcast { .. } | Op::Reshard { .. } => 0,
        // Splits and concats are counted above; a combined psum runs one psum per operand (but
        // for those summed in place, counted above).
        Op::Split { .. } => ins.outputs.len(),
        Op::Concat { .. } | Op::Psum { .. } => ins.inputs.len(),
        Op::DotGeneral { .. } => operand_copies(program, ins) + 1,
        Op::ReduceSum { axes } => {
            let p = plan_reduce(program.shape(ins.inputs[0]), axes);
            usize::from(p.perm.is_some()) + reduce::stages(p.n)
        }
        // The row sums of do * o, then dq, dk and dv: the tiled kernels' count (the subgroup
        // kernels on CPU adapters run two where the adapter binds 10 storage buffers).
        Op::AttentionGrad { .. } => 4,
        Op::LayerNormGrad => {
            let x = program.shape(ins.inputs[1]);
            let c = x.last().copied().unwrap_or(1).max(1);
            layernorm::backward_dispatches(program.info(ins.inputs[1]).numel() / c)
        }
        Op::Transpose { .. }
        | Op::BroadcastInDim { .. }
        | Op::Add
        | Op::Sub
        | Op::Mul
        | Op::Scale { .. }
        | Op::Full { .. }
        | Op::Gelu
        | Op::GeluGrad
        | Op::LayerNorm
        | Op::SoftmaxCausal
        | Op::SoftmaxCausalGrad
        | Op::Attention { .. }
        | Op::AttentionCombine
        | Op::SeqTake { .. }
        | Op::SeqPut { .. }
        | Op::CrossEntropy
        | Op::CrossEntropyGrad
        | Op::Gather
        | Op::ScatterAdd { .. }
        | Op::FoldIn { .. }
        | Op::RandomBits { .. }
        | Op::RandomBitsBlock { .. }
        | Op::ShardSlice { .. }
        | Op::Dropout { .. }
        | Op::AllGather { .. }
        | Op::PsumScatter { .. }
        | Op::Ppermute { .. }
        | Op::AllToAll { .. }
        | Op::FoldInAxisIndex { .. }
        | Op::MoeRoute { .. }
        | Op::MoeRouteGrad { .. }
        | Op::MoeDispatch
        | Op::MoeCombine
        | Op::MoeGateGrad
        | Op::SgdUpdate { .. }
        | Op::AdamWUpdate { .. } => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::RngLayout;
    use crate::model::{train_step_program, GptConfig, Optimizer};

    fn step(batch: usize, seq: usize) -> Program {
        let cfg = GptConfig {
            layers: 1,
            batch,
            seq,
            dropout: 0.1,
            ..GptConfig::tiny()
        };
        train_step_program(&cfg, Optimizer::AdamW { lr: 1e-3 }, RngLayout::Partitionable)
            .unwrap()
            .program
    }

    #[test]
    fn a_fused_pair_is_one_dispatch_on_its_first_instruction() {
        let program = step(2, 8);
        let l = lowered(&program);
        let pairs: Vec<usize> = (0..l.len()).filter(|&i| l[i].fuses.is_some()).collect();
        assert!(!pairs.is_empty());
        for i in pairs {
            assert!(l[i + 1].fused_into_previous && l[i + 1].dispatches == 0, "{i}");
            assert!(l[i].dispatches >= 1 || (l[i].folded && l[i + 1].folded), "{i}");
        }
    }

    #[test]
    fn column_sums_are_one_dispatch_up_to_sixteen_chunks_of_rows_and_two_past() {
        let count = |batch, seq| {
            let program = step(batch, seq);
            let l = lowered(&program);
            let of = |name: &str| -> Vec<usize> {
                (0..l.len())
                    .filter(|&i| program.instrs[i].op.name() == name && !l[i].fused_into_previous)
                    .map(|i| l[i].dispatches)
                    .collect()
            };
            (of("reduce_sum"), of("layer_norm_grad"))
        };
        // 128 rows are two chunks of 64, summed in one pass; the layer norms' backward is one
        // dispatch with its column sums.
        let (sums, ln) = count(4, 32);
        assert!(
            sums.iter().all(|&d| d == 1) && ln.iter().all(|&d| d == 1),
            "{sums:?} {ln:?}"
        );
        // The bias gradients sum B*T = 1280 rows, past 16 chunks; the position embedding's B = 8.
        let (sums, ln) = count(8, 160);
        assert_eq!(sums, [2, 2, 2, 2, 2, 1]);
        assert_eq!(ln, [3, 3, 3]);
    }
}
