//! The GPU runtime: one context per adapter, checked buffers, cached pipelines,
//! and pre-built dispatches that a step replays.
#[cfg(target_arch = "wasm32")]
mod async_pipeline;
mod buffer;
mod context;
mod dispatch;
mod error;
mod launch;
mod pipeline;
mod timer;
mod wall;

pub use buffer::GpuBuffer;
pub use context::{AdapterSummary, GpuContext};
pub use dispatch::{encode_all, encode_timed, grid_1d, Dispatch, TextureCopy, Work};
pub use error::GpuError;
pub use launch::{Binding, Kernel, Resource};
pub use pipeline::{BuildClock, PipelineCache};
pub use timer::{now_ms, DispatchTimes};
pub use wall::median;
