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
mod balance;
mod bench;
mod cache;
mod calibrate;
mod device;
mod export;
mod info;
mod inspect;
mod plan;
mod search;
mod stdout;
mod trace_file;
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

/// The planner and the search build and drop many small vectors (a layout per parameter per
/// candidate): glibc's allocator was a third of the search's time.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    prefer_wide_cpu_vectors();
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

/// lavapipe (Mesa's Vulkan on the CPU) compiles shaders for 256-bit vectors unless
/// `LP_NATIVE_VECTOR_WIDTH` says otherwise. On a CPU with AVX-512, 512 gives every instruction 16
/// lanes and subgroups of 16, which the sg matmul turns into about twice the multiply-adds a
/// second (n = 1024: 97 against 54 GFLOP/s); the other kernels run as fast either way, and real
/// GPUs never read the variable. Set first thing, before any thread starts or the driver loads;
/// a width the user set is kept (`LP_NATIVE_VECTOR_WIDTH=256` restores Mesa's default).
fn prefer_wide_cpu_vectors() {
    #[cfg(target_arch = "x86_64")]
    if std::env::var_os("LP_NATIVE_VECTOR_WIDTH").is_none() && std::arch::is_x86_feature_detected!("avx512f") {
        std::env::set_var("LP_NATIVE_VECTOR_WIDTH", "512");
    }
}
