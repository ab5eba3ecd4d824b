//! Automatic partitioning (jit with shardings): GSPMD-style sharding propagation over the
//! global program, one factor rule per op, then SPMD lowering with inserted collectives.
mod assign;
mod jit;
mod propagate;
mod rules;
mod train;

pub use assign::{dims_of_spec, spec_of_dims, Assignment, Dims, Sharding};
pub use jit::{jit, jit_with_constraints, AutoProgram, Inserted};
pub use propagate::{propagate, Propagation};
pub use rules::{op_rule, rule_of, FactorKind, OpRule};
pub use train::{auto_param_spec, auto_train_step, auto_train_step_with_specs};
