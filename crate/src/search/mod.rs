//! Which strategy? The search over the ways to run one model on N devices of a kind: every
//! strategy, mesh shape, partitioning mode and lever ([`LEVERS`], the one list), each planned
//! and priced by the cost model, what does not split or fit dropped, the rest ranked by
//! modelled step time.
mod command;
mod rank;
mod space;

pub use command::{composition_flags, describe, plan_command};
pub use rank::{search, Ranked, SearchError, SearchResult};
pub use space::{candidates, mesh_shapes, Lever, LEVERS};
