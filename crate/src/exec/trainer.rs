use std::sync::Arc;

use super::step_profile::{self, StepProfile};
use super::{ExecError, GpuExecutor, MatmulChoice, ReferenceExecutor, Tensor};
use crate::gpu::{now_ms, GpuContext};
use crate::ir::{Program, Role};
use crate::model::{eval_program, init_params, logits_program, param_specs, Batch, Dataset, TrainStep};
use crate::plan::{self, check_config, plan_and_check, MemoryLimits, MemoryPlan, Planned, TrainerOptions};
use crate::rng::Key;

/// Which executor runs the programs.
#[derive(Clone)]
pub enum Backend {
    Gpu(Arc<GpuContext>),
    Reference,
}

/// One finished step: the loss at the parameters before the update, and its wall time.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct StepStats {
    pub step: u64,
    pub loss: f32,
    pub step_ms: f64,
}

enum State {
    /// The persistent inputs (params, optimizer state) in the program's device layout.
    Reference { state: Vec<Tensor> },
    Gpu {
        ctx: Arc<GpuContext>,
        // Boxed: the executor is large, the reference variant small.
        exec: Box<GpuExecutor>,
    },
}

/// Trains the model one step at a time on either executor, on one device or sharded; the
/// state (parameters and optimizer moments) lives where the executor runs (on the GPU:
/// buffers updated in place) in the program's `[device, local...]` layout.
pub struct Trainer {
    planned: Planned,
    dataset: Dataset,
    state: State,
    steps_done: u64,
}

impl Backend {
    /// What a step on this backend must fit: the adapter's buffer limits on the GPU, the
    /// default budget (the CLI sets its own with [`MemoryLimits::with_budget_flag`]), and the
    /// wasm heap on the web.
    pub fn memory_limits(&self) -> MemoryLimits {
        match self {
            Backend::Gpu(ctx) => {
                let l = ctx.limits();
                MemoryLimits::adapter(l.max_buffer_size, l.max_storage_buffer_binding_size)
            }
            Backend::Reference => MemoryLimits::host(),
        }
    }
}

impl Trainer {
    /// Plans `opts` ([`plan::build`]) and starts training it.
    pub async fn new(backend: Backend, opts: TrainerOptions) -> Result<Self, ExecError> {
        let limits = backend.memory_limits();
        Self::with_limits(backend, opts, &limits).await
    }

    /// [`Trainer::new`] with the memory limits given: the configuration is checked in closed
    /// form before the step is traced, and the traced step's memory plan before any
    /// parameter is initialised or buffer allocated.
    pub async fn with_limits(backend: Backend, opts: TrainerOptions, limits: &MemoryLimits) -> Result<Self, ExecError> {
        opts.config.validate()?;
        check_config(&opts.config, opts.optimizer, opts.parallel.devices(), limits)?;
        let dataset = Dataset::new(opts.data.clone(), &opts.config, opts.seed)?;
        let planned = plan::build(&opts)?;
        Self::start(backend, planned, dataset, limits, MatmulChoice::Tuned).await
    }

    /// Starts training a step planned already (by `inspect` or the page, which show the
    /// plan too), without planning it again; its memory plan is checked against the
    /// backend's limits first.
    pub async fn from_plan(backend: Backend, planned: Planned) -> Result<Self, ExecError> {
        Self::from_plan_with(backend, planned, MatmulChoice::Tuned).await
    }

    /// [`Trainer::from_plan`], with the GPU matmuls' variants chosen as `matmuls` says: the page
    /// builds with [`MatmulChoice::Provisional`] so its first step does not wait for the
    /// autotuner, then calls [`Trainer::retune`] between steps.
    pub async fn from_plan_with(backend: Backend, planned: Planned, matmuls: MatmulChoice) -> Result<Self, ExecError> {
        let limits = backend.memory_limits();
        let opts = &planned.options;
        check_config(&opts.config, opts.optimizer, opts.parallel.devices(), &limits)?;
        let dataset = Dataset::new(opts.data.clone(), &opts.config, opts.seed)?;
        Self::start(backend, planned, dataset, &limits, matmuls).await
    }

