//! Strided views: the transposes around fused attention, folded into its kernels. The heads'
//! transpose and split in front of the op (q, k, v out of the qkv projection's (B, T, 3, H, Dh)
//! rows), the cotangent's in front of its backward, the output's back to (B, T, H, Dh) rows, and
//! the gradients' concat and transpose back to (B, T, 3, H, Dh) columns launch nothing: their
//! outputs share their operand's slot, as a reshape's do (the gradients share the columns' slot
//! from the backward on), and the fused kernels read and write the rows where they lie
//! ([`Layouts`]). A transpose folds only where every reader of what it makes (or, behind the op,
//! every writer of what it takes) is an operand the fused kernels take in any layout, through
//! reshapes; everything else still reads and writes row-major arrays.
use super::fuse::Fusion;
use crate::ir::{strides, Instr, Op, Program, ValueId};
use crate::kernels::attention::{Layout, Layouts};

/// A value's elements in its slot's buffer, per device block: element (i0, i1, ...) at
/// `offset + sum(i_k * strides[k])`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Strided {
    pub strides: Vec<usize>,
    pub offset: usize,
}

/// The folded transposes of a program and the values they leave strided.
pub(super) struct Views {
    /// Per instruction: whether it launches nothing: a folded transpose, and both of a folded
    /// fused pair (transpose-split, concat-transpose). The outputs of a folded transpose, or of
    /// a folded pair's second, share the operand's slot.
    pub quiet: Vec<bool>,
    /// Per value: where it is not row-major in its slot, its layout there.
    pub strided: Vec<Option<Strided>>,
    /// Per instruction: an attention backward whose gradients are written straight into the
    /// columns a folded concat and transpose would make: that value, whose slot they share.
    pub joint: Vec<Option<ValueId>>,
}

impl Views {
    /// Nothing folded (what the plan gives where no attention runs fused kernels).
    #[cfg(test)]
    pub fn none(program: &Program) -> Views {
        Views {
            quiet: vec![false; program.instrs.len()],
            strided: vec![None; program.values.len()],
            joint: vec![None; program.instrs.len()],
        }
    }

    /// The layouts of attention instruction `ins`'s q, k, v, o and do (the backward's operands
    /// 0, 1, 2, 3, 5; the forward's o is its output 0) and of the backward's dq, dk, dv, or
    /// `None` where all are row-major.
    pub fn layouts(&self, program: &Program, ins: &Instr) -> Option<Layouts> {
        let (o, d_o, grads) = match ins.op {
            Op::Attention { .. } => (ins.outputs[0], None, [None; 3]),
            Op::AttentionGrad { .. } => (
                ins.inputs[3],
                Some(ins.inputs[5]),
                [0, 1, 2].map(|k| Some(ins.outputs[k])),
            ),
            _ => return None,
        };
        let (q, k, v) = (ins.inputs[0], ins.inputs[1], ins.inputs[2]);
        let all = [Some(q), Some(k), Some(v), Some(o), d_o, grads[0], grads[1], grads[2]];
        if all.iter().flatten().all(|x| self.strided[x.index()].is_none()) {
            return None;
        }
        // The forward has no do or gradients: o's layout stands in, unused.
        let layout = |x: Option<ValueId>| {
            let x = x.unwrap_or(o);
            let shape = program.shape(x);
            let st = self.strided[x.index()].clone().unwrap_or_else(|| Strided {
                strides: strides(shape),
                offset: 0,
            });
            Layout {
                batch: st.strides[0],
                head: st.strides[1],
                row: st.strides[2],
                offset: st.offset,
            }
        };
        Some(Layouts {
            item_heads: program.shape(q)[1],
            q: layout(Some(q)),
            k: layout(Some(k)),
            v: layout(Some(v)),
            o: layout(Some(o)),
            d_o: layout(d_o),
            dq: layout(grads[0]),
            dk: layout(grads[1]),
            dv: layout(grads[2]),
        })
    }
}

/// The strides of a transpose's operand where its buffer holds the transpose's output (of
/// shape `out`) row-major: operand axis `perm[a]` steps as output axis `a` does.
fn under(perm: &[usize], out: &[usize]) -> Vec<usize> {
    let rows = strides(out);
    let mut st = vec![0; perm.len()];
    for (a, &p) in perm.iter().enumerate() {
        st[p] = rows[a];
    }
    st
}

