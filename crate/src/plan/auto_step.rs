//! The train step of a composition in automatic mode: the global step (forward, autodiff
//! backward, update) under jit, with the composition expressed only through shardings: the
//! logical-axis rules' in_shardings, and sequence parallelism's constraints.
use super::rules::{Holder, Logical};
use super::spec_names::{resolve_spec, SpecTarget};
use super::{Mode, Parallelism, PlanError};
use std::collections::BTreeMap;

use crate::ir::{CpOrder, Op, Program, RngLayout, Role, ValueId};
use crate::model::{accumulated_train_step_in_order, param_specs, GptConfig, Optimizer, ParamSpec, TrainStep};
use crate::partition::auto::{jit_pinned, Pin};
use crate::partition::{AutoProgram, PartitionError};
use crate::setting::{Refusal, Setting};
use crate::sharding::PartitionSpec;

/// The in_sharding of a parameter: the rules' layout of its stored shape (w_qkv's columns
/// split over "tp"; the partitioner reshards where the model views them per head), wpe's rows
/// split like the residual stream's sequence (each device holds and updates the rows its
/// tokens read).
pub fn auto_param_spec(cfg: &GptConfig, par: &Parallelism, ps: &ParamSpec) -> PartitionSpec {
    par.param_layout(cfg, ps, Mode::Auto).1
}

/// The in_sharding of a parameter's optimizer state: its parameter's, except under ZeRO,
/// which splits the state over "dp" while the parameter stays whole.
pub fn auto_state_spec(cfg: &GptConfig, par: &Parallelism, ps: &ParamSpec) -> PartitionSpec {
    par.state_layout(cfg, ps, Mode::Auto).1
}

/// jit of the global train step with the composition's shardings: params and optimizer state
/// as [`auto_param_spec`] says (outputs laid out like their inputs), tokens and targets split
/// as the rules split (B, T), the key and the loss replicated.
pub fn auto_train_step(
    cfg: &GptConfig,
    opt: Optimizer,
    rng_layout: RngLayout,
    par: &Parallelism,
) -> Result<(TrainStep, AutoProgram), PlanError> {
    auto_train_step_with_specs(cfg, opt, rng_layout, par, &[])
}

/// [`auto_train_step`] with per-value specs overriding the rules' (`--spec
/// w_fc=P(None,'tp')`), matched by [`resolve_spec`]: a name matches a parameter's full name (`h0.w_fc`) or, for block
/// parameters, its name in every block (`w_fc`), and sets its in_sharding (its optimizer state
/// and update follow it). Any other named value of the global step is matched by its name: an
/// input (`tokens`, `targets`) gets the spec as its in_sharding, an intermediate (`h0.att`,
/// `logits`, a gradient `dh0.w_fc`) as a `jax.lax.with_sharding_constraint`. Specs the
/// partitioner cannot honour are errors naming the value.
pub fn auto_train_step_with_specs(
    cfg: &GptConfig,
    opt: Optimizer,
    rng_layout: RngLayout,
    par: &Parallelism,
    overrides: &[(String, PartitionSpec)],
) -> Result<(TrainStep, AutoProgram), PlanError> {
    let (global, auto) = jit_train_step(cfg, opt, rng_layout, par, overrides, 1, CpOrder::Contiguous)?;
    Ok((partitioned_step(&global, &auto), auto))
}

/// The global train step (with gradient accumulation over `microbatches`, the sequence in
/// `order`) and jit's result for it under the composition's shardings with `overrides`
/// ([`auto_train_step_with_specs`] without assembling the partitioned step). Zig-zag order
/// is the global program's own: the tokens reordered inside it, so that jit's contiguous
/// blocks of the sequence are zig-zag's chunks.
pub(super) fn jit_train_step(
    cfg: &GptConfig,
    opt: Optimizer,
    rng_layout: RngLayout,
    par: &Parallelism,
    overrides: &[(String, PartitionSpec)],
    microbatches: usize,
    order: CpOrder,
) -> Result<(TrainStep, AutoProgram), PlanError> {
    par.check(cfg, microbatches)?;
    let zigzag = par.zigzag_parts(order);
    let global = accumulated_train_step_in_order(cfg, opt, rng_layout, microbatches, zigzag)?;
    // The composition's own constraints first, so a user's spec on the same value wins.
    let implicit = composition_constraints(cfg, par, microbatches, order);
    let s = step_shardings(cfg, opt, par, &global.program, &implicit, overrides, order)?;
    let out_shardings: Vec<Option<PartitionSpec>> = s.out_shardings.iter().cloned().map(Some).collect();
    let prog = &global.program;
    // Each pin says whose it is, so an op it makes jit insert names the rule that asked.
    let pins: BTreeMap<ValueId, Pin> = s
        .constraints
        .iter()
        .map(|(v, spec)| {
            let pin = Pin::constraint(spec.clone());
            let pin = match s.implicit_by.get(v) {
                Some(name) => Pin {
                    why: format!("the composition's with_sharding_constraint on {name}, from the logical-axis rules"),
                    ..pin
                },
                None => pin,
            };
            (*v, pin)
        })
        .collect();
    let auto = jit_pinned(prog, &par.mesh, &s.in_shardings, &out_shardings, &pins).map_err(|e| match &e {
        PartitionError::Constraint { value, why, .. } => match s.pinned_by.get(value) {
            Some((name, spec)) => Refusal::at(Setting::Spec(name.clone()), spec, why).into(),
            None => PlanError::from(e),
        },
        _ => PlanError::from(e),
    })?;
    Ok((global, auto))
}

