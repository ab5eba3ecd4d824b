//! Lowering: the dispatches of one instruction, on the slots the plan gave its values.
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use super::consts::Fold;
use super::fuse::{swapped, Fusion};
use super::parts::{one_copy, part_copies, Parts};
use super::slots::{Scratch, UpdatePlan};
use super::views::Views;
use crate::exec::lowering::{
    attention_blocks, moe_shape, on_devices, plan_broadcast, plan_shard_slice, plan_transpose, seq_runs,
};
use crate::exec::ExecError;
use crate::gpu::{Dispatch, GpuBuffer, GpuContext};
use crate::ir::{AttnSeq, DType, Instr, Op, Program, Runs, SeqBlock, ValueId};
use crate::kernels as k;
use crate::kernels::attention::Blocks;
use crate::kernels::collectives::CollectiveArgs;
use crate::kernels::copy::Strided;
use crate::kernels::matmul::{MatmulShape, Variant};
use crate::kernels::random::{Draw, KeyMode};
use crate::rng::Block;
use crate::sharding::Mesh;

/// How an executor's matmuls pick their variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulChoice {
    /// The autotuner's choice for each shape class, tuning a class at its first matmul.
    Tuned,
    /// The autotuner's choice where it has one; a class it has not tuned yet runs this variant
    /// instead of tuning now, so building waits neither for the timing runs nor for compiling
    /// every variant (the page's first step). [`GpuExecutor::retune`](super::GpuExecutor::retune)
    /// switches to the tuned choices later.
    Provisional(Variant),
}

/// What lowering reads: the program, the buffer of each value, and the optimizer's hyper buffers.
pub(super) struct Lowering<'a> {
    pub ctx: &'a GpuContext,
    pub program: &'a Program,
    pub slots: &'a [GpuBuffer],
    pub value_slot: &'a [usize],
    pub sgd_hyper: Option<&'a GpuBuffer>,
    pub adamw_hyper: Option<&'a GpuBuffer>,
    /// The fused pairs (fuse.rs): the first of a pair lowers both, the second nothing.
    pub fusion: &'a [Option<Fusion>],
    /// The transposes folded into fused attention (views.rs): they lower to nothing, and the
    /// attention kernels take the strided values in place.
    pub views: &'a Views,
    /// What runs as nothing or as one fill (consts.rs).
    pub folds: &'a [Fold],
    /// Per value, the random_bits instruction of bits fused attention draws in place
    /// ([`Program::bits_drawn_in_attention`]): that instruction launches nothing.
    pub drawn: &'a [Option<usize>],
    /// Values stored as parts of one buffer (parts.rs), and each group's range of that buffer.
    pub parts: &'a Parts,
    pub part_ranges: &'a [GpuBuffer],
    pub matmuls: MatmulChoice,
    /// The matmuls that ran a provisional variant (their class was untuned).
    pub provisional: RefCell<Vec<MatmulShape>>,
    /// The composed attention lowering's scratch, by size ([`Lowering::attention_scratch`]).
    pub attention_scratch: RefCell<HashMap<usize, Rc<[GpuBuffer; 2]>>>,
    /// The textures the dot_generals' operand copies fill, shared where they read the same value
    /// the same way; the repeated copies leave the list once it is whole.
    pub textures: k::matmul::SharedTextures,
    /// Per value of a pipelined program: made by some stages only and read on others, so its
    /// blocks on the devices outside its owner are filled with zeros after it is computed (the
    /// GPU computes a stage's work on every device's block; [`Program::read_outside_owner`]).
    pub zeroed: &'a [bool],
    /// Per owner, its flags of the devices outside it (one f32 per device).
    pub outside_flags: RefCell<HashMap<crate::ir::Owner, Rc<GpuBuffer>>>,
}

/// A draw of attention's dropout bits inside its kernels.
struct Drawn {
    /// The random_bits instruction.
    instr: usize,
    /// Each device's block of the bits' leading dims.
    blocks: Vec<Block>,
    layout: crate::rng::RngLayout,
    /// The global sequence length (the bits are (lead.., seq, seq)).
    seq: usize,
}

fn input(e: impl std::fmt::Display) -> ExecError {
    ExecError::Input(e.to_string())
}

/// The query rows of an attention operand (..., T, Dh).
fn lead_rows(shape: &[usize]) -> usize {
    shape[shape.len() - 2]
}

/// Whether two blocks put every row (`tq` queries, their `tk` keys) at the same positions.
fn same_positions(a: &Blocks, b: &Blocks, tq: usize) -> bool {
    a.tk == b.tk && (0..tq).all(|i| a.q.pos(i) == b.q.pos(i)) && (0..a.tk).all(|j| a.kv.pos(j) == b.kv.pos(j))
}

/// An attention op's shape over all devices' heads (they are independent problems).
fn attention_shape(shape: &[usize], scale: f32, rate: f32, devices: usize) -> k::attention::AttentionShape {
    let s = k::attention::AttentionShape::of(shape, scale, rate);
    k::attention::AttentionShape {
        heads: devices * s.heads,
        ..s
    }
}

/// Whether attention instruction `i` runs on fused kernels on `ctx`'s adapter, with every
/// device's whole sequence: those take q, k, v, o and do in any layout (views.rs).
pub(super) fn takes_layouts(ctx: &GpuContext, program: &Program, i: usize) -> bool {
    let ins = &program.instrs[i];
    let (Op::Attention { scale, rate, seq } | Op::AttentionGrad { scale, rate, seq }) = &ins.op else {
        return false;
    };
    let s = attention_shape(program.shape(ins.inputs[0]), *scale, *rate, program.devices());
    let blocks = vec![Blocks::whole(s.t); program.devices()];
    seq.is_whole()
        && matches!(
            k::attention::lowering(ctx, &s, &blocks),
            k::attention::Lowering::Fused(_)
        )
}

