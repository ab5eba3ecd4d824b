//! Embedding lookup and its scatter-add gradient. An id >= V reads zeros and its gradient is
//! dropped, so the two stay exact adjoints.

/// The shape of a lookup on D devices: `n` ids of all devices (N / D each), a table of `v` rows
/// of `c` per device, each device looking up in and scattering into its own table block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbeddingShape {
    pub n: usize,
    pub v: usize,
    pub c: usize,
    pub devices: usize,
}

impl EmbeddingShape {
    /// `n` ids into one table of `v` rows of `c`.
    pub fn new(n: usize, v: usize, c: usize) -> Self {
        Self { n, v, c, devices: 1 }
    }
}

/// table (D, V, C), ids (N) -> out (N, C) = each device's `table[ids]`.
pub fn forward(table: &[f32], ids: &[u32], s: EmbeddingShape) -> Vec<f32> {
    let (v, c) = (s.v, s.c);
    let nl = s.n / s.devices.max(1);
    let mut out = vec![0.0; s.n * c];
    for (i, &id) in ids[..s.n].iter().enumerate() {
        let (id, base) = (id as usize, (i / nl) * v * c);
        if id < v {
            out[i * c..(i + 1) * c].copy_from_slice(&table[base + id * c..base + (id + 1) * c]);
        }
    }
    out
}

/// dout (N, C), ids (N) -> dtable (D, V, C): row v of device d's block sums the dout rows of d
/// whose id is v, in order of i.
pub fn backward(dout: &[f32], ids: &[u32], s: EmbeddingShape) -> Vec<f32> {
    let (v, c) = (s.v, s.c);
    let nl = s.n / s.devices.max(1);
    let mut dtable = vec![0.0; s.devices * v * c];
    for (i, &id) in ids[..s.n].iter().enumerate() {
        let (id, base) = (id as usize, (i / nl) * v * c);
        if id < v {
            for j in 0..c {
                dtable[base + id * c + j] += dout[i * c + j];
            }
        }
    }
    dtable
}
