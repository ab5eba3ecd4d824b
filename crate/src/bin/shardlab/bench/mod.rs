//! `shardlab bench <what>`: one module per measurement.
mod kernels;
mod train;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum Command {
    /// Matmul GFLOP/s (autotuned variant vs naive vs CPU) and elementwise / softmax GB/s.
    Kernels(kernels::Args),
    /// Train-step speed: steps/s, tokens/s, forward / backward / update split, dispatches.
    Train(train::Args),
}

pub fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Kernels(args) => kernels::run(args),
        Command::Train(args) => train::run(args),
    }
}
