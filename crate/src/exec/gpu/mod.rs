//! The GPU executor, by job: slot planning (which buffer holds each value), lowering (the
//! dispatches of each instruction), packing (which optimizer updates share one dispatch), and the runtime (buffers, inputs, outputs, steps).
mod fuse;
mod lower;
mod packing;
mod runtime;
mod slots;

pub use runtime::GpuExecutor;
