//! The shard_map train step of any composition without a pipeline: the per-device body a JAX
//! user would write, composed per mesh axis ([`Compose`]): data parallelism's gradient
//! all-reduce, ZeRO's blocks over "dp", FSDP's gathers, Megatron's collectives (with sequence
//! parallelism or not), ring attention over "cp", each with gradient accumulation over
//! microbatches.
use super::compose::{gather, updates, Compose, ParamPlan};
use super::strategy::check_dropout_key;
use super::{DropoutKey, Mode, Parallelism, PlanError};
use crate::ir::{Builder, DType, IrError, RngLayout, Role, ValueId};
use crate::model::{accumulate, forward_loss, microbatch_rows, param_specs, Activations, GptConfig};
use crate::model::{Optimizer, TrainStep};
use crate::partition::{shard_map, Arg};
use crate::sharding::PartitionSpec;

/// The whole train step as a shard_map'ed per-device program: forward on local shapes,
/// gradients by autodiff (through the collectives), the reduction of gradients each axis
/// needs, and the optimizer update on each device's own shard.
pub fn shard_map_train_step(
    cfg: &GptConfig,
    opt: Optimizer,
    rng_layout: RngLayout,
    par: &Parallelism,
    dropout_key: DropoutKey,
) -> Result<TrainStep, PlanError> {
    let c = Compose {
        cfg,
        par,
        dropout_key,
        cp_order: Default::default(),
    };
    shard_map_accumulated_step(&c, opt, rng_layout, 1)
}

/// The shard_map arguments of a composition's parameters, their optimizer state, the tokens,
/// the targets and the key; with each parameter's [`ParamPlan`].
fn arguments(c: &Compose, opt: Optimizer) -> (Vec<Arg>, Vec<ParamPlan>) {
    let specs = param_specs(c.cfg);
    let mut args = vec![];
    let mut plans = vec![];
    for ps in &specs {
        let (shape, spec) = c.par.param_layout(c.cfg, ps, Mode::ShardMap);
        let (_, state) = c.par.state_layout(c.cfg, ps, Mode::ShardMap);
        args.push(Arg {
            name: ps.name.clone(),
            global_shape: shape,
            dtype: DType::F32,
            role: Role::Param(ps.index),
            spec: spec.clone(),
        });
        plans.push(ParamPlan {
            spec,
            state,
            decays: ps.decays(),
        });
    }
    for (ps, plan) in specs.iter().zip(&plans) {
        for slot in 0..opt.slots() {
            args.push(Arg {
                name: format!("{}.{}", ps.name, ["m", "v"][slot]),
                global_shape: args[ps.index].global_shape.clone(),
                dtype: DType::F32,
                role: Role::OptState { param: ps.index, slot },
                spec: plan.state.clone(),
            });
        }
    }
    for (name, role) in [("tokens", Role::Tokens), ("targets", Role::Targets)] {
        args.push(Arg {
            name: name.into(),
            global_shape: vec![c.cfg.batch, c.cfg.seq],
            dtype: DType::U32,
            role,
            spec: c.tokens_spec(),
        });
    }
    args.push(Arg {
        name: "key".into(),
        global_shape: vec![2],
        dtype: DType::U32,
        role: Role::RngKey,
        spec: PartitionSpec::replicated(),
    });
    (args, plans)
}

