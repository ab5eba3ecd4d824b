//! Rust launchers of the WGSL kernels in shaders/: each builds a [`Dispatch`](crate::gpu::Dispatch)
//! once (pipeline from the cache, bind group, uniforms); executors replay it every step.
//! Every kernel has a CPU twin of the same name in [`crate::reference`].
pub mod elementwise;
