//! How IR ops map onto the kernels' shapes, shared by the reference and GPU executors so
//! both run exactly the same decomposition.
use crate::ir::{numel, strides, AttnSeq, Instr, Op, Program, Runs, SeqBlock, ValueId};
use crate::reference::attention::Blocks;
use crate::reference::copy::Strided;
use crate::reference::matmul::MatmulShape;
use crate::sharding::Mesh;

/// dot_general as (optional operand transposes) + one batched matmul whose output layout
/// (batch, M, N) is dot_general's (batch dims, lhs free dims, rhs free dims).
#[derive(Clone, Debug, PartialEq)]
pub struct DotPlan {
    /// Transpose the lhs into `perm` order first (None: use it as stored).
    pub lhs_perm: Option<Vec<usize>>,
    pub rhs_perm: Option<Vec<usize>>,
    pub shape: MatmulShape,
}

/// Lays out one operand as batch ++ (free, contract) or batch ++ (contract, free), transposing
/// only when the stored order is neither. Returns (perm, contract_first).
fn operand_layout(rank: usize, batch: &[usize], contract: &[usize]) -> (Option<Vec<usize>>, bool) {
    let free: Vec<usize> = (0..rank)
        .filter(|d| !batch.contains(d) && !contract.contains(d))
        .collect();
    let free_first: Vec<usize> = batch.iter().chain(&free).chain(contract).copied().collect();
    let contract_first: Vec<usize> = batch.iter().chain(contract).chain(&free).copied().collect();
    let identity: Vec<usize> = (0..rank).collect();
    if free_first == identity {
        (None, false)
    } else if contract_first == identity {
        (None, true)
    } else {
        (Some(free_first), false)
    }
}

/// [`plan_dot`] of instruction `ins` of `program`; None when it is not a dot_general.
pub fn plan_instr_dot(program: &Program, ins: &Instr) -> Option<DotPlan> {
    let Op::DotGeneral {
        lhs_contract,
        rhs_contract,
        lhs_batch,
        rhs_batch,
        alpha,
    } = &ins.op
    else {
        return None;
    };
    let (lhs, rhs) = (program.shape(ins.inputs[0]), program.shape(ins.inputs[1]));
    Some(plan_dot(
        lhs,
        rhs,
        lhs_contract,
        rhs_contract,
        lhs_batch,
        rhs_batch,
        *alpha,
    ))
}

pub fn plan_dot(
    lhs: &[usize],
    rhs: &[usize],
    lhs_contract: &[usize],
    rhs_contract: &[usize],
    lhs_batch: &[usize],
    rhs_batch: &[usize],
    alpha: f32,
) -> DotPlan {
    let (lhs_perm, lhs_contract_first) = operand_layout(lhs.len(), lhs_batch, lhs_contract);
    let (rhs_perm, rhs_contract_first) = operand_layout(rhs.len(), rhs_batch, rhs_contract);
    let prod = |shape: &[usize], dims: &[usize]| dims.iter().map(|&d| shape[d]).product::<usize>();
    let batch = prod(lhs, lhs_batch);
    let k = prod(lhs, lhs_contract);
    let m = numel(lhs) / (batch * k).max(1);
    let n = numel(rhs) / (batch * k).max(1);
    DotPlan {
        lhs_perm,
        rhs_perm,
        shape: MatmulShape {
            batch,
            m,
            n,
            k,
            trans_a: lhs_contract_first,
            // rhs stored (contract, free) is the plain (K, N) layout.
            trans_b: !rhs_contract_first,
            stride_a: m * k,
            stride_b: k * n,
            stride_c: m * n,
            stride_bias: 0,
            alpha,
            accumulate: false,
        },
    }
}

