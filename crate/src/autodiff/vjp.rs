//! One vector-Jacobian product rule per op: given the cotangents of an instruction's
//! outputs, emit ops computing the cotangents of its inputs.
use crate::ir::{Builder, Instr, IrError, Op, ValueId};

type Cts = Vec<Option<ValueId>>;

pub(super) fn vjp(b: &mut Builder, ins: &Instr, cts: &[Option<ValueId>]) -> Result<Cts, IrError> {
    let x = &ins.inputs;
    let ct0 = cts[0];
    let Some(ct) = ct0.or_else(|| cts.iter().flatten().next().copied()) else {
        return Ok(vec![None; x.len()]);
    };
    Ok(match &ins.op {
        Op::Reshape { .. } => vec![Some(b.reshape(ct, &b.shape(x[0])))],
        Op::Transpose { perm } => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            vec![Some(b.transpose(ct, &inv))]
        }
        Op::BroadcastInDim { shape, dims } => vec![Some(unbroadcast(b, ct, shape, dims, &b.shape(x[0])))],
        Op::Split { axis, .. } => {
            let parts: Vec<ValueId> = ins
                .outputs
                .iter()
                .zip(cts)
                .map(|(o, c)| c.unwrap_or_else(|| zeros_like(b, *o)))
                .collect();
            vec![Some(b.concat(&parts, *axis))]
        }
        Op::Concat { axis } => {
            let sizes: Vec<usize> = x.iter().map(|v| b.shape(*v)[*axis]).collect();
            b.split(ct, *axis, &sizes).into_iter().map(Some).collect()
        }
        Op::Add => vec![Some(ct), Some(sum_to(b, ct, &b.shape(x[1])))],
        Op::Sub => {
            let neg = b.scale(ct, -1.0);
            vec![Some(ct), Some(sum_to(b, neg, &b.shape(x[1])))]
        }
        Op::Mul => {
            let da = b.mul(ct, x[1]);
            let full = b.mul(ct, x[0]);
            vec![Some(da), Some(sum_to(b, full, &b.shape(x[1])))]
        }
        Op::Scale { alpha } => vec![Some(b.scale(ct, *alpha))],
        // The same values: the cotangent passes through, typed like the operand (autodiff
        // records every cotangent's primal; JAX's transpose reshards back to it).
        Op::Reshard { .. } => vec![Some(ct)],
        Op::Full { .. } => vec![],
        Op::DotGeneral {
            lhs_contract,
            rhs_contract,
            lhs_batch,
            rhs_batch,
            alpha,
        } => {
            let (ls, rs) = (b.shape(x[0]), b.shape(x[1]));
            let lhs = DotOperand {
                rank: ls.len(),
                contract: lhs_contract,
                batch: lhs_batch,
            };
            let rhs = DotOperand {
                rank: rs.len(),
                contract: rhs_contract,
                batch: rhs_batch,
            };
            let dl = dot_transpose(b, ct, [x[0], x[1]], lhs, rhs, *alpha, true);
            let dr = dot_transpose(b, ct, [x[1], x[0]], rhs, lhs, *alpha, false);
            vec![Some(dl), Some(dr)]
        }
        Op::ReduceSum { axes } => {
            let shape = b.shape(x[0]);
            let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
            vec![Some(b.broadcast_in_dim(ct, &shape, &kept))]
        }
        Op::Gelu => vec![Some(b.emit1(Op::GeluGrad, &[x[0], ct]))],
        Op::LayerNorm => {
            let dy = ct0.unwrap_or_else(|| zeros_like(b, ins.outputs[0]));
            let (mean, rstd) = (ins.outputs[1], ins.outputs[2]);
            let g = b.emit(Op::LayerNormGrad, &[dy, x[0], mean, rstd, x[1]]);
            vec![Some(g[0]), Some(g[1]), Some(g[2])]
        }
        Op::SoftmaxCausal => vec![Some(b.emit1(Op::SoftmaxCausalGrad, &[ins.outputs[0], ct]))],
        // The log-sum-exp is a residual for the backward, not a value anyone differentiates.
        // (With blocks, lse is a residual too: ring attention differentiates its blocks in a
        // custom VJP, which reads the combined o and lse.)
        Op::Attention { scale, rate, seq } => {
            let d_o = ct0.unwrap_or_else(|| zeros_like(b, ins.outputs[0]));
            let mut inputs = vec![x[0], x[1], x[2], ins.outputs[0], ins.outputs[1], d_o];
            inputs.extend(x.get(3));
            let g = b.emit(
                Op::AttentionGrad {
                    scale: *scale,
                    rate: *rate,
                    seq: seq.clone(),
                },
                &inputs,
            );
            let mut grads = vec![Some(g[0]), Some(g[1]), Some(g[2])];
            grads.extend(x.get(3).map(|_| None));
            grads
        }
        Op::CrossEntropy => vec![Some(b.emit1(Op::CrossEntropyGrad, &[x[0], x[1], ct])), None],
        Op::Gather => {
            let rows = b.shape(x[0])[0];
            vec![Some(b.emit1(Op::ScatterAdd { rows }, &[ct, x[1]])), None]
        }
        // The mask is the same bits: dropout is its own transpose in x.
        Op::Dropout { rate } => vec![Some(b.emit1(Op::Dropout { rate: *rate }, &[ct, x[1]])), None],
        Op::FoldIn { .. } | Op::FoldInAxisIndex { .. } | Op::RandomBits { .. } | Op::RandomBitsBlock { .. } => {
            vec![None; x.len()]
        }
        // psum's transpose is a pcast to varying: an invariant cotangent reaches every device unchanged.
        // Per operand of a combined psum: absent cotangents stay absent.
        Op::Psum { .. } => cts.to_vec(),
        Op::Pcast { axes } => {
            let group = b.mesh().map_or(1, |m| {
                m.axes_size(&axes.iter().map(String::as_str).collect::<Vec<_>>())
                    .unwrap_or(1)
            });
            vec![Some(b.emit1(
                Op::Psum {
                    axes: axes.clone(),
                    group,
                },
                &[ct],
            ))]
        }
        // Invariant result: one cotangent for the whole array, of which each device's block
        // is its operand's (the transpose of to="invarying" is a slice, not a reduction).
        Op::AllGather {
            axes,
            group,
            axis,
            invarying: true,
            ..
        } => vec![Some(b.emit1(
            Op::ShardSlice {
                dim: *axis,
                axes: axes.clone(),
                parts: *group,
            },
            &[ct],
        ))],
        Op::AllGather {
            axes,
            group,
            axis,
            tiled,
            invarying: false,
        } => vec![Some(b.emit1(
            Op::PsumScatter {
                axes: axes.clone(),
                group: *group,
                scatter_dimension: *axis,
                tiled: *tiled,
            },
            &[ct],
        ))],
        Op::PsumScatter {
            axes,
            group,
            scatter_dimension,
            tiled,
        } => vec![Some(b.emit1(
            Op::AllGather {
                axes: axes.clone(),
                group: *group,
                axis: *scatter_dimension,
                tiled: *tiled,
                invarying: false,
            },
            &[ct],
        ))],
        Op::Ppermute { axis, perm } => {
            let inverse = perm.iter().map(|&(s, d)| (d, s)).collect();
            vec![Some(b.emit1(
                Op::Ppermute {
                    axis: axis.clone(),
                    perm: inverse,
                },
                &[ct],
            ))]
        }
        Op::AllToAll {
            axes,
            group,
            split_axis,
            concat_axis,
        } => vec![Some(b.emit1(
            Op::AllToAll {
                axes: axes.clone(),
                group: *group,
                split_axis: *concat_axis,
                concat_axis: *split_axis,
            },
            &[ct],
        ))],
        // Only the probabilities and the gates carry gradients: places and owners are indices,
        // the load counts choices (its gradient is zero almost everywhere, as jnp's of a count).
        Op::MoeRoute { capacity, .. } => {
            let o = &ins.outputs;
            let dprobs = cts[0].unwrap_or_else(|| zeros_like(b, o[0]));
            let dgates = cts[1].unwrap_or_else(|| zeros_like(b, o[1]));
            let op = Op::MoeRouteGrad { capacity: *capacity };
            vec![Some(b.emit1(op, &[o[0], o[1], o[2], dprobs, dgates]))]
        }
        // Dispatch and combine are each other's transpose; a gate's cotangent is its token's
        // row dotted with its slot's. Each cotangent of a buffer is named after it (`dNAME`),
        // so that jit can be told where to keep it, as a with_sharding_constraint's transpose
        // pins the cotangent in JAX.
        Op::MoeDispatch => {
            name_cotangent(b, ct, ins.outputs[0]);
            let dx = b.emit1(Op::MoeCombine, &moe_operands(ct, x));
            let mut grads = vec![Some(dx), None, None];
            if x.len() == 4 {
                grads.push(Some(b.emit1(Op::MoeGateGrad, &[x[0], ct, x[1]])));
            }
            grads
        }
        Op::MoeCombine => {
            let dy = b.emit1(Op::MoeDispatch, &moe_operands(ct, x));
            name_cotangent(b, dy, x[0]);
            let mut grads = vec![Some(dy), None, None];
            if x.len() == 4 {
                grads.push(Some(b.emit1(Op::MoeGateGrad, &[ct, x[0], x[1]])));
            }
            grads
        }
        Op::GeluGrad
        | Op::MoeRouteGrad { .. }
        | Op::MoeGateGrad
        | Op::LayerNormGrad
        | Op::SoftmaxCausalGrad
        | Op::AttentionGrad { .. }
        | Op::CrossEntropyGrad
        | Op::ScatterAdd { .. }
        | Op::SgdUpdate { .. }
        | Op::AdamWUpdate { .. } => {
            return Err(IrError::new(
                ins.op.name(),
                "has no gradient rule (second-order or optimizer op)",
            ));
        }
        Op::SeqTake { dim, seq } => {
            let len = b.shape(x[0])[*dim];
            vec![Some(b.emit1(
                Op::SeqPut {
                    dim: *dim,
                    seq: seq.clone(),
                    len,
                },
                &[ct],
            ))]
        }
        Op::SeqPut { dim, seq, .. } => vec![Some(b.emit1(
            Op::SeqTake {
                dim: *dim,
                seq: seq.clone(),
            },
            &[ct],
        ))],
        // Ring attention's merge of partial attentions: its region's custom VJP differentiates
        // the blocks from the combined o and lse instead (Builder::custom_vjp).
        Op::AttentionCombine => {
            return Err(IrError::new(
                ins.op.name(),
                "has no gradient rule: trace it inside Builder::custom_vjp, whose backward \
                 differentiates the blocks from the combined result",
            ));
        }
        // Inserted by jit's partitioner after differentiation; programs are differentiated before.
        Op::ShardSlice { .. } => {
            return Err(IrError::new(
                ins.op.name(),
                "has no gradient rule: differentiate the global program before jit",
            ));
        }
    })
}

