//! Export a shardlab experiment to another framework: a runnable JAX script with the same
//! model, init, data, optimizer, mesh and partitioning (`shardlab export jax`).
mod error;
mod jax;
mod layouts;
mod settings;

pub use error::ExportError;
pub use jax::jax_script;
