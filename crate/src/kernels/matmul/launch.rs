//! The public matmul launcher.
use super::autotune::choose_variant;
use super::shared::Sharing;
use super::variants::{adapter_supports, build, Operands, Variant};
use super::MatmulShape;
use crate::gpu::{Dispatch, GpuBuffer, GpuContext, GpuError};

/// `C = alpha * op(A) @ op(B) (+ bias) (+ C if accumulate)` for every batch item, with `variant`, or
/// when `None` the one the autotuner picked for this adapter and `s`'s shape class (tuned on first use,
/// then cached in the context's `Tuning`). Returns its dispatches in order (pack passes, then the matmul); any
/// intermediate buffers or textures are created here and kept alive by the dispatches.
///
/// a: (batch, M, K), or (batch, K, M) if trans_a; b: (batch, K, N), or (batch, N, K) if trans_b;
/// bias: (N), added to every row; c: (batch, M, N). Batch items are `stride_*` elements apart.
pub async fn matmul(
    ctx: &GpuContext,
    s: &MatmulShape,
    a: &GpuBuffer,
    b: &GpuBuffer,
    bias: Option<&GpuBuffer>,
    c: &GpuBuffer,
    variant: Option<Variant>,
) -> Result<Vec<Dispatch>, GpuError> {
    matmul_shared(ctx, s, Operands { a, b, bias, c }, variant, None).await
}

/// [`matmul`], where an operand copied whole into a texture shares it with the other matmuls
/// built with `sharing` that read the same contents the same way (shared.rs). Their repeated
/// copies stay in the dispatches until [`drop_repeated_copies`](super::drop_repeated_copies)
/// takes them out of the final list.
pub async fn matmul_shared(
    ctx: &GpuContext,
    s: &MatmulShape,
    ops: Operands<'_>,
    variant: Option<Variant>,
    sharing: Option<Sharing<'_>>,
) -> Result<Vec<Dispatch>, GpuError> {
    s.check(ops.a.len, ops.b.len, ops.bias.map(|x| x.len), ops.c.len)
        .map_err(GpuError::Invalid)?;
    let variant = match variant {
        Some(v) => v,
        None => choose_variant(ctx, s).await?,
    };
    build(ctx, variant, s, ops, sharing).await
}

/// The matmul variants this adapter supports (naive always).
pub fn variants(ctx: &GpuContext) -> Vec<Variant> {
    Variant::ALL
        .into_iter()
        .filter(|v| adapter_supports(ctx, *v).is_ok())
        .collect()
}
