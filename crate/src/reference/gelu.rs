//! GELU, tanh form (MODEL.md): 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))).

const S: f32 = 0.797_884_6; // sqrt(2/pi)
const K: f32 = 0.044715;

pub fn forward(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| 0.5 * v * (1.0 + (S * (v + K * v * v * v)).tanh()))
        .collect()
}

/// dx = dout * GELU'(x)
pub fn backward(x: &[f32], dout: &[f32]) -> Vec<f32> {
    x.iter()
        .zip(dout)
        .map(|(&v, &d)| {
            let t = (S * (v + K * v * v * v)).tanh();
            d * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * S * (1.0 + 3.0 * K * v * v))
        })
        .collect()
}
