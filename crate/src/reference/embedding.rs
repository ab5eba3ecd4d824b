//! Embedding lookup and its scatter-add gradient. An id >= V reads zeros and its gradient is
//! dropped, so the two stay exact adjoints.

/// table (V, C) with V = table.len() / c, ids (N) -> out (N, C) = `table[ids]`.
pub fn forward(table: &[f32], ids: &[u32], n: usize, c: usize) -> Vec<f32> {
    let v = table.len() / c;
    let mut out = vec![0.0; n * c];
    for (i, &id) in ids[..n].iter().enumerate() {
        let id = id as usize;
        if id < v {
            out[i * c..(i + 1) * c].copy_from_slice(&table[id * c..(id + 1) * c]);
        }
    }
    out
}

/// dout (N, C), ids (N) -> dtable (V, C): row v sums the dout rows whose id is v, in order of i.
pub fn backward(dout: &[f32], ids: &[u32], n: usize, v: usize, c: usize) -> Vec<f32> {
    let mut dtable = vec![0.0; v * c];
    for (i, &id) in ids[..n].iter().enumerate() {
        let id = id as usize;
        if id < v {
            for j in 0..c {
                dtable[id * c + j] += dout[i * c + j];
            }
        }
    }
    dtable
}