/// out = transpose(x, perm): walk the output in order, read x through permuted strides.
pub fn plan_transpose(shape: &[usize], perm: &[usize]) -> Strided {
    let st = strides(shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    Strided {
        dst_strides: strides(&out_shape),
        src_strides: perm.iter().map(|&p| st[p]).collect(),
        shape: out_shape,
        src_offset: 0,
        dst_offset: 0,
        accumulate: false,
    }
}

/// Part `[start, start + len)` along `axis` of transpose(x, perm), read straight from x: a
/// transpose and a split as one copy.
pub fn plan_transpose_slice(shape: &[usize], perm: &[usize], axis: usize, start: usize, len: usize) -> Strided {
    let mut c = plan_transpose(shape, perm);
    c.src_offset += start * c.src_strides[axis];
    c.shape[axis] = len;
    c.dst_strides = strides(&c.shape);
    c
}

/// A part of concat(parts, axis) that starts at `start` along `axis`, written straight to its
/// place in transpose(concat(parts), perm) (of shape `out_shape`): a concat and a transpose as
/// one copy per part.
pub fn plan_into_transposed(part: &[usize], out_shape: &[usize], perm: &[usize], axis: usize, start: usize) -> Strided {
    let out = strides(out_shape);
    // Dim d of the concat is dim `position of d in perm` of the output.
    let mut dst_strides = vec![0; perm.len()];
    for (i, &d) in perm.iter().enumerate() {
        dst_strides[d] = out[i];
    }
    Strided {
        shape: part.to_vec(),
        src_offset: 0,
        src_strides: strides(part),
        dst_offset: start * dst_strides[axis],
        dst_strides,
        accumulate: false,
    }
}

/// out = broadcast_in_dim(x, out_shape, dims): stride 0 along repeated dims.
pub fn plan_broadcast(in_shape: &[usize], out_shape: &[usize], dims: &[usize]) -> Strided {
    let st = strides(in_shape);
    let src_strides = (0..out_shape.len())
        .map(|d| match dims.iter().position(|&x| x == d) {
            Some(i) if in_shape[i] != 1 => st[i],
            _ => 0,
        })
        .collect();
    Strided {
        shape: out_shape.to_vec(),
        src_offset: 0,
        src_strides,
        dst_offset: 0,
        dst_strides: strides(out_shape),
        accumulate: false,
    }
}

/// Piece `[start, start+len)` of `axis`: read with an offset into x, write contiguously
/// (split), or the reverse (concat: `into_whole`).
pub fn plan_slice(whole: &[usize], axis: usize, start: usize, len: usize, into_whole: bool) -> Strided {
    let st = strides(whole);
    let mut piece = whole.to_vec();
    piece[axis] = len;
    let (whole_side, piece_side) = ((start * st[axis], st.clone()), (0, strides(&piece)));
    let ((src_offset, src_strides), (dst_offset, dst_strides)) = if into_whole {
        (piece_side, whole_side)
    } else {
        (whole_side, piece_side)
    };
    Strided {
        shape: piece,
        src_offset,
        src_strides,
        dst_offset,
        dst_strides,
        accumulate: false,
    }
}

/// reduce_sum as (optional transpose moving the reduced axes last) + sum over the middle
/// of (outer, n, inner).
#[derive(Clone, Debug, PartialEq)]
pub struct ReducePlan {
    pub perm: Option<Vec<usize>>,
    pub outer: usize,
    pub n: usize,
    pub inner: usize,
}

pub fn plan_reduce(shape: &[usize], axes: &[usize]) -> ReducePlan {
    let mut sorted = axes.to_vec();
    sorted.sort();
    let contiguous = sorted.windows(2).all(|w| w[1] == w[0] + 1);
    if sorted.is_empty() {
        return ReducePlan {
            perm: None,
            outer: numel(shape),
            n: 1,
            inner: 1,
        };
    }
    if contiguous {
        let (lo, hi) = (sorted[0], *sorted.last().unwrap());
        return ReducePlan {
            perm: None,
            outer: shape[..lo].iter().product(),
            n: shape[lo..=hi].iter().product(),
            inner: shape[hi + 1..].iter().product(),
        };
    }
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !sorted.contains(d)).collect();
    let perm: Vec<usize> = kept.iter().chain(&sorted).copied().collect();
    ReducePlan {
        outer: kept.iter().map(|&d| shape[d]).product(),
        n: sorted.iter().map(|&d| shape[d]).product(),
        inner: 1,
        perm: Some(perm),
    }
}

