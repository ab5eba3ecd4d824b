//! The train step of a strategy in automatic mode: the global step (forward, autodiff
//! backward, update) under jit, with the strategy expressed only through shardings.
use super::strategy::{check, param_layout};
use super::{PlanError, Strategy};
use crate::ir::{RngLayout, Role};
use crate::model::{param_specs, train_step_program, GptConfig, Optimizer, ParamSpec, TrainStep};
use crate::partition::{jit, AutoProgram};
use crate::sharding::{Mesh, PartitionSpec};

/// The in_sharding of a parameter under `strategy`: shard_map mode's specs, except that
/// w_qkv and b_qkv keep their stored shapes (columns split over "tp"; the partitioner
/// reshards where the model views them per head).
pub fn auto_param_spec(cfg: &GptConfig, strategy: Strategy, mesh: &Mesh, ps: &ParamSpec) -> PartitionSpec {
    let leaf = ps.name.rsplit('.').next().unwrap_or(&ps.name);
    let tp = matches!(strategy, Strategy::Tp | Strategy::DpTp);
    match leaf {
        "w_qkv" if tp => PartitionSpec::from_axes(&[None, Some("tp")]),
        "b_qkv" if tp => PartitionSpec::from_axes(&[Some("tp")]),
        _ => param_layout(cfg, strategy, mesh, ps).1,
    }
}

/// jit of the global train step with the strategy's shardings: params and optimizer state
/// as [`auto_param_spec`] says (outputs laid out like their inputs), tokens and targets
/// split over "dp" when the strategy has it, the key and the loss replicated.
pub fn auto_train_step(
    cfg: &GptConfig,
    opt: Optimizer,
    rng_layout: RngLayout,
    strategy: Strategy,
    mesh: &Mesh,
) -> Result<(TrainStep, AutoProgram), PlanError> {
    auto_train_step_with_specs(cfg, opt, rng_layout, strategy, mesh, &[])
}

/// [`auto_train_step`] with per-parameter specs overriding the strategy's (`--spec
/// w_fc=P(None,'tp')`): a name matches a parameter's full name (`h0.w_fc`) or, for block
/// parameters, its name in every block (`w_fc`). Specs the partitioner cannot honour are
/// errors naming the parameter.
pub fn auto_train_step_with_specs(
    cfg: &GptConfig,
    opt: Optimizer,
    rng_layout: RngLayout,
    strategy: Strategy,
    mesh: &Mesh,
    overrides: &[(String, PartitionSpec)],
) -> Result<(TrainStep, AutoProgram), PlanError> {
    let (global, auto) = jit_train_step(cfg, opt, rng_layout, strategy, mesh, overrides)?;
    Ok((partitioned_step(&global, &auto), auto))
}

/// The global train step and jit's result for it under the strategy's shardings with
/// `overrides` ([`auto_train_step_with_specs`] without assembling the partitioned step).
pub(super) fn jit_train_step(
    cfg: &GptConfig,
    opt: Optimizer,
    rng_layout: RngLayout,
    strategy: Strategy,
    mesh: &Mesh,
    overrides: &[(String, PartitionSpec)],
) -> Result<(TrainStep, AutoProgram), PlanError> {
    check(cfg, strategy, mesh)?;
    let global = train_step_program(cfg, opt, rng_layout)?;
    let specs = param_specs(cfg);
    let mut pspec: Vec<PartitionSpec> = specs
        .iter()
        .map(|ps| auto_param_spec(cfg, strategy, mesh, ps))
        .collect();
    for (name, spec) in overrides {
        let leaf = |ps: &ParamSpec| ps.name.rsplit('.').next().map(str::to_string).unwrap_or_default();
        let hits: Vec<usize> = specs
            .iter()
            .filter(|ps| ps.name == *name || leaf(ps) == *name)
            .map(|ps| ps.index)
            .collect();
        if hits.is_empty() {
            let names: Vec<String> = specs
                .iter()
                .map(leaf)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            return Err(PlanError::Invalid {
                what: format!("--spec {name}={spec}"),
                why: format!("there is no parameter `{name}`; parameters are {}", names.join(", ")),
            });
        }
        for i in hits {
            let ps = &specs[i];
            crate::sharding::NamedSharding::new(mesh.clone(), spec.clone())
                .and_then(|s| s.shard_shape(&ps.shape))
                .map_err(|e| PlanError::Invalid {
                    what: format!("--spec {name}={spec} for parameter `{}` {:?}", ps.name, ps.shape),
                    why: e.to_string(),
                })?;
            pspec[i] = spec.clone();
        }
    }
    let batch = if strategy.axes().contains(&"dp") {
        PartitionSpec::from_axes(&[Some("dp"), None])
    } else {
        PartitionSpec::replicated()
    };
    let in_shardings: Vec<PartitionSpec> = global
        .program
        .inputs
        .iter()
        .map(|(_, role)| match role {
            Role::Param(i) | Role::OptState { param: i, .. } => pspec[*i].clone(),
            Role::Tokens | Role::Targets => batch.clone(),
            _ => PartitionSpec::replicated(),
        })
        .collect();
    let mut out_shardings = vec![Some(PartitionSpec::replicated())];
    for spec in &pspec {
        for _ in 0..1 + opt.slots() {
            out_shardings.push(Some(spec.clone()));
        }
    }
    let auto = jit(&global.program, mesh, &in_shardings, &out_shardings)?;
    Ok((global, auto))
}

/// The partitioned train step of `auto`, jit's result for `global`: its phase boundaries
/// are where jit (and the combiner, if it ran on `auto`) put the global step's.
pub(super) fn partitioned_step(global: &TrainStep, auto: &AutoProgram) -> TrainStep {
    let start = |i: usize| auto.instr_starts.get(i).copied().unwrap_or(auto.program.instrs.len());
    TrainStep {
        program: auto.program.clone(),
        forward_end: start(global.forward_end),
        backward_end: start(global.backward_end),
        config: global.config.clone(),
        optimizer: global.optimizer,
    }
}
