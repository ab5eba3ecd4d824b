//! The partitionable layout (`jax_threefry_partitionable=True`, the default since JAX 0.5.0).
//!
//! Element i of the flattened array hashes the 64-bit counter i split as (hi, lo) words
//! (`iota_2x32_shape`) and keeps the xor of the two outputs. It depends on nothing but the
//! element's own global index, so each device can generate exactly its block.
use super::threefry::threefry2x32;
use super::Key;

/// Element with row-major global index `i` of `bits(key, shape)` in the partitionable layout.
pub fn partitionable_bits_at(key: Key, i: u64) -> u32 {
    let [y0, y1] = threefry2x32(key.0, [(i >> 32) as u32, i as u32]);
    y0 ^ y1
}