/// shard_slice of every device's block at once: every device keeps chunk `axes_index(axes)` of
/// `parts` along dimension `dim` of its block (local shape `local`). One strided copy over
/// `[mesh axes..., outer, chunk, inner]`, where the chunk offset is linear in the device's mesh
/// coordinates.
pub fn plan_shard_slice(mesh: &Mesh, local: &[usize], dim: usize, axes: &[String], parts: usize) -> Strided {
    let outer: usize = local[..dim].iter().product();
    let inner: usize = local[dim + 1..].iter().product();
    let (n, len) = (local[dim], local[dim] / parts);
    let (src_block, dst_block) = (outer * n * inner, outer * len * inner);
    let sizes = mesh.shape();
    let mut shape = sizes.clone();
    let (mut src_strides, mut dst_strides) = (vec![], vec![]);
    for (k, (name, _)) in mesh.axes().iter().enumerate() {
        let later: usize = sizes[k + 1..].iter().product();
        // The chunk index is axes_index(axes): this axis's coordinate times the sizes of
        // the axes after it in `axes`.
        let weight = match axes.iter().position(|a| a == name) {
            Some(p) => axes[p + 1..]
                .iter()
                .map(|a| mesh.size_of(a).unwrap_or(1))
                .product::<usize>(),
            None => 0,
        };
        src_strides.push(src_block * later + weight * len * inner);
        dst_strides.push(dst_block * later);
    }
    shape.extend([outer, len, inner]);
    src_strides.extend([n * inner, inner, 1]);
    dst_strides.extend([len * inner, inner, 1]);
    Strided {
        shape,
        src_offset: 0,
        src_strides,
        dst_offset: 0,
        dst_strides,
        accumulate: false,
    }
}

/// `c` on every device's block at once: a leading device dimension stepping by each side's
/// block size (`blocks` = (src, dst) elements per device).
pub fn on_devices(c: &Strided, devices: usize, blocks: (usize, usize)) -> Strided {
    Strided {
        shape: std::iter::once(devices).chain(c.shape.iter().copied()).collect(),
        src_offset: c.src_offset,
        src_strides: std::iter::once(blocks.0).chain(c.src_strides.iter().copied()).collect(),
        dst_offset: c.dst_offset,
        dst_strides: std::iter::once(blocks.1).chain(c.dst_strides.iter().copied()).collect(),
        accumulate: c.accumulate,
    }
}

/// Where device `device`'s `len` rows of sequence block `block` sit in the global sequence.
pub fn seq_runs(
    block: &SeqBlock,
    len: usize,
    mesh: Option<&Mesh>,
    device: usize,
) -> Result<Runs, crate::sharding::ShardingError> {
    let index = match mesh {
        Some(m) if !block.axes().is_empty() => {
            let axes: Vec<&str> = block.axes().iter().map(String::as_str).collect();
            m.axes_index(device, &axes)?
        }
        _ => 0,
    };
    block.runs(index, len)
}

/// Where device `device`'s rows of an attention over q of `tq` rows and keys of `tk` rows sit
/// in the global sequence (`seq` of the op; a program without a mesh has whole sides).
pub fn attention_blocks(
    seq: &AttnSeq,
    tq: usize,
    tk: usize,
    mesh: Option<&Mesh>,
    device: usize,
) -> Result<Blocks, crate::sharding::ShardingError> {
    Ok(Blocks {
        tk,
        q: seq_runs(&seq.q, tq, mesh, device)?,
        kv: seq_runs(&seq.kv, tk, mesh, device)?,
    })
}

