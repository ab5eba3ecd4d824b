//! Planning: from what a run chooses ([`TrainerOptions`]) to the train step that runs, in
//! one place ([`build`]), and what it needs in memory, checked before any allocation
//! ([`MemoryPlan`]). It holds the model-specific strategies (the hand-written shard_map
//! bodies and the shardings jit partitions from) and applies the passes once; the general
//! machinery it calls lives in [`crate::partition`].
mod auto_step;
mod build;
mod combine;
mod error;
mod memory;
mod options;
mod pipeline_step;
mod presets;
mod shard_map_step;
mod spec_names;
mod strategy;

pub use auto_step::{
    auto_param_spec, auto_state_spec, auto_train_step, auto_train_step_with_specs, gradient_pin, GradientPin,
};
pub use build::{build, Planned, ValueSharding};
pub use combine::combine_train_step;
pub use error::PlanError;
pub use memory::{
    binary_bytes, check_config, human_bytes, parse_size, plan_and_check, shape_bytes, MemoryError, MemoryLimits,
    MemoryPlan, TensorBytes, DEFAULT_BUDGET_BYTES, MAX_SIMULATED_DEVICES, WASM_HEAP_BYTES,
};
pub use options::{Parallel, TrainerOptions};
pub use presets::{page_limit, Limit, Preset, PAGE_LIMITS, PAGE_MAX_DEVICES, PAGE_MAX_ELEMENTS, PAGE_MAX_SPECS};
pub use shard_map_step::shard_map_train_step;
pub use spec_names::{block_leaf, group_name, params_named, resolve_spec, SpecTarget, TOKENS};
pub use strategy::{sequence_parallel_constraints, DropoutKey, Mode, Schedule, Strategy};
// A plan's record of inserted ops is the partitioner's.
pub use crate::partition::auto::Inserted;
