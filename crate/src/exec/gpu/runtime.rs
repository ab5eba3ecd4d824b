//! The runtime of the GPU executor: its buffers and dispatches, inputs, outputs and steps.
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use super::consts::{self, Fold};
use super::fuse::{self, Fusion};
use super::lower::{Lowering, MatmulChoice};
use super::parts::Parts;
use super::slots::{self, Scratch};
use super::views::{self, Views};
use crate::exec::{ExecError, Tensor};
use crate::gpu::{Dispatch, GpuBuffer, GpuContext};
use crate::ir::{DType, Op, Program, Role};
use crate::kernels as k;
use crate::kernels::matmul::MatmulShape;

/// Runs one program on the GPU, step after step.
///
/// Planning (once): every value gets a buffer *slot* (`slots.rs`), reused as soon as the
/// values in it are dead. Then every instruction becomes one or more [`Dispatch`]es, built
/// once (`lower.rs`). A step writes the fed inputs and replays the dispatches in one
/// submission: no pipeline, layout or bind group is made per step.
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
    /// What lowering needs again when the dispatches are rebuilt ([`GpuExecutor::retune`]).
    fusion: Vec<Option<Fusion>>,
    /// The transposes folded into fused attention, and the values they leave strided.
    views: Views,
    /// Constants worked out and values nobody reads: what launches nothing or one fill.
    folds: Vec<Fold>,
    /// [`Program::bits_drawn_in_attention`]: random bits fused attention makes in place.
    drawn: Vec<Option<usize>>,
    scratch: Vec<Scratch>,
    /// Values stored as parts of one buffer, and each group's range of it.
    parts: Parts,
    part_ranges: Vec<GpuBuffer>,
    /// The matmuls running a provisional variant ([`MatmulChoice::Provisional`]).
    provisional: Vec<MatmulShape>,
    /// Per value: zeroed on the devices outside its pipeline stages ([`Lowering::zeroed`]).
    zeroed: Vec<bool>,
}

/// Runs `futures` together and returns their outputs in order.
async fn join_in_order<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// The dispatches of a program, the instruction of each, and the matmuls left provisional.
type LoweredDispatches = (Vec<Dispatch>, Vec<usize>, Vec<MatmulShape>);

impl GpuExecutor {
    pub async fn new(ctx: &GpuContext, program: Program) -> Result<Self, ExecError> {
        Self::with_matmuls(ctx, program, MatmulChoice::Tuned).await
    }

