use super::lowering::{
    attention_blocks, moe_shape, plan_broadcast, plan_dot, plan_reduce, plan_slice, plan_transpose, seq_runs,
};
use super::{ExecError, Tensor};
use crate::ir::{numel, DType, Instr, Op, Program, SeqBlock};
use crate::reference as r;
use crate::reference::collectives::CollectiveArgs;
use crate::reference::copy::Strided;
use crate::reference::optimizer::AdamWHyper;
use crate::rng::{random_bits, random_bits_block, Block, Key};
use crate::sharding::{Mesh, NamedSharding};

/// Runs any program on the CPU with the reference kernels: the oracle of every GPU test,
/// and the executor where no GPU adapter exists.
pub struct ReferenceExecutor;

/// The rows (dimension `shape.len() - 2`) of `bits` in zig-zag order of `parts` blocks.
fn zigzag_rows(bits: &[u32], shape: &[usize], parts: usize) -> Vec<u32> {
    let n = shape.len();
    let (rows, inner) = (shape[n - 2], shape[n - 1]);
    let chunk = rows / (2 * parts);
    let order = crate::ir::CpOrder::Zigzag.chunk_order(parts);
    bits.chunks(rows * inner)
        .flat_map(|m| {
            order
                .iter()
                .flat_map(move |&c| &m[c * chunk * inner..(c + 1) * chunk * inner])
        })
        .copied()
        .collect()
}

fn copy<T: Copy + std::ops::AddAssign>(src: &[T], plan: &Strided, dst: &mut [T]) {
    r::copy::strided(src, dst, plan);
}

fn transpose(x: &[f32], shape: &[usize], perm: &[usize]) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    copy(x, &plan_transpose(shape, perm), &mut out);
    out
}

impl ReferenceExecutor {
    /// Runs `prog` on `inputs` (in `prog.inputs` order) and returns its outputs. A program
    /// with a mesh takes and returns every value as its devices' local blocks one after
    /// another (`[device, local...]`), as the GPU stores them.
    /// `step` is the 1-based optimizer step count (AdamW's bias correction).
    pub fn run(prog: &Program, inputs: &[Tensor], step: u64) -> Result<Vec<Tensor>, ExecError> {
        if inputs.len() != prog.inputs.len() {
            return Err(ExecError::Input(format!(
                "the program takes {} inputs, got {}",
                prog.inputs.len(),
                inputs.len()
            )));
        }
        let devices = prog.devices();
        let mut vals: Vec<Option<Tensor>> = vec![None; prog.values.len()];
        for ((v, _), t) in prog.inputs.iter().zip(inputs) {
            let info = prog.info(*v);
            if t.len() != devices * info.numel() {
                return Err(ExecError::Input(format!(
                    "input {} needs {} elements ({} per device), got {}",
                    info.name.clone().unwrap_or_default(),
                    devices * info.numel(),
                    info.numel(),
                    t.len()
                )));
            }
            vals[v.index()] = Some(t.clone());
        }
        let last_use = prog.last_uses();
        for (i, ins) in prog.instrs.iter().enumerate() {
            let outs = match prog.mesh.as_ref().filter(|_| is_collective(&ins.op)) {
                // Every device takes part; those outside the instruction's stages keep zeros.
                Some(mesh) => (0..devices)
                    .filter(|&d| !prog.runs_on(i, d))
                    .fold(collective(prog, ins, mesh, &vals)?, |outs, d| {
                        outs.into_iter().map(|t| t.zero_block(d, devices)).collect()
                    }),
                None if devices == 1 => {
                    let ins_vals: Vec<&Tensor> = ins
                        .inputs
                        .iter()
                        .map(|v| vals[v.index()].as_ref().expect("defined"))
                        .collect();
                    eval_local(prog, ins, &ins_vals, step, 0)?
                }
                None => {
                    // Every device runs the op on its own block of each operand.
                    let mut per_device: Vec<Vec<Tensor>> = vec![];
                    for d in 0..devices {
                        // A stage's own work: the other stages skip it and hold zeros.
                        if !prog.runs_on(i, d) {
                            per_device.push(ins.outputs.iter().map(|o| Tensor::zeros(prog.info(*o))).collect());
                            continue;
                        }
                        let blocks: Vec<Tensor> = ins
                            .inputs
                            .iter()
                            .map(|v| vals[v.index()].as_ref().expect("defined").block(d, devices))
                            .collect();
                        per_device.push(eval_local(prog, ins, &blocks.iter().collect::<Vec<_>>(), step, d)?);
                    }
                    (0..ins.outputs.len())
                        .map(|k| Tensor::concat(per_device.iter().map(|outs| &outs[k])))
                        .collect()
                }
            };
            for (o, t) in ins.outputs.iter().zip(outs) {
                debug_assert_eq!(
                    t.len(),
                    devices * prog.info(*o).numel(),
                    "{} output size",
                    ins.op.name()
                );
                debug_assert_eq!(matches!(t, Tensor::U32(_)), prog.info(*o).dtype == DType::U32);
                vals[o.index()] = Some(t);
            }
            // Free what no later instruction reads, so peak memory stays that of the program.
            for v in &ins.inputs {
                if last_use[v.index()] == Some(i) {
                    vals[v.index()] = None;
                }
            }
        }
        Ok(prog
            .outputs
            .iter()
            .map(|v| vals[v.index()].clone().expect("output defined"))
            .collect())
    }
}

