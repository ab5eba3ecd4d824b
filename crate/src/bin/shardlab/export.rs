//! `shardlab export jax`: the experiment `train` would run, as a standalone JAX script.
use clap::Subcommand;

use crate::args::{trainer_options, ModelArgs, ParallelArgs, PrecisionArg};

#[derive(Subcommand)]
pub enum Command {
    /// A runnable JAX script with the same model, init, data, optimizer, mesh and
    /// partitioning as `train` with these flags: jit with shardings (--mode auto), the
    /// shard_map body (--mode shard_map), or the global step on typed mesh axes (--mode
    /// explicit: jax.make_mesh's axis_types, jax.set_mesh, and the typed program's
    /// out_sharding= and reshard choices).
    Jax(JaxArgs),
}

#[derive(clap::Args)]
pub struct JaxArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub parallel: ParallelArgs,
    #[command(flatten)]
    pub precision: PrecisionArg,
    /// Number of optimizer updates the script runs.
    #[arg(long, default_value_t = 200)]
    pub steps: u64,
    /// Write the script to FILE instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<String>,
    /// Accepted so that `train`'s command line works unchanged (the script always prints JSON lines).
    #[arg(long, hide = true)]
    pub json: bool,
    /// Accepted so that `train`'s command line works unchanged (the script picks its devices).
    #[arg(long, hide = true)]
    pub cpu: bool,
    /// Accepted so that `train`'s command line works unchanged (nothing is tuned here).
    #[arg(long, hide = true)]
    pub retune: bool,
}

pub fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Jax(args) => jax(args),
    }
}

fn jax(mut args: JaxArgs) -> Result<(), String> {
    args.model.apply_preset(&mut args.parallel);
    let mut opts = trainer_options(&args.model, &args.parallel)?;
    opts.config.precision = args.precision.precision;
    if let Some(note) = crate::plan::f32_note(opts.config.precision) {
        // On stderr, so the script on stdout stays a script.
        eprintln!(
            "note: {}; the script computes in it, {note}",
            opts.config.precision.describe()
        );
    }
    let script = shardlab::export::jax_script(&opts, args.steps).map_err(|e| e.to_string())?;
    match &args.output {
        Some(path) => std::fs::write(path, script).map_err(|e| format!("cannot write -o {path}: {e}")),
        None => {
            print!("{script}");
            Ok(())
        }
    }
}
