//! The integration tests, one binary so the suite links once: a module per area.
//! One area alone: `cargo test -p shardlab-tests -- collectives::`.
mod auto_equivalence;
mod auto_property;
mod autodiff_vjp;
mod collectives;
mod combine;
mod export_jax;
mod gpu_runtime;
mod jax_parity;
mod kernels_copy_bits;
mod kernels_devices;
mod kernels_elementwise;
mod kernels_fused;
mod kernels_matmul;
mod kernels_nn;
mod kernels_optimizer;
mod kernels_random;
mod lowered_dispatches;
mod program_summary;
mod reference_gradients;
mod rng_known_answers;
mod selftest;
mod shaders_validate;
mod shard_map_equivalence;
mod sharding;
mod step_profile;
mod training;
