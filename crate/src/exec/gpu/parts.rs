//! Parts: values that live as consecutive blocks of one buffer, so that a split into them, or a
//! concat of them, is one strided copy over a leading part axis instead of one copy per part
//! (attention's q, k, v heads, and its dq, dk, dv gradients on their way back to columns), and a
//! kernel that reads or writes them all binds them as one range.
//!
//! Each part keeps its own `[device, local...]` block, as any value; the parts start `stride`
//! elements apart (a part's size, rounded up to a storage binding's offset alignment), so each
//! is also a binding of its own.
use super::fuse::Fusion;
use super::packing::root;
use crate::exec::lowering::{on_devices, plan_into_transposed, plan_slice, plan_transpose_slice};
use crate::ir::{Op, Program, ValueId};
use crate::kernels::copy::{Strided, MAX_RANK};

/// Elements a part's start is aligned to: WebGPU's default minStorageBufferOffsetAlignment
/// (256 bytes), so every part binds alone.
const ALIGN: usize = 64;

/// Values stored as consecutive parts of one buffer.
pub(super) struct PartGroup {
    /// The parts, in order (values that own their buffer: no reshape).
    pub values: Vec<ValueId>,
    /// Every device's elements of one part.
    pub len: usize,
    /// Elements from one part's start to the next's.
    pub stride: usize,
}

impl PartGroup {
    /// Elements from the first part's start to the last's end.
    pub fn span(&self) -> usize {
        (self.values.len() - 1) * self.stride + self.len
    }
}

/// The groups of a program.
pub(super) struct Parts {
    pub groups: Vec<PartGroup>,
    /// Per value: its (group, part index).
    pub of: Vec<Option<(usize, usize)>>,
    /// Per value: the value whose buffer it is (reshape and pcast alias their operand).
    roots: Vec<ValueId>,
}

impl Parts {
    /// The group whose parts are exactly the buffers of `values`, in order.
    pub fn group_of(&self, values: &[ValueId]) -> Option<usize> {
        let (g, _) = self.of[self.roots[values.first()?.index()].index()]?;
        let parts = &self.groups[g].values;
        let same = parts.len() == values.len() && values.iter().zip(parts).all(|(v, p)| self.roots[v.index()] == *p);
        same.then_some(g)
    }
}

/// Plans the groups: the outputs of a split into equal parts, and the outputs of an instruction
/// that a later concat joins whole and in order (an instruction's outputs are allocated together,
/// so they can sit side by side), where the copy over the part axis fits the copy kernel's rank.
/// A value in an optimizer arena (`placed`) or returned by the program keeps its own buffer, and
/// a split or concat folded into attention (views.rs) makes no parts: its values share one
/// buffer already.
pub(super) fn plan(
    program: &Program,
    fusion: &[Option<Fusion>],
    quiet: &[bool],
    placed: &[Option<(usize, usize, usize)>],
) -> Parts {
    let producer = program.producers();
    let roots: Vec<ValueId> = (0..program.values.len())
        .map(|v| root(program, &producer, ValueId(v as u32)))
        .collect();
    let mut parts = Parts {
        groups: vec![],
        of: vec![None; program.values.len()],
        roots,
    };
    let devices = program.devices();
    let free = |parts: &Parts, v: ValueId| {
        placed[v.index()].is_none()
            && parts.of[v.index()].is_none()
            && !program.outputs.iter().any(|o| parts.roots[o.index()] == v)
    };
    for (i, ins) in program.instrs.iter().enumerate() {
        let values: Vec<ValueId> = match ins.op {
            Op::Split { .. } | Op::Concat { .. } if quiet[i] => continue,
            Op::Split { .. } => ins.outputs.clone(),
            Op::Concat { .. } => {
                let roots: Vec<ValueId> = ins.inputs.iter().map(|v| parts.roots[v.index()]).collect();
                match producer[roots[0].index()] {
                    Some(j) if program.instrs[j].outputs == roots => roots,
                    _ => continue,
                }
            }
            _ => continue,
        };
        let len = devices * program.info(values[0]).numel();
        let equal = values.iter().all(|v| devices * program.info(*v).numel() == len);
        if values.len() < 2 || len == 0 || !equal || !values.iter().all(|v| free(&parts, *v)) {
            continue;
        }
        let stride = len.next_multiple_of(ALIGN);
        if one_copy(&part_copies(program, fusion, i, stride)).is_none() {
            continue;
        }
        let g = parts.groups.len();
        for (k, v) in values.iter().enumerate() {
            parts.of[v.index()] = Some((g, k));
        }
        parts.groups.push(PartGroup { values, len, stride });
    }
    parts
}

