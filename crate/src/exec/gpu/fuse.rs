//! Fusion: pairs of consecutive instructions that lowering runs as one kernel, so the
//! intermediate value makes no trip through memory and the pair costs one dispatch. A pair
//! qualifies only when the second instruction is the only reader of the first's output (or,
//! for [`Fusion::BiasGelu`], that output is written anyway) and it is not a program output.
//! Every fused kernel computes what the pair computes, in the same order (see
//! shaders/fused.wgsl), so fusing moves no number.
use crate::exec::plan_instr_dot;
use crate::ir::{DType, Instr, Op, Program, ValueId};
use crate::reference::matmul::MatmulShape;

/// How one instruction and the next are lowered together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fusion {
    /// dot_general, then a transpose that swaps its lhs-free and rhs-free dims (weight and
    /// attention gradients): the matmul with its operands swapped writes the transpose.
    DotTransposed,
    /// dot_general of one matrix per device, then the add of a bias along its last axis
    /// (`bias` is that input of the add): the matmul adds each device's bias as it stores C,
    /// `acc + bias` as the add computes it.
    DotBias { bias: usize },
    /// add (a bias), then gelu: `fused::bias_gelu`, which also writes the sum (GELU's backward
    /// reads it).
    BiasGelu,
    /// add (a bias), then the residual add; `residual` is the other input of the second add.
    BiasResidual { residual: usize },
    /// dropout, then the residual add; `residual` is the other input of the add.
    DropoutResidual { residual: usize },
    /// the residual add, then the layer norm of the sum: `layernorm::forward` adds as it reads
    /// and also writes the sum, which the residual stream's next add reads.
    AddLayerNorm,
    /// transpose, then a split of it (attention's q, k, v heads): each part copied straight
    /// from the transpose's operand, one pass instead of two (none where fused attention reads
    /// the parts in place: views.rs).
    TransposeSplit,
    /// concat, then a transpose of it (the q, k, v gradients back to columns): each part
    /// written straight to its place in the transposed output.
    ConcatTransposed,
}

impl Fusion {
    /// Whether the first instruction's output is written (and so has a buffer).
    pub fn keeps_intermediate(self) -> bool {
        matches!(self, Fusion::BiasGelu | Fusion::AddLayerNorm)
    }
}

/// For every instruction, the fusion it starts with the next one; `None` for an instruction
/// lowered alone and for the second of a fused pair (which lowers to no dispatch).
pub(super) fn plan(program: &Program) -> Vec<Option<Fusion>> {
    let mut readers = vec![0usize; program.values.len()];
    for ins in &program.instrs {
        for v in &ins.inputs {
            readers[v.index()] += 1;
        }
    }
    for v in &program.outputs {
        readers[v.index()] += 1;
    }
    let n = program.instrs.len();
    let mut out = vec![None; n];
    // A fused pair runs on one set of devices: a pipeline stage's work fuses with that
    // stage's only.
    let pair_at = |i: usize| {
        (program.instr_owner(i) == program.instr_owner(i + 1))
            .then(|| pair(program, &program.instrs[i], &program.instrs[i + 1], &readers))
            .flatten()
    };
    let mut i = 0;
    while i + 1 < n {
        let mut f = pair_at(i);
        // A bias add that starts a fusion of its own (with GELU, the residual) keeps it: that
        // pair saves a pass over the same tensor and more work. Unless the bias joins the
        // matmul and the residual add then joins the layer norm after it: two launches for
        // the four, where the bias chain leaves three.
        if matches!(f, Some(Fusion::DotBias { .. }))
            && i + 2 < n
            && pair_at(i + 1).is_some()
            && (i + 3 >= n || pair_at(i + 2) != Some(Fusion::AddLayerNorm))
        {
            f = None;
        }
        out[i] = f;
        i += if f.is_some() { 2 } else { 1 };
    }
    out
}