/// The operands of an index move's transpose: the cotangent in place of the rows, the same
/// places, owners and (if any) gates.
fn moe_operands(ct: ValueId, x: &[ValueId]) -> Vec<ValueId> {
    let mut operands = vec![ct];
    operands.extend_from_slice(&x[1..]);
    operands
}

/// Names cotangent `ct` of `v` `dNAME` where `v` is named and `ct` is not.
fn name_cotangent(b: &mut Builder, ct: ValueId, v: ValueId) {
    if let (Some(name), None) = (b.info(v).name.clone(), &b.info(ct).name) {
        b.set_name(ct, &format!("d{name}"));
    }
}

fn zeros_like(b: &mut Builder, v: ValueId) -> ValueId {
    let shape = b.shape(v);
    b.emit1(Op::Full { shape, value: 0.0 }, &[])
}

/// Sums `ct` over its leading dims down to `shape` (the transpose of suffix broadcasting).
fn sum_to(b: &mut Builder, ct: ValueId, shape: &[usize]) -> ValueId {
    let cs = b.shape(ct);
    if cs == shape {
        return ct;
    }
    let lead: Vec<usize> = (0..cs.len() - shape.len()).collect();
    b.sum(ct, &lead)
}

/// The transpose of broadcast_in_dim: sum over the broadcast dims, then restore the operand shape.
fn unbroadcast(b: &mut Builder, ct: ValueId, shape: &[usize], dims: &[usize], operand: &[usize]) -> ValueId {
    let axes: Vec<usize> = (0..shape.len())
        .filter(|d| match dims.iter().position(|x| x == d) {
            None => true,
            Some(i) => operand[i] == 1 && shape[*d] != 1,
        })
        .collect();
    let s = if axes.is_empty() { ct } else { b.sum(ct, &axes) };
    if b.shape(s) == operand {
        s
    } else {
        b.reshape(s, operand)
    }
}

