use thiserror::Error;

use crate::ir::{IrError, ValueId};
use crate::sharding::ShardingError;

/// A partitioning that cannot be done, with what to change.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PartitionError {
    #[error("{0}")]
    Sharding(#[from] ShardingError),
    #[error("{0}")]
    Ir(#[from] IrError),
    #[error("{what}: {why}")]
    Invalid { what: String, why: String },
    /// A with_sharding_constraint jit cannot honour, on the value it pins.
    #[error("{what}: {why}")]
    Constraint { value: ValueId, what: String, why: String },
    /// check_vma: an out_spec claims replication along an axis the value varies over.
    #[error("out_specs[{output}] = {spec} says `{value}` is replicated along mesh axis '{axis}', but it varies along '{axis}': reduce it over '{axis}' (psum / pmean) or name '{axis}' in its out_spec")]
    Vma {
        output: usize,
        value: String,
        axis: String,
        spec: String,
    },
    /// check_vma: a collective or pcast JAX refuses on its operand's varying axes.
    #[error("check_vma refuses {op} (instruction {instr}) on `{value}`: {why}")]
    VmaOp {
        instr: usize,
        op: String,
        value: String,
        why: String,
    },
}