/// `st` of a (B, H, T, Dh) operand whose slot holds `numel` elements per device, with a batch of
/// one item stepping by the device block (a reshape that added the unit axis gave it 0): a
/// head index runs over every device's batch items.
fn per_device(shape: &[usize], mut st: Strided, numel: usize) -> Strided {
    if shape.len() == 4 && shape[0] == 1 {
        st.strides[0] = numel;
    }
    st
}

/// Strides of `to` for a reshape of an array with `from`'s shape and strides that only drops or
/// inserts axes of extent 1 (an inserted one gets stride 0); `None` for any other reshape.
fn squeezed(from: &[usize], strides: &[usize], to: &[usize]) -> Option<Vec<usize>> {
    let kept: Vec<usize> = (0..from.len()).filter(|&a| from[a] != 1).collect();
    let mut out = Vec::with_capacity(to.len());
    let mut next = kept.iter();
    for &extent in to {
        if extent == 1 {
            out.push(0);
            continue;
        }
        let &a = next.next()?;
        if from[a] != extent {
            return None;
        }
        out.push(strides[a]);
    }
    next.next().is_none().then_some(out)
}

/// Which attention instructions run fused kernels that take their operands in any layout
/// (`strided_ok`), and so which transposes fold.
pub(super) fn plan(program: &Program, fusion: &[Option<Fusion>], strided_ok: &dyn Fn(usize) -> bool) -> Views {
    let mut readers: Vec<Vec<(usize, usize)>> = vec![vec![]; program.values.len()];
    for (i, ins) in program.instrs.iter().enumerate() {
        for (k, v) in ins.inputs.iter().enumerate() {
            readers[v.index()].push((i, k));
        }
    }
    let producer = program.producers();
    let returned = |v: ValueId| program.outputs.contains(&v);
    let mut views = Views {
        quiet: vec![false; program.instrs.len()],
        strided: vec![None; program.values.len()],
        joint: vec![None; program.instrs.len()],
    };
    let cx = Cx {
        program,
        readers: &readers,
        strided_ok,
    };
    for (i, ins) in program.instrs.iter().enumerate() {
        if fusion[i] == Some(Fusion::ConcatTransposed) {
            if let Some((j, grads)) = cx.gradients_in_columns(i, &producer) {
                views.quiet[i] = true;
                views.quiet[i + 1] = true;
                views.joint[j] = Some(program.instrs[i + 1].outputs[0]);
                for (g, st) in grads {
                    views.strided[g.index()] = Some(st);
                }
            }
            continue;
        }
        let Op::Transpose { perm } = &ins.op else { continue };
        if i > 0 && fusion[i - 1].is_some() {
            continue;
        }
        let x = ins.inputs[0];
        let shape = program.shape(x);
        // In front of the op: the transpose (and split) of a row-major array, read only in a layout.
        if views.strided[x.index()].is_none() {
            let rows = strides(shape);
            let whole = Strided {
                strides: perm.iter().map(|&p| rows[p]).collect(),
                offset: 0,
            };
            let parts: Vec<(ValueId, Strided)> = match fusion[i] {
                None => vec![(ins.outputs[0], whole)],
                Some(Fusion::TransposeSplit) => {
                    let split = &program.instrs[i + 1];
                    let Op::Split { axis, sizes } = &split.op else { continue };
                    let mut start = 0;
                    let mut parts = vec![];
                    for (o, &len) in split.outputs.iter().zip(sizes) {
                        let offset = start * whole.strides[*axis];
                        parts.push((
                            *o,
                            Strided {
                                offset,
                                ..whole.clone()
                            },
                        ));
                        start += len;
                    }
                    parts
                }
                Some(_) => continue,
            };
            let mut found = vec![];
            let numel = program.info(x).numel();
            if parts
                .into_iter()
                .all(|(v, st)| cx.read_in_layout(v, st, numel, &mut found))
            {
                views.quiet[i] = true;
                views.quiet[i + usize::from(fusion[i].is_some())] = true;
                for (v, st) in found {
                    views.strided[v.index()] = Some(st);
                }
                continue;
            }
        }
        // Behind the op: its output o, transposed to rows; o is then written in the rows' layout.
        if fusion[i].is_none() && !returned(x) {
            let Some(a) = producer[x.index()] else { continue };
            let writer = &program.instrs[a];
            let st = Strided {
                strides: under(perm, program.shape(ins.outputs[0])),
                offset: 0,
            };
            let others_ok = readers[x.index()].iter().all(|&(j, k)| {
                (j == i && k == 0)
                    || (matches!(program.instrs[j].op, Op::AttentionGrad { .. }) && k == 3 && strided_ok(j))
            });
            let once = readers[x.index()].iter().filter(|&&(j, _)| j == i).count() == 1;
            let writes_o = matches!(writer.op, Op::Attention { .. }) && writer.outputs[0] == x && strided_ok(a);
            if writes_o && others_ok && once && cx.layout_ok(x, &st, program.info(x).numel()) {
                views.quiet[i] = true;
                views.strided[x.index()] = Some(st);
            }
        }
    }
    views
}

