//! Automatic partitioning (jit with shardings): GSPMD-style sharding propagation over the
//! global program, one factor rule per op, then SPMD lowering with inserted collectives.
mod assign;
mod jit;
mod propagate;
mod rules;

pub use assign::{dims_of_spec, spec_of_dims, Assignment, Dims, Sharding};
pub use jit::{jit, jit_pinned, jit_with_constraints, AutoProgram, Inserted, Pin};
pub use propagate::{propagate, Propagation};
pub use rules::{op_rule, rule_of, FactorKind, OpRule};