    async fn start(
        backend: Backend,
        planned: Planned,
        dataset: Dataset,
        limits: &MemoryLimits,
        matmuls: MatmulChoice,
    ) -> Result<Self, ExecError> {
        let (opts, step) = (&planned.options, &planned.step);
        if step.program.precision != crate::ir::Precision::F32 {
            // Its kernels are f32: a bf16 plan is priced and exported, never run here.
            return Err(ExecError::Input(format!(
                "precision {}: the sandbox trains in f32 only; `shardlab plan` and `export jax` take --precision bf16, train with f32",
                step.program.precision.name()
            )));
        }
        plan_and_check(&step.program, &opts.config, opts.optimizer, limits)?;
        let params = init_params(&opts.config, opts.init);
        // The persistent inputs lead the program's inputs: each parameter (or stack of them,
        // a pipeline's stages) and its optimizer state, zeroed.
        let mut state = vec![];
        for (pos, (_, role)) in step.program.inputs.iter().enumerate() {
            let held = role.rows();
            if held.is_empty() {
                break;
            }
            // A stack's zero rows (a stage's missing blocks) are as long as its other rows: a
            // row's share of the global array (a stack may hold zeros only).
            let row_len = global_len(&step.program, pos)? / held.len();
            let global: Vec<f32> = held
                .iter()
                .flat_map(|row| match *row {
                    Some((i, None)) => params[i].clone(),
                    Some((_, Some(_))) | None => vec![0.0; row_len],
                })
                .collect();
            state.push(shard(&step.program, pos, Tensor::F32(global))?);
        }
        let state = match backend {
            Backend::Reference => State::Reference { state },
            Backend::Gpu(ctx) => {
                let exec = GpuExecutor::with_matmuls(&ctx, step.program.clone(), matmuls).await?;
                for (i, t) in state.iter().enumerate() {
                    exec.write_input(&ctx, i, t)?;
                }
                State::Gpu {
                    ctx,
                    exec: Box::new(exec),
                }
            }
        };
        Ok(Self {
            planned,
            dataset,
            state,
            steps_done: 0,
        })
    }

    pub fn options(&self) -> &TrainerOptions {
        &self.planned.options
    }

    /// The plan this trainer runs: its options, train step and, in automatic mode, what the
    /// partitioner inserted.
    pub fn planned(&self) -> &Planned {
        &self.planned
    }

    /// The train-step program (forward, backward, update) this trainer runs.
    pub fn program(&self) -> &Program {
        &self.planned.step.program
    }

    /// The train step with its forward / backward / update boundaries.
    pub fn train_step(&self) -> &TrainStep {
        &self.planned.step
    }

    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// The matmuls running a provisional variant (see [`MatmulChoice::Provisional`]).
    pub fn provisional_matmuls(&self) -> &[crate::kernels::matmul::MatmulShape] {
        match &self.state {
            State::Gpu { exec, .. } => exec.provisional_matmuls(),
            State::Reference { .. } => &[],
        }
    }

    /// Switches provisional matmuls to the autotuner's choices, tuning their classes now if
    /// they are still untuned (see [`GpuExecutor::retune`]); between steps, so a step runs one
    /// set of kernels throughout. Returns whether anything changed.
    pub async fn retune(&mut self) -> Result<bool, ExecError> {
        match &mut self.state {
            State::Gpu { ctx, exec } => exec.retune(ctx).await,
            State::Reference { .. } => Ok(false),
        }
    }

    /// GPU dispatches per step (0 on the reference executor), buffer-to-texture copies included.
    pub fn dispatches_per_step(&self) -> usize {
        match &self.state {
            State::Gpu { exec, .. } => exec.dispatch_count(),
            State::Reference { .. } => 0,
        }
    }

    /// How many of [`Trainer::dispatches_per_step`] are buffer-to-texture copies (of matmul
    /// operands already in a texture's layout), not compute dispatches.
    pub fn copies_per_step(&self) -> usize {
        match &self.state {
            State::Gpu { exec, .. } => exec.dispatches().iter().filter(|d| d.is_copy()).count(),
            State::Reference { .. } => 0,
        }
    }

    /// Bytes the step holds at once, all simulated devices together: on the GPU the
    /// executor's buffers; on the reference executor the program's liveness peak (it frees
    /// every value after its last use).
    pub fn peak_bytes(&self) -> u64 {
        match &self.state {
            State::Gpu { exec, .. } => exec.peak_bytes(),
            State::Reference { .. } => {
                MemoryPlan::of(self.program()).map_or(0, |m| m.total) * self.program().devices() as u64
            }
        }
    }

    fn key(&self, step: u64) -> Key {
        Key::from_seed(self.planned.options.seed as i64).fold_in(step as u32)
    }

    /// Tokens, targets and key in the program's device layout.
    fn data_inputs(&self, batch: &Batch, key: Key) -> Result<Vec<Tensor>, ExecError> {
        let prog = &self.planned.step.program;
        let first = prog
            .inputs
            .iter()
            .position(|(_, r)| *r == Role::Tokens)
            .expect("tokens input");
        let globals = [
            Tensor::U32(batch.inputs.clone()),
            Tensor::U32(batch.targets.clone()),
            Tensor::U32(key.0.to_vec()),
        ];
        globals
            .into_iter()
            .enumerate()
            .map(|(k, g)| shard(prog, first + k, g))
            .collect()
    }

