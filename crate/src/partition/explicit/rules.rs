//! One sharding rule per op, JAX 0.10's (`jax/_src/lax`): from the operands' types, the
//! result's type, or the `ShardingTypeError` JAX raises with the fix it names. shardlab's fused
//! ops (layer_norm, dot_product_attention, cross_entropy) are typed as the JAX compositions
//! they stand for; their gradients as JAX's transpose rules type them, like their primals.
use super::types::{duplicate_axis, py_entry, py_tuple, type_text, Dims};
use crate::ir::{DType, Op};
use crate::sharding::Mesh;

/// An operand as a rule sees it: its shape, dtype and type (explicit axes per dimension).
#[derive(Clone, Copy, Debug)]
pub struct Typed<'a> {
    pub shape: &'a [usize],
    pub dtype: DType,
    pub dims: &'a [Vec<String>],
}

impl Typed<'_> {
    fn text(&self) -> String {
        type_text(self.dtype, self.shape, self.dims)
    }

    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The fix JAX names for a refused op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FixKind {
    /// Give the op its result's sharding: `jnp.dot(..., out_sharding=P(...))`,
    /// `x.reshape(..., out_sharding=...)`, `table.at[ids].get(out_sharding=...)`.
    OutSharding,
    /// Move an operand to another sharding first: `jax.sharding.reshard(x, P(...))`.
    Reshard,
    /// Leave the op to the compiler: `jax.sharding.auto_axes(f, out_sharding=...)`.
    AutoAxes,
}

/// A refusal of one op: JAX's message, and the fix with a type that would make it typecheck.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleError {
    pub message: String,
    pub fix: FixKind,
    /// With [`FixKind::Reshard`]: the operand to reshard.
    pub operand: Option<usize>,
    /// The result's type (out_sharding) or the operand's (reshard) that typechecks.
    pub suggestion: Option<Dims>,
}

/// Whether the op takes `out_sharding=` in JAX (the ops whose result type a program may choose
/// without a reshard after them).
pub fn accepts_out_sharding(op: &Op) -> bool {
    matches!(
        op,
        Op::DotGeneral { .. }
            | Op::Reshape { .. }
            | Op::BroadcastInDim { .. }
            | Op::ReduceSum { .. }
            | Op::Full { .. }
            | Op::RandomBits { .. }
            | Op::Gather
            | Op::ScatterAdd { .. }
    )
}

type Rule = Result<Vec<Dims>, RuleError>;

