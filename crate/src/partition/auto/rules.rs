//! One sharding rule per op (as Shardy's `OpShardingRule`): every dimension of every operand
//! and result is a list of *factors* (major first); tensors that share a factor must shard it
//! the same way. A factor that an operand has and a result lacks is summed over by the op
//! (dot_general's contracting dims, reduce_sum's axes, scatter_add's indices): sharding it
//! leaves the result a partial sum. Factors an op cannot split (the normalized axis of
//! layer_norm, softmax's rows and columns, the vocabulary of cross_entropy and gather) are
//! `NeedReplication`.
use crate::ir::{Op, Program};

use super::super::PartitionError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FactorKind {
    /// May be sharded: each device computes its block of it.
    Pass,
    /// Must be replicated on every tensor that has it.
    NeedReplication,
}

/// The factors of one op: per operand and result, per dimension, factor indices (major first).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpRule {
    pub sizes: Vec<usize>,
    pub kinds: Vec<FactorKind>,
    pub operands: Vec<Vec<Vec<usize>>>,
    pub results: Vec<Vec<Vec<usize>>>,
}

impl OpRule {
    fn factor(&mut self, size: usize, kind: FactorKind) -> usize {
        self.sizes.push(size);
        self.kinds.push(kind);
        self.sizes.len() - 1
    }

    /// New factors for every dim of `shape` (`need` picks the ones that need replication).
    fn dims(&mut self, shape: &[usize], need: impl Fn(usize) -> bool) -> Vec<Vec<usize>> {
        (0..shape.len())
            .map(|d| {
                let kind = if need(d) {
                    FactorKind::NeedReplication
                } else {
                    FactorKind::Pass
                };
                vec![self.factor(shape[d], kind)]
            })
            .collect()
    }

    /// The tensors of the op, operands first: `(is_result, index)`.
    pub fn tensors(&self) -> impl Iterator<Item = &Vec<Vec<usize>>> {
        self.operands.iter().chain(&self.results)
    }

    /// Whether a result (rather than an operand) has factor `f`.
    pub fn in_result(&self, r: usize, f: usize) -> bool {
        self.results[r].iter().any(|d| d.contains(&f))
    }

    pub fn in_operands(&self, f: usize) -> bool {
        self.operands.iter().flatten().any(|d| d.contains(&f))
    }
}

/// The rule of instruction `i` of `prog` (a global program).
pub fn rule_of(prog: &Program, i: usize) -> Result<OpRule, PartitionError> {
    let ins = &prog.instrs[i];
    let ins_shapes: Vec<&[usize]> = ins.inputs.iter().map(|v| prog.shape(*v)).collect();
    let out_shapes: Vec<&[usize]> = ins.outputs.iter().map(|v| prog.shape(*v)).collect();
    op_rule(&ins.op, &ins_shapes, &out_shapes)
}