fn strs(axes: &[String]) -> Vec<&str> {
    axes.iter().map(String::as_str).collect()
}

fn is_collective(op: &Op) -> bool {
    matches!(
        op,
        Op::Psum { .. }
            | Op::AllGather { .. }
            | Op::PsumScatter { .. }
            | Op::Ppermute { .. }
            | Op::AllToAll { .. }
            | Op::FoldInAxisIndex { .. }
            | Op::ShardSlice { .. }
            | Op::RandomBitsBlock { .. }
    )
}

/// Chunk `chunk` of `parts` equal chunks of dimension `dim` of a row-major array (any dtype).
fn slice_chunk<T: Copy>(x: &[T], shape: &[usize], dim: usize, parts: usize, chunk: usize) -> Vec<T> {
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let (n, len) = (shape[dim], shape[dim] / parts);
    let mut out = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        let start = (o * n + chunk * len) * inner;
        out.extend_from_slice(&x[start..start + len * inner]);
    }
    out
}

/// A data-moving collective (no arithmetic) on either dtype, each moved as itself: the twins are
/// generic over the element type.
fn move_data<E>(
    x: &Tensor,
    f32s: impl FnOnce(&[f32]) -> Result<Vec<f32>, E>,
    u32s: impl FnOnce(&[u32]) -> Result<Vec<u32>, E>,
) -> Result<Tensor, E> {
    Ok(match x {
        Tensor::F32(v) => Tensor::F32(f32s(v)?),
        Tensor::U32(v) => Tensor::U32(u32s(v)?),
    })
}

