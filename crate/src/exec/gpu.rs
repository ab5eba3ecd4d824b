use super::lowering::{plan_broadcast, plan_dot, plan_reduce, plan_slice, plan_transpose, CopyPlan};
use super::{ExecError, Tensor};
use crate::gpu::{Dispatch, GpuBuffer, GpuContext};
use crate::ir::{DType, Op, Program, Role};
use crate::kernels as k;
use crate::rng::Block;

const NONE: usize = usize::MAX;

/// Runs one program on the GPU, step after step.
///
/// Planning (once): every value gets a buffer *slot*; slots are reused as soon as the
/// values in them are dead (liveness), reshapes alias their operand, and optimizer
/// updates write into their parameter's slot (donation). Then every instruction becomes
/// one or more [`Dispatch`]es, built once. A step writes the fed inputs and replays the
/// dispatches in one submission: no pipeline, layout or bind group is made per step.
pub struct GpuExecutor {
    program: Program,
    slots: Vec<GpuBuffer>,
    value_slot: Vec<usize>,
    dispatches: Vec<Dispatch>,
    /// The instruction each dispatch belongs to (per-op profiles).
    dispatch_instr: Vec<usize>,
    sgd_hyper: Option<(GpuBuffer, f32)>,
    adamw_hyper: Option<(GpuBuffer, f32)>,
    peak_bytes: u64,
}

/// Slot assignment by liveness: capacities grow while planning; buffers are made after.
#[derive(Default)]
struct SlotPlan {
    caps: Vec<usize>,
    refs: Vec<usize>,
    pinned: Vec<bool>,
    free: Vec<usize>,
}

impl SlotPlan {
    fn new_slot(&mut self, n: usize, pinned: bool) -> usize {
        self.caps.push(n);
        self.refs.push(1);
        self.pinned.push(pinned);
        self.caps.len() - 1
    }

    /// Best fit among free slots (the smallest that holds `n`, else the largest, grown).
    fn take(&mut self, n: usize) -> usize {
        let fits = self.free.iter().enumerate().filter(|(_, &s)| self.caps[s] >= n).min_by_key(|(_, &s)| self.caps[s]);
        let pick = fits.or_else(|| self.free.iter().enumerate().max_by_key(|(_, &s)| self.caps[s]));
        match pick {
            Some((i, &s)) => {
                self.free.swap_remove(i);
                self.caps[s] = self.caps[s].max(n);
                self.refs[s] = 1;
                s
            }
            None => self.new_slot(n, false),
        }
    }

    fn retain(&mut self, s: usize) {
        self.refs[s] += 1;
    }

    fn release(&mut self, s: usize) {
        self.refs[s] -= 1;
        if self.refs[s] == 0 && !self.pinned[s] {
            self.free.push(s);
        }
    }
}

/// Extra buffers one instruction needs besides its operands (transposed copies).
#[derive(Default)]
struct Scratch {
    lhs: Option<usize>,
    rhs: Option<usize>,
}

