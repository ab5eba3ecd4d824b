//! The GPU executor, by job: slot planning (which buffer holds each value), lowering (the
//! dispatches of each instruction), and the runtime (buffers, inputs, outputs, steps).
mod fuse;
mod lower;
mod runtime;
mod slots;

pub use lower::MatmulChoice;
pub use runtime::GpuExecutor;
