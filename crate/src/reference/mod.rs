//! The CPU reference: plain f32 Rust twins of every GPU kernel, forward and backward.
//! It is the oracle of every test and the fallback executor where no adapter exists.
pub mod attention;
pub mod ceiling;
pub mod collectives;
pub mod copy;
pub mod crossentropy;
pub mod dropout;
pub mod elementwise;
pub mod embedding;
pub mod fused;
pub mod gelu;
pub mod layernorm;
pub mod matmul;
pub mod moe;
pub mod optimizer;
pub mod random;
pub mod reduce;
pub mod seq;
pub mod softmax;
