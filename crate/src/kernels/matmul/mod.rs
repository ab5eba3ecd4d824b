//! Matmul, `C = alpha * op(A) @ op(B) (+ bias) (+ C)`, batched with strides and broadcast, in several
//! variants (shaders/matmul.wgsl, shaders/matmul_tex.wgsl) among which an autotuner picks per adapter
//! and shape class. CPU twin: [`crate::reference::matmul`].
mod autotune;
mod launch;
mod variants;

pub use crate::reference::matmul::MatmulShape;
pub use autotune::{
    choose_variant, class_key, prepare, supported_variant, time_dispatches, tuned_variant, MatmulClass, SizeClass,
};
pub use launch::{matmul, variants};
pub use variants::Variant;