impl GpuExecutor {
    pub async fn new(ctx: &GpuContext, program: Program) -> Result<Self, ExecError> {
        let last_use = program.last_uses();
        let mut plan = SlotPlan::default();
        let mut value_slot = vec![NONE; program.values.len()];
        for (v, _) in &program.inputs {
            value_slot[v.index()] = plan.new_slot(program.info(*v).numel(), true);
        }
        let mut scratch: Vec<Scratch> = Vec::with_capacity(program.instrs.len());
        for (i, ins) in program.instrs.iter().enumerate() {
            let mut sc = Scratch::default();
            match &ins.op {
                Op::Reshape { .. } | Op::Pvary { .. } => {
                    let s = value_slot[ins.inputs[0].index()];
                    plan.retain(s);
                    value_slot[ins.outputs[0].index()] = s;
                }
                Op::SgdUpdate { .. } | Op::AdamWUpdate { .. } => {
                    // In place: p' in p's slot (and m', v' in m's and v's).
                    let srcs: &[usize] = if ins.outputs.len() == 1 { &[0] } else { &[0, 2, 3] };
                    for (o, &src) in ins.outputs.iter().zip(srcs) {
                        let s = value_slot[ins.inputs[src].index()];
                        plan.retain(s);
                        value_slot[o.index()] = s;
                    }
                }
                op => {
                    if let Op::DotGeneral { .. } | Op::ReduceSum { .. } = op {
                        let (lhs_perm, rhs_perm) = match op {
                            Op::DotGeneral {
                                lhs_contract,
                                rhs_contract,
                                lhs_batch,
                                rhs_batch,
                                alpha,
                            } => {
                                let p = plan_dot(
                                    program.shape(ins.inputs[0]),
                                    program.shape(ins.inputs[1]),
                                    lhs_contract,
                                    rhs_contract,
                                    lhs_batch,
                                    rhs_batch,
                                    *alpha,
                                );
                                (p.lhs_perm.is_some(), p.rhs_perm.is_some())
                            }
                            Op::ReduceSum { axes } => (plan_reduce(program.shape(ins.inputs[0]), axes).perm.is_some(), false),
                            _ => unreachable!(),
                        };
                        if lhs_perm {
                            sc.lhs = Some(plan.take(program.info(ins.inputs[0]).numel()));
                        }
                        if rhs_perm {
                            sc.rhs = Some(plan.take(program.info(ins.inputs[1]).numel()));
                        }
                    }
                    for o in &ins.outputs {
                        value_slot[o.index()] = plan.take(program.info(*o).numel());
                    }
                    for s in [sc.lhs, sc.rhs].into_iter().flatten() {
                        plan.release(s);
                    }
                }
            }
            scratch.push(sc);
            // Dead after this instruction: its operands' last reads, and outputs nobody reads.
            let mut dead: Vec<usize> = ins.inputs.iter().filter(|v| last_use[v.index()] == Some(i)).map(|v| v.index()).collect();
            dead.sort();
            dead.dedup();
            dead.extend(ins.outputs.iter().filter(|o| last_use[o.index()].is_none()).map(|o| o.index()));
            for v in dead {
                plan.release(value_slot[v]);
            }
        }

        let mut slots = Vec::with_capacity(plan.caps.len());
        for (s, &cap) in plan.caps.iter().enumerate() {
            let name = (0..program.values.len())
                .find(|&v| value_slot[v] == s)
                .and_then(|v| program.values[v].name.clone())
                .unwrap_or_else(|| format!("slot{s}"));
            slots.push(ctx.zeros(&name, cap)?);
        }
        let [sgd_hyper, adamw_hyper] = Self::make_hyper(ctx, &program)?;
        let peak_bytes = slots.iter().map(|b| b.bytes()).sum();

        let mut exec = Self {
            program,
            slots,
            value_slot,
            dispatches: vec![],
            dispatch_instr: vec![],
            sgd_hyper,
            adamw_hyper,
            peak_bytes,
        };
        for i in 0..exec.program.instrs.len() {
            let ds = exec.lower(ctx, i, &scratch[i]).await?;
            exec.dispatch_instr.extend(std::iter::repeat(i).take(ds.len()));
            exec.dispatches.extend(ds);
        }
        ctx.check()?;
        Ok(exec)
    }

    fn buf(&self, v: crate::ir::ValueId) -> &GpuBuffer {
        &self.slots[self.value_slot[v.index()]]
    }

    async fn copy(ctx: &GpuContext, src: &GpuBuffer, dst: &GpuBuffer, p: &CopyPlan) -> Result<Dispatch, ExecError> {
        Ok(k::copy::strided(ctx, src, dst, &p.shape, p.src_offset, &p.src_strides, p.dst_offset, &p.dst_strides, false).await?)
    }