/// The shardings a global step is given: its in_shardings and out_shardings (parameters and
/// optimizer state as the rules lay them out, the tokens split as (B, T) is, the key and loss
/// replicated), and where values are pinned: the gradients as [`gradient_pin`] says, then
/// `implicit` (a composition's own constraints), then the user's `overrides` ([`resolve_spec`]:
/// a parameter's spec sets its in_sharding, its state's and its update's; an input's its
/// in_sharding; an intermediate's pins it).
pub(super) struct StepShardings {
    pub in_shardings: Vec<PartitionSpec>,
    pub out_shardings: Vec<PartitionSpec>,
    pub constraints: BTreeMap<ValueId, PartitionSpec>,
    /// The gradient pins among `constraints`.
    pub gradient_pins: BTreeMap<ValueId, PartitionSpec>,
    /// Which override pinned each value, so a pin that cannot hold is said at its spec.
    pub pinned_by: BTreeMap<ValueId, (String, PartitionSpec)>,
    /// The values the composition's own constraints pin, by the name they pin.
    pub implicit_by: BTreeMap<ValueId, String>,
}

pub(super) fn step_shardings(
    cfg: &GptConfig,
    opt: Optimizer,
    par: &Parallelism,
    prog: &Program,
    implicit: &[(String, PartitionSpec)],
    overrides: &[(String, PartitionSpec)],
    order: CpOrder,
) -> Result<StepShardings, PlanError> {
    let specs = param_specs(cfg);
    let mut pspec: Vec<PartitionSpec> = specs.iter().map(|ps| auto_param_spec(cfg, par, ps)).collect();
    let mut sspec: Vec<PartitionSpec> = specs.iter().map(|ps| auto_state_spec(cfg, par, ps)).collect();
    let mut inputs: BTreeMap<ValueId, PartitionSpec> = BTreeMap::new();
    let gradient_pins = gradient_constraints(prog, par, &pspec, &sspec);
    let mut constraints = gradient_pins.clone();
    let mut pinned_by: BTreeMap<ValueId, (String, PartitionSpec)> = BTreeMap::new();
    let mut implicit_by: BTreeMap<ValueId, String> = BTreeMap::new();
    let given = implicit
        .iter()
        .map(|o| (o, false))
        .chain(overrides.iter().map(|o| (o, true)));
    for ((name, spec), by_user) in given {
        match resolve_spec(&specs, prog, &par.mesh, name, spec)? {
            SpecTarget::Params(hits) => hits.into_iter().for_each(|i| {
                pspec[i] = spec.clone();
                sspec[i] = spec.clone();
            }),
            SpecTarget::Values {
                inputs: named_inputs,
                intermediates,
            } => {
                for v in named_inputs {
                    inputs.insert(v, spec.clone());
                }
                for v in intermediates {
                    constraints.insert(v, spec.clone());
                    if by_user {
                        pinned_by.insert(v, (name.clone(), spec.clone()));
                        implicit_by.remove(&v);
                    } else {
                        implicit_by.insert(v, name.clone());
                    }
                }
            }
        }
    }
    let batch = par.tokens_spec_in(cfg, order);
    let in_shardings: Vec<PartitionSpec> = prog
        .inputs
        .iter()
        .map(|(v, role)| match role {
            Role::Param(i) => pspec[*i].clone(),
            Role::OptState { param: i, .. } => sspec[*i].clone(),
            _ if inputs.contains_key(v) => inputs[v].clone(),
            Role::Tokens | Role::Targets => batch.clone(),
            _ => PartitionSpec::replicated(),
        })
        .collect();
    let mut out_shardings = vec![PartitionSpec::replicated()];
    for (spec, state) in pspec.iter().zip(&sspec) {
        out_shardings.push(spec.clone());
        for _ in 0..opt.slots() {
            out_shardings.push(state.clone());
        }
    }
    Ok(StepShardings {
        in_shardings,
        out_shardings,
        constraints,
        gradient_pins,
        pinned_by,
        implicit_by,
    })
}

