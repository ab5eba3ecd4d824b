//! Fused elementwise chains (shaders/fused.wgsl): bias + GELU, bias + residual, dropout +
//! residual, each one dispatch and one pass where the unfused program makes two. The executor's
//! lowering picks them (crate/src/exec/gpu/fuse.rs). CPU twins: [`crate::reference::fused`].
use super::check::{need, vec4_ok};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
pub use crate::reference::fused::FusedShape;
use crate::rng::keep_scale;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    nb: u32,
    nl: u32,
    keep: f32,
    scale: f32,
    _pad: [u32; 3],
}

/// Checks that `s` splits evenly over its devices and that the bias period divides a block.
fn params(k: &str, s: FusedShape) -> Result<Params, GpuError> {
    let FusedShape { n, nb, devices } = s;
    if devices == 0 || !n.is_multiple_of(devices) {
        return Err(GpuError::Invalid(format!(
            "{k}: {n} elements do not split evenly over {devices} devices; n counts all devices' elements"
        )));
    }
    let nl = n / devices;
    if nb == 0 || !nl.is_multiple_of(nb) {
        return Err(GpuError::Invalid(format!(
            "{k}: the bias period {nb} does not divide the {nl} elements of one device's block"
        )));
    }
    Ok(Params {
        n: n as u32,
        nb: nb as u32,
        nl: nl as u32,
        keep: 1.0,
        scale: 1.0,
        _pad: [0; 3],
    })
}

/// A launch of `entry` over `n` elements reading and writing `bindings` (slot, name, buffer,
/// written): its vec4 form (`entry4`, slots + 10, a quarter of the invocations) where `n` and
/// the bias period `nb` are multiples of 4 and every binding starts on 16 bytes.
fn elementwise<'a>(
    entry: &str,
    label: String,
    n: usize,
    nb: usize,
    bindings: &[(u32, &'static str, &'a GpuBuffer, bool)],
) -> Kernel<'a> {
    let bufs: Vec<&GpuBuffer> = bindings.iter().map(|b| b.2).collect();
    let vec4 = vec4_ok(n, &bufs) && (nb == 1 && !bindings.iter().any(|b| b.0 == 1) || nb.is_multiple_of(4));
    let (entry, shift, invocations) = if vec4 {
        (format!("{entry}4"), 10, n / 4)
    } else {
        (entry.to_string(), 0, n)
    };
    let mut kernel = Kernel::new("fused", &entry, label).grid(grid_1d(invocations, 256));
    for &(slot, name, buf, written) in bindings {
        kernel = if written {
            kernel.write(slot + shift, name, buf)
        } else {
            kernel.read(slot + shift, name, buf)
        };
    }
    kernel
}

fn label(entry: &str, s: FusedShape) -> String {
    if s.devices == 1 {
        format!("{entry} n={}", s.n)
    } else {
        format!("{entry} n={} devices={}", s.n, s.devices)
    }
}

/// `pre = a + bias` and `out = gelu(pre)` in one pass (`pre` is what GELU's backward reads).
pub async fn bias_gelu(
    ctx: &GpuContext,
    a: &GpuBuffer,
    bias: &GpuBuffer,
    pre: &GpuBuffer,
    out: &GpuBuffer,
    s: FusedShape,
) -> Result<Dispatch, GpuError> {
    let k = "fused::bias_gelu";
    let p = params(k, s)?;
    need(k, "a", a, s.n)?;
    need(k, "bias", bias, s.devices * s.nb)?;
    need(k, "pre", pre, s.n)?;
    need(k, "out", out, s.n)?;
    let bindings = [
        (0, "a", a, false),
        (1, "bias", bias, false),
        (4, "pre", pre, true),
        (5, "out", out, true),
    ];
    let kernel = elementwise("bias_gelu", label("bias_gelu", s), s.n, s.nb, &bindings).uniform(6, &p);
    ctx.launch(kernel).await
}

/// `out = residual + (a + bias)` in one pass.
pub async fn bias_residual(
    ctx: &GpuContext,
    a: &GpuBuffer,
    bias: &GpuBuffer,
    residual: &GpuBuffer,
    out: &GpuBuffer,
    s: FusedShape,
) -> Result<Dispatch, GpuError> {
    let k = "fused::bias_residual";
    let p = params(k, s)?;
    need(k, "a", a, s.n)?;
    need(k, "bias", bias, s.devices * s.nb)?;
    need(k, "residual", residual, s.n)?;
    need(k, "out", out, s.n)?;
    let bindings = [
        (0, "a", a, false),
        (1, "bias", bias, false),
        (2, "residual", residual, false),
        (5, "out", out, true),
    ];
    let kernel = elementwise("bias_residual", label("bias_residual", s), s.n, s.nb, &bindings).uniform(6, &p);
    ctx.launch(kernel).await
}

/// `out = residual + dropout(a, bits, rate)` over `n` elements in one pass.
pub async fn dropout_residual(
    ctx: &GpuContext,
    a: &GpuBuffer,
    bits: &GpuBuffer,
    residual: &GpuBuffer,
    out: &GpuBuffer,
    n: usize,
    rate: f32,
) -> Result<Dispatch, GpuError> {
    let k = "fused::dropout_residual";
    if !(0.0..1.0).contains(&rate) {
        return Err(GpuError::Invalid(format!("{k}: dropout rate {rate} must be in [0, 1)")));
    }
    let s = FusedShape { n, nb: 1, devices: 1 };
    let p = Params {
        keep: 1.0 - rate,
        scale: keep_scale(1.0 - rate),
        ..params(k, s)?
    };
    need(k, "a", a, n)?;
    need(k, "bits", bits, n)?;
    need(k, "residual", residual, n)?;
    need(k, "out", out, n)?;
    let bindings = [
        (0, "a", a, false),
        (3, "bits", bits, false),
        (2, "residual", residual, false),
        (5, "out", out, true),
    ];
    let kernel = elementwise("dropout_residual", label("dropout_residual", s), n, 1, &bindings).uniform(6, &p);
    ctx.launch(kernel).await
}