    /// The dispatches of instruction `i`.
    async fn lower(&self, ctx: &GpuContext, i: usize, sc: &Scratch) -> Result<Vec<Dispatch>, ExecError> {
        let ins = self.program.instrs[i].clone();
        let prog = &self.program;
        let x = |k: usize| self.buf(ins.inputs[k]);
        let y = |k: usize| self.buf(ins.outputs[k]);
        let shape = |k: usize| prog.shape(ins.inputs[k]).to_vec();
        let n_in = |k: usize| prog.info(ins.inputs[k]).numel();
        let n_out = ins.outputs.first().map_or(0, |o| prog.info(*o).numel());
        let unsupported = |why: &str| ExecError::Unsupported {
            op: ins.op.name().into(),
            executor: "GPU",
            why: why.into(),
        };
        let one = |d: Dispatch| vec![d];
        Ok(match &ins.op {
            Op::Reshape { .. } | Op::Pvary { .. } => vec![],
            Op::Transpose { perm } => {
                if prog.info(ins.inputs[0]).dtype != DType::F32 {
                    return Err(unsupported("only f32 arrays are transposed on the GPU"));
                }
                one(Self::copy(ctx, x(0), y(0), &plan_transpose(&shape(0), perm)).await?)
            }
            Op::BroadcastInDim { shape: to, dims } => {
                one(Self::copy(ctx, x(0), y(0), &plan_broadcast(&shape(0), to, dims)).await?)
            }
            Op::Split { axis, sizes } => {
                let mut ds = vec![];
                let mut start = 0;
                for (k, &len) in sizes.iter().enumerate() {
                    ds.push(Self::copy(ctx, x(0), y(k), &plan_slice(&shape(0), *axis, start, len, false)).await?);
                    start += len;
                }
                ds
            }
            Op::Concat { axis } => {
                let whole = prog.shape(ins.outputs[0]).to_vec();
                let mut ds = vec![];
                let mut start = 0;
                for k in 0..ins.inputs.len() {
                    let len = shape(k)[*axis];
                    ds.push(Self::copy(ctx, x(k), y(0), &plan_slice(&whole, *axis, start, len, true)).await?);
                    start += len;
                }
                ds
            }
            Op::Add | Op::Sub | Op::Mul => {
                let (kind, beta) = match ins.op {
                    Op::Add => (k::elementwise::Binary::Add, 1.0),
                    Op::Sub => (k::elementwise::Binary::Add, -1.0),
                    _ => (k::elementwise::Binary::Mul, 0.0),
                };
                one(k::elementwise::binary(ctx, kind, x(0), x(1), y(0), n_in(0), n_in(1), 1.0, beta).await?)
            }
            Op::Scale { alpha } => one(k::elementwise::scale(ctx, x(0), y(0), n_in(0), *alpha, 0.0).await?),
            Op::Full { value, .. } => one(k::elementwise::fill(ctx, y(0), n_out, *value).await?),
            Op::DotGeneral {
                lhs_contract,
                rhs_contract,
                lhs_batch,
                rhs_batch,
                alpha,
            } => {
                let p = plan_dot(&shape(0), &shape(1), lhs_contract, rhs_contract, lhs_batch, rhs_batch, *alpha);
                let mut ds = vec![];
                let mut a = x(0);
                let mut b = x(1);
                if let (Some(perm), Some(s)) = (&p.lhs_perm, sc.lhs) {
                    ds.push(Self::copy(ctx, a, &self.slots[s], &plan_transpose(&shape(0), perm)).await?);
                    a = &self.slots[s];
                }
                if let (Some(perm), Some(s)) = (&p.rhs_perm, sc.rhs) {
                    ds.push(Self::copy(ctx, b, &self.slots[s], &plan_transpose(&shape(1), perm)).await?);
                    b = &self.slots[s];
                }
                ds.extend(k::matmul::matmul(ctx, &p.shape, a, b, None, y(0)).await?);
                ds
            }
            Op::ReduceSum { axes } => {
                let p = plan_reduce(&shape(0), axes);
                let mut ds = vec![];
                let mut src = x(0);
                if let (Some(perm), Some(s)) = (&p.perm, sc.lhs) {
                    ds.push(Self::copy(ctx, src, &self.slots[s], &plan_transpose(&shape(0), perm)).await?);
                    src = &self.slots[s];
                }
                ds.push(k::reduce::sum_axis(ctx, src, y(0), p.outer, p.n, p.inner).await?);
                ds
            }
            Op::Gelu => one(k::gelu::forward(ctx, x(0), y(0), n_in(0)).await?),
            Op::GeluGrad => one(k::gelu::backward(ctx, x(0), x(1), y(0), n_in(0)).await?),
            Op::LayerNorm => {
                let c = *shape(0).last().unwrap();
                one(k::layernorm::forward(ctx, x(0), x(1), x(2), y(0), y(1), y(2), n_in(0) / c, c).await?)
            }
            Op::LayerNormGrad => {
                let c = *shape(1).last().unwrap();
                k::layernorm::backward(ctx, x(0), x(1), x(2), x(3), x(4), y(0), y(1), y(2), n_in(1) / c, c).await?
            }
            Op::SoftmaxCausal => {
                let t = *shape(0).last().unwrap();
                one(k::softmax::causal_forward(ctx, x(0), y(0), n_in(0) / t, t).await?)
            }
            Op::SoftmaxCausalGrad => {
                let t = *shape(0).last().unwrap();
                one(k::softmax::causal_backward(ctx, x(0), x(1), y(0), n_in(0) / t, t).await?)
            }
            Op::CrossEntropy => {
                let v = *shape(0).last().unwrap();
                one(k::crossentropy::forward(ctx, x(0), x(1), y(0), n_in(0) / v, v).await?)
            }
            Op::CrossEntropyGrad => {
                let v = *shape(0).last().unwrap();
                one(k::crossentropy::backward(ctx, x(0), x(1), x(2), y(0), n_in(0) / v, v).await?)
            }
            Op::Gather => {
                let (v, c) = (shape(0)[0], shape(0)[1]);
                one(k::embedding::forward_rows(ctx, x(0), x(1), y(0), n_in(1), v, c).await?)
            }
            Op::ScatterAdd { rows } => {
                let c = *shape(0).last().unwrap();
                one(k::embedding::backward(ctx, x(0), x(1), y(0), n_in(1), *rows, c).await?)
            }
            Op::FoldIn { data } => one(k::random::fold_in(ctx, x(0), y(0), &[*data], k::random::KeyMode::Shared).await?),
            Op::RandomBits { shape: s, layout } => {
                let block = Block::full(s);
                one(k::random::random_bits(ctx, x(0), y(0), *layout, &[block], k::random::KeyMode::Shared).await?)
            }
            Op::Dropout { rate } => one(k::dropout::apply(ctx, x(0), x(1), y(0), n_in(0), *rate).await?),
            Op::Psum { .. }
            | Op::AllGather { .. }
            | Op::PsumScatter { .. }
            | Op::Ppermute { .. }
            | Op::AllToAll { .. }
            | Op::FoldInAxisIndex { .. } => return Err(unsupported("collectives need a program with a mesh")),
            Op::SgdUpdate { lr } => {
                let _ = lr;
                let hyper = &self.sgd_hyper.as_ref().expect("made in new").0;
                one(k::optimizer::sgd(ctx, x(0), x(1), hyper, n_in(0)).await?)
            }
            Op::AdamWUpdate { lr, b1, b2, eps, wd } => {
                if (*b1, *b2, *eps) != (k::optimizer::ADAMW_B1, k::optimizer::ADAMW_B2, k::optimizer::ADAMW_EPS) {
                    return Err(unsupported("the GPU AdamW uses MODEL.md's b1, b2 and eps"));
                }
                let _ = lr;
                let hyper = &self.adamw_hyper.as_ref().expect("made in new").0;
                one(k::optimizer::adamw(ctx, x(0), x(1), x(2), x(3), hyper, n_in(0), *wd).await?)
            }
        })
    }

