//! CPU twin of [`crate::kernels::matmul`]: `C = alpha * op(A) @ op(B) (+ bias) (+ C)` per batch item,
//! through `matrixmultiply`'s sgemm (blocked and vectorised; its strides express the transposes).
//! The oracle of the GPU variants and the fallback executor's matmul.
pub use crate::kernels::matmul::MatmulShape;

/// a: (batch, M, K) or (batch, K, M) if trans_a; b: (batch, K, N) or (batch, N, K) if trans_b;
/// bias: (N); c: (batch, M, N); batch items `stride_*` elements apart (0 broadcasts).
///
/// Panics with the reason if the slices are too short for `s` (check with [`MatmulShape::check`] first
/// where the shape comes from a user).
pub fn matmul(s: &MatmulShape, a: &[f32], b: &[f32], bias: Option<&[f32]>, c: &mut [f32]) {
    if let Err(e) = s.check(a.len(), b.len(), bias.map(|x| x.len()), c.len()) {
        panic!("{e}");
    }
    let (a_si, a_sk) = s.a_strides();
    let (b_sk, b_sj) = s.b_strides();
    for z in 0..s.batch {
        let a_item = &a[z * s.stride_a..z * s.stride_a + s.m * s.k];
        let b_item = &b[z * s.stride_b..z * s.stride_b + s.k * s.n];
        let c_item = &mut c[z * s.stride_c..z * s.stride_c + s.m * s.n];
        // beta = 1 keeps what C holds: the old C (accumulate), plus the bias.
        if !s.accumulate {
            c_item.fill(0.0);
        }
        if let Some(bias) = bias {
            for row in c_item.chunks_exact_mut(s.n) {
                row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
            }
        }
        // SAFETY: `check` ensured each item's slice holds the M*K, K*N and M*N elements that these
        // dimensions and strides address, and C's strides (N, 1) do not alias.
        unsafe {
            matrixmultiply::sgemm(
                s.m,
                s.k,
                s.n,
                s.alpha,
                a_item.as_ptr(),
                a_si as isize,
                a_sk as isize,
                b_item.as_ptr(),
                b_sk as isize,
                b_sj as isize,
                1.0,
                c_item.as_mut_ptr(),
                s.n as isize,
                1,
            );
        }
    }
}
