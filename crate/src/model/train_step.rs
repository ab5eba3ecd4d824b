use super::gpt::{forward_logits, forward_loss, Activations, Local};
use super::microbatch::{accumulate, check_microbatches, microbatch_rows};
use super::{param_specs, GptConfig, ModelError, Optimizer};
use crate::ir::{Builder, DType, Op, Program, RngLayout, Role, ValueId};

/// The whole train step as one program, and where its pieces are.
///
/// Inputs: params, optimizer state (m then v per param, AdamW only), tokens, targets, key.
/// Outputs: loss (at the parameters before the update), then updated params and state,
/// each donated to its input (updated in place, like jit with donated arguments).
#[derive(Clone, Debug)]
pub struct TrainStep {
    pub program: Program,
    /// Instructions `[0, forward_end)` are the forward pass and loss, `[forward_end,
    /// backward_end)` the backward pass, the rest the optimizer update.
    pub forward_end: usize,
    pub backward_end: usize,
    pub config: GptConfig,
    pub optimizer: Optimizer,
}

fn param_inputs(b: &mut Builder, cfg: &GptConfig) -> Vec<ValueId> {
    param_specs(cfg)
        .iter()
        .map(|p| b.input(&p.name, &p.shape, DType::F32, Role::Param(p.index)))
        .collect()
}

fn data_inputs(b: &mut Builder, cfg: &GptConfig) -> (ValueId, ValueId, ValueId) {
    let tokens = b.input("tokens", &[cfg.batch, cfg.seq], DType::U32, Role::Tokens);
    let targets = b.input("targets", &[cfg.batch, cfg.seq], DType::U32, Role::Targets);
    let key = b.input("key", &[2], DType::U32, Role::RngKey);
    (tokens, targets, key)
}

/// Forward and loss only (for the loss after the last update, and evaluation).
pub fn eval_program(cfg: &GptConfig, rng_layout: RngLayout) -> Result<Program, ModelError> {
    cfg.validate()?;
    let mut b = Builder::new();
    let params = param_inputs(&mut b, cfg);
    let (tokens, targets, key) = data_inputs(&mut b, cfg);
    let acts = Activations {
        params: &params,
        tokens,
        targets,
        key,
        rng_layout,
        local: Local::of(cfg),
    };
    let loss = forward_loss(&mut b, cfg, &acts);
    b.output(loss);
    b.finish()
        .map_err(|e| ModelError::Build(format!("cannot build the model: {e}")))
}

/// Forward only, without dropout, returning the logits (B, T, V): what the model predicts.
/// Its inputs are eval_program's (the targets and key go unused).
pub fn logits_program(cfg: &GptConfig, rng_layout: RngLayout) -> Result<Program, ModelError> {
    cfg.validate()?;
    let cfg = &GptConfig {
        dropout: 0.0,
        ..cfg.clone()
    };
    let mut b = Builder::new();
    let params = param_inputs(&mut b, cfg);
    let (tokens, targets, key) = data_inputs(&mut b, cfg);
    let acts = Activations {
        params: &params,
        tokens,
        targets,
        key,
        rng_layout,
        local: Local::of(cfg),
    };
    let logits = forward_logits(&mut b, cfg, &acts);
    b.output(logits);
    b.finish()
        .map_err(|e| ModelError::Build(format!("cannot build the model: {e}")))
}

/// Forward, loss, gradients (reverse-mode autodiff of the traced forward) and update.
pub fn train_step_program(cfg: &GptConfig, opt: Optimizer, rng_layout: RngLayout) -> Result<TrainStep, ModelError> {
    accumulated_train_step(cfg, opt, rng_layout, 1)
}

/// [`train_step_program`] with gradient accumulation over `microbatches` slices of the batch
/// ([`microbatch_rows`]): each microbatch's forward and backward in turn, its loss over K
/// differentiated and the gradients summed into one buffer per parameter, then one update.
/// Microbatch j's dropout key is `fold_in(key, j)` (as a JAX loop over microbatches splits its
/// key); with one microbatch the step is [`train_step_program`]'s, key unchanged.
pub fn accumulated_train_step(
    cfg: &GptConfig,
    opt: Optimizer,
    rng_layout: RngLayout,
    microbatches: usize,
) -> Result<TrainStep, ModelError> {
    accumulated_train_step_in_order(cfg, opt, rng_layout, microbatches, None)
}