/// The fusion of `first` then `second`, if they form one.
fn pair(program: &Program, first: &Instr, second: &Instr, readers: &[usize]) -> Option<Fusion> {
    let [v] = first.outputs[..] else { return None };
    let reads_v = second.inputs.iter().filter(|&&x| x == v).count();
    if reads_v != 1 || program.info(v).dtype != DType::F32 {
        return None;
    }
    let only_reader = readers[v.index()] == 1;
    let numel = |x: ValueId| program.info(x).numel();
    // The other input of a residual add: full size (not broadcast).
    let residual = || {
        let r = second.inputs.iter().position(|&x| x != v)?;
        (numel(second.inputs[r]) == numel(v)).then_some(r)
    };
    match (&first.op, &second.op) {
        (Op::DotGeneral { .. }, Op::Transpose { perm }) if only_reader && swaps_free_dims(program, first, perm) => {
            Some(Fusion::DotTransposed)
        }
        (Op::DotGeneral { .. }, Op::Add) if only_reader => {
            dot_bias(program, first, second, v).map(|bias| Fusion::DotBias { bias })
        }
        (Op::Add, Op::Gelu) => Some(Fusion::BiasGelu),
        (Op::Add, Op::Add) if only_reader => residual().map(|residual| Fusion::BiasResidual { residual }),
        (Op::Dropout { .. }, Op::Add) if only_reader => residual().map(|residual| Fusion::DropoutResidual { residual }),
        // The sum is the layer norm's x, and both addends have its shape: no broadcast (the
        // embeddings' add broadcasts the positions over the batch, even where a device's batch
        // is one row and the sizes agree, so the launches do not change with the mesh).
        (Op::Add, Op::LayerNorm)
            if second.inputs[0] == v && first.inputs.iter().all(|&x| program.shape(x) == program.shape(v)) =>
        {
            Some(Fusion::AddLayerNorm)
        }
        (Op::Transpose { .. }, Op::Split { .. }) if only_reader => Some(Fusion::TransposeSplit),
        (Op::Concat { .. }, Op::Transpose { .. }) if only_reader => Some(Fusion::ConcatTransposed),
        _ => None,
    }
}

/// The input of `add` that is a bias of `dot`'s output `v`: a vector as long as v's last axis,
/// which is the matmul's N, of a dot that is one matrix product per device (the kernel adds
/// one bias per batch item).
fn dot_bias(program: &Program, dot: &Instr, add: &Instr, v: ValueId) -> Option<usize> {
    let p = plan_instr_dot(program, dot)?;
    let bias = add.inputs.iter().position(|&x| x != v)?;
    let out = program.shape(v);
    let one_product = p.shape.batch == 1 && out.last() == Some(&p.shape.n);
    let is_bias = program.shape(add.inputs[bias]) == [p.shape.n] && program.shape(add.outputs[0]) == out;
    (one_product && is_bias).then_some(bias)
}

/// Whether `perm` maps dot_general's output (batch, lhs free, rhs free) to (batch, rhs free,
/// lhs free), each group in order: what the same product with its operands swapped yields.
fn swaps_free_dims(program: &Program, dot: &Instr, perm: &[usize]) -> bool {
    let Op::DotGeneral {
        lhs_contract,
        rhs_contract,
        lhs_batch,
        ..
    } = &dot.op
    else {
        return false;
    };
    let nb = lhs_batch.len();
    let fl = program.shape(dot.inputs[0]).len() - nb - lhs_contract.len();
    let fr = program.shape(dot.inputs[1]).len() - nb - rhs_contract.len();
    if fl == 0 || fr == 0 {
        return false;
    }
    let want: Vec<usize> = (0..nb).chain(nb + fl..nb + fl + fr).chain(nb..nb + fl).collect();
    perm == want.as_slice()
}

