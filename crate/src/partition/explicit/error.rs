//! A program JAX would refuse in explicit mode: where, in JAX's words, and the fix as data.
use std::fmt;

use super::rules::FixKind;

/// The op JAX raises a `ShardingTypeError` at, with its message and the fix it names.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ShardingTypeError {
    /// The instruction of the typed program (reshards inserted before it counted).
    pub instr: usize,
    pub op: String,
    /// The line as the typed program prints it, each operand with its type.
    pub line: String,
    /// JAX 0.10's message for the same op on the same types.
    pub message: String,
    /// Boxed: the error is returned through every typing step, and the fix is most of it.
    pub fix: Box<Fix>,
}

/// What to write so that JAX accepts the op.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Fix {
    pub kind: FixKind,
    /// The value to annotate: the op's result (out_sharding) or the operand to reshard, by
    /// its name in the program where it has one, else `%n`.
    pub value: String,
    /// Whether `value` is a name a spec override can pin (`h0.qkv`), not an SSA number.
    pub named: bool,
    /// A type that makes the op typecheck: of the result, or of the resharded operand, as
    /// JAX writes it (`P('dp', None)`; [`crate::sharding::PartitionSpec::parse`] reads it).
    pub spec: Option<String>,
    /// The fix as JAX code: `out_sharding=P('dp', None)`, `reshard(h0.k, P())`.
    pub code: String,
}

impl fmt::Display for ShardingTypeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "explicit sharding: JAX raises at `{}`: {} (fix: {})",
            self.line, self.message, self.fix.code
        )
    }
}

impl std::error::Error for ShardingTypeError {}