/// The copy of each part of split or concat `i` (a transpose before the split, or after the
/// concat, fused in as fuse.rs plans it) on every device, with the parts `stride` apart on their
/// side: part k's block starts at k * stride.
pub(super) fn part_copies(program: &Program, fusion: &[Option<Fusion>], i: usize, stride: usize) -> Vec<Strided> {
    let ins = &program.instrs[i];
    let devices = program.devices();
    let numel = |v: ValueId| program.info(v).numel();
    match &ins.op {
        Op::Split { axis, sizes } => {
            let transposed = i > 0 && fusion[i - 1] == Some(Fusion::TransposeSplit);
            let first = &program.instrs[i - usize::from(transposed)];
            let whole = program.shape(first.inputs[0]);
            let mut start = 0;
            let mut copies = vec![];
            for (k, &len) in sizes.iter().enumerate() {
                let c = match (&first.op, transposed) {
                    (Op::Transpose { perm }, true) => plan_transpose_slice(whole, perm, *axis, start, len),
                    _ => plan_slice(whole, *axis, start, len, false),
                };
                let mut c = on_devices(&c, devices, (numel(first.inputs[0]), numel(ins.outputs[k])));
                c.dst_offset += k * stride;
                copies.push(c);
                start += len;
            }
            copies
        }
        Op::Concat { axis } => {
            let transposed = fusion[i] == Some(Fusion::ConcatTransposed);
            let last = &program.instrs[i + usize::from(transposed)];
            let whole = program.shape(last.outputs[0]);
            let mut start = 0;
            let mut copies = vec![];
            for (k, &part) in ins.inputs.iter().enumerate() {
                let shape = program.shape(part);
                let c = match (&last.op, transposed) {
                    (Op::Transpose { perm }, true) => plan_into_transposed(shape, whole, perm, *axis, start),
                    _ => plan_slice(program.shape(ins.outputs[0]), *axis, start, shape[*axis], true),
                };
                let mut c = on_devices(&c, devices, (numel(part), numel(last.outputs[0])));
                c.src_offset += k * stride;
                copies.push(c);
                start += shape[*axis];
            }
            copies
        }
        op => unreachable!("{} has no parts", op.name()),
    }
}

/// The part copies as one, over a leading part axis (each side steps by the offsets' difference),
/// with unit axes dropped; None unless the parts differ in offsets alone, by equal steps, and the
/// copy fits the copy kernel's rank.
pub(super) fn one_copy(copies: &[Strided]) -> Option<Strided> {
    let first = copies.first()?;
    let step = |f: fn(&Strided) -> usize| copies.get(1).map_or(Some(0), |c| f(c).checked_sub(f(first)));
    let (src_step, dst_step) = (step(|c| c.src_offset)?, step(|c| c.dst_offset)?);
    let regular = copies.iter().enumerate().all(|(k, c)| {
        c.shape == first.shape
            && c.src_strides == first.src_strides
            && c.dst_strides == first.dst_strides
            && c.src_offset == first.src_offset + k * src_step
            && c.dst_offset == first.dst_offset + k * dst_step
    });
    let axes = std::iter::once((copies.len(), src_step, dst_step))
        .chain((0..first.shape.len()).map(|a| (first.shape[a], first.src_strides[a], first.dst_strides[a])))
        .filter(|&(extent, _, _)| extent != 1);
    let (mut shape, mut src_strides, mut dst_strides) = (vec![], vec![], vec![]);
    for (e, s, d) in axes {
        shape.push(e);
        src_strides.push(s);
        dst_strides.push(d);
    }
    (regular && shape.len() <= MAX_RANK).then_some(Strided {
        shape,
        src_offset: first.src_offset,
        src_strides,
        dst_offset: first.dst_offset,
        dst_strides,
        accumulate: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::gpu::{fuse, packing};
    use crate::ir::RngLayout;
    use crate::model::{train_step_program, GptConfig, Optimizer};
    use crate::reference::copy::strided;

    #[test]
    fn attentions_heads_and_their_gradients_are_parts_of_one_buffer_each() {
        let cfg = GptConfig {
            layers: 2,
            ..GptConfig::tiny()
        };
        let program = train_step_program(&cfg, Optimizer::AdamW { lr: 1e-3 }, RngLayout::Partitionable)
            .unwrap()
            .program;
        let fusion = fuse::plan(&program);
        let quiet = vec![false; program.instrs.len()];
        let p = plan(
            &program,
            &fusion,
            &quiet,
            &packing::plan(&program, &fusion, usize::MAX).placed,
        );
        // Per block: q, k, v from the split, and dq, dk, dv for the concat.
        assert_eq!(p.groups.len(), 4);
        for (i, ins) in program.instrs.iter().enumerate() {
            match ins.op {
                Op::Split { .. } => assert!(p.group_of(&ins.outputs).is_some(), "split {i}"),
                Op::Concat { .. } => assert!(p.group_of(&ins.inputs).is_some(), "concat {i}"),
                Op::AttentionGrad { .. } => {
                    assert!(p.group_of(&ins.inputs[..3]).is_some() && p.group_of(&ins.outputs).is_some())
                }
                _ => {}
            }
        }
    }

    #[test]
    fn the_parts_copy_moves_what_the_copies_of_its_parts_move() {
        // A transposed split of (B, T, 3, H, Dh) into three parts on two devices, and back.
        let (whole, perm) = ([2, 3, 3, 2, 4], [2, 0, 3, 1, 4]);
        let n: usize = whole.iter().product();
        let stride = (2 * n / 3).next_multiple_of(ALIGN);
        let split: Vec<Strided> = (0..3)
            .map(|k| {
                let mut c = on_devices(&plan_transpose_slice(&whole, &perm, 0, k, 1), 2, (n, n / 3));
                c.dst_offset += k * stride;
                c
            })
            .collect();
        let src: Vec<f32> = (0..2 * n).map(|i| i as f32).collect();
        let (mut each, mut one) = (vec![-1.0; 3 * stride], vec![-1.0; 3 * stride]);
        for c in &split {
            strided(&src, &mut each, c);
        }
        strided(&src, &mut one, &one_copy(&split).unwrap());
        assert_eq!(each, one);
        // Parts of unequal shape are not one copy.
        let mut uneven = split.clone();
        uneven[2].shape[2] = 1;
        assert!(one_copy(&uneven).is_none());
    }
}
