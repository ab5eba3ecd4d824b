//! Strided copy: one operation for transpose, slice, concat and broadcast.

/// For every multi-index i over `shape` (row-major):
/// `dst[dst_offset + Σ i_k*dst_strides_k] (= or +=) src[src_offset + Σ i_k*src_strides_k]`.
/// Stride 0 in `src_strides` broadcasts; no two multi-indices may address the same dst element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strided {
    pub shape: Vec<usize>,
    pub src_offset: usize,
    pub src_strides: Vec<usize>,
    pub dst_offset: usize,
    pub dst_strides: Vec<usize>,
    /// `+=` instead of `=`.
    pub accumulate: bool,
}

impl Strided {
    /// Copies `shape` from `src_strides` to `dst_strides`, both from offset 0, overwriting dst.
    pub fn new(shape: &[usize], src_strides: &[usize], dst_strides: &[usize]) -> Self {
        Self {
            shape: shape.to_vec(),
            src_offset: 0,
            src_strides: src_strides.to_vec(),
            dst_offset: 0,
            dst_strides: dst_strides.to_vec(),
            accumulate: false,
        }
    }
}

/// The copy `c` from `src` into `dst` (any element type: it moves values, or adds them).
pub fn strided<T: Copy + std::ops::AddAssign>(src: &[T], dst: &mut [T], c: &Strided) {
    let total: usize = c.shape.iter().product();
    let mut index = vec![0usize; c.shape.len()];
    for _ in 0..total {
        let s = c.src_offset + index.iter().zip(&c.src_strides).map(|(i, st)| i * st).sum::<usize>();
        let d = c.dst_offset + index.iter().zip(&c.dst_strides).map(|(i, st)| i * st).sum::<usize>();
        if c.accumulate {
            dst[d] += src[s];
        } else {
            dst[d] = src[s];
        }
        // Next multi-index, the last axis fastest.
        for a in (0..c.shape.len()).rev() {
            index[a] += 1;
            if index[a] < c.shape[a] {
                break;
            }
            index[a] = 0;
        }
    }
}
