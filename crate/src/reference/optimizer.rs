//! CPU twins of shaders/optimizer.wgsl, in the same float order, and the optimizer's
//! hyperparameters (MODEL.md), which both the GPU launchers and the CPU reference use.
use thiserror::Error;

/// AdamW's first-moment decay (MODEL.md).
pub const ADAMW_B1: f32 = 0.9;
/// AdamW's second-moment decay.
pub const ADAMW_B2: f32 = 0.999;
/// AdamW's denominator epsilon.
pub const ADAMW_EPS: f32 = 1e-8;
/// AdamW's weight decay for 2-D weights (other parameters use 0).
pub const ADAMW_WEIGHT_DECAY: f32 = 0.01;

/// Words of the SGD `hyper` buffer.
pub const SGD_HYPER_LEN: usize = 1;
/// Words of the AdamW `hyper` buffer.
pub const ADAMW_HYPER_LEN: usize = 8;

/// A step count the optimizer cannot take.
#[derive(Debug, Clone, Error)]
pub enum OptimizerError {
    #[error("AdamW step 0: steps count from 1 (the first update), bias corrections 1 - b^0 would be 0")]
    StepZero,
}

/// The SGD `hyper` buffer: `[lr]`.
pub fn sgd_hyper(lr: f32) -> [f32; SGD_HYPER_LEN] {
    [lr]
}

/// The AdamW scalars of one step; on the GPU, the `hyper` buffer word by word in this order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct AdamWHyper {
    pub lr: f32,
    pub b1: f32,
    pub b2: f32,
    pub eps: f32,
    /// `1 - b1`, rounded from double precision as optax's weak-typed Python float is.
    pub one_minus_b1: f32,
    /// `1 - b2`, likewise.
    pub one_minus_b2: f32,
    /// Bias correction `1 - b1^t`.
    pub bc1: f32,
    /// Bias correction `1 - b2^t`.
    pub bc2: f32,
}

impl AdamWHyper {
    /// The scalars of update number `step` (1 for the first update, as optax counts).
    /// `b^t` is float32 `pow` (computed exactly, then rounded), `1 - b^t` then in float32.
    pub fn at(lr: f32, step: u32) -> Result<AdamWHyper, OptimizerError> {
        if step == 0 {
            return Err(OptimizerError::StepZero);
        }
        let pow = |b: f32| (b as f64).powi(step.min(i32::MAX as u32) as i32) as f32;
        Ok(AdamWHyper {
            lr,
            b1: ADAMW_B1,
            b2: ADAMW_B2,
            eps: ADAMW_EPS,
            one_minus_b1: (1.0 - 0.9f64) as f32,
            one_minus_b2: (1.0 - 0.999f64) as f32,
            bc1: 1.0 - pow(ADAMW_B1),
            bc2: 1.0 - pow(ADAMW_B2),
        })
    }

    /// The `hyper` buffer's contents.
    pub fn words(&self) -> [f32; ADAMW_HYPER_LEN] {
        bytemuck::cast(*self)
    }
}

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