/// The type of every result of `op` on `ins`, with results of `outs` shapes, given
/// `out_sharding` (only for ops that [`accepts_out_sharding`]).
pub fn infer(op: &Op, ins: &[Typed], outs: &[&[usize]], out_sharding: Option<&Dims>, mesh: &Mesh) -> Rule {
    if let Some(out) = out_sharding {
        return Ok(vec![out.clone()]);
    }
    let one = |d: Dims| Ok(vec![d]);
    match op {
        Op::Add | Op::Sub | Op::Mul | Op::GeluGrad | Op::Dropout { .. } | Op::SoftmaxCausalGrad => {
            one(broadcast(op.name(), ins)?)
        }
        Op::SgdUpdate { .. } | Op::AdamWUpdate { .. } => {
            let d = broadcast("sub", ins)?;
            Ok(vec![d; outs.len()])
        }
        Op::Scale { .. } | Op::Gelu | Op::SoftmaxCausal => one(ins[0].dims.to_vec()),
        Op::Reshard { .. } => unreachable!("a reshard's type is its spec, read by the caller"),
        Op::Full { .. } | Op::FoldIn { .. } | Op::RandomBits { .. } => one(vec![vec![]; outs[0].len()]),
        Op::Reshape { shape } => one(reshape(&ins[0], shape, mesh)?),
        Op::Transpose { perm } => one(perm.iter().map(|&p| ins[0].dims[p].clone()).collect()),
        Op::BroadcastInDim { shape, dims } => {
            let mut out = vec![vec![]; shape.len()];
            for (i, &d) in dims.iter().enumerate() {
                out[d] = ins[0].dims[i].clone();
            }
            one(out)
        }
        Op::Split { .. } => outs
            .iter()
            .map(|s| varying_out_shape("split", &ins[0], s, mesh))
            .collect(),
        Op::Concat { .. } => one(concat(ins)?),
        Op::DotGeneral {
            lhs_contract,
            rhs_contract,
            lhs_batch,
            rhs_batch,
            ..
        } => one(dot_general(
            &ins[0],
            &ins[1],
            (lhs_contract, rhs_contract),
            (lhs_batch, rhs_batch),
        )?),
        Op::ReduceSum { axes } => one(without(ins[0].dims, axes)),
        Op::LayerNorm => layer_norm(ins),
        Op::LayerNormGrad => {
            // dx as the composition's products make it; dgamma and dbeta as JAX's transpose of
            // the broadcast gamma types them: like gamma.
            let dx = broadcast("mul", &ins[..2])?;
            Ok(vec![dx, ins[4].dims.to_vec(), ins[4].dims.to_vec()])
        }
        Op::Attention { .. } => attention(ins),
        Op::AttentionGrad { .. } => {
            attention(&[ins[0], ins[1], ins[2]])?;
            Ok(vec![ins[0].dims.to_vec(), ins[1].dims.to_vec(), ins[2].dims.to_vec()])
        }
        Op::CrossEntropy | Op::CrossEntropyGrad => cross_entropy(op, ins),
        Op::Gather => one(gather(&ins[0], &ins[1])?),
        Op::MoeRoute { .. } | Op::MoeRouteGrad { .. } | Op::MoeDispatch | Op::MoeCombine | Op::MoeGateGrad => {
            moe(op, ins, outs)
        }
        Op::ScatterAdd { .. } => one(scatter_add(&ins[0], &ins[1], outs[0])?),
        Op::AttentionCombine
        | Op::Psum { .. }
        | Op::AllGather { .. }
        | Op::PsumScatter { .. }
        | Op::Ppermute { .. }
        | Op::AllToAll { .. }
        | Op::Pcast { .. }
        | Op::FoldInAxisIndex { .. }
        | Op::ShardSlice { .. }
        | Op::SeqTake { .. }
        | Op::SeqPut { .. }
        | Op::RandomBitsBlock { .. } => Err(RuleError {
            message: format!(
                "sharding rule for {} is not implemented: it is a per-device op, written inside jax.shard_map",
                op.name()
            ),
            fix: FixKind::AutoAxes,
            operand: None,
            suggestion: None,
        }),
    }
}

/// A mixture-of-experts op routes each group (sequence) on its own: its groups keep their
/// sharding, and every other dimension must be whole (an index names any token, expert or
/// slot), as a `jax.shard_map` over the group axis would see them. An expert buffer
/// (E, G, C, D) has its groups second; every other array first.
fn moe(op: &Op, ins: &[Typed], outs: &[&[usize]]) -> Rule {
    let group = |rank: usize| usize::from(rank == 4);
    let axes = ins[0].dims[group(ins[0].shape.len())].clone();
    for (k, x) in ins.iter().enumerate() {
        let g = group(x.shape.len());
        let other = x.dims.iter().enumerate().any(|(d, a)| d != g && !a.is_empty());
        if other || x.dims[g] != axes {
            let mut want = vec![vec![]; x.shape.len()];
            want[g] = axes.clone();
            return Err(RuleError {
                message: format!(
                    "{} routes each sequence on its own: its operand {} must be split over its sequences alone, \
                     as the first operand is",
                    op.name(),
                    x.text()
                ),
                fix: FixKind::Reshard,
                operand: Some(k),
                suggestion: Some(want),
            });
        }
    }
    Ok(outs
        .iter()
        .map(|s| {
            let mut d = vec![vec![]; s.len()];
            d[group(s.len())] = axes.clone();
            d
        })
        .collect())
}

fn without(dims: &[Vec<String>], axes: &[usize]) -> Dims {
    dims.iter()
        .enumerate()
        .filter(|(d, _)| !axes.contains(d))
        .map(|(_, a)| a.clone())
        .collect()
}

fn axes_size(mesh: &Mesh, axes: &[String]) -> usize {
    axes.iter().map(|a| mesh.size_of(a).unwrap_or(1)).product()
}

/// The operand with the fewest elements, the later one on a tie: the one a fix moves.
fn smallest(ins: &[Typed]) -> usize {
    (0..ins.len()).rev().min_by_key(|&k| ins[k].numel()).unwrap_or(0)
}

