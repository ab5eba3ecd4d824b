//! The GPU executor, by job: slot planning (which buffer holds each value), lowering (the
//! dispatches of each instruction; the fused pairs and dispatch counts read off the program
//! alone, for the cost model), packing (which optimizer updates and gradient psums share one
//! dispatch), parts (values side by side in one buffer, so a split or concat is one copy), and
//! the runtime (buffers, inputs, outputs, steps).
mod dispatches;
mod fuse;
mod lower;
mod packing;
mod parts;
mod runtime;
mod slots;

pub use dispatches::{lowered, Lowered};
pub use fuse::Fusion;
pub use lower::MatmulChoice;
pub use runtime::GpuExecutor;
