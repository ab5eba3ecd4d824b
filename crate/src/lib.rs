//! shardlab: a training sandbox for sharded transformers on simulated devices.
pub mod gpu;
pub mod kernels;
pub mod reference;
pub mod shaders;
