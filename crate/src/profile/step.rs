//! The per-device train step a set of options runs, built without executing anything.
use crate::exec::{ExecError, Parallel, TrainerOptions};
use crate::model::{train_step_program, TrainStep};
use crate::partition::auto::auto_train_step_with_specs;
use crate::partition::{combine_train_step, shard_map_train_step};

/// The partitioned step `opts` chooses, as `Trainer::new` builds it (the one helper to swap
/// for `plan::build` once that exists).
pub fn train_step_for(opts: &TrainerOptions) -> Result<TrainStep, ExecError> {
    let cfg = &opts.config;
    let step = match &opts.parallel {
        Parallel::None => train_step_program(cfg, opts.optimizer, opts.rng_layout)?,
        Parallel::ShardMap {
            strategy,
            mesh,
            dropout_key,
        } => shard_map_train_step(cfg, opts.optimizer, opts.rng_layout, *strategy, mesh, *dropout_key)?,
        Parallel::Auto { strategy, mesh, specs } => {
            auto_train_step_with_specs(cfg, opts.optimizer, opts.rng_layout, *strategy, mesh, specs)?.0
        }
    };
    Ok(if opts.combine_all_reduces {
        combine_train_step(&step)
    } else {
        step
    })
}
