//! Partitioning: from a program on global shapes to one per-device (SPMD) program.
//! shard_map mode: the body is written per device with explicit collectives.
pub mod auto;
mod combine;
mod error;
mod shard_map;
mod strategies;
mod vma;

pub use auto::{auto_train_step, jit, jit_with_constraints, AutoProgram};
pub use combine::{combine_all_reduces, combine_all_reduces_mapped, combine_auto_program, combine_train_step};
pub use error::PartitionError;
pub use shard_map::{shard_map, Arg};
pub use strategies::{shard_map_train_step, DropoutKey, Strategy};
pub use vma::{check_out_specs, varying_axes};
