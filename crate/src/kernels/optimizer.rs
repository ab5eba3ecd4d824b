//! Launchers of shaders/optimizer.wgsl: SGD and AdamW updates in place.
//!
//! Step-dependent scalars live in a small `hyper` storage buffer that the host rewrites each
//! step (`ctx.write(&hyper, &adamw_hyper(lr, step)?)`), so the [`Dispatch`] of every parameter
//! is built once and replayed. The layouts are [`sgd_hyper`] and [`AdamWHyper`], defined with
//! the CPU twins in [`crate::reference::optimizer`].
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
pub use crate::reference::optimizer::{
    sgd_hyper, AdamWHyper, OptimizerError, ADAMW_B1, ADAMW_B2, ADAMW_EPS, ADAMW_HYPER_LEN, ADAMW_WEIGHT_DECAY,
    SGD_HYPER_LEN,
};

impl From<OptimizerError> for GpuError {
    fn from(e: OptimizerError) -> Self {
        GpuError::Invalid(e.to_string())
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    weight_decay: f32,
    pad: [u32; 2],
}

/// `adamw_hyper(lr, step)` = `AdamWHyper::at(lr, step)?.words()`.
pub fn adamw_hyper(lr: f32, step: u32) -> Result<[f32; ADAMW_HYPER_LEN], GpuError> {
    Ok(AdamWHyper::at(lr, step)?.words())
}

fn check(what: &str, bufs: &[(&GpuBuffer, usize)]) -> Result<(), GpuError> {
    for (b, need) in bufs {
        if b.len < *need {
            return Err(GpuError::Invalid(format!(
                "{what}: buffer `{}` holds {} elements, needs {need}",
                b.name, b.len
            )));
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
    let params = Params {
        n: n as u32,
        weight_decay: 0.0,
        pad: [0; 2],
    };
    let kernel = Kernel::new("optimizer", "sgd", format!("sgd n={n}"))
        .write(0, "param", param)
        .read(1, "grad", grad)
        .read(4, "hyper", hyper)
        .uniform(5, &params)
        .grid(grid_1d(n, 256));
    ctx.launch(kernel).await
}

/// The buffers of one AdamW update, all updated in place but `grad` and `hyper`.
pub struct AdamWBuffers<'a> {
    pub param: &'a GpuBuffer,
    pub grad: &'a GpuBuffer,
    /// First moment (starts at 0).
    pub m: &'a GpuBuffer,
    /// Second moment (starts at 0).
    pub v: &'a GpuBuffer,
    /// [`AdamWHyper`] words, rewritten every step.
    pub hyper: &'a GpuBuffer,
}

/// One AdamW update in place of param and its moments m, v (n elements each); `weight_decay`
/// is fixed per parameter ([`ADAMW_WEIGHT_DECAY`] for 2-D weights, else 0).
pub async fn adamw(ctx: &GpuContext, b: &AdamWBuffers<'_>, n: usize, weight_decay: f32) -> Result<Dispatch, GpuError> {
    check(
        "adamw",
        &[
            (b.param, n),
            (b.grad, n),
            (b.m, n),
            (b.v, n),
            (b.hyper, ADAMW_HYPER_LEN),
        ],
    )?;
    let params = Params {
        n: n as u32,
        weight_decay,
        pad: [0; 2],
    };
    let kernel = Kernel::new("optimizer", "adamw", format!("adamw n={n}"))
        .write(0, "param", b.param)
        .read(1, "grad", b.grad)
        .write(2, "m", b.m)
        .write(3, "v", b.v)
        .read(4, "hyper", b.hyper)
        .uniform(5, &params)
        .grid(grid_1d(n, 256));
    ctx.launch(kernel).await
}
