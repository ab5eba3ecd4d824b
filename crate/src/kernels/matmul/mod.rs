//! Matmul, `C = alpha * op(A) @ op(B) (+ bias) (+ C)`, batched with strides and broadcast, in
//! several variants among which an autotuner picks per adapter and shape class: naive, tiled and
//! block8 and block16 (shaders/matmul.wgsl), tex16 (shaders/matmul_tex.wgsl), sg and sg1
//! (shaders/matmul_sg.wgsl, fed by tex16's pack passes), and for GPUs gpu64 and gpu128
//! (shaders/matmul_gpu.wgsl) and coop8 on cooperative matrices (shaders/matmul_coop.wgsl), fed by
//! block8's pack passes. All but naive, tiled, block8 and block16 store C through the prelude
//! shaders/matmul_out.wgsl. CPU twin: [`crate::reference::matmul`].
mod autotune;
mod launch;
mod shared;
mod variants;

pub use crate::reference::matmul::MatmulShape;
pub use autotune::{
    choose_variant, class_key, prepare, supported_variant, time_dispatches, tuned_variant, MatmulClass, SizeClass,
};
pub use launch::{matmul, matmul_shared, variants};
pub use shared::{drop_repeated_copies, SharedTextures, Sharing};
pub use variants::{Operands, Variant};