/// The composition's own `with_sharding_constraint`s in automatic mode, by the values' names:
/// sequence parallelism's, a mixture's expert buffers', zig-zag's reordered tokens.
pub fn composition_constraints(
    cfg: &GptConfig,
    par: &Parallelism,
    microbatches: usize,
    order: CpOrder,
) -> Vec<(String, PartitionSpec)> {
    let mut pins = if par.sequence_parallel {
        sequence_parallel_constraints(cfg, par)
    } else {
        vec![]
    };
    pins.extend(super::moe_constraints(cfg, par, microbatches));
    pins.extend(zigzag_constraints(cfg, par, order));
    pins
}

/// Zig-zag's constraints (none in contiguous order): the tokens and targets, reordered inside
/// the program, split as the rules split (B, T), so jit's contiguous block of the sequence on a
/// "cp" device is its two zig-zag chunks (without them the reorder's concatenation leaves the
/// sequence whole).
pub(super) fn zigzag_constraints(cfg: &GptConfig, par: &Parallelism, order: CpOrder) -> Vec<(String, PartitionSpec)> {
    if par.zigzag_parts(order).is_none() {
        return vec![];
    }
    crate::model::ZIGZAG_INPUTS
        .iter()
        .map(|name| (name.to_string(), par.tokens_spec(cfg)))
        .collect()
}

/// Sequence parallelism's shardings in automatic mode, as `with_sharding_constraint`s on the
/// step's named values, from the logical-axis rules (what MaxText's rules do): the residual
/// stream split on the sequence over "tp" (and "cp"), each layer norm's output whole over "tp"
/// before the column-parallel matmul (the partitioner all-gathers it), and each row-parallel
/// matmul's output split on the sequence (the partitioner reduce-scatters its partial sums).
/// Without them propagation would split the sequence through the matmuls and gather the
/// weights instead. (They pin forward values only: the backward is what propagation makes of
/// the cotangents.)
pub fn sequence_parallel_constraints(cfg: &GptConfig, par: &Parallelism) -> Vec<(String, PartitionSpec)> {
    use Logical::{Batch, Embed, Heads, Length};
    let (b, t, c) = (cfg.batch, cfg.seq, cfg.d_model);
    let gathered = Parallelism {
        sequence_parallel: false,
        ..par.clone()
    };
    let seq = par.spec(&[b, t, c], &[Some(Batch), Some(Length), Some(Embed)], Holder::Param);
    let whole = gathered.spec(&[b, t, c], &[Some(Batch), Some(Length), Some(Embed)], Holder::Param);
    // Attention between the two matmuls, as Megatron runs it: the whole sequence, the heads
    // split over "tp" (the column-parallel weights' own split).
    let heads = gathered.spec(
        &[b, cfg.heads, t, cfg.head_dim()],
        &[Some(Batch), Some(Heads), Some(Length), None],
        Holder::Param,
    );
    let mut out = vec![("x0".to_string(), seq.clone())];
    for l in 0..cfg.layers {
        for (name, spec) in [
            ("ln1", &whole),
            ("att", &heads),
            ("proj", &seq),
            ("x_att", &seq),
            ("ln2", &whole),
            ("mlp", &seq),
            ("x_mlp", &seq),
        ] {
            out.push((format!("h{l}.{name}"), spec.clone()));
        }
    }
    out
}

/// Where jit is told to keep a parameter's gradient (a with_sharding_constraint).
#[derive(Clone, Debug, PartialEq)]
pub enum GradientPin {
    /// Nowhere: it goes where propagation takes it.
    Free,
    /// The gradient the update reads, laid out so (ZeRO-1: replicated, all-reduced once after
    /// the microbatches; the update then slices each device's block).
    Update(PartitionSpec),
    /// Every value it accumulates in (`dNAME`), laid out so (ZeRO-2 and FSDP: the state's
    /// blocks, so each microbatch's gradient is reduce-scattered as it is made and only blocks
    /// are held; without the pin jit reduce-scatters where the update reads it, holding it
    /// whole until then).
    Every(PartitionSpec),
}

