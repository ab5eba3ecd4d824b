//! Raw Threefry keys and JAX's key ops on them.
use super::original::original_bits_at;
use super::threefry::threefry2x32;
use super::RngLayout;

/// A raw Threefry key: the `uint32[2]` key data of `jax.random.PRNGKey` / `key_data`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key(pub [u32; 2]);

impl Key {
    /// `jax.random.PRNGKey(seed)` in JAX's default 32-bit mode: the seed is taken modulo
    /// 2^32 (as int32), and the high word is 0 even for negative seeds.
    pub fn from_seed(seed: i64) -> Key {
        Key([0, seed as u32])
    }

    /// `jax.random.PRNGKey(seed)` with `jax_enable_x64`: the 64-bit seed bit-cast to (hi, lo).
    pub fn from_seed_x64(seed: i64) -> Key {
        let s = seed as u64;
        Key([(s >> 32) as u32, s as u32])
    }

    /// `jax.random.split(key, n)`. The layout matters: the original layout hashes the counts
    /// `iota(2n)` as one array (key i = outputs 2i, 2i+1), the partitionable one hashes the
    /// pair (0, i) for key i ("fold-like").
    pub fn split(self, n: usize, layout: RngLayout) -> Vec<Key> {
        match layout {
            RngLayout::Original => {
                let words = 2 * n as u64;
                (0..n as u64)
                    .map(|i| {
                        Key([
                            original_bits_at(self, words, 2 * i),
                            original_bits_at(self, words, 2 * i + 1),
                        ])
                    })
                    .collect()
            }
            RngLayout::Partitionable => (0..n as u64)
                .map(|i| Key(threefry2x32(self.0, [(i >> 32) as u32, i as u32])))
                .collect(),
        }
    }

    /// `jax.random.fold_in(key, data)`: the hash of the pair (0, data); the same in both layouts.
    pub fn fold_in(self, data: u32) -> Key {
        Key(threefry2x32(self.0, [0, data]))
    }
}
