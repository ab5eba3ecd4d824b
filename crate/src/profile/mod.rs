//! What a program costs: FLOPs, memory, random bits and op categories, read off the
//! program (modelled), and per-op GPU times (measured by the executor).
mod cost;
mod summary;

pub use cost::{category, instr_flops, Category};
pub use summary::{summarize, ProgramSummary};
