//! `shardlab bench compare [--preset seed] [--rng original|partitionable] [--json]`: the
//! automatic, explicit and shard_map steps of the same strategy, interleaved in one process;
//! medians.
use shardlab::bench::compare::compare;
use shardlab::exec::Backend;

use crate::args::{trainer_options, MemoryBudgetArg, ModelArgs, ParallelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub parallel: ParallelArgs,
    /// Measured steps of each program (after 2 warm-up steps each).
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// One JSON object: {"auto_ms":..,"explicit_ms":..,"shard_map_ms":..,"ratio":..,"modes":[..],...}.
    #[arg(long)]
    pub json: bool,
    /// Run on the CPU reference executor.
    #[arg(long)]
    pub cpu: bool,
    #[command(flatten)]
    pub budget: MemoryBudgetArg,
    #[command(flatten)]
    pub retune: crate::tuning_cache::RetuneArg,
}

pub fn run(mut args: Args) -> Result<(), String> {
    args.model.apply_preset(&mut args.parallel);
    if args.parallel.mode == shardlab::plan::Mode::Single {
        // Every mode runs anyway; the mode flag only matters for which flags apply.
        args.parallel.mode = shardlab::plan::Mode::ShardMap;
    }
    let opts = trainer_options(&args.model, &args.parallel)?;
    if let Some(par) = opts.parallel.parallelism().filter(|p| p.is_pipeline()) {
        let mesh = par.name();
        return Err(format!(
            "--mesh {mesh}: bench compare races automatic and explicit mode against shard_map, and a pipeline runs in \
             shard_map mode only (jit's partitioner has no pipeline yet; `shardlab plan --mesh {mesh} --mode auto` says \
             what it lacks): time it with `shardlab train --mesh {mesh} --mode shard_map`, or compare a mesh every \
             mode runs"
        ));
    }
    if args.steps == 0 {
        return Err("--steps must be at least 1: the comparison reports medians of measured steps".into());
    }
    let tuned = if args.cpu {
        None
    } else {
        Some(crate::tuning_cache::open(args.retune)?)
    };
    let backend = match &tuned {
        None => Backend::Reference,
        Some(t) => Backend::Gpu(t.ctx.clone()),
    };
    let limits = args.budget.limits(&backend);
    let c = pollster::block_on(compare(backend, &opts, &limits, args.steps)).map_err(|e| e.to_string())?;
    if args.json {
        println!("{}", serde_json::to_string(&c).map_err(|e| e.to_string())?);
    } else {
        for m in &c.modes {
            println!(
                "{:<9} {:>9.2} ms/step  x{:.2} of shard_map  random bits per device {:>10}  all-reduces {}",
                m.mode.name(),
                m.ms,
                m.ratio_to_shard_map,
                m.rng_bits_per_device,
                m.all_reduces
            );
        }
        println!(
            "ratio auto/shard_map: {:.2} (pairs' quartiles {:.2}-{:.2})",
            c.ratio, c.ratio_low, c.ratio_high
        );
        println!(
            "(measured on this machine, {} simulated devices, medians of {} interleaved steps)",
            c.devices, c.steps
        );
    }
    Ok(())
}
