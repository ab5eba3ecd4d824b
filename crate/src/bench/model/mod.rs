//! `shardlab bench model`: the cost model checked against what can be measured here. Every
//! configuration of three blocks runs on this adapter (the sweep; the held-out block, the seed
//! preset's size and larger; the ranking block, the search's configurations of one model on 4
//! devices), each measured step beside the model's prediction for the same program on the
//! calibrated `this` profile, simulated placement (all devices as shards of this one adapter,
//! as they run).
mod configs;
mod ops;
mod stats;
mod sweep;

pub use configs::{all, held_out, ranking, sweep, Block, Config};
pub use ops::{pick_configs, run_ops, OpsCheck, OPS_DEFAULT};
pub use stats::{errors, spearman, GroupError};
pub use sweep::{run_sweep, ModelCheck, ModelSweep};
