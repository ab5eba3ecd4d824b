//! CPU twin of [`crate::kernels::matmul`]: `C = alpha * op(A) @ op(B) (+ bias) (+ C)` per batch item,
//! through `matrixmultiply`'s sgemm (blocked and vectorised; its strides express the transposes).
//! The oracle of the GPU variants and the fallback executor's matmul.

/// a: (batch, M, K) or (batch, K, M) if trans_a; b: (batch, K, N) or (batch, N, K) if trans_b;
/// bias: (N), or one per batch item `stride_bias` apart; c: (batch, M, N); batch items `stride_*`
/// elements apart (0 broadcasts).
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
            let bias = &bias[z * s.stride_bias..z * s.stride_bias + s.n];
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

/// The shape and flags of one (batched) matmul: `C = alpha * op(A) @ op(B) (+ bias) (+ C)`.
///
/// Per batch item z: op(A) is (M, K), op(B) is (K, N), C is (M, N), all row-major; item z of each
/// operand starts `stride * z` elements into its buffer, so a stride of 0 broadcasts one matrix.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatmulShape {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// A stored (K, M) per batch item instead of (M, K).
    pub trans_a: bool,
    /// B stored (N, K) instead of (K, N).
    pub trans_b: bool,
    /// Elements between batch items; 0 = broadcast the same matrix.
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
    /// Elements between the batch items' biases; 0 = one bias for every item. A fused bias add of
    /// simulated devices: each device's matmul item adds its own device's bias.
    pub stride_bias: usize,
    /// C = alpha * op(A) @ op(B) (+ bias) (+ C if accumulate).
    pub alpha: f32,
    pub accumulate: bool,
}

impl MatmulShape {
    /// `batch` contiguous items of (M, K) @ (K, N), no transposes, alpha 1, C overwritten.
    pub fn new(batch: usize, m: usize, n: usize, k: usize) -> Self {
        Self {
            batch,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            stride_a: m * k,
            stride_b: k * n,
            stride_c: m * n,
            stride_bias: 0,
            alpha: 1.0,
            accumulate: false,
        }
    }

    /// Element strides (row i, column k) of op(A)[i, k] inside one batch item.
    pub fn a_strides(&self) -> (usize, usize) {
        if self.trans_a {
            (1, self.m)
        } else {
            (self.k, 1)
        }
    }

    /// Element strides (row k, column j) of op(B)[k, j] inside one batch item.
    pub fn b_strides(&self) -> (usize, usize) {
        if self.trans_b {
            (1, self.k)
        } else {
            (self.n, 1)
        }
    }

    /// Elements A's buffer must hold.
    pub fn a_len(&self) -> usize {
        (self.batch - 1) * self.stride_a + self.m * self.k
    }

    pub fn b_len(&self) -> usize {
        (self.batch - 1) * self.stride_b + self.k * self.n
    }

    pub fn c_len(&self) -> usize {
        (self.batch - 1) * self.stride_c + self.m * self.n
    }

    /// Floating-point operations (a multiply-add counts 2).
    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// Checks the shape against the lengths of its operands (`bias_len` when there is a bias).
    pub fn check(&self, a_len: usize, b_len: usize, bias_len: Option<usize>, c_len: usize) -> Result<(), String> {
        let s = self;
        if s.batch == 0 || s.m == 0 || s.n == 0 || s.k == 0 {
            return Err(format!(
                "matmul: empty shape batch={} m={} n={} k={}; every dimension must be at least 1",
                s.batch, s.m, s.n, s.k
            ));
        }
        if s.batch > 1 && s.stride_c < s.m * s.n {
            return Err(format!(
                "matmul: stride_c {} is below m*n = {}: the outputs of batch items would overlap",
                s.stride_c,
                s.m * s.n
            ));
        }
        for (name, need, have) in [
            ("A", s.a_len(), a_len),
            ("B", s.b_len(), b_len),
            ("C", s.c_len(), c_len),
        ] {
            if have < need {
                return Err(format!(
                    "matmul {}: {name} holds {have} elements but the shape needs {need}",
                    s.describe()
                ));
            }
            if need > u32::MAX as usize {
                return Err(format!(
                    "matmul {}: {name} needs {need} elements, over 2^32",
                    s.describe()
                ));
            }
        }
        if let Some(len) = bias_len {
            let need = (s.batch - 1) * s.stride_bias + s.n;
            if len < need {
                return Err(format!(
                    "matmul {}: bias holds {len} elements, needs {need} (n = {}, stride_bias {})",
                    s.describe(),
                    s.n,
                    s.stride_bias
                ));
            }
        }
        // The kernels find a C element's batch item as its index / stride_c.
        if s.stride_bias > 0 && s.stride_c < s.m * s.n {
            return Err(format!(
                "matmul {}: a bias per batch item needs stride_c >= m*n = {}, not {}",
                s.describe(),
                s.m * s.n,
                s.stride_c
            ));
        }
        Ok(())
    }

    /// `8x64x32x16 nt` style: batch x M x N x K and the transposes (n = plain, t = transposed).
    pub fn describe(&self) -> String {
        let t = |x: bool| if x { 't' } else { 'n' };
        format!(
            "{}x{}x{}x{} {}{}",
            self.batch,
            self.m,
            self.n,
            self.k,
            t(self.trans_a),
            t(self.trans_b)
        )
    }
}
