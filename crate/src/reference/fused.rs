//! Fused elementwise chains (shaders/fused.wgsl): one pass where the unfused program makes two.
//! Each twin is defined as the composition of the unfused twins it replaces, element by
//! element, so the fused kernels round exactly as the chains they replace.
use super::dropout;
use super::gelu;

/// The shape of a fused pass on D devices: `n` elements of the full-size operands over all
/// devices (n / D each), and each device's block of the bias (`nb` elements, the period)
/// repeating over its own block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusedShape {
    pub n: usize,
    pub nb: usize,
    pub devices: usize,
}

impl FusedShape {
    /// The index into the bias (D, nb) that element `i` meets.
    pub fn bias_index(&self, i: usize) -> usize {
        let nl = self.n / self.devices.max(1);
        (i / nl) * self.nb + i % self.nb
    }
}

/// `pre = a + bias` and `out = gelu(pre)`: add (bias) then gelu.
pub fn bias_gelu(a: &[f32], bias: &[f32], s: FusedShape) -> (Vec<f32>, Vec<f32>) {
    let pre: Vec<f32> = (0..s.n).map(|i| a[i] + bias[s.bias_index(i)]).collect();
    let out = gelu::forward(&pre);
    (pre, out)
}

/// `out = residual + (y + bias)`: add (bias) then add (residual).
pub fn bias_residual(y: &[f32], bias: &[f32], residual: &[f32], s: FusedShape) -> Vec<f32> {
    (0..s.n).map(|i| residual[i] + (y[i] + bias[s.bias_index(i)])).collect()
}

/// `out = residual + dropout(x, bits, rate)`: dropout then add (residual).
pub fn dropout_residual(x: &[f32], bits: &[u32], residual: &[f32], rate: f32) -> Vec<f32> {
    let dropped = dropout::apply(x, bits, rate);
    residual.iter().zip(dropped).map(|(&r, d)| r + d).collect()
}