/// One operand of a dot_general: its rank and its contracting and batch dims.
#[derive(Clone, Copy)]
struct DotOperand<'a> {
    rank: usize,
    contract: &'a [usize],
    batch: &'a [usize],
}

/// The cotangent of one operand `X` of `dot_general(X, Y)` (or of `Y` with roles swapped):
/// contract `ct`'s dims that came from `Y`'s free dims with `Y`, batch with batch, then
/// permute the result into `X`'s dim order. As JAX's transpose rule, the product is typed like
/// `X`'s sharding in its own dim order (`out_sharding=`), recorded for explicit sharding.
fn dot_transpose(
    b: &mut Builder,
    ct: ValueId,
    [x, y]: [ValueId; 2],
    xo: DotOperand,
    yo: DotOperand,
    alpha: f32,
    x_is_lhs: bool,
) -> ValueId {
    let (x_rank, x_contract, x_batch) = (xo.rank, xo.contract, xo.batch);
    let (y_rank, y_contract, y_batch) = (yo.rank, yo.contract, yo.batch);
    let nb = x_batch.len();
    let x_free: Vec<usize> = (0..x_rank)
        .filter(|d| !x_contract.contains(d) && !x_batch.contains(d))
        .collect();
    let y_free: Vec<usize> = (0..y_rank)
        .filter(|d| !y_contract.contains(d) && !y_batch.contains(d))
        .collect();
    // ct dims: [batch][lhs free][rhs free]; y's free dims follow x's when x is the lhs.
    let y_free_at = if x_is_lhs { nb + x_free.len() } else { nb };
    let ct_contract: Vec<usize> = (0..y_free.len()).map(|j| y_free_at + j).collect();
    let ct_batch: Vec<usize> = (0..nb).collect();
    let r = b.dot_general(ct, y, (&ct_contract, &y_free), (&ct_batch, y_batch), alpha);
    // r dims: [batch][x free (ct's remaining, in order)][y's remaining = y_contract dims ascending].
    let mut y_rest: Vec<usize> = y_contract.to_vec();
    y_rest.sort();
    let mut perm = vec![0; x_rank];
    for (i, &d) in x_batch.iter().enumerate() {
        perm[d] = i;
    }
    for (j, &d) in x_free.iter().enumerate() {
        perm[d] = nb + j;
    }
    for (k, &d) in x_contract.iter().enumerate() {
        let p = y_rest.iter().position(|&yd| yd == y_contract[k]).unwrap();
        perm[d] = nb + x_free.len() + p;
    }
    // r's dim j is x's dim d where perm[d] = j.
    let mut r_dims = vec![0; x_rank];
    for (d, &j) in perm.iter().enumerate() {
        r_dims[j] = d;
    }
    b.type_like(r, x, r_dims);
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        r
    } else {
        b.transpose(r, &perm)
    }
}