fn strs(a: &[String]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

impl Lowering<'_> {
    fn buf(&self, v: ValueId) -> &GpuBuffer {
        &self.slots[self.value_slot[v.index()]]
    }

    /// The variant a matmul of shape `s` runs: `None` leaves it to the autotuner.
    fn matmul_variant(&self, s: &MatmulShape) -> Option<Variant> {
        let MatmulChoice::Provisional(v) = self.matmuls else {
            return None;
        };
        if k::matmul::tuned_variant(self.ctx, s).is_some() {
            return None;
        }
        self.provisional.borrow_mut().push(*s);
        Some(k::matmul::supported_variant(self.ctx, v, s))
    }

    /// The blocks each device draws of a random_bits instruction's global array, and its layout.
    fn draw_blocks(&self, ins: &Instr) -> Result<(Vec<Block>, crate::rng::RngLayout), ExecError> {
        let devices = self.program.devices();
        match &ins.op {
            // Each device draws the local-shape array from its own key (shard_map's semantics;
            // with equal keys the draws repeat across devices).
            Op::RandomBits { rows, .. } if *rows != SeqBlock::Whole => Err(ExecError::Unsupported {
                op: ins.op.name().into(),
                executor: "GPU",
                why: "bits in a global zig-zag order are drawn by jit's partitioned program, each device its block"
                    .into(),
            }),
            Op::RandomBits { shape, layout, .. } => Ok((vec![Block::full(shape); devices], *layout)),
            Op::RandomBitsBlock { seq, .. } if !seq.is_whole() => Err(ExecError::Unsupported {
                op: ins.op.name().into(),
                executor: "GPU",
                why: "attention's bits at ring positions are drawn inside the attention kernels only; read them \
                      only as a dot_product_attention's dropout bits"
                    .into(),
            }),
            Op::RandomBitsBlock {
                global, spec, layout, ..
            } => {
                let mut blocks = Vec::with_capacity(devices);
                for d in 0..devices {
                    blocks.push(Block::new(global, &self.device_ranges(spec, global, d)?).map_err(input)?);
                }
                Ok((blocks, *layout))
            }
            op => unreachable!("{} draws no random bits", op.name()),
        }
    }

    /// Device `d`'s index ranges of `global` split as `spec` says.
    fn device_ranges(
        &self,
        spec: &crate::sharding::PartitionSpec,
        global: &[usize],
        d: usize,
    ) -> Result<Vec<std::ops::Range<usize>>, ExecError> {
        let mesh = self
            .program
            .mesh
            .as_ref()
            .ok_or_else(|| ExecError::Input("random bits blocks need a program with a mesh".into()))?;
        let sharding = crate::sharding::NamedSharding::new(mesh.clone(), spec.clone()).map_err(input)?;
        sharding.device_indices(d, global).map_err(input)
    }

    /// Where each device's rows of an attention over q of `q` shape and k of `k` shape sit.
    fn attention_rows(&self, seq: &AttnSeq, q: &[usize], k: &[usize]) -> Result<Vec<Blocks>, ExecError> {
        let (tq, tk) = (q[q.len() - 2], k[k.len() - 2]);
        (0..self.program.devices())
            .map(|d| attention_blocks(seq, tq, tk, self.program.mesh.as_ref(), d).map_err(input))
            .collect()
    }

    /// For an attention instruction whose operand `bits` is drawn in its kernels: the draw's
    /// instruction, each device's block of the bits' leading dims, the layout and the global
    /// sequence length. The draw's rows must be the op's `rows` (they are in every program
    /// shardlab builds: the bits are drawn where the op reads them).
    fn drawn_blocks(&self, ins: &Instr, bits: usize, rows: &[Blocks]) -> Result<Option<Drawn>, ExecError> {
        let Some(&Some(i)) = ins.inputs.get(bits).map(|v| &self.drawn[v.index()]) else {
            return Ok(None);
        };
        let draw = &self.program.instrs[i];
        let mismatch = || ExecError::Unsupported {
            op: ins.op.name().into(),
            executor: "GPU",
            why: "its dropout bits are drawn at other rows than it attends: make them with random_bits where it reads \
                  them"
                .into(),
        };
        let (global, layout) = match &draw.op {
            Op::RandomBits { shape, layout, .. } => (shape.clone(), *layout),
            Op::RandomBitsBlock { global, layout, .. } => (global.clone(), *layout),
            op => unreachable!("{} draws no random bits", op.name()),
        };
        let n = global.len();
        let (lead, t) = (&global[..n - 2], global[n - 1]);
        let mut blocks = Vec::with_capacity(rows.len());
        for (d, row) in rows.iter().enumerate() {
            let (ranges, drawn_rows) = match &draw.op {
                Op::RandomBits { .. } => (lead.iter().map(|&g| 0..g).collect::<Vec<_>>(), Blocks::whole(t)),
                Op::RandomBitsBlock { spec, seq, shape, .. } => {
                    let ranges = self.device_ranges(spec, &global, d)?;
                    let rows = if seq.is_whole() {
                        let run = |r: &std::ops::Range<usize>| Runs {
                            starts: [r.start, 0],
                            chunk: r.len(),
                        };
                        Blocks {
                            tk: ranges[n - 1].len(),
                            q: run(&ranges[n - 2]),
                            kv: run(&ranges[n - 1]),
                        }
                    } else {
                        let mesh = self.program.mesh.as_ref();
                        attention_blocks(seq, shape[n - 2], shape[n - 1], mesh, d).map_err(input)?
                    };
                    (ranges[..n - 2].to_vec(), rows)
                }
                _ => unreachable!(),
            };
            let tq = lead_rows(&self.program.info(ins.inputs[0]).shape);
            if !same_positions(&drawn_rows, row, tq) {
                return Err(mismatch());
            }
            blocks.push(Block::new(lead, &ranges).map_err(input)?);
        }
        Ok(Some(Drawn {
            instr: i,
            blocks,
            layout,
            seq: t,
        }))
    }

    /// Attention's dropout: none, the bits operand's buffer, or drawn in place from the key.
    fn dropout<'b>(
        &'b self,
        ins: &Instr,
        bits: usize,
        rate: f32,
        drawn: &'b Option<Drawn>,
    ) -> k::attention::Dropout<'b> {
        match drawn {
            _ if rate == 0.0 => k::attention::Dropout::None,
            Some(d) => k::attention::Dropout::Drawn {
                key: self.buf(self.program.instrs[d.instr].inputs[0]),
                draw: Draw {
                    layout: d.layout,
                    blocks: &d.blocks,
                    keys: KeyMode::PerDevice,
                },
                seq: d.seq,
            },
            None => k::attention::Dropout::Bits(self.buf(ins.inputs[bits])),
        }
    }

    /// A matmul of every device's items at once, with the tuned (or provisional) variant.
    async fn matmul(
        &self,
        s: &MatmulShape,
        a: &GpuBuffer,
        b: &GpuBuffer,
        c: &GpuBuffer,
    ) -> Result<Vec<Dispatch>, ExecError> {
        let v = self.matmul_variant(s);
        Ok(k::matmul::matmul(self.ctx, s, a, b, None, c, v).await?)
    }

    /// The two (heads, T, T) arrays of the composed attention lowering, shared by every
    /// attention op of that size (each op's dispatches are done with them before the next's).
    fn attention_scratch(&self, s: &k::attention::AttentionShape) -> Result<Rc<[GpuBuffer; 2]>, ExecError> {
        let n = k::attention::scores_len(s);
        if let Some(b) = self.attention_scratch.borrow().get(&n) {
            return Ok(b.clone());
        }
        let made = Rc::new([
            self.ctx.zeros("attention scores (composed)", n)?,
            self.ctx.zeros("attention dscores (composed)", n)?,
        ]);
        self.attention_scratch.borrow_mut().insert(n, made.clone());
        Ok(made)
    }

    /// The composed attention backward (kernels/attention.rs): rows, scores = scale q k^T,
    /// dp = do v^T, the kept probabilities and ds in their place, then dv = p'^T do,
    /// dq = ds k, dk = ds^T q.
    async fn attention_backward_composed(
        &self,
        op: k::attention::Backward<'_>,
        s: &k::attention::AttentionShape,
    ) -> Result<Vec<Dispatch>, ExecError> {
        let scratch = self.attention_scratch(s)?;
        let [scores, dscores] = &*scratch;
        let (t, dh, heads) = (s.t, s.dh, s.heads);
        // B (heads, T, Dh) read transposed: q k^T and do v^T.
        let rows_t = |m: MatmulShape| MatmulShape { trans_b: true, ..m };
        let qk = rows_t(MatmulShape {
            alpha: s.scale,
            ..MatmulShape::new(heads, t, t, dh)
        });
        let dov = rows_t(MatmulShape::new(heads, t, t, dh));
        // dv = p'^T do and dk = ds^T q: A (heads, T, T) read transposed.
        let at = MatmulShape {
            trans_a: true,
            ..MatmulShape::new(heads, t, dh, t)
        };
        let (q, kk, v, d_o, dq, dk, dv) = (op.q, op.k, op.v, op.d_o, op.dq, op.dk, op.dv);
        let b = k::attention::ComposedBackward { op, scores, dscores };
        let (rows, grad) = k::attention::composed_backward(self.ctx, &b, s).await?;
        let mut ds = vec![rows];
        ds.extend(self.matmul(&qk, q, kk, scores).await?);
        ds.extend(self.matmul(&dov, d_o, v, dscores).await?);
        ds.push(grad);
        ds.extend(self.matmul(&at, scores, d_o, dv).await?);
        ds.extend(self.matmul(&MatmulShape::new(heads, t, dh, t), dscores, kk, dq).await?);
        ds.extend(self.matmul(&at, dscores, q, dk).await?);
        Ok(ds)
    }

    /// A strided copy of every device's block at once.
    async fn copy(
        &self,
        src: &GpuBuffer,
        dst: &GpuBuffer,
        c: &Strided,
        blocks: (usize, usize),
    ) -> Result<Dispatch, ExecError> {
        let all = on_devices(c, self.program.devices(), blocks);
        Ok(k::copy::strided(self.ctx, src, dst, &all).await?)
    }

    /// The dispatches of instruction `i` (`sc` is its plan from slot planning), then, in a
    /// pipelined program, the zeros its results hold on the stages that do not run it, where
    /// another stage reads them: the GPU runs each stage's work on every device's block (one
    /// dispatch for all of them, as every other op), and those blocks must read as skipped.
    pub async fn instr(&self, i: usize, sc: &Scratch) -> Result<Vec<Dispatch>, ExecError> {
        let mut ds = self.work(i, sc).await?;
        let fused = self.fusion[i].is_some().then_some(i + 1);
        if (i > 0 && self.fusion[i - 1].is_some()) || self.views.quiet[i] || self.folds[i] == Fold::Skip {
            return Ok(ds);
        }
        for j in std::iter::once(i).chain(fused) {
            let owner = self.program.instr_owner(j);
            for &o in &self.program.instrs[j].outputs {
                if self.zeroed[o.index()] && self.drawn[o.index()].is_none() {
                    ds.push(self.zero_outside(o, owner).await?);
                }
            }
        }
        Ok(ds)
    }

    /// Zeros in `v`'s blocks on the devices outside `owner`.
    async fn zero_outside(&self, v: ValueId, owner: crate::ir::Owner) -> Result<Dispatch, ExecError> {
        let flags = self.outside_flags.borrow().get(&owner).cloned();
        let flags = match flags {
            Some(f) => f,
            None => {
                let prog = self.program;
                let per_device: Vec<f32> = (0..prog.devices())
                    .map(|d| {
                        if prog.stage_of(d).is_some_and(|s| !owner.active(s)) {
                            1.0
                        } else {
                            0.0
                        }
                    })
                    .collect();
                let f = Rc::new(self.ctx.upload("devices outside a stage's work", &per_device)?);
                self.outside_flags.borrow_mut().insert(owner, f.clone());
                f
            }
        };
        let nl = self.program.info(v).numel();
        let n = self.program.devices() * nl;
        Ok(k::elementwise::fill_blocks(self.ctx, self.buf(v), &flags, (n, nl), 0.0).await?)
    }

    /// The dispatches of instruction `i` itself.
    async fn work(&self, i: usize, sc: &Scratch) -> Result<Vec<Dispatch>, ExecError> {
        if (i > 0 && self.fusion[i - 1].is_some()) || self.views.quiet[i] {
            return Ok(vec![]);
        }
        if let Some(f) = self.fusion[i] {
            return self.fused(i, f, sc).await;
        }
        let ctx = self.ctx;
        let prog = self.program;
        let ins: &Instr = &prog.instrs[i];
        match self.folds[i] {
            Fold::Skip => return Ok(vec![]),
            Fold::Fill(value) => {
                let n = prog.devices() * prog.info(ins.outputs[0]).numel();
                return Ok(vec![
                    k::elementwise::fill(ctx, self.buf(ins.outputs[0]), n, value).await?,
                ]);
            }
            Fold::Run => {}
        }
        let x = |k: usize| self.buf(ins.inputs[k]);
        let y = |k: usize| self.buf(ins.outputs[k]);
        let shape = |k: usize| prog.shape(ins.inputs[k]).to_vec();
        let devices = prog.devices();
        let n_in = |k: usize| devices * prog.info(ins.inputs[k]).numel();
        let n_out = devices * ins.outputs.first().map_or(0, |o| prog.info(*o).numel());
        // Local sizes; kernels get all devices' counts (`devices * ...`).
        let local_in = |k: usize| prog.info(ins.inputs[k]).numel();
        let local_out = |k: usize| prog.info(ins.outputs[k]).numel();
        let unsupported = |why: &str| ExecError::Unsupported {
            op: ins.op.name().into(),
            executor: "GPU",
            why: why.into(),
        };
        let mesh = || {
            prog.mesh
                .as_ref()
                .ok_or_else(|| unsupported("collectives and per-device blocks need a program with a mesh"))
        };
        let one = |d: Dispatch| vec![d];
        let per_device = KeyMode::PerDevice;
        Ok(match &ins.op {
            Op::Reshape { .. } | Op::Pcast { .. } | Op::Reshard { .. } => vec![],
            Op::Transpose { perm } => {
                if prog.info(ins.inputs[0]).dtype != DType::F32 {
                    return Err(unsupported("only f32 arrays are transposed on the GPU"));
                }
                let c = plan_transpose(&shape(0), perm);
                one(self.copy(x(0), y(0), &c, (local_in(0), local_out(0))).await?)
            }
            Op::BroadcastInDim { shape: to, dims } => {
                let c = plan_broadcast(&shape(0), to, dims);
                one(self.copy(x(0), y(0), &c, (local_in(0), local_out(0))).await?)
            }
            Op::Split { .. } => self.split(i, x(0)).await?,
            Op::Concat { .. } => self.concat(i, y(0)).await?,
            Op::Add | Op::Sub | Op::Mul => {
                let (op, beta) = match ins.op {
                    Op::Add => (k::elementwise::Binary::Add, 1.0),
                    Op::Sub => (k::elementwise::Binary::Add, -1.0),
                    _ => (k::elementwise::Binary::Mul, 0.0),
                };
                let args = k::elementwise::BinaryArgs {
                    devices,
                    ..k::elementwise::BinaryArgs::new(op, n_in(0), local_in(1), 1.0, beta)
                };
                one(k::elementwise::binary(ctx, x(0), x(1), y(0), &args).await?)
            }
            Op::Scale { alpha } => one(k::elementwise::scale(ctx, x(0), y(0), n_in(0), *alpha, 0.0).await?),
            Op::Full { value, .. } => one(k::elementwise::fill(ctx, y(0), n_out, *value).await?),
            Op::DotGeneral { .. } => self.dot(ins, sc, None, y(0)).await?,
            Op::ReduceSum { .. } => {
                let p = sc.reduce.as_ref().expect("slot planning plans every reduce_sum");
                let mut ds = vec![];
                let mut src = x(0);
                if let (Some(perm), Some(s)) = (&p.perm, sc.lhs) {
                    let c = plan_transpose(&shape(0), perm);
                    ds.push(self.copy(src, &self.slots[s], &c, (local_in(0), local_in(0))).await?);
                    src = &self.slots[s];
                }
                ds.extend(k::reduce::sum_axis(ctx, src, y(0), (devices * p.outer, p.n, p.inner), None).await?);
                ds
            }
            Op::Gelu => one(k::gelu::forward(ctx, x(0), y(0), n_in(0)).await?),
            Op::GeluGrad => one(k::gelu::backward(ctx, x(0), x(1), y(0), n_in(0)).await?),
            Op::LayerNorm => one(self.layer_norm(ins, x(0), None).await?),
            Op::LayerNormGrad => {
                let c = *shape(1).last().unwrap();
                let s = k::layernorm::LayerNormShape {
                    rows: n_in(1) / c,
                    c,
                    devices,
                };
                let b = k::layernorm::BackwardBuffers {
                    dout: x(0),
                    x: x(1),
                    mean: x(2),
                    rstd: x(3),
                    gamma: x(4),
                    dx: y(0),
                    dgamma: y(1),
                    dbeta: y(2),
                };
                k::layernorm::backward(ctx, &b, s, None).await?
            }
            Op::SoftmaxCausal => {
                let t = *shape(0).last().unwrap();
                one(k::softmax::causal_forward(ctx, x(0), y(0), n_in(0) / t, t, None).await?)
            }
            Op::SoftmaxCausalGrad => {
                let t = *shape(0).last().unwrap();
                one(k::softmax::causal_backward(ctx, x(0), x(1), y(0), n_in(0) / t, t, None).await?)
            }
            Op::Attention { scale, rate, seq } => {
                let s = attention_shape(&shape(0), *scale, *rate, devices);
                let blocks = self.attention_rows(seq, &shape(0), &shape(1))?;
                let drawn = self.drawn_blocks(ins, 3, &blocks)?;
                let dropout = self.dropout(ins, 3, *rate, &drawn);
                let layouts = self.views.layouts(prog, ins);
                match k::attention::lowering(ctx, &s, &blocks) {
                    k::attention::Lowering::Fused(kernels) => {
                        let b = k::attention::Forward {
                            q: x(0),
                            k: x(1),
                            v: x(2),
                            dropout,
                            o: y(0),
                            lse: y(1),
                            blocks: &blocks,
                            layouts: layouts.as_ref(),
                        };
                        one(k::attention::forward(ctx, &b, &s, kernels).await?)
                    }
                    k::attention::Lowering::Composed if layouts.is_some() => {
                        return Err(unsupported("the composed lowering reads heads-major arrays only"))
                    }
                    k::attention::Lowering::Composed => {
                        let scratch = self.attention_scratch(&s)?;
                        let [scores, _] = &*scratch;
                        let (t, dh, heads) = (s.t, s.dh, s.heads);
                        // scores = scale q k^T; o = probs v.
                        let qk = MatmulShape {
                            trans_b: true,
                            alpha: s.scale,
                            ..MatmulShape::new(heads, t, t, dh)
                        };
                        let mut ds = self.matmul(&qk, x(0), x(1), scores).await?;
                        ds.push(k::attention::probs(ctx, scores, y(1), dropout, x(0), &blocks, &s).await?);
                        ds.extend(
                            self.matmul(&MatmulShape::new(heads, t, dh, t), scores, x(2), y(0))
                                .await?,
                        );
                        ds
                    }
                }
            }
            Op::SeqTake { dim, seq } | Op::SeqPut { dim, seq, .. } => {
                let take = matches!(ins.op, Op::SeqTake { .. });
                let (whole, block) = if take {
                    (shape(0), prog.shape(ins.outputs[0]).to_vec())
                } else {
                    (prog.shape(ins.outputs[0]).to_vec(), shape(0))
                };
                let runs: Vec<Runs> = (0..devices)
                    .map(|d| seq_runs(seq, block[*dim], prog.mesh.as_ref(), d).map_err(input))
                    .collect::<Result<_, _>>()?;
                let s = k::seq::SeqShape::of(&whole, *dim, block[*dim]);
                let direction = if take {
                    k::seq::Direction::Take
                } else {
                    k::seq::Direction::Put
                };
                one(k::seq::rows(ctx, x(0), y(0), &s, &runs, direction).await?)
            }
            Op::AttentionCombine => {
                let s = attention_shape(&shape(0), 1.0, 0.0, devices);
                let b = k::attention::Combine {
                    o_a: x(0),
                    lse_a: x(1),
                    o_b: x(2),
                    lse_b: x(3),
                    o: y(0),
                    lse: y(1),
                };
                one(k::attention::combine(ctx, &b, &s).await?)
            }
            Op::AttentionGrad { scale, rate, seq } => {
                let s = attention_shape(&shape(0), *scale, *rate, devices);
                let rows = sc
                    .rows
                    .expect("slot planning gives attention's backward its row scratch");
                let blocks = self.attention_rows(seq, &shape(0), &shape(1))?;
                let drawn = self.drawn_blocks(ins, 6, &blocks)?;
                let layouts = self.views.layouts(prog, ins);
                let b = k::attention::Backward {
                    q: x(0),
                    k: x(1),
                    v: x(2),
                    o: x(3),
                    lse: x(4),
                    d_o: x(5),
                    dropout: self.dropout(ins, 6, *rate, &drawn),
                    rows: &self.slots[rows],
                    dq: y(0),
                    dk: y(1),
                    dv: y(2),
                    blocks: &blocks,
                    layouts: layouts.as_ref(),
                };
                match k::attention::lowering(ctx, &s, &blocks) {
                    k::attention::Lowering::Fused(kernels) => k::attention::backward(ctx, &b, &s, kernels).await?,
                    k::attention::Lowering::Composed if layouts.is_some() => {
                        return Err(unsupported("the composed lowering reads heads-major arrays only"))
                    }
                    k::attention::Lowering::Composed => self.attention_backward_composed(b, &s).await?,
                }
            }
            Op::CrossEntropy => {
                let v = *shape(0).last().unwrap();
                one(k::crossentropy::forward(ctx, x(0), x(1), y(0), n_in(0) / v, v, None).await?)
            }
            Op::CrossEntropyGrad => {
                let v = *shape(0).last().unwrap();
                let b = k::crossentropy::BackwardBuffers {
                    logits: x(0),
                    targets: x(1),
                    dlosses: x(2),
                    dlogits: y(0),
                };
                one(k::crossentropy::backward(ctx, &b, n_in(0) / v, v, None).await?)
            }
            Op::Gather => {
                let (v, c) = (shape(0)[0], shape(0)[1]);
                let s = k::embedding::EmbeddingShape {
                    devices,
                    ..k::embedding::EmbeddingShape::new(n_in(1), v, c)
                };
                one(k::embedding::forward(ctx, x(0), x(1), y(0), s).await?)
            }
            Op::ScatterAdd { rows } => {
                let c = *shape(0).last().unwrap();
                let s = k::embedding::EmbeddingShape {
                    devices,
                    ..k::embedding::EmbeddingShape::new(n_in(1), *rows, c)
                };
                one(k::embedding::backward(ctx, x(0), x(1), y(0), s).await?)
            }
            // Keys are values like any other: one per device (`[device, 2]`).
            Op::FoldIn { data } => one(k::random::fold_in(ctx, x(0), y(0), &vec![*data; devices], per_device).await?),
            Op::RandomBits { .. } | Op::RandomBitsBlock { .. } if self.drawn[ins.outputs[0].index()].is_some() => {
                vec![]
            }
            Op::RandomBits { .. } | Op::RandomBitsBlock { .. } => {
                let (blocks, layout) = self.draw_blocks(ins)?;
                let draw = Draw {
                    layout,
                    blocks: &blocks,
                    keys: per_device,
                };
                one(k::random::random_bits(ctx, x(0), y(0), &draw).await?)
            }
            Op::ShardSlice { dim, axes, parts } => {
                let c = plan_shard_slice(mesh()?, &shape(0), *dim, axes, *parts);
                one(k::copy::strided(ctx, x(0), y(0), &c).await?)
            }
            Op::Dropout { rate } => one(k::dropout::apply(ctx, x(0), x(1), y(0), n_in(0), *rate).await?),
            Op::MoeRoute { .. } => {
                let b = k::moe::Route {
                    logits: x(0),
                    probs: y(0),
                    gates: y(1),
                    places: y(2),
                    owners: y(3),
                    load: y(4),
                };
                one(k::moe::route(ctx, &b, moe_shape(prog, ins), devices).await?)
            }
            Op::MoeRouteGrad { .. } => {
                let b = k::moe::RouteGrad {
                    probs: x(0),
                    gates: x(1),
                    places: x(2),
                    dprobs: x(3),
                    dgates: x(4),
                    dlogits: y(0),
                };
                one(k::moe::route_grad(ctx, &b, moe_shape(prog, ins), devices).await?)
            }
            Op::MoeDispatch => {
                let gates = (ins.inputs.len() == 4).then(|| x(3));
                one(k::moe::dispatch(ctx, x(0), x(2), gates, y(0), moe_shape(prog, ins), devices).await?)
            }
            Op::MoeCombine => {
                let gates = (ins.inputs.len() == 4).then(|| x(3));
                one(k::moe::combine(ctx, x(0), x(1), gates, y(0), moe_shape(prog, ins), devices).await?)
            }
            Op::MoeGateGrad => {
                one(k::moe::gate_grad(ctx, x(0), x(1), x(2), y(0), moe_shape(prog, ins), devices).await?)
            }
            // A combined psum: one psum dispatch per operand, but for the operands summed in
            // place with the rest of their run (packing.rs): their run's one dispatch, at its
            // last psum. The program, and so the profile, still counts every all-reduce.
            Op::Psum { axes, .. } => {
                let mesh = mesh()?;
                let in_place = |k: usize| sc.psum.as_ref().is_some_and(|p| p.in_place[k]);
                let mut ds = Vec::with_capacity(ins.inputs.len());
                for k in (0..ins.inputs.len()).filter(|&k| !in_place(k)) {
                    ds.push(self.collective(mesh, &ins.op, x(k), y(k), &shape(k)).await?);
                }
                if let Some((arena, arrays)) = sc.psum.as_ref().and_then(|p| p.run.as_ref()) {
                    let arena = &self.slots[*arena];
                    ds.push(k::collectives::psum_packed(ctx, mesh, &strs(axes), arena, arrays).await?);
                }
                ds
            }
            Op::AllGather { .. }
            | Op::PsumScatter { .. }
            | Op::Ppermute { .. }
            | Op::AllToAll { .. }
            | Op::FoldInAxisIndex { .. } => one(self.collective(mesh()?, &ins.op, x(0), y(0), &shape(0)).await?),
            Op::SgdUpdate { .. } | Op::AdamWUpdate { .. } => match &sc.update {
                Some(u) => one(self.update(&ins.op, u).await?),
                // Packed with later updates: the group's last one lowers them all.
                None => vec![],
            },
        })
    }

    /// One optimizer dispatch over every update of a group (packing.rs): on its arenas, or on
    /// one update's own buffers.
    async fn update(&self, op: &Op, u: &UpdatePlan) -> Result<Dispatch, ExecError> {
        let buf = |k: usize| &self.slots[u.buffers[k]];
        Ok(match op {
            Op::SgdUpdate { .. } => {
                let hyper = self.sgd_hyper.expect("made with the executor");
                let n = u.segments.last().map_or(0, |s| s.start + s.len);
                k::optimizer::sgd(self.ctx, buf(0), buf(1), hyper, n).await?
            }
            Op::AdamWUpdate { b1, b2, eps, .. } => {
                if (*b1, *b2, *eps) != (k::optimizer::ADAMW_B1, k::optimizer::ADAMW_B2, k::optimizer::ADAMW_EPS) {
                    return Err(ExecError::Unsupported {
                        op: op.name().into(),
                        executor: "GPU",
                        why: "the GPU AdamW uses MODEL.md's b1, b2 and eps".into(),
                    });
                }
                let b = k::optimizer::AdamWBuffers {
                    param: buf(0),
                    grad: buf(1),
                    m: buf(2),
                    v: buf(3),
                    hyper: self.adamw_hyper.expect("made with the executor"),
                };
                k::optimizer::adamw(self.ctx, &b, &u.segments).await?
            }
            _ => unreachable!("not an optimizer update"),
        })
    }

    /// dot_general `ins` into `out`, adding `bias` (one per device) where given: its operand
    /// copies and its matmul.
    async fn dot(
        &self,
        ins: &Instr,
        sc: &Scratch,
        bias: Option<ValueId>,
        out: &GpuBuffer,
    ) -> Result<Vec<Dispatch>, ExecError> {
        let p = sc.dot.as_ref().expect("slot planning plans every dot_general");
        let (mut ds, [a, b], contents) = self.dot_operands(ins, sc).await?;
        // Every device's batch of matrices is contiguous: devices multiply the batch.
        let mut shape = p.shape;
        shape.batch *= self.program.devices();
        if let Some(bias) = bias {
            shape.stride_bias = self.program.info(bias).numel();
        }
        let v = self.matmul_variant(&shape);
        let bias = bias.map(|x| self.buf(x));
        let ops = k::matmul::Operands { a, b, bias, c: out };
        ds.extend(k::matmul::matmul_shared(self.ctx, &shape, ops, v, Some(self.sharing(contents))).await?);
        Ok(ds)
    }

    /// Texture sharing for a matmul whose operands hold `contents`.
    fn sharing(&self, contents: [Option<u64>; 2]) -> k::matmul::Sharing<'_> {
        k::matmul::Sharing {
            textures: &self.textures,
            contents,
        }
    }

    /// A dot_general's operands as its matmul reads them: each transposed into a scratch slot
    /// first where its plan says so (those copies are the returned dispatches). With them, what
    /// each holds for texture sharing: the value it is, which nothing writes while it is read (a
    /// program writes each value once, and a slot again only once its value is dead); none for
    /// scratch, which the next transpose overwrites.
    async fn dot_operands(
        &self,
        ins: &Instr,
        sc: &Scratch,
    ) -> Result<(Vec<Dispatch>, [&GpuBuffer; 2], [Option<u64>; 2]), ExecError> {
        let p = sc.dot.as_ref().expect("slot planning plans every dot_general");
        let mut ds = vec![];
        let mut ops = [self.buf(ins.inputs[0]), self.buf(ins.inputs[1])];
        let mut contents = [0, 1].map(|k| Some(ins.inputs[k].index() as u64));
        for (k, (perm, slot)) in [(&p.lhs_perm, sc.lhs), (&p.rhs_perm, sc.rhs)].into_iter().enumerate() {
            if let (Some(perm), Some(s)) = (perm, slot) {
                let c = plan_transpose(self.program.shape(ins.inputs[k]), perm);
                let local = self.program.info(ins.inputs[k]).numel();
                ds.push(self.copy(ops[k], &self.slots[s], &c, (local, local)).await?);
                ops[k] = &self.slots[s];
                contents[k] = None;
            }
        }
        Ok((ds, ops, contents))
    }

    /// The dispatches of the fused pair that instruction `i` starts (see fuse.rs).
    /// Layer norm instruction `ln` over `x`: its own input, or with `residual` the first addend
    /// of the add fused in front (fuse.rs's AddLayerNorm), whose sum is `ln`'s input.
    async fn layer_norm(
        &self,
        ln: &Instr,
        x: &GpuBuffer,
        residual: Option<k::layernorm::Residual<'_>>,
    ) -> Result<Dispatch, ExecError> {
        let devices = self.program.devices();
        let info = self.program.info(ln.inputs[0]);
        let c = info.shape.last().copied().unwrap_or(1).max(1);
        let s = k::layernorm::LayerNormShape {
            rows: devices * info.numel() / c,
            c,
            devices,
        };
        let b = k::layernorm::ForwardBuffers {
            x,
            gamma: self.buf(ln.inputs[1]),
            beta: self.buf(ln.inputs[2]),
            out: self.buf(ln.outputs[0]),
            mean: self.buf(ln.outputs[1]),
            rstd: self.buf(ln.outputs[2]),
            residual,
        };
        Ok(k::layernorm::forward(self.ctx, &b, s, None).await?)
    }

    async fn fused(&self, i: usize, f: Fusion, sc: &Scratch) -> Result<Vec<Dispatch>, ExecError> {
        let ctx = self.ctx;
        let prog = self.program;
        let (first, second) = (&prog.instrs[i], &prog.instrs[i + 1]);
        let devices = prog.devices();
        let x = |k: usize| self.buf(first.inputs[k]);
        let out = self.buf(second.outputs[0]);
        let numel = |k: usize| prog.info(first.inputs[k]).numel();
        let shape = || k::fused::FusedShape {
            n: devices * numel(0),
            nb: numel(1),
            devices,
        };
        Ok(match f {
            Fusion::DotTransposed => {
                let p = sc.dot.as_ref().expect("slot planning plans every dot_general");
                let (mut ds, [a, b], [ca, cb]) = self.dot_operands(first, sc).await?;
                let mut t = swapped(&p.shape);
                t.batch *= devices;
                let v = self.matmul_variant(&t);
                let ops = k::matmul::Operands {
                    a: b,
                    b: a,
                    bias: None,
                    c: out,
                };
                ds.extend(k::matmul::matmul_shared(ctx, &t, ops, v, Some(self.sharing([cb, ca]))).await?);
                ds
            }
            // One product per device (fuse.rs): each device's item adds its own device's bias.
            Fusion::DotBias { bias } => self.dot(first, sc, Some(second.inputs[bias]), out).await?,
            Fusion::BiasGelu => {
                let pre = self.buf(first.outputs[0]);
                vec![k::fused::bias_gelu(ctx, x(0), x(1), pre, out, shape()).await?]
            }
            Fusion::BiasResidual { residual } => {
                let r = self.buf(second.inputs[residual]);
                vec![k::fused::bias_residual(ctx, x(0), x(1), r, out, shape()).await?]
            }
            Fusion::DropoutResidual { residual } => {
                let Op::Dropout { rate } = first.op else {
                    unreachable!("fuse.rs pairs dropout only")
                };
                let r = self.buf(second.inputs[residual]);
                vec![k::fused::dropout_residual(ctx, x(0), x(1), r, out, shape().n, rate).await?]
            }
            Fusion::AddLayerNorm => {
                let residual = k::layernorm::Residual {
                    res: x(1),
                    sum: self.buf(first.outputs[0]),
                };
                vec![self.layer_norm(second, x(0), Some(residual)).await?]
            }
            // Each part copied straight from the transpose's operand.
            Fusion::TransposeSplit => self.split(i + 1, x(0)).await?,
            // Each part written straight to its place in the transposed output.
            Fusion::ConcatTransposed => self.concat(i, out).await?,
        })
    }

    /// Split `i` (its transpose fused in, if fuse.rs pairs them) from `src`: one copy into its
    /// parts' buffer where they are parts of one, else one copy per part.
    async fn split(&self, i: usize, src: &GpuBuffer) -> Result<Vec<Dispatch>, ExecError> {
        let outputs = &self.program.instrs[i].outputs;
        if let Some(g) = self.parts.group_of(outputs) {
            let c = one_copy(&part_copies(self.program, self.fusion, i, self.parts.groups[g].stride));
            let c = c.expect("parts.rs groups only parts one copy moves");
            return Ok(vec![k::copy::strided(self.ctx, src, &self.part_ranges[g], &c).await?]);
        }
        let mut ds = vec![];
        for (c, part) in part_copies(self.program, self.fusion, i, 0).iter().zip(outputs) {
            ds.push(k::copy::strided(self.ctx, src, self.buf(*part), c).await?);
        }
        Ok(ds)
    }

    /// Concat `i` (a transpose after it fused in, if fuse.rs pairs them) into `dst`: one copy
    /// from its parts' buffer where its operands are parts of one, else one copy per operand.
    async fn concat(&self, i: usize, dst: &GpuBuffer) -> Result<Vec<Dispatch>, ExecError> {
        let inputs = &self.program.instrs[i].inputs;
        if let Some(g) = self.parts.group_of(inputs) {
            let c = one_copy(&part_copies(self.program, self.fusion, i, self.parts.groups[g].stride));
            let c = c.expect("parts.rs groups only parts one copy moves");
            return Ok(vec![k::copy::strided(self.ctx, &self.part_ranges[g], dst, &c).await?]);
        }
        let mut ds = vec![];
        for (c, part) in part_copies(self.program, self.fusion, i, 0).iter().zip(inputs) {
            ds.push(k::copy::strided(self.ctx, self.buf(*part), dst, c).await?);
        }
        Ok(ds)
    }

    /// One collective over all devices' blocks (`local` is the operand's local shape).
    async fn collective(
        &self,
        mesh: &Mesh,
        op: &Op,
        x: &GpuBuffer,
        y: &GpuBuffer,
        local: &[usize],
    ) -> Result<Dispatch, ExecError> {
        use k::collectives as c;
        let ctx = self.ctx;
        Ok(match op {
            Op::Psum { axes, .. } => {
                let axes = strs(axes);
                c::psum(
                    ctx,
                    &CollectiveArgs {
                        mesh,
                        axes: &axes,
                        local_shape: local,
                    },
                    x,
                    y,
                )
                .await?
            }
            Op::AllGather { axes, axis, tiled, .. } => {
                let axes = strs(axes);
                let a = CollectiveArgs {
                    mesh,
                    axes: &axes,
                    local_shape: local,
                };
                c::all_gather(ctx, &a, x, y, *axis, *tiled).await?
            }
            Op::PsumScatter {
                axes,
                scatter_dimension,
                tiled,
                ..
            } => {
                let axes = strs(axes);
                let a = CollectiveArgs {
                    mesh,
                    axes: &axes,
                    local_shape: local,
                };
                c::psum_scatter(ctx, &a, x, y, *scatter_dimension, *tiled).await?
            }
            Op::Ppermute { axis, perm } => {
                let axes = [axis.as_str()];
                let a = CollectiveArgs {
                    mesh,
                    axes: &axes,
                    local_shape: local,
                };
                c::ppermute(ctx, &a, x, y, perm).await?
            }
            Op::AllToAll {
                axes,
                split_axis,
                concat_axis,
                ..
            } => {
                let axes = strs(axes);
                let a = CollectiveArgs {
                    mesh,
                    axes: &axes,
                    local_shape: local,
                };
                c::all_to_all(ctx, &a, x, y, *split_axis, *concat_axis, true).await?
            }
            Op::FoldInAxisIndex { axes, stride, offset } => {
                let data: Vec<u32> = (0..mesh.devices())
                    .map(|d| {
                        mesh.axes_index(d, &strs(axes))
                            .map(|i| (i as u32).wrapping_mul(*stride).wrapping_add(*offset))
                    })
                    .collect::<Result<_, _>>()
                    .map_err(|e| ExecError::Input(e.to_string()))?;
                k::random::fold_in(ctx, x, y, &data, KeyMode::PerDevice).await?
            }
            _ => unreachable!("not a collective"),
        })
    }
}
