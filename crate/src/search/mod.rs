//! Which strategy? The search over the ways to run one model on N devices of a kind: every
//! mesh of up to four axes (dp, fsdp, tp, cp, pp) in every size that divides the devices, with
//! ZeRO's stage, sequence parallelism, the mode, remat, a pipeline's schedule and microbatches
//! ([`LEVERS`], the one list). Every candidate is screened in closed form (memory and a
//! step estimate), the fastest few planned and priced exactly by the cost model, what does
//! not split or fit dropped, the rest ranked by modelled step time.
mod command;
mod rank;
mod space;

pub use command::{composition_flags, describe, plan_command};
pub use rank::{block_passes, search, Ranked, SearchError, SearchResult, EXACT, TRACE_BUDGET};
pub use space::{candidates, mesh_shapes, Lever, LEVERS, MAX_AXES, MAX_RING};
