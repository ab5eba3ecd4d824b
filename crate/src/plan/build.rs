//! The one way from options to what runs: the model's train step, partitioned as the options
//! say (a strategy's shard_map body, or jit with the strategy's shardings), then the passes.
use super::auto_step::{jit_train_step, partitioned_step};
use super::pipeline_step::{check_pipeline, pipeline_train_step};
use super::shard_map_step::shard_map_accumulated_step;
use super::strategy::check_cp;
use super::{combine_train_step, Mode, Parallel, PlanError, TrainerOptions};
use crate::model::{accumulated_train_step, TrainStep};
use crate::partition::auto::Inserted;
use crate::partition::combine_auto_program;
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
    /// In automatic mode, every named value of the global step (parameters, optimizer state,
    /// tokens, activations, gradients, updates) with its global shape and the sharding jit
    /// gave it; empty in the other modes.
    pub values: Vec<ValueSharding>,
}

/// A named value of the global step and where jit laid it out (what
/// `jax.debug.visualize_array_sharding` would be shown).
#[derive(Clone, Debug, PartialEq)]
pub struct ValueSharding {
    pub name: String,
    pub shape: Vec<usize>,
    pub spec: PartitionSpec,
}

/// Plans `opts`: checks the model, strategy and mesh, builds the train step, partitions it and
/// runs the all-reduce combiner once if asked. Everything that runs or shows a step (the
/// trainer, export, inspect, bench and the page) starts here.
pub fn build(opts: &TrainerOptions) -> Result<Planned, PlanError> {
    let cfg = &opts.config;
    let combine = opts.combine_all_reduces;
    let combined = |step: TrainStep| if combine { combine_train_step(&step) } else { step };
    if let Parallel::ShardMap { strategy, mesh, .. } | Parallel::Auto { strategy, mesh, .. } = &opts.parallel {
        check_pipeline(cfg, *strategy, mesh, opts.schedule, opts.parallel.mode())?;
    }
    let (step, inserted, values) = match &opts.parallel {
        Parallel::None if opts.cp_order != Default::default() => {
            return Err(PlanError::Invalid {
                what: format!("--cp-order {}", opts.cp_order.name()),
                why: "orders context parallelism's blocks, and one device has none: use --strategy cp or dp_cp".into(),
            })
        }
        Parallel::None if opts.schedule != Default::default() => {
            return Err(PlanError::Invalid {
                what: format!("--schedule {}", opts.schedule.name()),
                why: "orders a pipeline's microbatches, and one device has none: use --strategy pp or dp_pp".into(),
            })
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
        Parallel::ShardMap {
            strategy,
            mesh,
            dropout_key,
        } if strategy.is_pipeline() => (
            combined(pipeline_train_step(
                cfg,
                opts.optimizer,
                opts.rng_layout,
                *strategy,
                mesh,
                *dropout_key,
                opts.microbatches,
                opts.schedule,
            )?),
            None,
            vec![],
        ),
        Parallel::ShardMap {
            strategy,
            mesh,
            dropout_key,
        } => (
            combined(shard_map_accumulated_step(
                cfg,
                opts.optimizer,
                opts.rng_layout,
                *strategy,
                mesh,
                *dropout_key,
                opts.microbatches,
                opts.cp_order,
            )?),
            None,
            vec![],
        ),
        Parallel::Auto { strategy, mesh, specs } => {
            check_cp(cfg, *strategy, mesh, opts.cp_order, Mode::Auto)?;
            let (global, auto) = jit_train_step(
                cfg,
                opts.optimizer,
                opts.rng_layout,
                *strategy,
                mesh,
                specs,
                opts.microbatches,
            )?;
            // Combined on jit's result, so the inserted-op records follow the psums they name.
            let auto = if combine { combine_auto_program(&auto) } else { auto };
            // One entry per name: with microbatches a name (h0.att, a gradient's buffer) is
            // made once per microbatch; the last is the one the step ends with.
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
            (partitioned_step(&global, &auto), Some(auto.inserted), values)
        }
    };
    // The partitioners trace new programs; the dtype policy is the configuration's.
    let mut step = step;
    step.program.precision = cfg.precision;
    Ok(Planned {
        options: opts.clone(),
        step,
        inserted,
        values,
    })
}
