//! Executors: run any program (global or per-device) on the CPU reference or on the GPU.
mod error;
mod gpu;
mod lowering;
mod reference;
mod routing;
mod step_profile;
mod tensor;
mod trainer;

pub use error::ExecError;
pub use gpu::{lowered, Fusion, GpuExecutor, Lowered, MatmulChoice};
pub use lowering::{attention_blocks, plan_dot, plan_instr_dot, plan_reduce, seq_runs, DotPlan, ReducePlan};
pub use reference::ReferenceExecutor;
pub use routing::Routing;
pub use tensor::Tensor;
// The options live with the plan; re-exported here because every run starts from them.
pub use crate::plan::{Parallel, TrainerOptions};
pub use step_profile::{OpTime, StepProfile, REPS as PROFILE_REPS};
pub use trainer::{Backend, StepStats, Trainer};