/// A collective over all devices' blocks at once, by the reference twins.
fn collective(prog: &Program, ins: &Instr, mesh: &Mesh, vals: &[Option<Tensor>]) -> Result<Vec<Tensor>, ExecError> {
    let x = vals[ins.inputs[0].index()].as_ref().expect("defined");
    let local = prog.shape(ins.inputs[0]);
    let err = |e: crate::sharding::ShardingError| ExecError::Input(e.to_string());
    let out = match &ins.op {
        // A combined psum: each operand reduced alone (one collective on real hardware).
        Op::Psum { axes, .. } => {
            let axes = strs(axes);
            return ins
                .inputs
                .iter()
                .map(|v| {
                    let x = vals[v.index()].as_ref().expect("defined");
                    let c = CollectiveArgs {
                        mesh,
                        axes: &axes,
                        local_shape: prog.shape(*v),
                    };
                    Ok(Tensor::F32(r::collectives::psum(&c, x.f32()).map_err(err)?))
                })
                .collect();
        }
        Op::AllGather { axes, axis, tiled, .. } => {
            let axes = strs(axes);
            let c = CollectiveArgs {
                mesh,
                axes: &axes,
                local_shape: local,
            };
            move_data(
                x,
                |v| r::collectives::all_gather(&c, v, *axis, *tiled),
                |v| r::collectives::all_gather(&c, v, *axis, *tiled),
            )
            .map_err(err)?
        }
        Op::PsumScatter {
            axes,
            scatter_dimension,
            tiled,
            ..
        } => {
            let axes = strs(axes);
            let c = CollectiveArgs {
                mesh,
                axes: &axes,
                local_shape: local,
            };
            Tensor::F32(r::collectives::psum_scatter(&c, x.f32(), *scatter_dimension, *tiled).map_err(err)?)
        }
        Op::Ppermute { axis, perm } => {
            let axes = [axis.as_str()];
            let c = CollectiveArgs {
                mesh,
                axes: &axes,
                local_shape: local,
            };
            move_data(
                x,
                |v| r::collectives::ppermute(&c, v, perm),
                |v| r::collectives::ppermute(&c, v, perm),
            )
            .map_err(err)?
        }
        Op::AllToAll {
            axes,
            split_axis,
            concat_axis,
            ..
        } => {
            let axes = strs(axes);
            let c = CollectiveArgs {
                mesh,
                axes: &axes,
                local_shape: local,
            };
            move_data(
                x,
                |v| r::collectives::all_to_all(&c, v, *split_axis, *concat_axis, true),
                |v| r::collectives::all_to_all(&c, v, *split_axis, *concat_axis, true),
            )
            .map_err(err)?
        }
        Op::FoldInAxisIndex { axes, stride, offset } => {
            let idx = r::collectives::axis_index(mesh, &strs(axes)).map_err(err)?;
            let idx: Vec<u32> = idx
                .iter()
                .map(|&i| i.wrapping_mul(*stride).wrapping_add(*offset))
                .collect();
            let k = x.u32();
            let keys = idx
                .iter()
                .enumerate()
                .flat_map(|(d, &i)| Key([k[2 * d], k[2 * d + 1]]).fold_in(i).0)
                .collect();
            Tensor::U32(keys)
        }
        Op::ShardSlice { dim, axes, parts } => {
            let n = numel(local);
            let mut blocks = vec![];
            for d in 0..mesh.devices() {
                let chunk = mesh.axes_index(d, &strs(axes)).map_err(err)?;
                blocks.push(match x.block(d, mesh.devices()) {
                    Tensor::F32(v) => Tensor::F32(slice_chunk(&v[..n], local, *dim, *parts, chunk)),
                    Tensor::U32(v) => Tensor::U32(slice_chunk(&v[..n], local, *dim, *parts, chunk)),
                });
            }
            Tensor::concat(blocks.iter())
        }
        Op::RandomBitsBlock {
            global,
            spec,
            layout,
            seq,
            shape,
        } => {
            let sharding = NamedSharding::new(mesh.clone(), spec.clone()).map_err(err)?;
            let k = x.u32();
            let mut bits = vec![];
            let rng = |e: crate::rng::RngError| ExecError::Input(e.to_string());
            for d in 0..mesh.devices() {
                let key = Key([k[2 * d], k[2 * d + 1]]);
                let ranges = sharding.device_indices(d, global).map_err(err)?;
                if seq.is_whole() {
                    let block = Block::new(global, &ranges).map_err(rng)?;
                    bits.extend(random_bits_block(key, *layout, &block));
                    continue;
                }
                // Attention's bits at the device's query and key positions.
                let n = global.len();
                let (tq, tk) = (shape[n - 2], shape[n - 1]);
                let b = attention_blocks(seq, tq, tk, Some(mesh), d).map_err(err)?;
                let lead = Block::new(&global[..n - 2], &ranges[..n - 2]).map_err(rng)?;
                let q: Vec<usize> = (0..tq).map(|i| b.q.pos(i)).collect();
                let kv: Vec<usize> = (0..tk).map(|j| b.kv.pos(j)).collect();
                bits.extend(r::random::attention_bits(key, *layout, &lead, global[n - 1], &q, &kv));
            }
            Tensor::U32(bits)
        }
        _ => unreachable!(),
    };
    Ok(vec![out])
}

