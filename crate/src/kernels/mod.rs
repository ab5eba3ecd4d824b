//! Rust launchers of the WGSL kernels in shaders/: each op has one public launcher that checks its
//! arguments and describes the launch as a [`Kernel`](crate::gpu::Kernel), which
//! [`GpuContext::launch`](crate::gpu::GpuContext::launch) turns into a
//! [`Dispatch`](crate::gpu::Dispatch) once; executors replay it every step. Every kernel has a CPU
//! twin of the same name and shape in [`crate::reference`].
pub mod attention;
pub mod ceiling;
mod check;
pub mod collectives;
pub mod copy;
pub mod crossentropy;
pub mod dropout;
pub mod elementwise;
pub mod embedding;
pub mod fused;
pub mod gelu;
pub mod layernorm;
pub mod matmul;
pub mod moe;
pub mod optimizer;
pub mod random;
pub mod reduce;
mod rows;
pub mod seq;
pub mod softmax;
mod tuning;

pub use rows::RowStrategy;
pub use tuning::{Tuning, TuningCache};
