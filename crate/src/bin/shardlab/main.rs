//! The `shardlab` command line. One module per subcommand; each `run` returns a one-line error that
//! main prints before exiting with status 2 (clap does the same for bad flags).

/// `println!` and `print!` in every subcommand resolve to these (a `macro_rules!` defined
/// before the modules shadows the prelude's): they write through [`stdout::write`], which
/// ends the process quietly when the reader has gone (`shardlab train --json | head -1`)
/// instead of panicking.
macro_rules! println {
    () => {
        $crate::stdout::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

macro_rules! print {
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!($($arg)*))
    };
}

mod args;
mod bench;
mod calibrate;
mod device;
mod export;
mod info;
mod inspect;
mod plan;
mod stdout;
mod train;
mod tuning_cache;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "shardlab",
    version,
    about = "A training sandbox for sharded transformers on simulated devices"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the GPU adapter, its features and key limits.
    Info(info::Args),
    /// Train the model (one device for now).
    Train(train::Args),
    /// Print the train-step program and what it costs.
    Inspect(inspect::Args),
    /// Calibrate the `this` device profile on the local adapter (cached per adapter).
    Calibrate(calibrate::Args),
    /// Model a train step on real devices of one kind, without running it.
    Plan(plan::Args),
    /// Measure kernels on this adapter.
    #[command(subcommand)]
    Bench(bench::Command),
    /// Write the experiment as a script for another framework (`export jax`).
    #[command(subcommand)]
    Export(export::Command),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info(args) => info::run(args),
        Command::Train(args) => train::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Calibrate(args) => calibrate::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Bench(command) => bench::run(command),
        Command::Export(command) => export::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
