//! Rust launchers of the WGSL kernels in shaders/: each builds a [`Dispatch`](crate::gpu::Dispatch)
//! once (pipeline from the cache, bind group, uniforms); executors replay it every step.
//! Every kernel has a CPU twin of the same name in [`crate::reference`].
pub mod collectives;
pub mod copy;
pub mod crossentropy;
pub mod dropout;
pub mod elementwise;
pub mod embedding;
pub mod gelu;
pub mod layernorm;
pub mod matmul;
pub mod optimizer;
pub mod random;
pub mod reduce;
pub mod softmax;