/// One instruction on device `device`'s operands (local shapes).
fn eval_local(
    prog: &Program,
    ins: &Instr,
    vals: &[&Tensor],
    step: u64,
    device: usize,
) -> Result<Vec<Tensor>, ExecError> {
    let get = |k: usize| vals[k];
    let shape = |k: usize| prog.shape(ins.inputs[k]);
    let f = |k: usize| get(k).f32();
    let out_shape = |k: usize| prog.shape(ins.outputs[k]);
    // An attention's rows on this device: positions in the global sequence.
    let blocks = |seq: &crate::ir::AttnSeq| {
        let (q, k) = (shape(0), shape(1));
        attention_blocks(seq, q[q.len() - 2], k[k.len() - 2], prog.mesh.as_ref(), device)
            .map_err(|e| ExecError::Input(e.to_string()))
    };
    Ok(match &ins.op {
        Op::Reshape { .. } | Op::Pcast { .. } | Op::Reshard { .. } => vec![get(0).clone()],
        Op::Transpose { perm } => vec![Tensor::F32(transpose(f(0), shape(0), perm))],
        Op::BroadcastInDim { shape: to, dims } => {
            let mut out = vec![0.0; numel(to)];
            copy(f(0), &plan_broadcast(shape(0), to, dims), &mut out);
            vec![Tensor::F32(out)]
        }
        // Any dtype: a microbatch of the token batch is a split of u32s.
        Op::Split { axis, sizes } => {
            let mut start = 0;
            sizes
                .iter()
                .map(|&len| {
                    let plan = plan_slice(shape(0), *axis, start, len, false);
                    start += len;
                    match get(0) {
                        Tensor::F32(x) => {
                            let mut out = vec![0.0; numel(&plan.shape)];
                            copy(x, &plan, &mut out);
                            Tensor::F32(out)
                        }
                        Tensor::U32(x) => {
                            let mut out = vec![0u32; numel(&plan.shape)];
                            copy(x, &plan, &mut out);
                            Tensor::U32(out)
                        }
                    }
                })
                .collect()
        }
        // Any dtype: zig-zag's reorder concatenates the tokens' chunks.
        Op::Concat { axis } => {
            let whole = out_shape(0);
            let places = (0..ins.inputs.len()).scan(0, |start, k| {
                let len = shape(k)[*axis];
                *start += len;
                Some((k, plan_slice(whole, *axis, *start - len, len, true)))
            });
            match get(0) {
                Tensor::F32(_) => {
                    let mut out = vec![0.0; numel(whole)];
                    places.for_each(|(k, plan)| copy(f(k), &plan, &mut out));
                    vec![Tensor::F32(out)]
                }
                Tensor::U32(_) => {
                    let mut out = vec![0u32; numel(whole)];
                    places.for_each(|(k, plan)| copy(get(k).u32(), &plan, &mut out));
                    vec![Tensor::U32(out)]
                }
            }
        }
        Op::Add | Op::Sub => {
            let beta = if ins.op == Op::Add { 1.0 } else { -1.0 };
            vec![Tensor::F32(r::elementwise::add(f(0), f(1), 1.0, beta))]
        }
        Op::Mul => vec![Tensor::F32(r::elementwise::mul(f(0), f(1), 1.0))],
        Op::Scale { alpha } => vec![Tensor::F32(r::elementwise::scale(f(0), *alpha, 0.0))],
        Op::Full { shape, value } => vec![Tensor::F32(vec![*value; numel(shape)])],
        Op::DotGeneral {
            lhs_contract,
            rhs_contract,
            lhs_batch,
            rhs_batch,
            alpha,
        } => {
            let plan = plan_dot(
                shape(0),
                shape(1),
                lhs_contract,
                rhs_contract,
                lhs_batch,
                rhs_batch,
                *alpha,
            );
            let a = match &plan.lhs_perm {
                Some(p) => transpose(f(0), shape(0), p),
                None => f(0).to_vec(),
            };
            let b = match &plan.rhs_perm {
                Some(p) => transpose(f(1), shape(1), p),
                None => f(1).to_vec(),
            };
            let mut c = vec![0.0; numel(out_shape(0))];
            r::matmul::matmul(&plan.shape, &a, &b, None, &mut c);
            vec![Tensor::F32(c)]
        }
        Op::ReduceSum { axes } => {
            let plan = plan_reduce(shape(0), axes);
            let x = match &plan.perm {
                Some(p) => transpose(f(0), shape(0), p),
                None => f(0).to_vec(),
            };
            vec![Tensor::F32(r::reduce::sum_axis(&x, plan.outer, plan.n, plan.inner))]
        }
        Op::Gelu => vec![Tensor::F32(r::gelu::forward(f(0)))],
        Op::GeluGrad => vec![Tensor::F32(r::gelu::backward(f(0), f(1)))],
        Op::LayerNorm => {
            let c = *shape(0).last().unwrap();
            let s = r::layernorm::LayerNormShape::new(f(0).len() / c, c);
            let (y, mean, rstd) = r::layernorm::forward(f(0), f(1), f(2), s);
            vec![Tensor::F32(y), Tensor::F32(mean), Tensor::F32(rstd)]
        }
        Op::LayerNormGrad => {
            let c = *shape(1).last().unwrap();
            let s = r::layernorm::LayerNormShape::new(f(1).len() / c, c);
            let (dx, dg, db) = r::layernorm::backward(f(0), f(1), f(2), f(3), f(4), s);
            vec![Tensor::F32(dx), Tensor::F32(dg), Tensor::F32(db)]
        }
        Op::SoftmaxCausal => {
            let t = *shape(0).last().unwrap();
            vec![Tensor::F32(r::softmax::causal_forward(f(0), f(0).len() / t, t))]
        }
        Op::SoftmaxCausalGrad => {
            let t = *shape(0).last().unwrap();
            vec![Tensor::F32(r::softmax::causal_backward(f(0), f(1), f(0).len() / t, t))]
        }
        Op::Attention { scale, rate, seq } => {
            let s = r::attention::AttentionShape::of(shape(0), *scale, *rate);
            let b = blocks(seq)?;
            let bits = (*rate > 0.0).then(|| get(3).u32());
            let (o, lse) = r::attention::forward_blocks(f(0), f(1), f(2), bits, s, &b);
            vec![Tensor::F32(o), Tensor::F32(lse)]
        }
        Op::AttentionGrad { scale, rate, seq } => {
            let s = r::attention::AttentionShape::of(shape(0), *scale, *rate);
            let b = blocks(seq)?;
            let saved = r::attention::Saved {
                o: f(3),
                lse: f(4),
                d_o: f(5),
                bits: (*rate > 0.0).then(|| get(6).u32()),
            };
            r::attention::backward_blocks(f(0), f(1), f(2), &saved, s, &b)
                .map(Tensor::F32)
                .to_vec()
        }
        Op::SeqTake { dim, seq } => {
            let len = out_shape(0)[*dim];
            let runs = seq_runs(seq, len, prog.mesh.as_ref(), device).map_err(|e| ExecError::Input(e.to_string()))?;
            let s = r::seq::SeqShape::of(shape(0), *dim, len);
            vec![match get(0) {
                Tensor::F32(x) => Tensor::F32(r::seq::take(x, &s, &runs)),
                Tensor::U32(x) => Tensor::U32(r::seq::take(x, &s, &runs)),
            }]
        }
        Op::SeqPut { dim, seq, .. } => {
            let len = shape(0)[*dim];
            let runs = seq_runs(seq, len, prog.mesh.as_ref(), device).map_err(|e| ExecError::Input(e.to_string()))?;
            let s = r::seq::SeqShape::of(out_shape(0), *dim, len);
            vec![match get(0) {
                Tensor::F32(x) => Tensor::F32(r::seq::put(x, &s, &runs)),
                Tensor::U32(x) => Tensor::U32(r::seq::put(x, &s, &runs)),
            }]
        }
        Op::AttentionCombine => {
            let dh = *shape(0).last().unwrap_or(&1);
            let (o, lse) = r::attention::combine(f(0), f(1), f(2), f(3), dh);
            vec![Tensor::F32(o), Tensor::F32(lse)]
        }
        Op::CrossEntropy => {
            let v = *shape(0).last().unwrap();
            vec![Tensor::F32(r::crossentropy::forward(
                f(0),
                get(1).u32(),
                f(0).len() / v,
                v,
            ))]
        }
        Op::CrossEntropyGrad => {
            let v = *shape(0).last().unwrap();
            vec![Tensor::F32(r::crossentropy::backward(
                f(0),
                get(1).u32(),
                f(2),
                f(0).len() / v,
                v,
            ))]
        }
        Op::Gather => {
            let (v, c) = (shape(0)[0], shape(0)[1]);
            let ids = get(1).u32();
            let s = r::embedding::EmbeddingShape::new(ids.len(), v, c);
            vec![Tensor::F32(r::embedding::forward(f(0), ids, s))]
        }
        Op::ScatterAdd { rows } => {
            let c = *shape(0).last().unwrap();
            let ids = get(1).u32();
            let s = r::embedding::EmbeddingShape::new(ids.len(), *rows, c);
            vec![Tensor::F32(r::embedding::backward(f(0), ids, s))]
        }
        Op::FoldIn { data } => {
            let k = get(0).u32();
            vec![Tensor::U32(Key([k[0], k[1]]).fold_in(*data).0.to_vec())]
        }
        Op::RandomBits { shape, layout, rows } => {
            let k = get(0).u32();
            let bits = random_bits(Key([k[0], k[1]]), *layout, shape);
            vec![Tensor::U32(match rows {
                SeqBlock::Zigzag { parts } => zigzag_rows(&bits, shape, *parts),
                _ => bits,
            })]
        }
        Op::Dropout { rate } => vec![Tensor::F32(r::dropout::apply(f(0), get(1).u32(), *rate))],
        Op::MoeRoute { .. } | Op::MoeRouteGrad { .. } | Op::MoeDispatch | Op::MoeCombine | Op::MoeGateGrad => {
            moe(prog, ins, vals)
        }
        Op::Psum { .. }
        | Op::AllGather { .. }
        | Op::PsumScatter { .. }
        | Op::Ppermute { .. }
        | Op::AllToAll { .. }
        | Op::FoldInAxisIndex { .. }
        | Op::ShardSlice { .. }
        | Op::RandomBitsBlock { .. } => {
            return Err(ExecError::Unsupported {
                op: ins.op.name().into(),
                executor: "reference",
                why: "collectives and per-device slices need a program with a mesh".into(),
            })
        }
        Op::SgdUpdate { lr } => {
            let mut p = f(0).to_vec();
            r::optimizer::sgd(&mut p, f(1), *lr);
            vec![Tensor::F32(p)]
        }
        Op::AdamWUpdate { lr, b1, b2, eps, wd } => {
            let mut hyper = AdamWHyper::at(*lr, step as u32).map_err(|e| ExecError::Input(e.to_string()))?;
            (hyper.b1, hyper.b2, hyper.eps) = (*b1, *b2, *eps);
            let (mut p, mut m, mut v) = (f(0).to_vec(), f(2).to_vec(), f(3).to_vec());
            r::optimizer::adamw(&mut p, f(1), &mut m, &mut v, &hyper, *wd);
            vec![Tensor::F32(p), Tensor::F32(m), Tensor::F32(v)]
        }
    })
}

/// A mixture-of-experts op on one device's blocks ([`r::moe`]).
fn moe(prog: &Program, ins: &Instr, vals: &[&Tensor]) -> Vec<Tensor> {
    let s = moe_shape(prog, ins);
    let f = |k: usize| vals[k].f32();
    let u = |k: usize| vals[k].u32();
    let gates = vals.get(3).map(|t| t.f32());
    match &ins.op {
        Op::MoeRoute { .. } => {
            let o = r::moe::route(f(0), s);
            vec![
                Tensor::F32(o.probs),
                Tensor::F32(o.gates),
                Tensor::U32(o.places),
                Tensor::U32(o.owners),
                Tensor::F32(o.load),
            ]
        }
        Op::MoeRouteGrad { .. } => vec![Tensor::F32(r::moe::route_grad(f(0), f(1), u(2), f(3), f(4), s))],
        Op::MoeDispatch => vec![Tensor::F32(r::moe::dispatch(f(0), u(2), gates, s))],
        Op::MoeCombine => vec![Tensor::F32(r::moe::combine(f(0), u(1), gates, s))],
        _ => vec![Tensor::F32(r::moe::gate_grad(f(0), f(1), u(2), s))],
    }
}
