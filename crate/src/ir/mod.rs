//! The IR: programs on global (or, after partitioning, local) shapes, in SSA form,
//! built by tracing Rust code against a small jax.numpy-like [`Builder`].
mod builder;
mod checkpoint;
mod custom_vjp;
mod error;
pub mod moe;
mod op;
mod precision;
mod print;
mod program;
mod seq;
mod shape;
mod stages;
mod vma;

pub use builder::Builder;
pub use checkpoint::{Checkpoint, CheckpointPolicy};
pub use custom_vjp::{CustomVjp, VjpRule};
pub use error::IrError;
pub use op::{Op, RngLayout};
pub use precision::Precision;
pub use program::{DType, Instr, LikePrimal, Program, Role, Stack, ValueId, ValueInfo};
pub use seq::{AttnSeq, CpOrder, Runs, SeqBlock};
pub use shape::{fmt_shape, numel, size_in_bytes, strides};
pub use stages::{Action, Owner, Pass, PassSpan, StageWork, MAX_STAGES};
pub use vma::{check_vma, varying_axes, Axes, VmaRefusal};
