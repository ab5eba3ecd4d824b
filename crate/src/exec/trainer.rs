use std::sync::Arc;

use super::{ExecError, GpuExecutor, ReferenceExecutor, Tensor};
use crate::gpu::{now_ms, GpuContext};
use crate::ir::{Program, Role, RngLayout};
use crate::model::{
    eval_program, init_params, param_specs, train_step_program, Batch, DataSource, Dataset, GptConfig, Init, Optimizer,
};
use crate::rng::Key;

/// Which executor runs the programs.
#[derive(Clone)]
pub enum Backend {
    Gpu(Arc<GpuContext>),
    Reference,
}

/// Everything `shardlab train` chooses.
#[derive(Clone, Debug)]
pub struct TrainerOptions {
    pub config: GptConfig,
    pub optimizer: Optimizer,
    pub init: Init,
    pub data: DataSource,
    pub seed: u64,
    pub rng_layout: RngLayout,
}

/// One finished step: the loss at the parameters before the update, and its wall time.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct StepStats {
    pub step: u64,
    pub loss: f32,
    pub step_ms: f64,
}

enum State {
    Reference {
        params: Vec<Vec<f32>>,
        opt_state: Vec<Vec<f32>>,
    },
    Gpu {
        ctx: Arc<GpuContext>,
        exec: GpuExecutor,
    },
}

/// Trains the model one step at a time on either executor; the state (parameters and
/// optimizer moments) lives where the executor runs (GPU buffers, updated in place).
pub struct Trainer {
    opts: TrainerOptions,
    dataset: Dataset,
    step_program: Program,
    state: State,
    steps_done: u64,
}

impl Trainer {
    pub async fn new(backend: Backend, opts: TrainerOptions) -> Result<Self, ExecError> {
        let cfg = &opts.config;
        let dataset = Dataset::new(opts.data.clone(), cfg, opts.seed)?;
        let step = train_step_program(cfg, opts.optimizer, opts.rng_layout)?;
        let params = init_params(cfg, opts.init);
        let opt_state: Vec<Vec<f32>> = params
            .iter()
            .flat_map(|p| std::iter::repeat_n(vec![0.0; p.len()], opts.optimizer.slots()))
            .collect();
        let state = match backend {
            Backend::Reference => State::Reference { params, opt_state },
            Backend::Gpu(ctx) => {
                let exec = GpuExecutor::new(&ctx, step.program.clone()).await?;
                for (i, p) in params.into_iter().chain(opt_state).enumerate() {
                    exec.write_input(&ctx, i, &Tensor::F32(p))?;
                }
                State::Gpu { ctx, exec }
            }
        };
        Ok(Self {
            opts,
            dataset,
            step_program: step.program,
            state,
            steps_done: 0,
        })
    }

    pub fn options(&self) -> &TrainerOptions {
        &self.opts
    }

    /// The train-step program (forward, backward, update) this trainer runs.
    pub fn program(&self) -> &Program {
        &self.step_program
    }

    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// GPU dispatches per step (0 on the reference executor).
    pub fn dispatches_per_step(&self) -> usize {
        match &self.state {
            State::Gpu { exec, .. } => exec.dispatch_count(),
            State::Reference { .. } => 0,
        }
    }

    /// Bytes the step holds at once on the GPU (None on the reference executor).
    pub fn peak_bytes(&self) -> Option<u64> {
        match &self.state {
            State::Gpu { exec, .. } => Some(exec.peak_bytes()),
            State::Reference { .. } => None,
        }
    }

    fn key(&self, step: u64) -> Key {
        Key::from_seed(self.opts.seed as i64).fold_in(step as u32)
    }

    fn data_inputs(&self, batch: &Batch, key: Key) -> [Tensor; 3] {
        [
            Tensor::U32(batch.inputs.clone()),
            Tensor::U32(batch.targets.clone()),
            Tensor::U32(key.0.to_vec()),
        ]
    }

    /// Runs one train step: returns the loss before the update.
    pub async fn step(&mut self) -> Result<StepStats, ExecError> {
        let batch = self.dataset.batch(self.steps_done);
        let data = self.data_inputs(&batch, self.key(self.steps_done));
        let update = self.steps_done + 1;
        let t0 = now_ms();
        let loss = match &mut self.state {
            State::Reference { params, opt_state } => {
                let mut inputs: Vec<Tensor> = params.iter().chain(opt_state.iter()).map(|p| Tensor::F32(p.clone())).collect();
                inputs.extend(data);
                let mut outs = ReferenceExecutor::run(&self.step_program, &inputs, update)?.into_iter();
                let loss = outs.next().expect("loss").scalar();
                let n = params.len();
                let mut rest: Vec<Vec<f32>> = outs.map(Tensor::into_f32).collect();
                // outputs: params (SGD) or (p, m, v) per param (AdamW)
                if opt_state.is_empty() {
                    *params = rest;
                } else {
                    for (i, chunk) in rest.chunks_mut(3).enumerate() {
                        params[i] = std::mem::take(&mut chunk[0]);
                        opt_state[2 * i] = std::mem::take(&mut chunk[1]);
                        opt_state[2 * i + 1] = std::mem::take(&mut chunk[2]);
                    }
                    debug_assert_eq!(params.len(), n);
                }
                loss
            }
            State::Gpu { ctx, exec } => {
                let first_data = exec.input_position(&Role::Tokens).expect("tokens input");
                for (k, t) in data.iter().enumerate() {
                    exec.write_input(ctx, first_data + k, t)?;
                }
                exec.set_step(ctx, update)?;
                exec.submit(ctx);
                exec.read_output(ctx, 0).await?.scalar()
            }
        };
        let step_ms = now_ms() - t0;
        self.steps_done += 1;
        if !loss.is_finite() {
            return Err(ExecError::Input(format!(
                "the loss became {loss} at step {}: lower --lr",
                self.steps_done - 1
            )));
        }
        Ok(StepStats {
            step: self.steps_done - 1,
            loss,
            step_ms,
        })
    }

    /// Current parameters, in MODEL.md order.
    pub async fn params(&self) -> Result<Vec<Vec<f32>>, ExecError> {
        match &self.state {
            State::Reference { params, .. } => Ok(params.clone()),
            State::Gpu { ctx, exec } => {
                let mut out = vec![];
                for i in 0..param_specs(&self.opts.config).len() {
                    out.push(exec.read_input(ctx, i).await?);
                }
                Ok(out)
            }
        }
    }

    /// The loss at the current parameters on the batch of the next step (no update), on the
    /// reference executor for GPU runs too: it runs once per training run.
    pub async fn eval_loss(&self) -> Result<f32, ExecError> {
        let prog = eval_program(&self.opts.config, self.opts.rng_layout)?;
        let batch = self.dataset.batch(self.steps_done);
        let mut inputs: Vec<Tensor> = self.params().await?.into_iter().map(Tensor::F32).collect();
        inputs.extend(self.data_inputs(&batch, self.key(self.steps_done)));
        let outs = ReferenceExecutor::run(&prog, &inputs, 0)?;
        Ok(outs[0].scalar())
    }
}