/// The same product transposed, `C^T = op(B)^T @ op(A)^T`: the shape of the matmul that takes
/// `b` as its A and `a` as its B and writes `shape`'s C transposed, per batch item.
pub(super) fn swapped(shape: &MatmulShape) -> MatmulShape {
    MatmulShape {
        m: shape.n,
        n: shape.m,
        trans_a: !shape.trans_b,
        trans_b: !shape.trans_a,
        stride_a: shape.stride_b,
        stride_b: shape.stride_a,
        ..*shape
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::RngLayout;
    use crate::model::{train_step_program, Attention, GptConfig, Optimizer};

    fn fusions(dropout: f32, attention: Attention) -> (Vec<Option<Fusion>>, Program) {
        let cfg = GptConfig {
            layers: 2,
            dropout,
            attention,
            ..GptConfig::tiny()
        };
        let step = train_step_program(&cfg, Optimizer::AdamW { lr: 1e-3 }, RngLayout::Partitionable).unwrap();
        (plan(&step.program), step.program)
    }

    fn count(f: &[Option<Fusion>], want: impl Fn(Fusion) -> bool) -> usize {
        f.iter().flatten().filter(|&&x| want(x)).count()
    }

    #[test]
    fn a_train_step_fuses_its_gradient_transposes_and_bias_chains() {
        for (dropout, attention) in [0.0, 0.1].into_iter().flat_map(|d| Attention::ALL.map(|a| (d, a))) {
            let (f, program) = fusions(dropout, attention);
            // Per block: dw_qkv, dw_proj, dw_fc, dw_out, and unfused attention's dv; and the
            // head's dw. The fused op makes its dv itself.
            let per_block = if attention == Attention::Fused { 4 } else { 5 };
            assert_eq!(
                count(&f, |x| x == Fusion::DotTransposed),
                2 * per_block + 1,
                "dropout {dropout}, {attention:?}"
            );
            assert_eq!(count(&f, |x| x == Fusion::BiasGelu), 2, "dropout {dropout}");
            // Without dropout both residual adds of a block join the layer norm after them
            // (the next block's first, or the final one) and every bias its matmul; with it,
            // the dropout sits between bias and residual and fuses with the residual add.
            let bias = count(&f, |x| matches!(x, Fusion::BiasResidual { .. }));
            let drop = count(&f, |x| matches!(x, Fusion::DropoutResidual { .. }));
            let add_ln = count(&f, |x| x == Fusion::AddLayerNorm);
            assert_eq!((bias, drop, add_ln), if dropout == 0.0 { (0, 0, 4) } else { (0, 4, 0) });
            // The qkv, projection and second MLP biases join their matmuls either way.
            let dot_bias = count(&f, |x| matches!(x, Fusion::DotBias { .. }));
            assert_eq!(dot_bias, 6, "dropout {dropout}");
            // Per block: the heads' transpose and split forward, their concat and transpose back.
            assert_eq!(count(&f, |x| x == Fusion::TransposeSplit), 2, "dropout {dropout}");
            assert_eq!(count(&f, |x| x == Fusion::ConcatTransposed), 2, "dropout {dropout}");
            // A pair's second instruction starts nothing, and no intermediate that is not
            // written is read after its pair or returned.
            for (i, x) in f.iter().enumerate() {
                let Some(x) = x else { continue };
                assert!(f[i + 1].is_none(), "instruction {} is in two pairs", i + 1);
                let v = program.instrs[i].outputs[0];
                if !x.keeps_intermediate() {
                    let readers = program.instrs.iter().filter(|ins| ins.inputs.contains(&v)).count();
                    assert_eq!(readers, 1, "{x:?} at {i}");
                    assert!(!program.outputs.contains(&v));
                }
            }
        }
    }

    #[test]
    fn swapping_the_operands_transposes_every_batch_item_of_the_product() {
        let s = MatmulShape {
            trans_a: true,
            ..MatmulShape::new(3, 4, 5, 6)
        };
        let t = swapped(&s);
        assert_eq!((t.m, t.n, t.k, t.batch), (5, 4, 6, 3));
        assert_eq!((t.trans_a, t.trans_b), (true, false));
        assert_eq!(
            (t.stride_a, t.stride_b, t.stride_c),
            (s.stride_b, s.stride_a, s.stride_c)
        );
        let a: Vec<f32> = (0..3 * 24).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..3 * 30).map(|i| (i % 5) as f32 * 0.5).collect();
        let (mut c, mut ct) = (vec![0.0; 60], vec![0.0; 60]);
        crate::reference::matmul::matmul(&s, &a, &b, None, &mut c);
        crate::reference::matmul::matmul(&t, &b, &a, None, &mut ct);
        for z in 0..3 {
            for i in 0..4 {
                for j in 0..5 {
                    assert_eq!(c[z * 20 + i * 5 + j], ct[z * 20 + j * 4 + i]);
                }
            }
        }
    }
}
