//! What a program costs: FLOPs, memory, random bits, collectives and op categories, read
//! off the program (modelled), and the alpha-beta model of interconnects.
mod cost;
mod interconnect;
mod summary;

pub use cost::{category, instr_flops, Category};
pub use interconnect::{preset, CollectiveKind, Interconnect, PRESETS};
pub use summary::{summarize, CollectiveUse, KindTotals, ProgramSummary};
