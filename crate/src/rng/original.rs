//! The original layout (`jax_threefry_partitionable=False`, JAX's default before 0.5.0).
//!
//! `bits(key, shape)` hashes the counts `iota(n)` of the *flattened global* array of n
//! elements as one `threefry_2x32` call: the counts are cut in halves (h = ceil(n/2)), pair
//! j is (j, j + h) (the count past the end is 0), its first output goes to element j and its
//! second to element j + h. So element i depends on the global size n, and every hash feeds
//! two elements half an array apart. A device that holds one block of the array cannot
//! produce it from its local shape: it needs n and its global offsets, and in JAX's lowering
//! (one iota over the whole flattened array, split in halves, concatenated back) the SPMD
//! partitioner cannot shard the computation at all, so it makes every device generate the
//! full global array and slice its block. shardlab's automatic mode models that by giving
//! every device `Block::full` (the kernel, knowing n, could make any block, and
//! [`crate::rng::random_bits_block`] shows the slice is the same; JAX does not do this).
use super::threefry::threefry2x32;
use super::Key;

/// Counts of one `threefry_2x32` call; larger arrays use keys split per block.
const MAX_COUNT: u64 = u32::MAX as u64;

/// Element `i` of `bits(key, (n,))` in the original layout, computed alone (one hash).
/// Past 2^32 - 1 elements JAX splits the key into one subkey per block of 2^32 - 1 counts
/// (plus one for the remainder); that case is followed here too.
pub fn original_bits_at(key: Key, n: u64, i: u64) -> u32 {
    if n < MAX_COUNT {
        return in_one_call(key.0, n as u32, i as u32);
    }
    let (nblocks, rem) = (n / MAX_COUNT, n % MAX_COUNT);
    // `threefry_split(key, (nblocks + 1,))` runs under the original layout here.
    let words = 2 * (nblocks + 1);
    let subkey = |b: u64| {
        [
            original_bits_at(key, words, 2 * b),
            original_bits_at(key, words, 2 * b + 1),
        ]
    };
    let (b, r) = (i / MAX_COUNT, i % MAX_COUNT);
    let len = if b < nblocks { MAX_COUNT } else { rem };
    in_one_call(subkey(b), len as u32, r as u32)
}

/// Element `i` of `threefry_2x32(key, iota(n))`.
fn in_one_call(key: [u32; 2], n: u32, i: u32) -> u32 {
    let h = n - n / 2;
    let j = if i < h { i } else { i - h };
    let hi = if (j as u64 + h as u64) < n as u64 { j + h } else { 0 };
    let [y0, y1] = threefry2x32(key, [j, hi]);
    if i < h {
        y0
    } else {
        y1
    }
}
