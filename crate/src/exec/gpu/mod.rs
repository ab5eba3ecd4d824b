//! The GPU executor, by job: slot planning (which buffer holds each value), lowering (the
//! dispatches of each instruction; the fused pairs and dispatch counts read off the program
//! alone, for the cost model), packing (which optimizer updates and gradient psums share one
//! dispatch), parts (values side by side in one buffer, so a split or concat is one copy), and
//! views (the transposes around fused attention folded into its kernels), consts (constants
//! worked out and unread values dropped), and the runtime
//! (buffers, inputs, outputs, steps).
mod consts;
mod dispatches;
mod fuse;
mod lower;
mod packing;
mod parts;
mod runtime;
mod slots;
mod views;

pub use dispatches::{lowered, Lowered};
pub use fuse::Fusion;
pub use lower::MatmulChoice;
pub use runtime::GpuExecutor;