struct Cx<'a> {
    program: &'a Program,
    readers: &'a [Vec<(usize, usize)>],
    strided_ok: &'a dyn Fn(usize) -> bool,
}

impl Cx<'_> {
    /// Whether every reader of `v` (laid out as `st` in a slot whose device blocks hold `numel`
    /// elements), through reshapes, reads it as a fused attention operand; collects the layout
    /// of `v` and of each reshape of it in `found`.
    fn read_in_layout(&self, v: ValueId, st: Strided, numel: usize, found: &mut Vec<(ValueId, Strided)>) -> bool {
        let program = self.program;
        if program.outputs.contains(&v) {
            return false;
        }
        let shape = program.shape(v);
        let st = per_device(shape, st, numel);
        let ok = self.readers[v.index()].iter().all(|&(j, k)| {
            let reader = &program.instrs[j];
            match reader.op {
                Op::Reshape { .. } | Op::Pcast { .. } | Op::Reshard { .. } => {
                    let out = reader.outputs[0];
                    let Some(strides) = squeezed(shape, &st.strides, program.shape(out)) else {
                        return false;
                    };
                    let next = Strided {
                        strides,
                        offset: st.offset,
                    };
                    self.read_in_layout(out, next, numel, found)
                }
                Op::Attention { .. } => k < 3 && (self.strided_ok)(j) && self.layout_ok(v, &st, numel),
                Op::AttentionGrad { .. } => {
                    matches!(k, 0..=3 | 5) && (self.strided_ok)(j) && self.layout_ok(v, &st, numel)
                }
                _ => false,
            }
        });
        found.push((v, st));
        ok
    }

    /// For the concat at `i` and the transpose after it: where every part is a reshape of one
    /// output of a single fused attention backward, read by nothing else, that instruction and
    /// the layout each of its gradients has inside the transposed columns.
    fn gradients_in_columns(&self, i: usize, producer: &[Option<usize>]) -> Option<(usize, Vec<(ValueId, Strided)>)> {
        let program = self.program;
        let (concat, transpose) = (&program.instrs[i], &program.instrs[i + 1]);
        let (Op::Concat { axis }, Op::Transpose { perm }) = (&concat.op, &transpose.op) else {
            return None;
        };
        let y = transpose.outputs[0];
        let strides = under(perm, program.shape(y));
        let numel = program.info(y).numel();
        let only_read_by = |v: ValueId, j: usize| {
            !program.outputs.contains(&v) && self.readers[v.index()].iter().all(|&(r, _)| r == j)
        };
        let mut backward = None;
        let mut grads = vec![];
        let mut start = 0;
        for &part in &concat.inputs {
            let r = producer[part.index()]?;
            let Op::Reshape { .. } = program.instrs[r].op else {
                return None;
            };
            let g = program.instrs[r].inputs[0];
            let j = producer[g.index()]?;
            if !matches!(program.instrs[j].op, Op::AttentionGrad { .. }) || *backward.get_or_insert(j) != j {
                return None;
            }
            let offset = start * strides[*axis];
            start += program.shape(part)[*axis];
            let st = Strided {
                strides: squeezed(program.shape(part), &strides, program.shape(g))?,
                offset,
            };
            let st = per_device(program.shape(g), st, numel);
            if !only_read_by(part, i) || !only_read_by(g, r) || !self.layout_ok(g, &st, numel) {
                return None;
            }
            grads.push((g, st));
        }
        let j = backward?;
        let outputs = &program.instrs[j].outputs;
        let all = grads.len() == outputs.len() && outputs.iter().all(|o| grads.iter().any(|(g, _)| g == o));
        (all && (self.strided_ok)(j)).then_some((j, grads))
    }

    /// Whether a (B, H, T, Dh) operand laid out as `st` is one the kernels address: Dh
    /// contiguous, and device blocks of `numel` elements B batch strides apart (a head index
    /// runs over every device's batch items).
    fn layout_ok(&self, v: ValueId, st: &Strided, numel: usize) -> bool {
        let shape = self.program.shape(v);
        shape.len() == 4 && st.strides[3] == 1 && shape[0] * st.strides[0] == numel
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::gpu::fuse;
    use crate::ir::RngLayout;
    use crate::model::{train_step_program, Attention, GptConfig, Optimizer};

    #[test]
    fn a_reshape_that_drops_or_adds_unit_axes_keeps_the_strides_and_no_other_does() {
        assert_eq!(squeezed(&[1, 2, 3], &[9, 5, 1], &[2, 3]), Some(vec![5, 1]));
        assert_eq!(squeezed(&[2, 3], &[5, 1], &[2, 1, 3]), Some(vec![5, 0, 1]));
        assert_eq!(squeezed(&[2, 3], &[5, 1], &[6]), None);
        assert_eq!(squeezed(&[2, 3], &[5, 1], &[3, 2]), None);
        assert_eq!(under(&[0, 2, 1, 3], &[2, 5, 3, 4]), vec![60, 4, 12, 1]);
    }

    #[test]
    fn the_transposes_around_fused_attention_fold_and_the_unfused_models_do_not() {
        for attention in Attention::ALL {
            let cfg = GptConfig {
                layers: 2,
                attention,
                ..GptConfig::tiny()
            };
            let program = train_step_program(&cfg, Optimizer::AdamW { lr: 1e-3 }, RngLayout::Partitionable)
                .unwrap()
                .program;
            let fusion = fuse::plan(&program);
            let v = plan(&program, &fusion, &|_| true);
            // A folded transpose, or a folded pair (counted once, at its first instruction).
            let folded = (0..program.instrs.len())
                .filter(|&i| v.quiet[i] && !(i > 0 && v.quiet[i - 1] && fusion[i - 1].is_some()))
                .count();
            // Per block: q, k and v's transpose (with the split), o's, do's, and the
            // gradients' concat (with the transpose back to columns).
            let want = if attention == Attention::Fused {
                4 * cfg.layers
            } else {
                0
            };
            assert_eq!(folded, want, "{attention:?}");
            // Only the transposes and their splits and concats launch nothing: the op after
            // each runs.
            for (i, ins) in program.instrs.iter().enumerate() {
                let moves = matches!(ins.op, Op::Transpose { .. } | Op::Split { .. } | Op::Concat { .. });
                assert!(!v.quiet[i] || moves, "{} at {i} is quiet", ins.op.name());
            }
            let quiet = v.quiet.iter().filter(|&&q| q).count();
            assert_eq!(quiet, want + want / 2, "{attention:?}: two pairs of two a block");
            // Each backward writes its gradients into the columns the concat would make.
            assert_eq!(v.joint.iter().flatten().count(), want / 4, "{attention:?}");
            // Without fused kernels nothing folds.
            let none = plan(&program, &fusion, &|_| false);
            assert!(!none.quiet.contains(&true));
            assert_eq!(none.strided, Views::none(&program).strided);
            // Every attention reads q, k and v at 0, C and 2C of the qkv rows, 3C apart, and
            // every backward writes dq, dk and dv there in the gradient's columns.
            for ins in &program.instrs {
                let Some(l) = v.layouts(&program, ins) else {
                    continue;
                };
                let (t, c) = (cfg.seq, cfg.d_model);
                let dh = c / cfg.heads;
                let columns = |offset| Layout {
                    batch: 3 * t * c,
                    head: dh,
                    row: 3 * c,
                    offset,
                };
                assert_eq!(l.item_heads, cfg.heads);
                assert_eq!([l.q, l.k, l.v], [0, c, 2 * c].map(columns));
                if let Op::AttentionGrad { .. } = ins.op {
                    assert_eq!([l.dq, l.dk, l.dv], [0, c, 2 * c].map(columns));
                }
                let rows = Layout {
                    batch: t * c,
                    head: dh,
                    row: c,
                    offset: 0,
                };
                assert_eq!((l.o, l.d_o), (rows, rows));
            }
        }
    }
}
