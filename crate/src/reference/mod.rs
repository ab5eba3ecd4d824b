//! The CPU reference: plain f32 Rust twins of every GPU kernel, forward and backward.
//! It is the oracle of every test and the fallback executor where no adapter exists.
pub mod elementwise;