    /// [`GpuExecutor::new`], with the matmuls' variants chosen as `matmuls` says.
    pub async fn with_matmuls(ctx: &GpuContext, program: Program, matmuls: MatmulChoice) -> Result<Self, ExecError> {
        let fusion = fuse::plan(&program);
        let views = views::plan(&program, &fusion, &|i| super::lower::takes_layouts(ctx, &program, i));
        let program_drawn = program.bits_drawn_in_attention();
        let program_zeroed = program.read_outside_owner();
        let folds = consts::plan(&program, &fusion, &views.quiet);
        let limits = ctx.limits();
        let max_arena = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size) / 4;
        let plan = slots::plan(
            &program,
            &fusion,
            &views,
            usize::try_from(max_arena).unwrap_or(usize::MAX),
        );
        // The next step reads a donated output from its input's buffer.
        for &(out, input) in &program.donations {
            let (o, i) = (program.outputs[out], program.inputs[input].0);
            if plan.value_slot[o.index()] != plan.value_slot[i.index()] {
                return Err(ExecError::Unsupported {
                    op: "donation".into(),
                    executor: "GPU",
                    why: format!(
                        "output {out} is written while its input {} is still read: no buffer to update in place",
                        program.info(i).name.clone().unwrap_or_default()
                    ),
                });
            }
        }
        let mut slots: Vec<GpuBuffer> = Vec::with_capacity(plan.caps.len());
        for (s, &cap) in plan.caps.iter().enumerate() {
            let name = plan.name(&program, s);
            let buf = match plan.views[s] {
                Some((arena, start)) => slots[arena].view(&name, start, cap)?,
                None => ctx.zeros(&name, cap)?,
            };
            slots.push(buf);
        }
        let mut part_ranges = Vec::with_capacity(plan.parts.groups.len());
        for (group, &first) in plan.parts.groups.iter().zip(&plan.first_part) {
            let (whole, start) = plan.views[first].expect("a part is a view of its parts' slot");
            part_ranges.push(slots[whole].view(&format!("{} parts", slots[first].name), start, group.span())?);
        }
        let [sgd_hyper, adamw_hyper] = Self::make_hyper(ctx, &program)?;
        // Views share their arena's bytes.
        let peak_bytes = slots.iter().filter(|b| !b.is_view()).map(|b| b.bytes()).sum();
        let mut exec = Self {
            program,
            slots,
            value_slot: plan.value_slot,
            dispatches: vec![],
            dispatch_instr: vec![],
            sgd_hyper,
            adamw_hyper,
            peak_bytes,
            fusion,
            views,
            folds,
            drawn: program_drawn,
            scratch: plan.scratch,
            parts: plan.parts,
            part_ranges,
            provisional: vec![],
            zeroed: program_zeroed,
        };
        (exec.dispatches, exec.dispatch_instr, exec.provisional) = exec.lower(ctx, matmuls).await?;
        Ok(exec)
    }

    /// Every instruction's dispatches on the executor's slots.
    async fn lower(&self, ctx: &GpuContext, matmuls: MatmulChoice) -> Result<LoweredDispatches, ExecError> {
        let mut dispatches = vec![];
        let mut dispatch_instr = vec![];
        let lowering = Lowering {
            ctx,
            program: &self.program,
            slots: &self.slots,
            value_slot: &self.value_slot,
            sgd_hyper: self.sgd_hyper.as_ref().map(|(b, _)| b),
            adamw_hyper: self.adamw_hyper.as_ref().map(|(b, _)| b),
            fusion: &self.fusion,
            views: &self.views,
            folds: &self.folds,
            drawn: &self.drawn,
            parts: &self.parts,
            part_ranges: &self.part_ranges,
            matmuls,
            provisional: RefCell::default(),
            attention_scratch: RefCell::default(),
            textures: Default::default(),
            zeroed: &self.zeroed,
            outside_flags: RefCell::default(),
        };
        let lowered = if matches!(matmuls, MatmulChoice::Provisional(_)) {
            // Nothing tunes meanwhile, so the instructions may lower together: on the web their
            // pipelines then compile side by side instead of one after another.
            let all = self.scratch.iter().enumerate().map(|(i, sc)| lowering.instr(i, sc));
            join_in_order(all.collect()).await
        } else {
            let mut each = Vec::with_capacity(self.scratch.len());
            for (i, sc) in self.scratch.iter().enumerate() {
                each.push(lowering.instr(i, sc).await);
            }
            each
        };
        for (i, ds) in lowered.into_iter().enumerate() {
            let ds = ds?;
            dispatch_instr.extend(std::iter::repeat_n(i, ds.len()));
            dispatches.extend(ds);
        }
        // Matmuls that share a texture each brought its copy; now that the order is final the
        // first of them fills it for all.
        let (dispatches, kept) = k::matmul::drop_repeated_copies(dispatches);
        let dispatch_instr = dispatch_instr
            .into_iter()
            .zip(kept)
            .filter(|(_, k)| *k)
            .map(|(i, _)| i)
            .collect();
        ctx.check()?;
        Ok((dispatches, dispatch_instr, lowering.provisional.into_inner()))
    }

    /// The matmuls that run a provisional variant, their class untuned when the executor was built.
    pub fn provisional_matmuls(&self) -> &[MatmulShape] {
        &self.provisional
    }

    /// Rebuilds the dispatches with the autotuner's choices (tuning the classes still untuned)
    /// where matmuls ran a provisional variant; the buffers, and so the state, stay as they are.
    /// Returns whether anything was rebuilt. Call it between steps.
    pub async fn retune(&mut self, ctx: &GpuContext) -> Result<bool, ExecError> {
        if self.provisional.is_empty() {
            return Ok(false);
        }
        (self.dispatches, self.dispatch_instr, self.provisional) = self.lower(ctx, MatmulChoice::Tuned).await?;
        Ok(true)
    }

    fn buf(&self, v: crate::ir::ValueId) -> &GpuBuffer {
        &self.slots[self.value_slot[v.index()]]
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
        self.read_value(ctx, self.program.outputs[pos]).await
    }

    /// Reads value `v` of every device after a step: an output, or a value that lives to the
    /// step's end (`Program::last_uses`); any other's buffer holds whatever was put there last.
    pub async fn read_value(&self, ctx: &GpuContext, v: crate::ir::ValueId) -> Result<Tensor, ExecError> {
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

    /// Reads f32 values `vs` of every device after a step, as [`GpuExecutor::read_value`] does,
    /// in one round trip.
    pub async fn read_values(&self, ctx: &GpuContext, vs: &[crate::ir::ValueId]) -> Result<Vec<Tensor>, ExecError> {
        let bufs: Vec<&GpuBuffer> = vs.iter().map(|&v| self.buf(v)).collect();
        let all = ctx.read_all::<f32>(&bufs).await?;
        Ok(all
            .into_iter()
            .zip(vs)
            .map(|(mut d, &v)| {
                d.truncate(self.program.devices() * self.program.info(v).numel());
                Tensor::F32(d)
            })
            .collect())
    }

    /// Reads input `pos` (e.g. a parameter, updated in place by the step).
    pub async fn read_input(&self, ctx: &GpuContext, pos: usize) -> Result<Vec<f32>, ExecError> {
        let (v, _) = self.program.inputs[pos];
        let mut d = ctx.read::<f32>(self.buf(v)).await?;
        d.truncate(self.program.devices() * self.program.info(v).numel());
        Ok(d)
    }

    /// Copies of the buffers a step updates in place (parameters and optimizer state): a
    /// profile runs the update again on them and then puts the step's state back.
    pub fn save_state(&self, ctx: &GpuContext) -> Result<SavedState, ExecError> {
        let mut copies = vec![];
        for slot in self.state_slots() {
            let src = &self.slots[slot];
            copies.push((slot, ctx.zeros(&format!("{} (saved)", src.name), src.len)?));
        }
        self.copy_state(ctx, &copies, true);
        Ok(SavedState { copies })
    }

    /// Puts back the state [`GpuExecutor::save_state`] copied (queued; later submits see it).
    pub fn restore_state(&self, ctx: &GpuContext, saved: &SavedState) {
        self.copy_state(ctx, &saved.copies, false);
    }

    fn state_slots(&self) -> Vec<usize> {
        let mut s: Vec<usize> = self
            .program
            .donations
            .iter()
            .map(|&(_, input)| self.value_slot[self.program.inputs[input].0.index()])
            .collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    fn copy_state(&self, ctx: &GpuContext, copies: &[(usize, GpuBuffer)], save: bool) {
        let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some(if save {
                "shardlab save state"
            } else {
                "shardlab restore state"
            }),
        });
        for (slot, copy) in copies {
            let live = &self.slots[*slot];
            let (from, to) = if save {
                ((&live.buffer, live.offset), (&copy.buffer, 0))
            } else {
                ((&copy.buffer, 0), (&live.buffer, live.offset))
            };
            enc.copy_buffer_to_buffer(from.0, from.1, to.0, to.1, live.bytes());
        }
        ctx.queue.submit([enc.finish()]);
    }
}

/// The parameters and optimizer state of one step, copied on the GPU (see
/// [`GpuExecutor::save_state`]).
pub struct SavedState {
    copies: Vec<(usize, GpuBuffer)>,
}
