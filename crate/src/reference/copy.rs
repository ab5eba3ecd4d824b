//! Strided copy: one operation for transpose, slice, concat and broadcast.

/// For every multi-index i over `shape` (row-major):
/// `dst[dst_offset + Σ i_k*dst_strides_k] (= or +=) src[src_offset + Σ i_k*src_strides_k]`.
/// Stride 0 in `src_strides` broadcasts; no two multi-indices may address the same dst element.
#[allow(clippy::too_many_arguments)]
pub fn strided(
    src: &[f32],
    dst: &mut [f32],
    shape: &[usize],
    src_offset: usize,
    src_strides: &[usize],
    dst_offset: usize,
    dst_strides: &[usize],
    accumulate: bool,
) {
    let total: usize = shape.iter().product();
    let mut index = vec![0usize; shape.len()];
    for _ in 0..total {
        let s = src_offset + index.iter().zip(src_strides).map(|(i, st)| i * st).sum::<usize>();
        let d = dst_offset + index.iter().zip(dst_strides).map(|(i, st)| i * st).sum::<usize>();
        if accumulate {
            dst[d] += src[s];
        } else {
            dst[d] = src[s];
        }
        // Next multi-index, the last axis fastest.
        for a in (0..shape.len()).rev() {
            index[a] += 1;
            if index[a] < shape[a] {
                break;
            }
            index[a] = 0;
        }
    }
}