/// [`accumulated_train_step`] with the sequence in zig-zag order of `zigzag` blocks inside
/// the program (automatic mode's context parallelism, [`super::Local::zigzag`]): the same
/// losses and updates, the tokens and targets taken in their order.
pub fn accumulated_train_step_in_order(
    cfg: &GptConfig,
    opt: Optimizer,
    rng_layout: RngLayout,
    microbatches: usize,
    zigzag: Option<usize>,
) -> Result<TrainStep, ModelError> {
    cfg.validate()?;
    check_microbatches(cfg.batch, microbatches, 1)?;
    let specs = param_specs(cfg);
    let mut b = Builder::new();
    let params = param_inputs(&mut b, cfg);
    let state: Vec<[ValueId; 2]> = match opt {
        Optimizer::Sgd { .. } => vec![],
        Optimizer::AdamW { .. } => specs
            .iter()
            .map(|p| {
                [0, 1].map(|slot| {
                    let name = format!("{}.{}", p.name, ["m", "v"][slot]);
                    b.input(&name, &p.shape, DType::F32, Role::OptState { param: p.index, slot })
                })
            })
            .collect(),
    };
    let (tokens, targets, key) = data_inputs(&mut b, cfg);
    let k = microbatches;
    let tokens = microbatch_rows(&mut b, tokens, k);
    let targets = microbatch_rows(&mut b, targets, k);
    let names: Vec<String> = specs.iter().map(|p| format!("d{}", p.name)).collect();
    let mut losses = vec![];
    let mut loss_of = |b: &mut Builder, j: usize| {
        let acts = Activations {
            params: &params,
            tokens: tokens[j],
            targets: targets[j],
            key: if k == 1 { key } else { b.fold_in(key, j as u32) },
            rng_layout,
            local: Local {
                batch: cfg.batch / k,
                zigzag,
                ..Local::of(cfg)
            },
        };
        let loss = forward_loss(b, cfg, &acts);
        let scaled = if k == 1 { loss } else { b.scale(loss, 1.0 / k as f32) };
        losses.push(scaled);
        Ok(scaled)
    };
    let acc = accumulate(&mut b, k, &params, &names, &mut loss_of, &mut |_, _, g| g)
        .map_err(|e| ModelError::Build(format!("cannot differentiate the model: {e}")))?;
    let (grads, forward_end) = (acc.grads, acc.first_forward_end);
    let loss = losses
        .iter()
        .copied()
        .reduce(|a, l| b.add(a, l))
        .ok_or_else(|| ModelError::Build("a step needs at least one microbatch".into()))?;
    if k > 1 {
        b.set_name(loss, "loss");
    }

    b.output(loss);
    let backward_end = b.program().instrs.len();
    let n = specs.len();
    for (i, p) in specs.iter().enumerate() {
        let slots: &[ValueId] = state.get(i).map_or(&[], |s| &s[..]);
        let outs = update(&mut b, opt, p.decays(), params[i], grads[i], slots);
        b.set_name(outs[0], &format!("{}'", p.name));
        for (slot, v) in outs.into_iter().enumerate() {
            let o = b.output(v);
            b.donate(o, state_input(n, opt, i, slot));
        }
    }
    let mut program = b
        .finish()
        .map_err(|e| ModelError::Build(format!("cannot build the train step: {e}")))?;
    program.precision = cfg.precision;
    program.expert_imbalance = cfg.moe.map(|m| m.imbalance);
    Ok(TrainStep {
        program,
        forward_end,
        backward_end,
        config: cfg.clone(),
        optimizer: opt,
    })
}

/// The optimizer's update of one parameter from its gradient and its state slots (AdamW's m
/// and v; SGD has none): the new parameter, then the new state, in slot order.
pub fn update(
    b: &mut Builder,
    opt: Optimizer,
    decays: bool,
    param: ValueId,
    grad: ValueId,
    state: &[ValueId],
) -> Vec<ValueId> {
    match opt {
        Optimizer::Sgd { lr } => vec![b.emit1(Op::SgdUpdate { lr }, &[param, grad])],
        Optimizer::AdamW { lr } => {
            // optax's defaults; weight decay on the 2-D weights only.
            let wd = if decays { 0.01 } else { 0.0 };
            let op = Op::AdamWUpdate {
                lr,
                b1: 0.9,
                b2: 0.999,
                eps: 1e-8,
                wd,
            };
            b.emit(op, &[param, grad, state[0], state[1]])
        }
    }
}

/// The input an update's output `slot` (0 the parameter, then its state) of parameter `i`
/// donates to: the parameter, or its state slot, which follows the `n` parameters,
/// `opt.slots()` per parameter.
pub fn state_input(n: usize, opt: Optimizer, i: usize, slot: usize) -> usize {
    if slot == 0 {
        i
    } else {
        n + opt.slots() * i + (slot - 1)
    }
}