    /// Runs one train step: returns the loss before the update.
    pub async fn step(&mut self) -> Result<StepStats, ExecError> {
        Ok(self.run_step(None).await?.0)
    }

    /// Like [`Trainer::step`], but measures where the time goes (see [`StepProfile`]).
    pub async fn profile_step(&mut self) -> Result<(StepStats, Option<StepProfile>), ExecError> {
        self.run_step(Some(step_profile::REPS)).await
    }

    /// [`Trainer::profile_step`] with `reps` split runs of each measurement (the page's story
    /// takes three: its categories at about half the cost).
    pub async fn profile_step_with(&mut self, reps: usize) -> Result<(StepStats, Option<StepProfile>), ExecError> {
        self.run_step(Some(reps)).await
    }

    async fn run_step(&mut self, profile: Option<usize>) -> Result<(StepStats, Option<StepProfile>), ExecError> {
        let mut prof = None;
        let batch = self.dataset.batch(self.steps_done);
        let data = self.data_inputs(&batch, self.key(self.steps_done))?;
        let update = self.steps_done + 1;
        let t0 = now_ms();
        let loss = match &mut self.state {
            State::Reference { state } => {
                let mut inputs = state.clone();
                inputs.extend(data);
                let outs = ReferenceExecutor::run(&self.planned.step.program, &inputs, update)?;
                for &(out, input) in &self.planned.step.program.donations {
                    state[input] = outs[out].clone();
                }
                outs[0].scalar()
            }
            State::Gpu { ctx, exec } => {
                let first = exec.input_position(&Role::Tokens).expect("tokens input");
                for (k, t) in data.iter().enumerate() {
                    exec.write_input(ctx, first + k, t)?;
                }
                exec.set_step(ctx, update)?;
                exec.submit(ctx);
                exec.read_output(ctx, 0).await?.scalar()
            }
        };
        let step_ms = now_ms() - t0;
        if let Some(reps) = profile {
            if let State::Gpu { ctx, exec } = &self.state {
                prof = Some(step_profile::measure(ctx, exec, &self.planned.step, reps).await?);
            }
        }
        self.steps_done += 1;
        if !loss.is_finite() {
            return Err(ExecError::Input(format!(
                "the loss became {loss} at step {}: lower the learning rate (--lr)",
                self.steps_done - 1
            )));
        }
        let stats = StepStats {
            step: self.steps_done - 1,
            loss,
            step_ms,
        };
        Ok((stats, prof))
    }

    /// Wall time of the step's collective dispatches run alone (GPU only): what the measured
    /// step time spends simulating communication rather than computing.
    pub async fn collectives_ms(&self) -> Result<Option<f64>, ExecError> {
        let State::Gpu { ctx, exec } = &self.state else {
            return Ok(None);
        };
        let prog = &self.planned.step.program;
        let picked: Vec<&crate::gpu::Dispatch> = exec
            .dispatches()
            .iter()
            .zip(exec.dispatch_instrs())
            .filter(|(_, &i)| prog.instrs[i].op.is_collective())
            .map(|(d, _)| d)
            .collect();
        if picked.is_empty() {
            return Ok(Some(0.0));
        }
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        crate::gpu::encode_all(&mut encoder, picked, "shardlab collectives");
        // Collectives read and write only their own buffers' values, which the next real step
        // recomputes before use, so running them again leaves training unchanged.
        let t0 = now_ms();
        ctx.queue.submit([encoder.finish()]);
        ctx.finish().await?;
        Ok(Some(now_ms() - t0))
    }

    /// The last step's routing, read back from its routers' counts (GPU only: the reference
    /// executor keeps no values past a step); None without a mixture of experts.
    pub async fn routing(&self) -> Result<Option<super::Routing>, ExecError> {
        let (State::Gpu { ctx, exec }, Some(moe)) = (&self.state, &self.planned.options.config.moe) else {
            return Ok(None);
        };
        let prog = &self.planned.step.program;
        let counts: Vec<_> = prog.routing_counts().into_iter().map(|(_, v)| v).collect();
        let loads = exec.read_values(ctx, &counts).await?;
        Ok(Some(super::Routing::of_loads(&loads, prog.devices(), moe.experts)))
    }

