//! Matmul, `C = alpha * op(A) @ op(B) (+ bias) (+ C)`, batched with strides and broadcast, in several
//! variants (shaders/matmul.wgsl, shaders/matmul_tex.wgsl) among which an autotuner picks per adapter
//! and shape class. CPU twin: [`crate::reference::matmul`].
mod autotune;
mod launch;
mod shape;
mod variants;

pub use autotune::{choose_variant, class_key, time_dispatches, PIN_KEY};
pub use launch::{matmul, matmul_variant, variants};
pub use shape::MatmulShape;