/// `{name} operation with inputs: ... produces an illegally sharded result: ...` where `out`
/// shards two dimensions over one axis; the fix reshards the smallest operand off that axis.
fn check_legal(name: &str, ins: &[Typed], out_shape: &[usize], dtype: DType, out: Dims) -> Result<Dims, RuleError> {
    let Some(axis) = duplicate_axis(&out).map(str::to_string) else {
        return Ok(out);
    };
    let inputs: Vec<String> = ins.iter().map(Typed::text).collect();
    let k = smallest(ins);
    let moved: Dims = ins[k]
        .dims
        .iter()
        .map(|a| a.iter().filter(|x| **x != axis).cloned().collect())
        .collect();
    Err(RuleError {
        message: format!(
            "{name} operation with inputs: {} produces an illegally sharded result: {}",
            inputs.join(", "),
            type_text(dtype, out_shape, &out)
        ),
        fix: FixKind::Reshard,
        operand: Some(k),
        suggestion: Some(moved),
    })
}

/// Operands of lower rank broadcast as jax.numpy broadcasts them: leading dimensions of size 1.
fn expanded<'a>(ins: &[Typed<'a>], rank: usize) -> Vec<(Vec<usize>, Dims, DType)> {
    ins.iter()
        .map(|t| {
            let pad = rank - t.shape.len();
            let shape = std::iter::repeat_n(1, pad).chain(t.shape.iter().copied()).collect();
            let dims = std::iter::repeat_n(vec![], pad).chain(t.dims.iter().cloned()).collect();
            (shape, dims, t.dtype)
        })
        .collect()
}

/// JAX's `broadcasting_sharding_rule`: per dimension, the operands' shardings must agree where
/// they are not trivially broadcast (a size-1 dimension with no sharding); a replicated operand
/// takes the other's sharding. Then the result must be legal.
fn broadcast(name: &str, ins: &[Typed]) -> Result<Dims, RuleError> {
    let rank = ins.iter().map(|t| t.shape.len()).max().unwrap_or(0);
    let ex = expanded(ins, rank);
    let typed: Vec<Typed> = ex
        .iter()
        .map(|(shape, dims, dtype)| Typed {
            shape,
            dtype: *dtype,
            dims,
        })
        .collect();
    let mut out: Dims = vec![vec![]; rank];
    for (d, res) in out.iter_mut().enumerate() {
        let ss: Vec<&Vec<String>> = ex.iter().map(|(_, dims, _)| &dims[d]).collect();
        if ss.iter().all(|s| *s == ss[0]) {
            *res = ss[0].clone();
            continue;
        }
        let non_trivial: Vec<&Vec<String>> = ex
            .iter()
            .filter(|(shape, dims, _)| !(shape[d] == 1 && dims[d].is_empty()))
            .map(|(_, dims, _)| &dims[d])
            .collect();
        if non_trivial.iter().all(|s| *s == non_trivial[0]) {
            *res = non_trivial.first().map(|s| (*s).clone()).unwrap_or_default();
            continue;
        }
        for s in &ss {
            if res.is_empty() && !s.is_empty() {
                *res = (*s).clone();
            } else if !res.is_empty() && !s.is_empty() && *res != **s {
                let specs: Vec<String> = ex.iter().map(|(_, dims, _)| py_tuple(dims)).collect();
                let k = smallest(&typed);
                let mut moved = ex[k].1.clone();
                moved[d] = res.clone();
                let moved = moved[rank - ins[k].shape.len()..].to_vec();
                return Err(RuleError {
                    message: format!(
                        "{name} got incompatible shardings for broadcasting: {}.",
                        specs.join(", ")
                    ),
                    fix: FixKind::Reshard,
                    operand: Some(k),
                    suggestion: Some(moved),
                });
            }
        }
    }
    let shape: Vec<usize> = (0..rank)
        .map(|d| ex.iter().map(|(s, _, _)| s[d]).max().unwrap_or(1))
        .collect();
    check_legal(name, &typed, &shape, ins[0].dtype, out).map_err(|mut e| {
        // The operand to move is one of the caller's, whatever its rank.
        if let (Some(k), Some(s)) = (e.operand, e.suggestion.as_mut()) {
            *s = s[rank - ins[k].shape.len()..].to_vec();
        }
        e
    })
}

