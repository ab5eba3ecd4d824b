//! JAX's Threefry-2x32 PRNG in plain Rust, bit-exact with `jax.random` (no GPU): the hash,
//! key ops (`PRNGKey`, `split`, `fold_in`), random bits in JAX's two layouts, and the
//! `uniform` / `bernoulli` draws dropout is built on. shaders/random.wgsl is its GPU twin.
mod bits;
mod block;
mod error;
mod key;
mod original;
mod partitionable;
mod threefry;

pub use bits::{
    bernoulli_keep, keep_prob, keep_scale, random_bits, random_bits_block, uniform, uniform_from_bits, RngLayout,
};
pub use block::Block;
pub use error::RngError;
pub use key::Key;
pub use original::original_bits_at;
pub use partitionable::partitionable_bits_at;
pub use threefry::{threefry2x32, threefry_2x32_counts};
