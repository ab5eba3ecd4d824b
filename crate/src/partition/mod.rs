//! Partitioning: from a program on global shapes to one per-device (SPMD) program, the
//! general JAX machinery only (it knows programs and shardings, no model):
//! * shard_map: the body is written per device with explicit collectives, and check_vma
//!   checks its out_specs;
//! * jit with shardings ([`auto`]): propagation over the global program, then SPMD lowering;
//! * explicit sharding ([`explicit`]): the global program typed op by op with JAX's sharding
//!   rules, then lowered as jit with every value laid out as its type says;
//! * the all-reduce combiner, a pass over any per-device program.
pub mod auto;
mod check_vma;
mod combine;
mod error;
pub mod explicit;
mod shard_map;

pub use auto::{jit, jit_with_constraints, AutoProgram};
pub use check_vma::check_out_specs;
pub use combine::{combine_all_reduces, combine_all_reduces_mapped, combine_auto_program, combined_starts};
pub use error::PartitionError;
pub use shard_map::{shard_map, Arg};
