//! `shardlab bench published`: the cost model held against published training runs (the
//! table in docs/published_runs.md): each run priced on its device preset beside its published
//! step time, and the mean absolute percentage error.
mod price;
mod table;

pub use price::{price_runs, run_options, trace_cost, Pricing, PublishedCheck, PublishedReport, FITTED, TRACE_LIMIT};
pub use table::{parse_table, FlopCount, Published, PublishedRun, TableError, TABLE, TABLE_PATH};