/// [`shard_map_train_step`] with gradient accumulation: each device splits its rows into
/// `microbatches` ([`microbatch_rows`]) and runs forward and backward on each in turn. Data
/// parallelism and ZeRO-1 sum the microbatches' gradients on the device and reduce them once,
/// after the last; ZeRO-2 and FSDP hold only their block of the gradients, so they
/// reduce-scatter each microbatch's as it is made and sum the blocks. Context parallelism lays
/// its sequence blocks over the ring in the composition's cp order.
pub(super) fn shard_map_accumulated_step(
    c: &Compose,
    opt: Optimizer,
    rng_layout: RngLayout,
    microbatches: usize,
) -> Result<TrainStep, PlanError> {
    let (cfg, par) = (c.cfg, c.par);
    cfg.validate()?;
    par.check(cfg, microbatches)?;
    par.check_cp(cfg, c.cp_order, Mode::ShardMap)?;
    check_dropout_key(par, c.dropout_key)?;
    let specs = param_specs(cfg);
    let (args, plans) = arguments(c, opt);
    let n = specs.len();
    let mut out_specs = vec![PartitionSpec::replicated()];
    for plan in &plans {
        out_specs.push(plan.spec.clone());
        for _ in 0..opt.slots() {
            out_specs.push(plan.state.clone());
        }
    }
    // Collectives over an axis of size 1 are kept: they are no-ops, but the program stays
    // the same shape for every mesh size and check_vma sees the reductions.
    let token_axes = par.token_axes();
    let k = microbatches;
    let names: Vec<String> = specs.iter().map(|ps| format!("d{}", ps.name)).collect();
    let local = c.local(k);

    let mut marks = (0, 0);
    let program = shard_map(&par.mesh, &args, &out_specs, |b, vals| {
        let params = &vals[..n];
        let state = &vals[n..n + n * opt.slots()];
        let (mut tokens, mut targets, key) = (vals[vals.len() - 3], vals[vals.len() - 2], vals[vals.len() - 1]);
        (tokens, targets) = c.take_rows(b, &local, tokens, targets);
        let tokens = microbatch_rows(b, tokens, k);
        let targets = microbatch_rows(b, targets, k);
        let mut local_losses = vec![];
        let mut loss_of = |b: &mut Builder, j: usize| {
            // Inside the microbatch, so that each microbatch's gradient reaches FSDP's
            // reduce-scatter.
            let full: Vec<ValueId> = params.iter().zip(&plans).map(|(&v, p)| gather(b, v, &p.spec)).collect();
            let key = c.key(b, key);
            let key = if k == 1 { key } else { b.fold_in(key, j as u32) };
            let acts = Activations {
                params: &full,
                tokens: tokens[j],
                targets: targets[j],
                key,
                rng_layout,
                local: local.clone(),
            };
            let local_loss = forward_loss(b, cfg, &acts);
            local_losses.push(local_loss);
            // The global loss is the mean of the devices' (and microbatches') local means:
            // differentiate loss/(n k), n the devices splitting the tokens, so that summing the
            // gradients over them and the microbatches gives the mean's.
            Ok(if !token_axes.is_empty() || k > 1 {
                b.scale(local_loss, 1.0 / (par.token_split() * k) as f32)
            } else {
                local_loss
            })
        };
        let mut on_grad = |b: &mut Builder, i: usize, g: ValueId| match plans[i].scatter_dim(par.zero) {
            Some(d) => b.psum_scatter(g, &["dp"], d, true),
            None => g,
        };
        let acc = accumulate(b, k, params, &names, &mut loss_of, &mut on_grad)?;
        marks.0 = acc.first_forward_end;
        let mut grads = acc.grads;
        for (i, g) in grads.iter_mut().enumerate() {
            // Gradients of parameters not split over a token axis are the explicit all-reduce
            // of the data-parallel body; FSDP's were reduce-scattered by the all_gather's
            // transpose, ZeRO-2's as they were made.
            let axes = plans[i].sum_axes(&token_axes, &[], par.zero);
            if !axes.is_empty() {
                *g = b.psum(*g, &axes);
                b.set_name(*g, &names[i]);
            }
        }
        let local_loss = local_losses
            .iter()
            .copied()
            .reduce(|a, l| b.add(a, l))
            .ok_or_else(|| IrError::new("accumulate", "needs at least one microbatch"))?;
        let local_loss = if k > 1 {
            b.scale(local_loss, 1.0 / k as f32)
        } else {
            local_loss
        };
        let loss = if token_axes.is_empty() {
            local_loss
        } else {
            b.pmean(local_loss, &token_axes)
        };
        b.set_name(loss, "loss");
        marks.1 = b.program().instrs.len();

        let names: Vec<&str> = specs.iter().map(|ps| ps.name.as_str()).collect();
        Ok(updates(
            b,
            opt,
            par.zero,
            &plans,
            &names,
            (params, &grads, state),
            vec![loss],
        ))
    })?;
    Ok(TrainStep {
        program,
        forward_end: marks.0,
        backward_end: marks.1,
        config: cfg.clone(),
        optimizer: opt,
    })
}
