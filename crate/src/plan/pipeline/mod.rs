//! Pipeline parallelism: which blocks each stage holds ([`StageLayout`]), the schedules as each
//! stage's list of passes ([`Table`]), and the shard_map body that runs them, one stage's work
//! on its own devices.
mod emit;
mod layout;
mod step;
mod table;

pub use layout::{check, parse_stage_layers, stage_layers_text, StageLayout};
pub use step::PipelinePlan;
pub(super) use step::{check_pipeline, pipeline_train_step};
pub use table::{Action, Pass, PassTimes, Slot, Table, Timing};
