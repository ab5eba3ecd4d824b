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
        let fits = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, &s)| self.caps[s] >= n)
            .min_by_key(|(_, &s)| self.caps[s]);
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
        // Every value holds all devices' local blocks: `[device, local...]`.
        let devices = program.devices();
        let numel = |v: crate::ir::ValueId| devices * program.info(v).numel();
        let mut plan = SlotPlan::default();
        let mut value_slot = vec![NONE; program.values.len()];
        for (v, _) in &program.inputs {
            value_slot[v.index()] = plan.new_slot(numel(*v), true);
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
                            Op::ReduceSum { axes } => {
                                (plan_reduce(program.shape(ins.inputs[0]), axes).perm.is_some(), false)
                            }
                            _ => unreachable!(),
                        };
                        if lhs_perm {
                            sc.lhs = Some(plan.take(numel(ins.inputs[0])));
                        }
                        if rhs_perm {
                            sc.rhs = Some(plan.take(numel(ins.inputs[1])));
                        }
                    }
                    for o in &ins.outputs {
                        value_slot[o.index()] = plan.take(numel(*o));
                    }
                    for s in [sc.lhs, sc.rhs].into_iter().flatten() {
                        plan.release(s);
                    }
                }
            }
            scratch.push(sc);
            // Dead after this instruction: its operands' last reads, and outputs nobody reads.
            let mut dead: Vec<usize> = ins
                .inputs
                .iter()
                .filter(|v| last_use[v.index()] == Some(i))
                .map(|v| v.index())
                .collect();
            dead.sort();
            dead.dedup();
            dead.extend(
                ins.outputs
                    .iter()
                    .filter(|o| last_use[o.index()].is_none())
                    .map(|o| o.index()),
            );
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
            exec.dispatch_instr.extend(std::iter::repeat_n(i, ds.len()));
            exec.dispatches.extend(ds);
        }
        ctx.check()?;
        Ok(exec)
    }

    fn buf(&self, v: crate::ir::ValueId) -> &GpuBuffer {
        &self.slots[self.value_slot[v.index()]]
    }

    /// A strided copy of every device's block at once: the plan gains a leading device
    /// dimension stepping by each side's block size.
    async fn copy(
        ctx: &GpuContext,
        src: &GpuBuffer,
        dst: &GpuBuffer,
        p: &CopyPlan,
        devices: usize,
        blocks: (usize, usize),
    ) -> Result<Dispatch, ExecError> {
        let shape: Vec<usize> = std::iter::once(devices).chain(p.shape.iter().copied()).collect();
        let src_strides: Vec<usize> = std::iter::once(blocks.0).chain(p.src_strides.iter().copied()).collect();
        let dst_strides: Vec<usize> = std::iter::once(blocks.1).chain(p.dst_strides.iter().copied()).collect();
        Ok(k::copy::strided(
            ctx,
            src,
            dst,
            &shape,
            p.src_offset,
            &src_strides,
            p.dst_offset,
            &dst_strides,
            false,
        )
        .await?)
    }

    /// The dispatches of instruction `i`.
    async fn lower(&self, ctx: &GpuContext, i: usize, sc: &Scratch) -> Result<Vec<Dispatch>, ExecError> {
        let ins = self.program.instrs[i].clone();
        let prog = &self.program;
        let x = |k: usize| self.buf(ins.inputs[k]);
        let y = |k: usize| self.buf(ins.outputs[k]);
        let shape = |k: usize| prog.shape(ins.inputs[k]).to_vec();
        let devices = prog.devices();
        let n_in = |k: usize| devices * prog.info(ins.inputs[k]).numel();
        let n_out = devices * ins.outputs.first().map_or(0, |o| prog.info(*o).numel());
        // Local sizes; kernels get all devices' counts (`devices * ...`).
        let local_in = |k: usize| prog.info(ins.inputs[k]).numel();
        let local_out = |k: usize| prog.info(ins.outputs[k]).numel();
        let mesh = prog.mesh.clone();
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
                one(Self::copy(
                    ctx,
                    x(0),
                    y(0),
                    &plan_transpose(&shape(0), perm),
                    devices,
                    (local_in(0), local_out(0)),
                )
                .await?)
            }
            Op::BroadcastInDim { shape: to, dims } => one(Self::copy(
                ctx,
                x(0),
                y(0),
                &plan_broadcast(&shape(0), to, dims),
                devices,
                (local_in(0), local_out(0)),
            )
            .await?),
            Op::Split { axis, sizes } => {
                let mut ds = vec![];
                let mut start = 0;
                for (k, &len) in sizes.iter().enumerate() {
                    let plan = plan_slice(&shape(0), *axis, start, len, false);
                    ds.push(Self::copy(ctx, x(0), y(k), &plan, devices, (local_in(0), local_out(k))).await?);
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
                    let plan = plan_slice(&whole, *axis, start, len, true);
                    ds.push(Self::copy(ctx, x(k), y(0), &plan, devices, (local_in(k), local_out(0))).await?);
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
                one(k::elementwise::binary_devices(
                    ctx,
                    kind,
                    x(0),
                    x(1),
                    y(0),
                    n_in(0),
                    local_in(1),
                    1.0,
                    beta,
                    devices,
                )
                .await?)
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
                let p = plan_dot(
                    &shape(0),
                    &shape(1),
                    lhs_contract,
                    rhs_contract,
                    lhs_batch,
                    rhs_batch,
                    *alpha,
                );
                let mut ds = vec![];
                let mut a = x(0);
                let mut b = x(1);
                if let (Some(perm), Some(s)) = (&p.lhs_perm, sc.lhs) {
                    let plan = plan_transpose(&shape(0), perm);
                    ds.push(Self::copy(ctx, a, &self.slots[s], &plan, devices, (local_in(0), local_in(0))).await?);
                    a = &self.slots[s];
                }
                if let (Some(perm), Some(s)) = (&p.rhs_perm, sc.rhs) {
                    let plan = plan_transpose(&shape(1), perm);
                    ds.push(Self::copy(ctx, b, &self.slots[s], &plan, devices, (local_in(1), local_in(1))).await?);
                    b = &self.slots[s];
                }
                // Every device's batch of matrices is contiguous: devices multiply the batch.
                let mut shape = p.shape;
                shape.batch *= devices;
                ds.extend(k::matmul::matmul(ctx, &shape, a, b, None, y(0)).await?);
                ds
            }
            Op::ReduceSum { axes } => {
                let p = plan_reduce(&shape(0), axes);
                let mut ds = vec![];
                let mut src = x(0);
                if let (Some(perm), Some(s)) = (&p.perm, sc.lhs) {
                    let plan = plan_transpose(&shape(0), perm);
                    ds.push(Self::copy(ctx, src, &self.slots[s], &plan, devices, (local_in(0), local_in(0))).await?);
                    src = &self.slots[s];
                }
                ds.push(k::reduce::sum_axis(ctx, src, y(0), devices * p.outer, p.n, p.inner).await?);
                ds
            }
            Op::Gelu => one(k::gelu::forward(ctx, x(0), y(0), n_in(0)).await?),
            Op::GeluGrad => one(k::gelu::backward(ctx, x(0), x(1), y(0), n_in(0)).await?),
            Op::LayerNorm => {
                let c = *shape(0).last().unwrap();
                one(
                    k::layernorm::forward_devices(ctx, x(0), x(1), x(2), y(0), y(1), y(2), n_in(0) / c, c, devices)
                        .await?,
                )
            }
            Op::LayerNormGrad => {
                let c = *shape(1).last().unwrap();
                k::layernorm::backward_devices(
                    ctx,
                    x(0),
                    x(1),
                    x(2),
                    x(3),
                    x(4),
                    y(0),
                    y(1),
                    y(2),
                    n_in(1) / c,
                    c,
                    devices,
                )
                .await?
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
                one(k::embedding::forward_devices(ctx, x(0), x(1), y(0), n_in(1), v, c, devices).await?)
            }
            Op::ScatterAdd { rows } => {
                let c = *shape(0).last().unwrap();
                one(k::embedding::backward_devices(ctx, x(0), x(1), y(0), n_in(1), *rows, c, devices).await?)
            }
            // Keys are values like any other: one per device (`[device, 2]`).
            Op::FoldIn { data } => {
                one(k::random::fold_in(ctx, x(0), y(0), &vec![*data; devices], k::random::KeyMode::PerDevice).await?)
            }
            Op::RandomBits { shape: s, layout } => {
                // Each device draws the local-shape array from its own key (shard_map's
                // semantics; with equal keys the draws repeat across devices).
                let blocks = vec![Block::full(s); devices];
                one(k::random::random_bits(ctx, x(0), y(0), *layout, &blocks, k::random::KeyMode::PerDevice).await?)
            }
            Op::RandomBitsBlock {
                global, spec, layout, ..
            } => {
                let mesh = mesh
                    .as_ref()
                    .ok_or_else(|| unsupported("a per-device block needs a program with a mesh"))?;
                let err = |e: String| ExecError::Input(e);
                let sharding =
                    crate::sharding::NamedSharding::new(mesh.clone(), spec.clone()).map_err(|e| err(e.to_string()))?;
                let mut blocks = Vec::with_capacity(devices);
                for d in 0..devices {
                    let ranges = sharding.device_indices(d, global).map_err(|e| err(e.to_string()))?;
                    blocks.push(Block::new(global, &ranges).map_err(|e| err(e.to_string()))?);
                }
                one(k::random::random_bits(ctx, x(0), y(0), *layout, &blocks, k::random::KeyMode::PerDevice).await?)
            }
            Op::ShardSlice { dim, axes, parts } => {
                let mesh = mesh
                    .as_ref()
                    .ok_or_else(|| unsupported("a per-device slice needs a program with a mesh"))?;
                one(Self::shard_slice(ctx, mesh, x(0), y(0), &shape(0), *dim, axes, *parts).await?)
            }
            Op::Dropout { rate } => one(k::dropout::apply(ctx, x(0), x(1), y(0), n_in(0), *rate).await?),
            // A combined psum: one psum dispatch per operand (the simulated devices share one
            // GPU, so fusing the buffers would save nothing; the profile counts one collective).
            Op::Psum { .. } => {
                let mesh = mesh
                    .as_ref()
                    .ok_or_else(|| unsupported("collectives need a program with a mesh"))?;
                let mut ds = Vec::with_capacity(ins.inputs.len());
                for k in 0..ins.inputs.len() {
                    ds.push(Self::collective(ctx, mesh, &ins.op, x(k), y(k), &shape(k)).await?);
                }
                ds
            }
            Op::AllGather { .. }
            | Op::PsumScatter { .. }
            | Op::Ppermute { .. }
            | Op::AllToAll { .. }
            | Op::FoldInAxisIndex { .. } => {
                let mesh = mesh
                    .as_ref()
                    .ok_or_else(|| unsupported("collectives need a program with a mesh"))?;
                one(Self::collective(ctx, mesh, &ins.op, x(0), y(0), &shape(0)).await?)
            }
            Op::SgdUpdate { .. } => {
                let hyper = &self.sgd_hyper.as_ref().expect("made in new").0;
                one(k::optimizer::sgd(ctx, x(0), x(1), hyper, n_in(0)).await?)
            }
            Op::AdamWUpdate { b1, b2, eps, wd, .. } => {
                if (*b1, *b2, *eps) != (k::optimizer::ADAMW_B1, k::optimizer::ADAMW_B2, k::optimizer::ADAMW_EPS) {
                    return Err(unsupported("the GPU AdamW uses MODEL.md's b1, b2 and eps"));
                }
                let hyper = &self.adamw_hyper.as_ref().expect("made in new").0;
                one(k::optimizer::adamw(ctx, x(0), x(1), x(2), x(3), hyper, n_in(0), *wd).await?)
            }
        })
    }

    /// Every device keeps chunk `axes_index(axes)` of dimension `dim` of its block: one strided
    /// copy over `[mesh axes..., outer, chunk, inner]`, where the chunk offset is linear in the
    /// device's mesh coordinates.
    #[allow(clippy::too_many_arguments)]
    async fn shard_slice(
        ctx: &GpuContext,
        mesh: &crate::sharding::Mesh,
        x: &GpuBuffer,
        y: &GpuBuffer,
        local: &[usize],
        dim: usize,
        axes: &[String],
        parts: usize,
    ) -> Result<Dispatch, ExecError> {
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
                    .map(|a| mesh.axis_size(a).unwrap_or(1))
                    .product::<usize>(),
                None => 0,
            };
            src_strides.push(src_block * later + weight * len * inner);
            dst_strides.push(dst_block * later);
        }
        shape.extend([outer, len, inner]);
        src_strides.extend([n * inner, inner, 1]);
        dst_strides.extend([len * inner, inner, 1]);
        Ok(k::copy::strided(ctx, x, y, &shape, 0, &src_strides, 0, &dst_strides, false).await?)
    }

    /// One collective over all devices' blocks (`local` is the operand's local shape).
    async fn collective(
        ctx: &GpuContext,
        mesh: &crate::sharding::Mesh,
        op: &Op,
        x: &GpuBuffer,
        y: &GpuBuffer,
        local: &[usize],
    ) -> Result<Dispatch, ExecError> {
        use k::collectives as c;
        fn strs(a: &[String]) -> Vec<&str> {
            a.iter().map(String::as_str).collect()
        }
        Ok(match op {
            Op::Psum { axes, .. } => c::psum(ctx, mesh, &strs(axes), x, y, local).await?,
            Op::AllGather { axes, axis, tiled, .. } => {
                c::all_gather(ctx, mesh, &strs(axes), x, y, local, *axis, *tiled).await?
            }
            Op::PsumScatter {
                axes,
                scatter_dimension,
                tiled,
                ..
            } => c::psum_scatter(ctx, mesh, &strs(axes), x, y, local, *scatter_dimension, *tiled).await?,
            Op::Ppermute { axis, perm } => c::ppermute(ctx, mesh, &[axis.as_str()], x, y, local, perm).await?,
            Op::AllToAll {
                axes,
                split_axis,
                concat_axis,
                ..
            } => c::all_to_all(ctx, mesh, &strs(axes), x, y, local, *split_axis, *concat_axis, true).await?,
            Op::FoldInAxisIndex { axes } => {
                let data: Vec<u32> = (0..mesh.devices())
                    .map(|d| mesh.axes_index(d, &strs(axes)).map(|i| i as u32))
                    .collect::<Result<_, _>>()
                    .map_err(|e| ExecError::Input(e.to_string()))?;
                k::random::fold_in(ctx, x, y, &data, k::random::KeyMode::PerDevice).await?
            }
            _ => unreachable!("not a collective"),
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
        let n = self.program.devices() * info.numel();
        if t.len() != n {
            return Err(ExecError::Input(format!(
                "input {} needs {n} elements (all devices' blocks), got {}",
                info.name.clone().unwrap_or_default(),
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
        let n = self.program.devices() * info.numel();
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
        d.truncate(self.program.devices() * self.program.info(v).numel());
        Ok(d)
    }
}
