//! The IR: programs on global (or, after partitioning, local) shapes, in SSA form,
//! built by tracing Rust code against a small jax.numpy-like [`Builder`].
mod builder;
mod error;
mod memory;
mod op;
mod print;
mod program;
mod shape;
mod vma;

pub use builder::Builder;
pub use error::IrError;
pub use memory::{memory_use, size_in_bytes, MemoryUse};
pub use op::{Op, RngLayout};
pub use program::{DType, Instr, Program, Role, ValueId, ValueInfo};
pub use shape::{fmt_shape, numel, strides};
pub use vma::varying_axes;
