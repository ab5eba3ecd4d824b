//! The docs/MODEL.md transformer, traced into IR programs: configuration, parameters and
//! their deterministic init, the forward pass, the train step, and the data.
mod config;
mod data;
mod gpt;
mod microbatch;
mod moe;
mod params;
mod ring;
mod text_file;
mod train_step;

pub use config::{Attention, GptConfig, ModelError, Optimizer, Remat, MAX_LAYERS};
pub use data::{Batch, DataSource, Dataset};
pub use gpt::{
    block, embed, forward_logits, forward_loss, head, reorder, Activations, Local, MaskBlocks, Stage, ZIGZAG_INPUTS,
};
pub use microbatch::{accumulate, check_microbatches, microbatch_rows, Accumulated};
pub use moe::{moe_mlp, Capacity, Moe, MoeSplit, ASSUMED_IMBALANCE};
pub use params::{init_params, param_specs, Init, ParamSpec};
pub use ring::{ring_attention, Ring, RingDropout};
pub use text_file::{read_text_file, MAX_TEXT_BYTES};
pub use train_step::{
    accumulated_train_step, accumulated_train_step_in_order, eval_program, logits_program, state_input,
    train_step_program, update, TrainStep,
};