    /// The per-step hyperparameter buffers of the optimizer updates (one per optimizer; all
    /// updates of a program share its learning rate).
    fn make_hyper(ctx: &GpuContext, program: &Program) -> Result<[Option<(GpuBuffer, f32)>; 2], ExecError> {
        let mut out: [Option<(GpuBuffer, f32)>; 2] = [None, None];
        for ins in &program.instrs {
            let (slot, lr, len, name) = match ins.op {
                Op::SgdUpdate { lr } => (0, lr, k::optimizer::SGD_HYPER_LEN, "sgd hyper"),
                Op::AdamWUpdate { lr, .. } => (1, lr, k::optimizer::ADAMW_HYPER_LEN, "adamw hyper"),
                _ => continue,
            };
            match &out[slot] {
                None => out[slot] = Some((ctx.zeros(name, len)?, lr)),
                Some((_, prev)) if *prev != lr => {
                    return Err(ExecError::Unsupported {
                        op: ins.op.name().into(),
                        executor: "GPU",
                        why: "all updates of one program must share a learning rate".into(),
                    })
                }
                Some(_) => {}
            }
        }
        Ok(out)
    }

    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Bytes of every buffer the program holds at once (inputs, params and reused slots).
    pub fn peak_bytes(&self) -> u64 {
        self.peak_bytes
    }

