//! CPU twins of shaders/optimizer.wgsl, in the same float order.
use crate::kernels::optimizer::AdamWHyper;

/// `param -= lr * grad`.
pub fn sgd(param: &mut [f32], grad: &[f32], lr: f32) {
    for (w, &g) in param.iter_mut().zip(grad) {
        *w -= lr * g;
    }
}

/// One AdamW update of `param` and its moments `m`, `v` (MODEL.md; optax's order):
/// `m = (1-b1) g + b1 m`, `v = (1-b2) g^2 + b2 v`, `mhat = m / (1-b1^t)`, `vhat = v / (1-b2^t)`,
/// `param -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * param)`.
pub fn adamw(param: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], hyper: &AdamWHyper, weight_decay: f32) {
    let h = hyper;
    for i in 0..param.len() {
        let g = grad[i];
        m[i] = h.one_minus_b1 * g + h.b1 * m[i];
        v[i] = h.one_minus_b2 * (g * g) + h.b2 * v[i];
        let mhat = m[i] / h.bc1;
        let vhat = v[i] / h.bc2;
        let w = param[i];
        param[i] = w - h.lr * (mhat / (vhat.sqrt() + h.eps) + weight_decay * w);
    }
}
