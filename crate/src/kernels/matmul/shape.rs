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
            if len < s.n {
                return Err(format!(
                    "matmul {}: bias holds {len} elements, needs n = {}",
                    s.describe(),
                    s.n
                ));
            }
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