    pub fn dispatch_count(&self) -> usize {
        self.dispatches.len()
    }

    pub fn dispatches(&self) -> &[Dispatch] {
        &self.dispatches
    }

    /// The instruction of each dispatch, for per-op profiles.
    pub fn dispatch_instrs(&self) -> &[usize] {
        &self.dispatch_instr
    }

    /// Writes input `pos` (in `program.inputs` order).
    pub fn write_input(&self, ctx: &GpuContext, pos: usize, t: &Tensor) -> Result<(), ExecError> {
        let (v, _) = &self.program.inputs[pos];
        let info = self.program.info(*v);
        if t.len() != info.numel() {
            return Err(ExecError::Input(format!(
                "input {} needs {} elements, got {}",
                info.name.clone().unwrap_or_default(),
                info.numel(),
                t.len()
            )));
        }
        let buf = self.buf(*v);
        match t {
            Tensor::F32(d) => ctx.write(buf, d),
            Tensor::U32(d) => ctx.write(buf, d),
        }
        Ok(())
    }

    /// Position of the input with `role`.
    pub fn input_position(&self, role: &Role) -> Option<usize> {
        self.program.inputs.iter().position(|(_, r)| r == role)
    }

    /// Sets the per-step optimizer scalars of update number `step` (1-based).
    pub fn set_step(&self, ctx: &GpuContext, step: u64) -> Result<(), ExecError> {
        if let Some((buf, lr)) = &self.sgd_hyper {
            ctx.write(buf, &k::optimizer::sgd_hyper(*lr));
        }
        if let Some((buf, lr)) = &self.adamw_hyper {
            let step = u32::try_from(step).map_err(|_| ExecError::Input("step count past u32".into()))?;
            ctx.write(buf, &k::optimizer::adamw_hyper(*lr, step)?);
        }
        Ok(())
    }

    /// Submits one run of the whole program (does not wait).
    pub fn submit(&self, ctx: &GpuContext) {
        ctx.run(&self.dispatches);
    }

    /// Reads output `pos` (awaits the GPU).
    pub async fn read_output(&self, ctx: &GpuContext, pos: usize) -> Result<Tensor, ExecError> {
        let v = self.program.outputs[pos];
        let info = self.program.info(v);
        let buf = self.buf(v);
        let n = info.numel();
        Ok(match info.dtype {
            DType::F32 => {
                let mut d = ctx.read::<f32>(buf).await?;
                d.truncate(n);
                Tensor::F32(d)
            }
            DType::U32 => {
                let mut d = ctx.read::<u32>(buf).await?;
                d.truncate(n);
                Tensor::U32(d)
            }
        })
    }

    /// Reads input `pos` (e.g. a parameter, updated in place by the step).
    pub async fn read_input(&self, ctx: &GpuContext, pos: usize) -> Result<Vec<f32>, ExecError> {
        let (v, _) = self.program.inputs[pos];
        let mut d = ctx.read::<f32>(self.buf(v)).await?;
        d.truncate(self.program.info(v).numel());
        Ok(d)
    }
}
