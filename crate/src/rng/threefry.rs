//! The Threefry-2x32 block cipher with 20 rounds, as JAX's `threefry2x32_p` computes it.

const ROTATIONS: [[u32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];
/// Skein's key-schedule parity constant.
const PARITY: u32 = 0x1BD1_1BDA;

/// Hashes the counter pair `x` under `key`: 5 groups of 4 rounds, a key injection after
/// each group (JAX's `_threefry2x32_lowering`).
pub fn threefry2x32(key: [u32; 2], x: [u32; 2]) -> [u32; 2] {
    let ks = [key[0], key[1], key[0] ^ key[1] ^ PARITY];
    let mut x0 = x[0].wrapping_add(ks[0]);
    let mut x1 = x[1].wrapping_add(ks[1]);
    for group in 0..5usize {
        for &r in &ROTATIONS[group % 2] {
            x0 = x0.wrapping_add(x1);
            x1 = x1.rotate_left(r) ^ x0;
        }
        x0 = x0.wrapping_add(ks[(group + 1) % 3]);
        x1 = x1.wrapping_add(ks[(group + 2) % 3]).wrapping_add(group as u32 + 1);
    }
    [x0, x1]
}

/// JAX's `threefry_2x32(keypair, count)` on a whole count array: the counts (padded with one
/// 0 when odd) are split in halves that form the pairs `(count[j], count[j + h])`, and the
/// two output halves are concatenated back (the padding dropped).
pub fn threefry_2x32_counts(key: [u32; 2], counts: &[u32]) -> Vec<u32> {
    let n = counts.len();
    let h = n.div_ceil(2);
    let mut out = vec![0u32; n];
    for j in 0..h {
        let hi = if j + h < n { counts[j + h] } else { 0 };
        let [y0, y1] = threefry2x32(key, [counts[j], hi]);
        out[j] = y0;
        if j + h < n {
            out[j + h] = y1;
        }
    }
    out
}