/// The sharding rule of `op` on operands and results of these (global) shapes.
pub fn op_rule(op: &Op, ins: &[&[usize]], outs: &[&[usize]]) -> Result<OpRule, PartitionError> {
    let mut r = OpRule::default();
    let never = |_: usize| false;
    match op {
        Op::Add
        | Op::Sub
        | Op::Mul
        | Op::Scale { .. }
        | Op::Reshard { .. }
        | Op::Gelu
        | Op::GeluGrad
        | Op::Dropout { .. }
        | Op::SgdUpdate { .. }
        | Op::AdamWUpdate { .. } => elementwise(&mut r, ins, outs),
        Op::Full { .. } => r.results = vec![r.dims(outs[0], never)],
        Op::Reshape { .. } => reshape(&mut r, ins[0], outs[0]),
        Op::Transpose { perm } => {
            let f = r.dims(ins[0], never);
            r.results = vec![perm.iter().map(|&p| f[p].clone()).collect()];
            r.operands = vec![f];
        }
        Op::BroadcastInDim { dims, .. } => {
            let f = r.dims(outs[0], never);
            let operand = dims
                .iter()
                .enumerate()
                .map(|(i, &d)| if ins[0][i] == outs[0][d] { f[d].clone() } else { vec![] })
                .collect();
            r.operands = vec![operand];
            r.results = vec![f];
        }
        Op::Split { axis, .. } => {
            let f = r.dims(ins[0], |d| d == *axis);
            r.results = outs
                .iter()
                .map(|s| {
                    let mut g = f.clone();
                    g[*axis] = vec![r.factor(s[*axis], FactorKind::NeedReplication)];
                    g
                })
                .collect();
            r.operands = vec![f];
        }
        Op::Concat { axis } => {
            let f = r.dims(outs[0], |d| d == *axis);
            r.operands = ins
                .iter()
                .map(|s| {
                    let mut g = f.clone();
                    g[*axis] = vec![r.factor(s[*axis], FactorKind::NeedReplication)];
                    g
                })
                .collect();
            r.results = vec![f];
        }
        Op::DotGeneral {
            lhs_contract,
            rhs_contract,
            lhs_batch,
            rhs_batch,
            ..
        } => dot_general(&mut r, ins, (lhs_contract, rhs_contract), (lhs_batch, rhs_batch)),
        Op::ReduceSum { axes } => {
            let f = r.dims(ins[0], never);
            r.results = vec![(0..ins[0].len())
                .filter(|d| !axes.contains(d))
                .map(|d| f[d].clone())
                .collect()];
            r.operands = vec![f];
        }
        Op::LayerNorm => {
            // (x (rows.., C), gamma (C), beta (C)) -> (y, mean (rows..), rstd (rows..))
            let c = ins[0].len() - 1;
            let x = r.dims(ins[0], |d| d == c);
            let rows = x[..c].to_vec();
            r.operands = vec![x.clone(), vec![x[c].clone()], vec![x[c].clone()]];
            r.results = vec![x, rows.clone(), rows];
        }
        Op::LayerNormGrad => {
            // (dy, x, mean, rstd, gamma) -> (dx, dgamma, dbeta): dgamma/dbeta sum over the rows.
            let c = ins[0].len() - 1;
            let x = r.dims(ins[0], |d| d == c);
            let rows = x[..c].to_vec();
            let col = vec![x[c].clone()];
            r.operands = vec![x.clone(), x.clone(), rows.clone(), rows, col.clone()];
            r.results = vec![x, col.clone(), col];
        }
        Op::SoftmaxCausal | Op::SoftmaxCausalGrad => {
            // The causal mask needs the global query and key indices: the last two dims whole.
            let n = ins[0].len();
            let f = r.dims(ins[0], |d| d + 2 >= n);
            r.operands = vec![f.clone(); ins.len()];
            r.results = vec![f];
        }
        Op::Attention { .. } | Op::AttentionGrad { .. } => attention(&mut r, op, ins),
        Op::AttentionCombine => {
            // (o (rows.., Dh), lse (rows..)) twice -> the same: row by row.
            let o = r.dims(ins[0], never);
            let rows = o[..o.len() - 1].to_vec();
            r.operands = vec![o.clone(), rows.clone(), o.clone(), rows.clone()];
            r.results = vec![o, rows];
        }
        Op::CrossEntropy | Op::CrossEntropyGrad => {
            // (logits (rows.., V), targets (rows..)[, dloss (rows..)]) -> loss (rows..) | dlogits
            let v = ins[0].len() - 1;
            let l = r.dims(ins[0], |d| d == v);
            let rows = l[..v].to_vec();
            let mut operands = vec![l.clone(), rows.clone()];
            if ins.len() == 3 {
                operands.push(rows.clone());
            }
            r.operands = operands;
            r.results = vec![if matches!(op, Op::CrossEntropy) { rows } else { l }];
        }
        Op::Gather => {
            // (table (V, C), ids (idx..)) -> (idx.., C): a row lookup needs the whole vocabulary.
            let table = r.dims(ins[0], |d| d == 0);
            let ids = r.dims(ins[1], never);
            let mut out = ids.clone();
            out.push(table[1].clone());
            r.operands = vec![table, ids];
            r.results = vec![out];
        }
        Op::ScatterAdd { .. } => {
            // (dout (idx.., C), ids (idx..)) -> (V, C): the indices are summed over.
            let n = ins[0].len() - 1;
            let dout = r.dims(ins[0], never);
            let rows = r.factor(outs[0][0], FactorKind::NeedReplication);
            r.results = vec![vec![vec![rows], dout[n].clone()]];
            r.operands = vec![dout.clone(), dout[..n].to_vec()];
        }
        Op::MoeRoute { .. } | Op::MoeRouteGrad { .. } | Op::MoeDispatch | Op::MoeCombine | Op::MoeGateGrad => {
            moe(&mut r, op, ins, outs)
        }
        Op::FoldIn { .. } => {
            let k = r.dims(ins[0], |_| true);
            r.results = vec![r.dims(outs[0], |_| true)];
            r.operands = vec![k];
        }
        Op::RandomBits { .. } => {
            // Result-only factors: the lowering decides how each device gets its block.
            r.operands = vec![r.dims(ins[0], |_| true)];
            r.results = vec![r.dims(outs[0], never)];
        }
        Op::Psum { .. }
        | Op::AllGather { .. }
        | Op::PsumScatter { .. }
        | Op::Ppermute { .. }
        | Op::AllToAll { .. }
        | Op::Pcast { .. }
        | Op::FoldInAxisIndex { .. }
        | Op::ShardSlice { .. }
        | Op::SeqTake { .. }
        | Op::SeqPut { .. }
        | Op::RandomBitsBlock { .. } => {
            return Err(PartitionError::Invalid {
                what: format!("jit: `{}`", op.name()),
                why:
                    "is a per-device op; jit takes a program on global shapes (use shard_map for explicit collectives)"
                        .into(),
            })
        }
    }
    Ok(r)
}

