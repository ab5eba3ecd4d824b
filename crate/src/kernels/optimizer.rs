//! Launchers of shaders/optimizer.wgsl: SGD and AdamW updates in place.
//!
//! Step-dependent scalars live in a small `hyper` storage buffer that the host rewrites each
//! step (`ctx.write(&hyper, &AdamWHyper::at(lr, step)?.words())`), so the [`Dispatch`] of every
//! parameter is built once and replayed. The layouts are [`sgd_hyper`] and [`AdamWHyper`].
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    weight_decay: f32,
    pad: [u32; 2],
}

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

/// The SGD `hyper` buffer: `[lr]`.
pub fn sgd_hyper(lr: f32) -> [f32; SGD_HYPER_LEN] {
    [lr]
}

/// The AdamW `hyper` buffer of one step, word by word in this order.
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
    pub fn at(lr: f32, step: u32) -> Result<AdamWHyper, GpuError> {
        if step == 0 {
            return Err(GpuError::Invalid(
                "AdamW step 0: steps count from 1 (the first update), bias corrections 1 - b^0 would be 0".into(),
            ));
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

    /// The buffer contents.
    pub fn words(&self) -> [f32; ADAMW_HYPER_LEN] {
        bytemuck::cast(*self)
    }
}

/// `adamw_hyper(lr, step)` = `AdamWHyper::at(lr, step)?.words()`.
pub fn adamw_hyper(lr: f32, step: u32) -> Result<[f32; ADAMW_HYPER_LEN], GpuError> {
    Ok(AdamWHyper::at(lr, step)?.words())
}

fn check(what: &str, bufs: &[(&GpuBuffer, usize)]) -> Result<(), GpuError> {
    for (i, (b, need)) in bufs.iter().enumerate() {
        if b.len < *need {
            return Err(GpuError::Invalid(format!(
                "{what}: buffer `{}` holds {} elements, needs {need}",
                b.name, b.len
            )));
        }
        for (c, _) in &bufs[..i] {
            if c.buffer == b.buffer {
                return Err(GpuError::Invalid(format!(
                    "{what}: buffer `{}` is bound twice; WebGPU forbids writable aliasing, use separate buffers",
                    b.name
                )));
            }
        }
    }
    Ok(())
}

/// `param -= lr * grad` in place over n elements; hyper: [`sgd_hyper`].
pub async fn sgd(
    ctx: &GpuContext,
    param: &GpuBuffer,
    grad: &GpuBuffer,
    hyper: &GpuBuffer,
    n: usize,
) -> Result<Dispatch, GpuError> {
    check("sgd", &[(param, n), (grad, n), (hyper, SGD_HYPER_LEN)])?;
    let pipeline = ctx.pipeline("optimizer", "sgd").await?;
    let label = format!("sgd n={n}");
    let u = ctx.uniform(
        &label,
        &Params {
            n: n as u32,
            weight_decay: 0.0,
            pad: [0; 2],
        },
    );
    let bind_group = ctx.bind(
        &label,
        &pipeline,
        &[(0, &param.buffer), (1, &grad.buffer), (4, &hyper.buffer), (5, &u)],
    );
    Ok(Dispatch {
        label,
        pipeline,
        bind_group,
        workgroups: grid_1d(n, 256),
        uniforms: vec![u],
    })
}

/// One AdamW update in place of param and its moments m, v (n elements each; m, v start at
/// 0); hyper: [`AdamWHyper`]; `weight_decay` is fixed per parameter ([`ADAMW_WEIGHT_DECAY`]
/// for 2-D weights, else 0).
#[allow(clippy::too_many_arguments)]
pub async fn adamw(
    ctx: &GpuContext,
    param: &GpuBuffer,
    grad: &GpuBuffer,
    m: &GpuBuffer,
    v: &GpuBuffer,
    hyper: &GpuBuffer,
    n: usize,
    weight_decay: f32,
) -> Result<Dispatch, GpuError> {
    check(
        "adamw",
        &[(param, n), (grad, n), (m, n), (v, n), (hyper, ADAMW_HYPER_LEN)],
    )?;
    let pipeline = ctx.pipeline("optimizer", "adamw").await?;
    let label = format!("adamw n={n}");
    let u = ctx.uniform(
        &label,
        &Params {
            n: n as u32,
            weight_decay,
            pad: [0; 2],
        },
    );
    let bind_group = ctx.bind(
        &label,
        &pipeline,
        &[
            (0, &param.buffer),
            (1, &grad.buffer),
            (2, &m.buffer),
            (3, &v.buffer),
            (4, &hyper.buffer),
            (5, &u),
        ],
    );
    Ok(Dispatch {
        label,
        pipeline,
        bind_group,
        workgroups: grid_1d(n, 256),
        uniforms: vec![u],
    })
}
