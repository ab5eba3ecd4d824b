//! Planning: from what a run chooses ([`TrainerOptions`]) to the train step that runs, in
//! one place ([`build`]), and what it needs in memory, checked before any allocation
//! ([`MemoryPlan`]). Parallelism is composed per mesh axis ([`Parallelism`]): one table of
//! logical-axis rules ([`RULES`]) gives every array's sharding, and the shard_map bodies
//! compose each axis's collectives; explicit mode types the global step with them op by op;
//! the named strategies are presets of it. The general
//! machinery it calls lives in [`crate::partition`].
mod auto_step;
mod axes;
mod build;
mod closed_form;
mod combine;
mod compose;
mod error;
mod explicit_step;
mod memory;
mod moe;
mod options;
mod page;
mod parallelism;
mod pipeline;
mod presets;
mod rules;
mod shard_map_step;
mod spec_names;
mod strategy;

pub use auto_step::{
    auto_param_spec, auto_state_spec, auto_train_step, auto_train_step_with_specs, composition_constraints,
    gradient_pin, sequence_parallel_constraints, GradientPin,
};
pub use axes::{AxisKind, Zero};
pub use build::{build, Planned, ValueSharding};
pub use closed_form::{
    closed_memory, gathered_norms, regathers_norms, stage_activations, ClosedMemory, ACTIVATION_BOUND,
};
pub use combine::combine_train_step;
pub use error::PlanError;
pub use explicit_step::{explicit_axis_types, parse_axis_types, ExplicitView};
pub use memory::{
    binary_bytes, check_config, human_bytes, parse_size, plan_and_check, shape_bytes, MemoryError, MemoryLimits,
    MemoryPlan, TensorBytes, DEFAULT_BUDGET_BYTES, MAX_SIMULATED_DEVICES, WASM_HEAP_BYTES,
};
pub use moe::moe_constraints;
pub use options::{Parallel, TrainerOptions};
pub use page::{
    check_page_limits, check_page_mesh, check_page_sizes, page_limit, Limit, PAGE_LIMITS, PAGE_MAX_DEVICES,
    PAGE_MAX_ELEMENTS, PAGE_MAX_SPECS,
};
pub use parallelism::{mesh_text, Parallelism};
pub use pipeline::{
    check as check_pipeline_layout, parse_stage_layers, stage_layers_text, Action, Pass, PassTimes, PipelinePlan, Slot,
    StageLayout, Table, Timing,
};
pub use presets::Preset;
pub use rules::{axes_for, param_dims, Holder, Logical, RULES};
pub use shard_map_step::shard_map_train_step;
pub use spec_names::{block_leaf, group_name, params_named, resolve_spec, SpecTarget, TOKENS};
pub use strategy::{DropoutKey, Mode, Schedule, Strategy};
// A plan's record of inserted ops is the partitioner's.
pub use crate::partition::auto::Inserted;