/// Fused attention: q, o, dq (..., Tq, Dh), k, v, dk, dv (..., Tk, Dh), lse (..., Tq), bits
/// (..., Tq, Tk). The leading dims (batch, heads) shard freely, and so do the queries: each
/// device attends with its block of them, the lowering telling the op where that block sits
/// (the causal mask compares global positions). The keys need every position (every query
/// reads every earlier key), so a sequence-sharded K and V are gathered; dK and dV, which a
/// device makes from its queries only, are partial sums over the queries' axes. Dh is
/// contracted within a head.
fn attention(r: &mut OpRule, op: &Op, ins: &[&[usize]]) {
    let n = ins[0].len();
    let lead: Vec<Vec<usize>> = (0..n - 2)
        .map(|d| vec![r.factor(ins[0][d], FactorKind::Pass)])
        .collect();
    let need = FactorKind::NeedReplication;
    let (tq, tk, dh) = (
        r.factor(ins[0][n - 2], FactorKind::Pass),
        r.factor(ins[1][n - 2], need),
        r.factor(ins[0][n - 1], need),
    );
    let with =
        |tail: &[usize]| -> Vec<Vec<usize>> { lead.iter().cloned().chain(tail.iter().map(|&f| vec![f])).collect() };
    let (q, kv, rows, bits) = (with(&[tq, dh]), with(&[tk, dh]), with(&[tq]), with(&[tq, tk]));
    match op {
        Op::Attention { .. } => {
            r.operands = vec![q.clone(), kv.clone(), kv.clone()];
            r.results = vec![q, rows];
        }
        _ => {
            r.operands = vec![q.clone(), kv.clone(), kv.clone(), q.clone(), rows, q.clone()];
            r.results = vec![q, kv.clone(), kv];
        }
    }
    if ins.len() > r.operands.len() {
        r.operands.push(bits);
    }
}

/// The mixture-of-experts ops: groups (sequences) shard freely, each routed on its own; a
/// row's width shards too (it is only moved, and summed by the gates' gradient). The router's
/// tokens need their whole group (an expert's slots go in sequence order) and so do the
/// dispatch's (a slot's owner is any token of it); combining and the gradients are per
/// token. Experts, slots and choices stay whole: an index names any of them. Where the
/// experts are split over devices, the buffers move by all-to-all between these ops and the
/// experts' matmuls.
fn moe(r: &mut OpRule, op: &Op, ins: &[&[usize]], outs: &[&[usize]]) {
    let need = FactorKind::NeedReplication;
    let whole_tokens = matches!(op, Op::MoeRoute { .. } | Op::MoeDispatch);
    // (G, S, k) and (G, E, C) from the routing arrays; the rows' width D.
    let (routing, slots) = match op {
        Op::MoeRoute { .. } => (outs[1], outs[3]),
        Op::MoeRouteGrad { .. } => (ins[1], &[ins[0][0], ins[0][2], 1][..]),
        Op::MoeGateGrad => (ins[2], &[ins[1][1], ins[1][0], ins[1][2]][..]),
        _ => (ins[1], ins[2]),
    };
    let g = r.factor(routing[0], FactorKind::Pass);
    let s = r.factor(routing[1], if whole_tokens { need } else { FactorKind::Pass });
    let k = r.factor(routing[2], need);
    let e = r.factor(slots[1], need);
    let c = r.factor(slots[2], need);
    let d = |r: &mut OpRule, dims: &[usize]| dims.last().map(|&n| r.factor(n, FactorKind::Pass));
    let (tokens_k, probs) = (vec![vec![g], vec![s], vec![k]], vec![vec![g], vec![s], vec![e]]);
    let owners = vec![vec![g], vec![e], vec![c]];
    match op {
        Op::MoeRoute { .. } => {
            let two = r.factor(2, need);
            r.operands = vec![probs.clone()];
            r.results = vec![
                probs,
                tokens_k.clone(),
                tokens_k,
                owners,
                vec![vec![g], vec![two], vec![e]],
            ];
        }
        Op::MoeRouteGrad { .. } => {
            r.operands = vec![
                probs.clone(),
                tokens_k.clone(),
                tokens_k.clone(),
                probs.clone(),
                tokens_k,
            ];
            r.results = vec![probs];
        }
        _ => {
            let width = d(r, ins[0]).map_or(vec![], |f| vec![f]);
            let rows = vec![vec![g], vec![s], width.clone()];
            let buffer = vec![vec![e], vec![g], vec![c], width];
            let mut operands = match op {
                Op::MoeDispatch => vec![rows.clone(), tokens_k.clone(), owners],
                Op::MoeCombine => vec![buffer.clone(), tokens_k.clone(), owners],
                _ => vec![rows.clone(), buffer.clone(), tokens_k.clone()],
            };
            if ins.len() == 4 {
                operands.push(tokens_k.clone());
            }
            r.operands = operands;
            r.results = vec![match op {
                Op::MoeDispatch => buffer,
                Op::MoeCombine => rows,
                _ => tokens_k,
            }];
        }
    }
}