/// The routing sizes of a mixture-of-experts instruction, read off its operands' and results'
/// local shapes.
pub fn moe_shape(prog: &Program, ins: &Instr) -> crate::reference::moe::MoeShape {
    let shape = |v: ValueId| prog.shape(v);
    let (groups, seq, experts, k, capacity, width) = match &ins.op {
        Op::MoeRoute { k, capacity } => {
            let l = shape(ins.inputs[0]);
            (l[0], l[1], l[2], *k, *capacity, 0)
        }
        Op::MoeRouteGrad { capacity } => {
            let (p, g) = (shape(ins.inputs[0]), shape(ins.inputs[1]));
            (p[0], p[1], p[2], g[2], *capacity, 0)
        }
        Op::MoeDispatch | Op::MoeCombine => {
            let (p, o) = (shape(ins.inputs[1]), shape(ins.inputs[2]));
            let d = *shape(ins.inputs[0]).last().unwrap_or(&0);
            (p[0], p[1], o[1], p[2], o[2], d)
        }
        _ => {
            let (a, b, p) = (shape(ins.inputs[0]), shape(ins.inputs[1]), shape(ins.inputs[2]));
            (a[0], a[1], b[0], p[2], b[2], a[2])
        }
    };
    crate::reference::moe::MoeShape {
        groups,
        seq,
        experts,
        k,
        capacity,
        width,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::copy::strided;

    fn copy(src: &[f32], n: usize, c: &Strided) -> Vec<f32> {
        let mut dst = vec![0.0; n];
        strided(src, &mut dst, c);
        dst
    }

    // Attention's heads: (B, T, 3, H, Dh) -> (3, B, H, T, Dh), split along 0, and back.
    const SHAPE: [usize; 5] = [2, 3, 3, 2, 4];
    const PERM: [usize; 5] = [2, 0, 3, 1, 4];

    #[test]
    fn a_transposed_slice_reads_what_a_transpose_then_a_slice_read() {
        let x: Vec<f32> = (0..numel(&SHAPE)).map(|i| i as f32).collect();
        let t_shape: Vec<usize> = PERM.iter().map(|&p| SHAPE[p]).collect();
        let t = copy(&x, x.len(), &plan_transpose(&SHAPE, &PERM));
        for (start, len) in [(0, 1), (1, 1), (2, 1), (1, 2)] {
            let n = x.len() / 3 * len;
            let want = copy(&t, n, &plan_slice(&t_shape, 0, start, len, false));
            assert_eq!(copy(&x, n, &plan_transpose_slice(&SHAPE, &PERM, 0, start, len)), want);
        }
    }

    #[test]
    fn parts_written_into_the_transpose_equal_a_concat_then_a_transpose() {
        let whole: Vec<usize> = PERM.iter().map(|&p| SHAPE[p]).collect(); // (3, B, H, T, Dh)
        let inv = [1, 3, 0, 2, 4]; // back to (B, T, 3, H, Dh)
        let out_shape: Vec<usize> = inv.iter().map(|&p| whole[p]).collect();
        let n = numel(&whole);
        let parts: Vec<Vec<f32>> = (0..3)
            .map(|k| (0..n / 3).map(|i| (k * 1000 + i) as f32).collect())
            .collect();
        let mut cat = vec![0.0; n];
        for (k, p) in parts.iter().enumerate() {
            strided(p, &mut cat, &plan_slice(&whole, 0, k, 1, true));
        }
        let want = copy(&cat, n, &plan_transpose(&whole, &inv));
        let mut got = vec![0.0; n];
        let mut part = whole.clone();
        part[0] = 1;
        for (k, p) in parts.iter().enumerate() {
            strided(p, &mut got, &plan_into_transposed(&part, &out_shape, &inv, 0, k));
        }
        assert_eq!(got, want);
    }
}