/// JAX's `_dot_general_sharding_rule`: batch dimensions and contracting dimensions must not be
/// sharded differently on the two sides; contracting dimensions sharded on both sides leave
/// the result ambiguous (a partial sum to be reduced one way or another: `out_sharding=`);
/// otherwise the result is the batch dims (the lhs's), the lhs's free dims, the rhs's.
fn dot_general(
    lhs: &Typed,
    rhs: &Typed,
    contract: (&[usize], &[usize]),
    batch: (&[usize], &[usize]),
) -> Result<Dims, RuleError> {
    let specs = |t: &Typed, dims: &[usize]| -> Dims { dims.iter().map(|&d| t.dims[d].clone()).collect() };
    let (lb, rb) = (specs(lhs, batch.0), specs(rhs, batch.1));
    let (lc, rc) = (specs(lhs, contract.0), specs(rhs, contract.1));
    // The fix of a mismatch: the rhs laid out as the lhs on those dims.
    let rhs_like_lhs = |dims: &[usize], want: &Dims| -> Dims {
        let mut d = rhs.dims.to_vec();
        for (&r, w) in dims.iter().zip(want) {
            d[r] = w.clone();
        }
        d
    };
    let mismatch = |l: &Dims, r: &Dims| l.iter().zip(r).any(|(a, b)| !a.is_empty() && !b.is_empty() && a != b);
    if mismatch(&lb, &rb) {
        return Err(RuleError {
            message: format!(
                "dot_general requires lhs batch dimensions and rhs batch dimensions to have the consistent sharding, \
                 got {} and {}.",
                py_tuple(&lb),
                py_tuple(&rb)
            ),
            fix: FixKind::Reshard,
            operand: Some(1),
            suggestion: Some(rhs_like_lhs(batch.1, &lb)),
        });
    }
    if mismatch(&lc, &rc) {
        return Err(RuleError {
            message: format!(
                "dot_general requires contracting dimensions to have consistent sharding, got {} and {}.",
                py_tuple(&lc),
                py_tuple(&rc)
            ),
            fix: FixKind::Reshard,
            operand: Some(1),
            suggestion: Some(rhs_like_lhs(contract.1, &lc)),
        });
    }
    let free = |t: &Typed, c: &[usize], b: &[usize]| -> Dims {
        (0..t.shape.len())
            .filter(|d| !c.contains(d) && !b.contains(d))
            .map(|d| t.dims[d].clone())
            .collect()
    };
    let out: Dims = lb
        .iter()
        .cloned()
        .chain(free(lhs, contract.0, batch.0))
        .chain(free(rhs, contract.1, batch.1))
        .collect();
    if lc.iter().zip(&rc).any(|(a, b)| !a.is_empty() && !b.is_empty()) {
        return Err(RuleError {
            message: format!(
                "Contracting dimensions are sharded and it is ambiguous how the output should be sharded. Please \
                 specify the output sharding via the `out_sharding` parameter. Got lhs_contracting_spec={} and \
                 rhs_contracting_spec={}",
                py_tuple(&lc),
                py_tuple(&rc)
            ),
            fix: FixKind::OutSharding,
            operand: None,
            suggestion: (duplicate_axis(&out).is_none()).then(|| out.clone()),
        });
    }
    let shape: Vec<usize> = batch
        .0
        .iter()
        .map(|&d| lhs.shape[d])
        .chain(
            (0..lhs.shape.len())
                .filter(|d| !contract.0.contains(d) && !batch.0.contains(d))
                .map(|d| lhs.shape[d]),
        )
        .chain(
            (0..rhs.shape.len())
                .filter(|d| !contract.1.contains(d) && !batch.1.contains(d))
                .map(|d| rhs.shape[d]),
        )
        .collect();
    check_legal("dot_general", &[*lhs, *rhs], &shape, lhs.dtype, out)
}

fn reshape_error(x: &Typed, to: &[usize]) -> RuleError {
    RuleError {
        message: format!(
            "This reshape is not supported. Please specify the sharding of the output via the `out_sharding` argument \
             of jax.lax.reshape. Got operand type: {}, new sizes: {}",
            x.text(),
            py_sizes(to)
        ),
        fix: FixKind::OutSharding,
        operand: None,
        suggestion: None,
    }
}