/// Same-shape operands and results; an operand of lower rank is a suffix (broadcast) of them.
fn elementwise(r: &mut OpRule, ins: &[&[usize]], outs: &[&[usize]]) {
    let f = r.dims(outs[0], |_| false);
    r.operands = ins.iter().map(|s| f[f.len() - s.len()..].to_vec()).collect();
    r.results = vec![f; outs.len()];
}

/// Batch dims shared by both operands and the result, free dims by one operand and the
/// result, contracting dims by both operands only (summed: a sharded one leaves a partial sum).
fn dot_general(r: &mut OpRule, ins: &[&[usize]], contract: (&[usize], &[usize]), batch: (&[usize], &[usize])) {
    let (l, rr) = (ins[0], ins[1]);
    let mut lhs = vec![vec![]; l.len()];
    let mut rhs = vec![vec![]; rr.len()];
    let mut out = vec![];
    for (&a, &b) in batch.0.iter().zip(batch.1) {
        let f = r.factor(l[a], FactorKind::Pass);
        (lhs[a], rhs[b]) = (vec![f], vec![f]);
        out.push(vec![f]);
    }
    for (&a, &b) in contract.0.iter().zip(contract.1) {
        let f = r.factor(l[a], FactorKind::Pass);
        (lhs[a], rhs[b]) = (vec![f], vec![f]);
    }
    for d in (0..l.len()).filter(|d| !contract.0.contains(d) && !batch.0.contains(d)) {
        let f = r.factor(l[d], FactorKind::Pass);
        lhs[d] = vec![f];
        out.push(vec![f]);
    }
    for d in (0..rr.len()).filter(|d| !contract.1.contains(d) && !batch.1.contains(d)) {
        let f = r.factor(rr[d], FactorKind::Pass);
        rhs[d] = vec![f];
        out.push(vec![f]);
    }
    r.operands = vec![lhs, rhs];
    r.results = vec![out];
}

/// Splits and merges of dims as common factors: `[B, T, 3C] -> [B, T, 3, H, Dh]` gives the
/// operand's last dim the factors (3, H, Dh). Where sizes do not divide each other the rest
/// of both shapes gets factors of their own that must stay replicated.
fn reshape(r: &mut OpRule, from: &[usize], to: &[usize]) {
    let mut a = vec![vec![]; from.len()];
    let mut b = vec![vec![]; to.len()];
    let (mut i, mut j) = (0, 0);
    let (mut ra, mut rb) = (from.first().copied().unwrap_or(1), to.first().copied().unwrap_or(1));
    loop {
        while i < from.len() && ra == 1 {
            i += 1;
            ra = from.get(i).copied().unwrap_or(1);
        }
        while j < to.len() && rb == 1 {
            j += 1;
            rb = to.get(j).copied().unwrap_or(1);
        }
        if i >= from.len() || j >= to.len() {
            break;
        }
        let size = if ra % rb == 0 {
            rb
        } else if rb % ra == 0 {
            ra
        } else {
            for (k, d) in a.iter_mut().enumerate().skip(i) {
                d.push(r.factor(from[k], FactorKind::NeedReplication));
            }
            for (k, d) in b.iter_mut().enumerate().skip(j) {
                d.push(r.factor(to[k], FactorKind::NeedReplication));
            }
            break;
        };
        let f = r.factor(size, FactorKind::Pass);
        a[i].push(f);
        b[j].push(f);
        ra /= size;
        rb /= size;
    }
    r.operands = vec![a];
    r.results = vec![b];
}
