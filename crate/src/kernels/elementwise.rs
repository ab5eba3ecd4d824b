use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    nb: u32,
    alpha: f32,
    beta: f32,
}

/// Which elementwise kernel of shaders/elementwise.wgsl.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    /// out = alpha * a + beta * b[i % nb]
    Add,
    /// out = alpha * a * b[i % nb]
    Mul,
}

/// `out = alpha*a + beta*b` or `out = alpha*a*b`, `b` repeating with period `b.len`.
pub async fn binary(
    ctx: &GpuContext,
    op: Binary,
    a: &GpuBuffer,
    b: &GpuBuffer,
    out: &GpuBuffer,
    n: usize,
    nb: usize,
    alpha: f32,
    beta: f32,
) -> Result<Dispatch, GpuError> {
    if nb == 0 || n % nb != 0 {
        return Err(GpuError::Invalid(format!("elementwise: period {nb} does not divide {n}")));
    }
    let entry = match op {
        Binary::Add => "add",
        Binary::Mul => "mul",
    };
    let pipeline = ctx.pipeline("elementwise", entry).await?;
    let label = format!("{entry} n={n}");
    let params = Params { n: n as u32, nb: nb as u32, alpha, beta };
    let u = ctx.uniform(&label, &params);
    let bind_group = ctx.bind(&label, &pipeline, &[(0, &a.buffer), (1, &b.buffer), (2, &out.buffer), (3, &u)]);
    Ok(Dispatch {
        label,
        pipeline,
        bind_group,
        workgroups: grid_1d(n, 256),
        uniforms: vec![u],
    })
}

/// `out = alpha * a + beta`.
pub async fn scale(ctx: &GpuContext, a: &GpuBuffer, out: &GpuBuffer, n: usize, alpha: f32, beta: f32) -> Result<Dispatch, GpuError> {
    let pipeline = ctx.pipeline("elementwise", "scale").await?;
    let label = format!("scale n={n}");
    let params = Params { n: n as u32, nb: 1, alpha, beta };
    let u = ctx.uniform(&label, &params);
    let bind_group = ctx.bind(&label, &pipeline, &[(0, &a.buffer), (2, &out.buffer), (3, &u)]);
    Ok(Dispatch {
        label,
        pipeline,
        bind_group,
        workgroups: grid_1d(n, 256),
        uniforms: vec![u],
    })
}
