//! `shardlab bench <what>`: one module per measurement.
mod compare;
mod kernels;
mod model;
mod peer_process;
mod peers;
mod published;
mod train;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum Command {
    /// Matmul GFLOP/s (autotuned variant vs naive vs CPU), elementwise / softmax GB/s, and the ms of each
    /// fused attention design this adapter runs (the executor's marked)
    Kernels(kernels::Args),
    /// Automatic, explicit and shard_map train steps, interleaved:
    /// {"auto_ms","explicit_ms","shard_map_ms","ratio","modes"}.
    Compare(Box<compare::Args>),
    /// Train-step speed: steps/s, tokens/s, forward / backward / update split, dispatches.
    Train(train::Args),
    /// The cost model checked: predicted (device `this`) beside measured step times of a
    /// sweep of small configurations, and the mean absolute percentage error.
    Model(model::Args),
    /// shardlab against JAX (train steps) and numpy (matmul) on the same CPU cores, alternating
    /// in one run: medians, ratios and the speed goals.
    Peers(peers::Args),
    /// The cost model held against published training runs (docs/published_runs.md): each
    /// run's modelled step on its device preset beside the published one, and the MAPE.
    Published(published::Args),
}

pub fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Kernels(args) => kernels::run(args),
        Command::Train(args) => train::run(args),
        Command::Compare(args) => compare::run(*args),
        Command::Model(args) => model::run(args),
        Command::Peers(args) => peers::run(args),
        Command::Published(args) => published::run(args),
    }
}
