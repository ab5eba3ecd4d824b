//! The one way from options to what runs: the model's train step, partitioned as the options
//! say (a shard_map body composed per mesh axis, or jit with the rules' shardings), then the
//! passes.
use super::auto_step::{jit_train_step, partitioned_step};
use super::compose::Compose;
use super::explicit_step::{explicit_train_step, ExplicitView};
use super::pipeline::{check_pipeline, pipeline_train_step};
use super::shard_map_step::shard_map_accumulated_step;
use super::{combine_train_step, Mode, Parallel, PlanError, TrainerOptions};
use crate::model::{accumulated_train_step, TrainStep};
use crate::partition::auto::Inserted;
use crate::partition::combine_auto_program;
use crate::setting::{Refusal, Setting};
use crate::sharding::PartitionSpec;

/// A planned run: its options and the train step that runs them.
#[derive(Clone, Debug)]
pub struct Planned {
    pub options: TrainerOptions,
    /// The train step (forward, backward, update) on every device's local shapes, with the
    /// all-reduces combined when the options ask for it.
    pub step: TrainStep,
    /// In automatic mode, what the partitioner inserted and why, at instructions of
    /// `step.program`; None in the other modes, where the body says every collective.
    pub inserted: Option<Vec<Inserted>>,
    /// In automatic and explicit mode, every named value of the global step (parameters,
    /// optimizer state, tokens, activations, gradients, updates) with its global shape and the
    /// sharding jit gave it; empty in the other modes.
    pub values: Vec<ValueSharding>,
    /// In explicit mode, the typed global program: each line with its types, the program's
    /// choices (`out_sharding=`, `reshard`) and where its random bits live.
    pub explicit: Option<ExplicitView>,
}

/// A named value of the global step and where jit laid it out (what
/// `jax.debug.visualize_array_sharding` would be shown).
#[derive(Clone, Debug, PartialEq)]
pub struct ValueSharding {
    pub name: String,
    pub shape: Vec<usize>,
    pub spec: PartitionSpec,
}

/// Plans `opts`: checks the model and the composition, builds the train step, partitions it and
/// runs the all-reduce combiner once if asked. Everything that runs or shows a step (the
/// trainer, export, inspect, bench and the page) starts here.
pub fn build(opts: &TrainerOptions) -> Result<Planned, PlanError> {
    let cfg = &opts.config;
    let combine = opts.combine_all_reduces;
    let combined = |step: TrainStep| if combine { combine_train_step(&step) } else { step };
    // The model splits over every axis before anything else is said of the mode.
    if let Some(par) = opts.parallel.parallelism() {
        cfg.validate()?;
        super::pipeline::check(
            cfg,
            par,
            opts.schedule,
            opts.virtual_stages,
            &opts.stage_layers,
            opts.microbatches,
        )?;
        par.check_with_stages(cfg, opts.microbatches, &opts.stage_layers)?;
        check_pipeline(par, opts.schedule, opts.parallel.mode())?;
    }
    let mut explicit = None;
    let (step, inserted, values) = match &opts.parallel {
        Parallel::None if opts.cp_order != Default::default() => {
            let why = format!(
                "orders context parallelism's blocks, and one device has none: use a mesh with a 'cp' axis (e.g. {})",
                Setting::MeshAxis("cp".into()).at(4)
            );
            return Err(Refusal::at(Setting::CpOrder, opts.cp_order.name(), why).into());
        }
        Parallel::None if opts.schedule != Default::default() => {
            let why = format!(
                "orders a pipeline's microbatches, and one device has none: use a mesh with a 'pp' axis (e.g. {})",
                Setting::MeshAxis("pp".into()).at(2)
            );
            return Err(Refusal::at(Setting::Schedule, opts.schedule.name(), why).into());
        }
        Parallel::None if opts.virtual_stages != 1 || !opts.stage_layers.is_empty() => {
            let (setting, value) = match opts.virtual_stages {
                1 => (Setting::StageLayers, super::stage_layers_text(&opts.stage_layers)),
                v => (Setting::VirtualStages, v.to_string()),
            };
            let why = format!(
                "lays a pipeline's blocks over its stages, and one device has none: use a mesh with a 'pp' axis (e.g. {})",
                Setting::MeshAxis("pp".into()).at(2)
            );
            return Err(Refusal::at(setting, value, why).into());
        }
        Parallel::None => (
            combined(accumulated_train_step(
                cfg,
                opts.optimizer,
                opts.rng_layout,
                opts.microbatches,
            )?),
            None,
            vec![],
        ),
        Parallel::ShardMap { par, dropout_key } => {
            let c = Compose {
                cfg,
                par,
                dropout_key: *dropout_key,
                cp_order: opts.cp_order,
            };
            let step = if par.is_pipeline() {
                pipeline_train_step(&c, opts.optimizer, opts.rng_layout, opts.microbatches, &opts.pipeline())?
            } else {
                shard_map_accumulated_step(&c, opts.optimizer, opts.rng_layout, opts.microbatches)?
            };
            (combined(step), None, vec![])
        }
        Parallel::Auto { par, specs } => {
            par.check_cp(cfg, opts.cp_order, Mode::Auto)?;
            let (global, auto) = jit_train_step(
                cfg,
                opts.optimizer,
                opts.rng_layout,
                par,
                specs,
                opts.microbatches,
                opts.cp_order,
            )?;
            // Combined on jit's result, so the inserted-op records follow the psums they name.
            let auto = if combine { combine_auto_program(&auto) } else { auto };
            let values = value_shardings(&global, &auto);
            (partitioned_step(&global, &auto), Some(auto.inserted), values)
        }
        Parallel::Explicit { par, axis_types, specs } => {
            par.check_cp(cfg, opts.cp_order, Mode::Explicit)?;
            let (typed, auto, view): (TrainStep, _, ExplicitView) = explicit_train_step(opts, par, axis_types, specs)?;
            let auto = if combine { combine_auto_program(&auto) } else { auto };
            let values = value_shardings(&typed, &auto);
            explicit = Some(view);
            (partitioned_step(&typed, &auto), Some(auto.inserted), values)
        }
    };
    // The partitioners trace new programs; the dtype policy is the configuration's.
    let mut step = step;
    step.program.precision = cfg.precision;
    step.program.expert_imbalance = cfg.moe.map(|m| m.imbalance);
    Ok(Planned {
        options: opts.clone(),
        step,
        inserted,
        values,
        explicit,
    })
}

/// Every named value of `global` with the sharding jit gave it. One entry per name: with
/// microbatches a name (h0.att, a gradient's buffer) is made once per microbatch; the last is
/// the one the step ends with.
fn value_shardings(global: &TrainStep, auto: &crate::partition::AutoProgram) -> Vec<ValueSharding> {
    let mut values: Vec<ValueSharding> = vec![];
    for (info, spec) in global.program.values.iter().zip(&auto.global_shardings) {
        let Some(name) = &info.name else { continue };
        values.retain(|v| &v.name != name);
        values.push(ValueSharding {
            name: name.clone(),
            shape: info.shape.clone(),
            spec: spec.clone(),
        });
    }
    values
}