fn py_sizes(s: &[usize]) -> String {
    match s {
        [one] => format!("({one},)"),
        many => format!("({})", many.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")),
    }
}

/// A dimension of a reshape's grouping: kept as it is, or split into (merged from) several.
#[derive(Clone, Debug, PartialEq)]
enum Group {
    Same,
    Many(Vec<usize>),
}

/// JAX's `_split_on_one_axis(from, to)`: whether `to` splits exactly one dimension of `from`
/// (trailing size-1 dimensions aside), and each dimension of `from`'s grouping. None where
/// more than one dimension would split (JAX's ReshapeExplicitError).
fn split_on_one_axis(from: &[usize], to: &[usize]) -> Option<(bool, Vec<Group>)> {
    if to.len() <= from.len() {
        return Some((false, vec![]));
    }
    let (mut from, mut to) = (from, to);
    let mut ones = 0;
    while from.last() == Some(&1) && to.last() == Some(&1) {
        ones += 1;
        from = &from[..from.len() - 1];
        to = &to[..to.len() - 1];
    }
    let (mut i, mut j, mut count, mut out) = (0, 0, 0, vec![]);
    while j < to.len() {
        let Some(&fi) = from.get(i) else {
            return Some((false, vec![]));
        };
        if fi == to[j] {
            out.push(Group::Same);
        } else {
            count += 1;
            if count > 1 {
                return None;
            }
            let mut temp = vec![to[j]];
            let (mut next_j, next_i) = (j + 1, i + 1);
            let prod = |t: &[usize]| t.iter().product::<usize>();
            while prod(&temp) != fi || (next_j < to.len() && to[next_j] == 1) {
                if prod(&temp) > fi {
                    return Some((false, vec![]));
                }
                if prod(&temp) == fi && next_i < from.len() && to.get(next_j) == Some(&from[next_i]) {
                    break;
                }
                j += 1;
                if j >= to.len() {
                    return Some((false, vec![]));
                }
                temp.push(to[j]);
                next_j += 1;
            }
            out.push(Group::Many(temp));
        }
        i += 1;
        j += 1;
    }
    out.extend(std::iter::repeat_n(Group::Same, ones));
    (out.len() == from.len() + ones).then_some((true, out))
}

/// JAX's `split_partitions`: the axes `axes` (major first) laid over dimensions of `sizes`,
/// each taking axes while it divides; None where an axis does not divide or one is left over.
fn split_partitions(mesh: &Mesh, axes: &[String], sizes: &[usize]) -> Option<Dims> {
    let mut rest = axes.iter();
    let mut out = vec![];
    for &size in sizes {
        let mut o = size;
        let mut dim = vec![];
        while o > 1 {
            let Some(axis) = rest.next() else { break };
            let n = mesh.size_of(axis).unwrap_or(1);
            if o % n != 0 {
                return None;
            }
            o /= n;
            dim.push(axis.clone());
        }
        out.push(dim);
    }
    rest.next().is_none().then_some(out)
}

/// JAX's `_reshape_sharding_rule`: size-1 dimensions come and go freely; one dimension split
/// passes its axes to the new dimensions major first, as far as they divide; one group merged
/// takes its axes if only its major dimensions are sharded. Anything else needs out_sharding.
fn reshape(x: &Typed, to: &[usize], mesh: &Mesh) -> Result<Dims, RuleError> {
    if x.dims.iter().all(Vec::is_empty) {
        return Ok(vec![vec![]; to.len()]);
    }
    let non1 = |s: &[usize]| s.iter().copied().filter(|&n| n != 1).collect::<Vec<_>>();
    if non1(x.shape) == non1(to) {
        let mut specs = x
            .shape
            .iter()
            .zip(x.dims)
            .filter(|(n, _)| **n != 1)
            .map(|(_, d)| d.clone());
        return Ok(to
            .iter()
            .map(|&n| {
                if n == 1 {
                    vec![]
                } else {
                    specs.next().unwrap_or_default()
                }
            })
            .collect());
    }
    let err = || reshape_error(x, to);
    let (is_split, groups) = split_on_one_axis(x.shape, to).ok_or_else(err)?;
    if is_split {
        let mut out = vec![];
        for (g, axes) in groups.iter().zip(x.dims) {
            match g {
                Group::Same => out.push(axes.clone()),
                Group::Many(sizes) if axes.is_empty() => out.extend(std::iter::repeat_n(vec![], sizes.len())),
                Group::Many(sizes) => out.extend(split_partitions(mesh, axes, sizes).ok_or_else(err)?),
            }
        }
        return Ok(out);
    }
    let (is_merge, groups) = if to.len() >= x.shape.len() {
        (false, vec![])
    } else {
        split_on_one_axis(to, x.shape).ok_or_else(err)?
    };
    if !is_merge {
        return Err(err());
    }
    let mut specs = x.dims.iter();
    let mut out = vec![];
    for (&n, g) in to.iter().zip(&groups) {
        match g {
            Group::Same => out.push(specs.next().cloned().unwrap_or_default()),
            Group::Many(merged) => {
                let parts: Vec<&Vec<String>> = merged.iter().filter_map(|_| specs.next()).collect();
                if parts.iter().all(|p| p.is_empty()) {
                    out.push(vec![]);
                    continue;
                }
                // Sharded dims must lead the group: no unsharded dim before a sharded one.
                let last = parts.iter().rposition(|p| !p.is_empty()).unwrap_or(0);
                if parts[..last].iter().any(|p| p.is_empty()) {
                    return Err(err());
                }
                let axes: Vec<String> = parts.iter().flat_map(|p| p.iter().cloned()).collect();
                out.extend(split_partitions(mesh, &axes, &[n]).ok_or_else(err)?);
            }
        }
    }
    Ok(out)
}

/// JAX's `_get_sharding_for_varying_out_shape` (split, slices): the operand's sharding, where
/// every sharded dimension that changes size still divides by its axes.
fn varying_out_shape(name: &str, x: &Typed, out: &[usize], mesh: &Mesh) -> Result<Dims, RuleError> {
    for (d, axes) in x.dims.iter().enumerate() {
        let n = axes_size(mesh, axes);
        if x.shape[d] != out[d] && !axes.is_empty() && !out[d].is_multiple_of(n) {
            let mut moved = x.dims.to_vec();
            moved[d] = vec![];
            return Err(RuleError {
                message: format!(
                    "{name} on sharded dims where out dim ({}) is not divisible by mesh axes ({n}) with spec ({}) is not \
                     implemented. Got input type={} and output shape={}",
                    out[d],
                    py_entry(axes),
                    x.text(),
                    py_sizes(out)
                ),
                fix: FixKind::Reshard,
                operand: Some(0),
                suggestion: Some(moved),
            });
        }
    }
    Ok(x.dims.to_vec())
}

/// JAX's `_concatenate_sharding_rule`: every operand sharded alike.
fn concat(ins: &[Typed]) -> Result<Dims, RuleError> {
    if let Some(k) = ins.iter().position(|t| t.dims != ins[0].dims) {
        let specs: Vec<String> = ins
            .iter()
            .map(|t| crate::partition::auto::spec_of_dims(t.dims).p_text())
            .collect();
        return Err(RuleError {
            message: format!(
                "All operands should have the same sharding. Got shardings {}",
                specs.join(", ")
            ),
            fix: FixKind::Reshard,
            operand: Some(k),
            suggestion: Some(ins[0].dims.to_vec()),
        });
    }
    Ok(ins[0].dims.to_vec())
}

/// layer_norm as `(x - mean) * rsqrt(var + eps) * gamma + beta` over the last axis: the
/// reductions drop it, the products broadcast gamma and beta (as (1, ..., C)) against x.
fn layer_norm(ins: &[Typed]) -> Rule {
    let y = broadcast("mul", &[ins[0], ins[1]])?;
    let shape = ins[0].shape;
    let y_typed = Typed {
        shape,
        dtype: ins[0].dtype,
        dims: &y,
    };
    let y = broadcast("add", &[y_typed, ins[2]])?;
    let rows = ins[0].dims[..shape.len() - 1].to_vec();
    Ok(vec![y, rows.clone(), rows])
}

/// dot_product_attention as its composition: `s = q @ k^T` (contracting Dh, batching the
/// leading dims), `p = softmax(s)` (times the dropout mask), `o = p @ v` (contracting the
/// keys); lse is s reduced over the keys.
fn attention(ins: &[Typed]) -> Rule {
    let (q, k, v) = (&ins[0], &ins[1], &ins[2]);
    let n = q.shape.len();
    let lead: Vec<usize> = (0..n - 2).collect();
    let s = dot_general(q, k, (&[n - 1], &[n - 1]), (&lead, &lead))?;
    let s_shape: Vec<usize> = q.shape[..n - 1].iter().copied().chain([k.shape[n - 2]]).collect();
    let mut p = s.clone();
    if let Some(bits) = ins.get(3) {
        let s_typed = Typed {
            shape: &s_shape,
            dtype: q.dtype,
            dims: &s,
        };
        p = broadcast("mul", &[s_typed, *bits])?;
    }
    let p_typed = Typed {
        shape: &s_shape,
        dtype: q.dtype,
        dims: &p,
    };
    let o = dot_general(&p_typed, v, (&[n - 1], &[n - 2]), (&lead, &lead))?;
    Ok(vec![o, s[..n - 1].to_vec()])
}

/// cross_entropy as `logsumexp(logits) - sum(logits * one_hot(targets))` over the vocabulary:
/// the one-hot targets (targets' sharding, the vocabulary unsharded) broadcast against the
/// logits; the loss drops the vocabulary, its gradient keeps it.
fn cross_entropy(op: &Op, ins: &[Typed]) -> Rule {
    let (logits, targets) = (&ins[0], &ins[1]);
    let hot_shape: Vec<usize> = targets.shape.iter().copied().chain([1]).collect();
    let hot_dims: Dims = targets.dims.iter().cloned().chain([vec![]]).collect();
    let hot = Typed {
        shape: &hot_shape,
        dtype: DType::F32,
        dims: &hot_dims,
    };
    let mut operands = vec![*logits, hot];
    let (dl_shape, dl_dims): (Vec<usize>, Dims);
    if let Some(dloss) = ins.get(2) {
        dl_shape = dloss.shape.iter().copied().chain([1]).collect();
        dl_dims = dloss.dims.iter().cloned().chain([vec![]]).collect();
        operands.push(Typed {
            shape: &dl_shape,
            dtype: DType::F32,
            dims: &dl_dims,
        });
    }
    let all = broadcast("mul", &operands)?;
    Ok(vec![match op {
        Op::CrossEntropy => all[..all.len() - 1].to_vec(),
        _ => all,
    }])
}

/// JAX's gather rule for `table[ids]` (`_gather_spec_computation`): the indexed dimension of
/// the table replicated and the indices replicated (each device would need every index), or
/// the result is ambiguous: `.at[ids].get(out_sharding=...)`.
fn gather(table: &Typed, ids: &Typed) -> Result<Dims, RuleError> {
    let all_none = table.dims.iter().chain(ids.dims).all(Vec::is_empty);
    if all_none {
        return Ok(vec![vec![]; ids.shape.len() + 1]);
    }
    let out: Dims = ids.dims.iter().cloned().chain([table.dims[1].clone()]).collect();
    if table.dims[0].is_empty() && ids.dims.iter().all(Vec::is_empty) {
        return Ok(out);
    }
    let ids3: Vec<usize> = ids.shape.iter().copied().chain([1]).collect();
    let ids_dims: Dims = ids.dims.iter().cloned().chain([vec![]]).collect();
    let dt = |t: DType| if t == DType::U32 { "int32" } else { "float32" };
    let shaped = |dtype: DType, shape: &[usize], dims: &[Vec<String>]| {
        let t = type_text(dtype, shape, dims);
        format!("ShapedArray({}{})", dt(dtype), &t[t.find('[').unwrap_or(0)..])
    };
    let mut suggestion = out;
    if let Some(a) = duplicate_axis(&suggestion).map(str::to_string) {
        let last = suggestion.len() - 1;
        suggestion[last].retain(|x| *x != a);
    }
    Err(RuleError {
        message: format!(
            "Use `.at[...].get(out_sharding=)` to provide output PartitionSpec for the gather indexing as out sharding \
             could not be resolved unambiguously (or would require collectives on inputs). Got operand={}, indices={}",
            shaped(table.dtype, table.shape, table.dims),
            shaped(ids.dtype, &ids3, &ids_dims)
        ),
        fix: FixKind::OutSharding,
        operand: None,
        suggestion: Some(suggestion),
    })
}

/// The transpose of the embedding's gather, `zeros.at[ids].add(dout)`: resolved only where
/// nothing is sharded; otherwise `.at[...].add(out_sharding=...)` (JAX's transpose gives it
/// the table's sharding).
fn scatter_add(dout: &Typed, ids: &Typed, out: &[usize]) -> Result<Dims, RuleError> {
    if dout.dims.iter().chain(ids.dims).all(Vec::is_empty) {
        return Ok(vec![vec![]; out.len()]);
    }
    Err(RuleError {
        message: format!(
            "Use `.at[...].set/add/mul/...(out_sharding=)` to provide output PartitionSpec for the scatter update as \
             out sharding could not be resolved unambiguously (or would require collectives on inputs). Got \
             indices={}, updates={}",
            ids.text(),
            dout.text()
        ),
        fix: FixKind::OutSharding,
        operand: None,
        suggestion: Some(vec![vec![]; out.len()]),
    })
}