/// ZeRO and FSDP in jit: the optimizer state's in_shardings ([`auto_state_spec`]) and this pin
/// on the gradient of a parameter laid out as `param` whose state is laid out as `state`.
/// Where the state is not split over a data axis (too small to split, or no ZeRO) the gradient
/// is free.
pub fn gradient_pin(par: &Parallelism, param: &PartitionSpec, state: &PartitionSpec) -> GradientPin {
    let fsdp = state.uses_axis("fsdp");
    let zero = par.zero.shards_state() && state.uses_axis("dp") && !param.uses_axis("dp");
    if !fsdp && !zero {
        GradientPin::Free
    } else if fsdp || par.zero.shards_gradients() {
        GradientPin::Every(state.clone())
    } else {
        GradientPin::Update(param.clone())
    }
}

/// The with_sharding_constraints of [`gradient_pin`] on the global step's values.
fn gradient_constraints(
    prog: &Program,
    par: &Parallelism,
    pspec: &[PartitionSpec],
    sspec: &[PartitionSpec],
) -> BTreeMap<ValueId, PartitionSpec> {
    let mut pins = BTreeMap::new();
    let params: Vec<(usize, ValueId)> = prog
        .inputs
        .iter()
        .filter_map(|(v, role)| match role {
            Role::Param(i) => Some((*i, *v)),
            _ => None,
        })
        .collect();
    for ins in &prog.instrs {
        if !matches!(ins.op, Op::SgdUpdate { .. } | Op::AdamWUpdate { .. }) {
            continue;
        }
        let Some(&(i, _)) = params.iter().find(|(_, p)| *p == ins.inputs[0]) else {
            continue;
        };
        let g = ins.inputs[1];
        match gradient_pin(par, &pspec[i], &sspec[i]) {
            GradientPin::Free => {}
            GradientPin::Update(spec) => {
                pins.insert(g, spec);
            }
            GradientPin::Every(spec) => {
                let name = prog.info(g).name.clone();
                for (v, info) in prog.values.iter().enumerate() {
                    if name.is_some() && info.name == name {
                        pins.insert(ValueId(v as u32), spec.clone());
                    }
                }
            }
        }
    }
    pins
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dp_step(overrides: &[(&str, &str)]) -> Result<(TrainStep, AutoProgram), PlanError> {
        let cfg = GptConfig {
            dropout: 0.0,
            ..GptConfig::tiny()
        };
        let par = Parallelism::dp(2).unwrap();
        let overrides: Vec<(String, PartitionSpec)> = overrides
            .iter()
            .map(|(n, s)| (n.to_string(), PartitionSpec::parse(s).unwrap()))
            .collect();
        jit_train_step(
            &cfg,
            Optimizer::AdamW { lr: 1e-3 },
            RngLayout::Original,
            &par,
            &overrides,
            1,
            CpOrder::Contiguous,
        )
    }

    fn sharding_of(global: &TrainStep, auto: &AutoProgram, name: &str) -> PartitionSpec {
        let v = global
            .program
            .values
            .iter()
            .position(|i| i.name.as_deref() == Some(name))
            .unwrap();
        auto.global_shardings[v].clone()
    }

    #[test]
    fn a_spec_named_tokens_is_the_token_batchs_in_sharding() {
        let (global, auto) = dp_step(&[("tokens", "P()")]).unwrap();
        assert_eq!(sharding_of(&global, &auto, "tokens"), PartitionSpec::replicated());
        // The targets keep the strategy's batch split.
        assert_eq!(sharding_of(&global, &auto, "targets").dim_axes(0), vec!["dp"]);
    }

    #[test]
    fn a_spec_naming_an_intermediate_is_a_sharding_constraint() {
        let (global, plain) = dp_step(&[]).unwrap();
        assert_eq!(sharding_of(&global, &plain, "h0.att").dim_axes(0), vec!["dp"]);
        let (global, auto) = dp_step(&[("h0.att", "P()")]).unwrap();
        assert_eq!(sharding_of(&global, &auto, "h0.att"), PartitionSpec::replicated());
        assert!(auto.inserted.iter().any(|r| r.source_op == "with_sharding_constraint"));
    }

    #[test]
    fn a_spec_naming_nothing_or_optimizer_state_is_refused_with_the_fix() {
        let e = dp_step(&[("nope", "P()")]).unwrap_err().to_string();
        assert!(e.contains("no parameter or named value `nope`"), "{e}");
        let e = dp_step(&[("h0.w_fc.m", "P()")]).unwrap_err().to_string();
        assert!(e.contains("give `h0.w_fc` the spec"), "{e}");
    }
}
