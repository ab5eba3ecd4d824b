//! shardlab: a training sandbox for sharded transformers on simulated devices.
pub mod autodiff;
pub mod bench;
pub mod exec;
pub mod export;
pub mod gpu;
pub mod ir;
pub mod kernels;
#[cfg(test)]
mod layering;
pub mod model;
pub mod partition;
pub mod plan;
pub mod profile;
pub mod reference;
pub mod rng;
pub mod search;
pub mod selftest;
pub mod setting;
pub mod shaders;
pub mod sharding;