    /// Current parameters, global, in docs/MODEL.md order.
    pub async fn params(&self) -> Result<Vec<Vec<f32>>, ExecError> {
        let prog = &self.planned.step.program;
        let mut out = vec![vec![]; param_specs(&self.planned.options.config).len()];
        for (pos, (_, role)) in prog.inputs.iter().enumerate() {
            if !role.is_param() {
                continue;
            }
            let local = match &self.state {
                State::Reference { state } => state[pos].f32().to_vec(),
                State::Gpu { ctx, exec } => exec.read_input(ctx, pos).await?,
            };
            // A stack's rows are its parameters, in order.
            let global = unshard(prog, pos, &local)?;
            let held = role.rows();
            let rows = global.chunks(global.len() / held.len().max(1));
            for (row, values) in held.iter().zip(rows) {
                if let Some((i, _)) = row {
                    out[*i] = values.to_vec();
                }
            }
        }
        Ok(out)
    }

    /// The loss at the current parameters on the batch of the next step (no update), on the
    /// reference executor for GPU runs too: it runs once per training run.
    pub async fn eval_loss(&self) -> Result<f32, ExecError> {
        let prog = eval_program(&self.planned.options.config, self.planned.options.rng_layout)?;
        let batch = self.dataset.batch(self.steps_done);
        let key = self.key(self.steps_done);
        let mut inputs: Vec<Tensor> = self.params().await?.into_iter().map(Tensor::F32).collect();
        inputs.extend([
            Tensor::U32(batch.inputs.clone()),
            Tensor::U32(batch.targets.clone()),
            Tensor::U32(key.0.to_vec()),
        ]);
        let outs = ReferenceExecutor::run(&prog, &inputs, 0)?;
        let loss = outs[0].scalar();
        if !loss.is_finite() {
            return Err(ExecError::Input(format!(
                "the loss became {loss} after {} updates: lower the learning rate (--lr)",
                self.steps_done
            )));
        }
        Ok(loss)
    }
}

impl Trainer {
    /// What the model predicts for the first example of batch `batch_index` at the current
    /// parameters: the argmax of the logits at each of its positions (forward only, no
    /// dropout), on the reference executor as `eval_loss` is.
    pub async fn predict(&self, batch_index: u64) -> Result<Vec<u32>, ExecError> {
        let cfg = &self.planned.options.config;
        let prog = logits_program(cfg, self.planned.options.rng_layout)?;
        let batch = self.dataset.batch(batch_index);
        let key = self.key(batch_index);
        let mut inputs: Vec<Tensor> = self.params().await?.into_iter().map(Tensor::F32).collect();
        inputs.extend([
            Tensor::U32(batch.inputs.clone()),
            Tensor::U32(batch.targets.clone()),
            Tensor::U32(key.0.to_vec()),
        ]);
        let outs = ReferenceExecutor::run(&prog, &inputs, 0)?;
        let logits = outs[0].f32();
        let v = cfg.vocab;
        Ok(logits[..cfg.seq * v]
            .chunks(v)
            .map(|row| {
                let best = row
                    .iter()
                    .enumerate()
                    .fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b });
                best.0 as u32
            })
            .collect())
    }
}

/// A global host array laid out as input `pos` of `prog` wants it: `[device, local...]`.
fn shard(prog: &Program, pos: usize, global: Tensor) -> Result<Tensor, ExecError> {
    let Some((sharding, shape)) = input_layout(prog, pos)? else {
        return Ok(global);
    };
    let err = |e: crate::sharding::ShardingError| ExecError::Input(e.to_string());
    Ok(match global {
        Tensor::F32(v) => Tensor::F32(sharding.shard(&v, &shape).map_err(err)?),
        Tensor::U32(v) => Tensor::U32(sharding.shard(&v, &shape).map_err(err)?),
    })
}

/// Elements of input `pos`'s global array.
fn global_len(prog: &Program, pos: usize) -> Result<usize, ExecError> {
    Ok(match input_layout(prog, pos)? {
        Some((_, shape)) => shape.iter().product(),
        None => prog.shape(prog.inputs[pos].0).iter().product(),
    })
}

/// The global array of input `pos` from its devices' blocks.
fn unshard(prog: &Program, pos: usize, blocks: &[f32]) -> Result<Vec<f32>, ExecError> {
    let Some((sharding, shape)) = input_layout(prog, pos)? else {
        return Ok(blocks.to_vec());
    };
    sharding
        .unshard(blocks, &shape)
        .map_err(|e| ExecError::Input(e.to_string()))
}

/// Input `pos`'s sharding and global shape; None on one device, where local is global.
fn input_layout(prog: &Program, pos: usize) -> Result<Option<(crate::sharding::NamedSharding, Vec<usize>)>, ExecError> {
    if prog.mesh.is_none() {
        return Ok(None);
    }
    let sharding = prog.input_sharding(pos).map_err(|e| ExecError::Input(e.to_string()))?;
    let shape = prog.global_shape(prog.shape(prog.inputs[pos].0), &sharding.spec);
    Ok(Some((sharding, shape)))
}
