//! Planning a step before it runs: what it needs in memory, checked before any allocation.
mod memory;

pub use memory::{
    check_config, human_bytes, plan_and_check, shape_bytes, MemoryError, MemoryLimits, MemoryPlan, TensorBytes,
    DEFAULT_BUDGET_BYTES, MAX_SIMULATED_DEVICES, WASM_HEAP_BYTES,
};
