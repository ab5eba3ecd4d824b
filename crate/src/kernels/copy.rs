//! Strided copy (shaders/copy.wgsl): one kernel for transpose, slice, concat and broadcast.
use super::check::{need, vec4_ok};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
pub use crate::reference::copy::Strided;

/// The highest rank [`strided`] accepts.
pub const MAX_RANK: usize = 6;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    shape: [u32; 8],
    src_strides: [u32; 8],
    dst_strides: [u32; 8],
    total: u32,
    src_offset: u32,
    dst_offset: u32,
    src_outer: u32,
    dst_outer: u32,
    _pad: [u32; 3],
}

/// (shape, src strides, dst strides) with unit axes dropped and adjacent axes merged where
/// they are contiguous in both src and dst: the same elements, in the same order, in as few
/// axes as possible (at least 1).
fn collapse(shape: &[usize], src: &[usize], dst: &[usize]) -> Vec<(usize, usize, usize)> {
    let mut axes: Vec<(usize, usize, usize)> = Vec::new();
    for a in 0..shape.len() {
        if shape[a] == 1 {
            continue;
        }
        match axes.last_mut() {
            Some((e, s, d)) if *s == shape[a] * src[a] && *d == shape[a] * dst[a] => {
                *e *= shape[a];
                *s = src[a];
                *d = dst[a];
            }
            _ => axes.push((shape[a], src[a], dst[a])),
        }
    }
    if axes.is_empty() {
        axes.push((1, 0, 0));
    }
    axes
}

/// The copy `c` ([`Strided`], rank 0..=6) on the GPU, every device's block at once when the
/// shape has a leading device axis: for every multi-index i over `c.shape`,
/// `dst[dst_offset + Σ i_k*dst_strides_k] (= or +=) src[src_offset + Σ i_k*src_strides_k]`.
/// Stride 0 in `src_strides` broadcasts. Transpose = permuted source strides; slice = source
/// offset and strides; concat = one copy into each slice of dst.
///
/// Requirement: no two multi-indices may address the same dst element, or writes race
/// (and `accumulate` would lose updates). A dst stride 0 over an extent > 1 is rejected;
/// other overlapping dst layouts are the caller's to avoid. src and dst must be different
/// buffers.
pub async fn strided(ctx: &GpuContext, src: &GpuBuffer, dst: &GpuBuffer, c: &Strided) -> Result<Dispatch, GpuError> {
    let Strided {
        shape,
        src_offset,
        src_strides,
        dst_offset,
        dst_strides,
        accumulate,
    } = c;
    let (src_offset, dst_offset, accumulate) = (*src_offset, *dst_offset, *accumulate);
    let k = "copy::strided";
    let rank = shape.len();
    if rank > MAX_RANK {
        return Err(GpuError::Invalid(format!(
            "{k}: rank {rank} is over {MAX_RANK}; merge adjacent axes that are contiguous in both src and dst"
        )));
    }
    if src_strides.len() != rank || dst_strides.len() != rank {
        return Err(GpuError::Invalid(format!(
            "{k}: shape has rank {rank} but src_strides has {} and dst_strides {} entries; give one stride per axis",
            src_strides.len(),
            dst_strides.len()
        )));
    }
    if let Some(a) = (0..rank).find(|&a| shape[a] > 1 && dst_strides[a] == 0) {
        return Err(GpuError::Invalid(format!(
            "{k}: dst stride 0 on axis {a} (extent {}) makes several elements write one dst element; reduce with \
             reduce::sum_axis instead",
            shape[a]
        )));
    }
    let overflow = || {
        GpuError::Invalid(format!(
            "{k}: shape {shape:?} with these strides overflows the index range"
        ))
    };
    let total = shape
        .iter()
        .try_fold(1usize, |t, &e| t.checked_mul(e))
        .ok_or_else(overflow)?;
    if total > u32::MAX as usize {
        return Err(overflow());
    }
    // The highest index each side touches must lie inside its buffer.
    let last = |offset: usize, strides: &[usize]| -> Result<usize, GpuError> {
        shape.iter().zip(strides).try_fold(offset, |acc, (&e, &s)| {
            e.saturating_sub(1)
                .checked_mul(s)
                .and_then(|x| acc.checked_add(x))
                .ok_or_else(overflow)
        })
    };
    if total > 0 {
        need(k, "src", src, last(src_offset, src_strides)? + 1)?;
        need(k, "dst", dst, last(dst_offset, dst_strides)? + 1)?;
    }
    // Right-align the collapsed axes into the kernel's 6; padding axes have extent 1.
    let mut axes = collapse(shape, src_strides, dst_strides);
    // Four elements at a time where the last axis is contiguous on both sides and every other
    // stride, every offset and its extent are multiples of 4: the same copy in vec4 units.
    let vec4 = !accumulate
        && total > 0
        && matches!(axes.last(), Some(&(e, 1, 1)) if e.is_multiple_of(4))
        && axes[..axes.len() - 1]
            .iter()
            .all(|&(_, s, d)| s.is_multiple_of(4) && d.is_multiple_of(4))
        && src_offset.is_multiple_of(4)
        && dst_offset.is_multiple_of(4)
        && vec4_ok(total, &[src, dst]);
    let (unit, entry) = match (vec4, accumulate) {
        (true, _) => (4, "copy4"),
        (false, true) => (1, "accumulate"),
        (false, false) => (1, "copy"),
    };
    if vec4 {
        let last = axes.len() - 1;
        for (a, (e, s, d)) in axes.iter_mut().enumerate() {
            if a == last {
                *e /= 4;
            } else {
                *s /= 4;
                *d /= 4;
            }
        }
    }
    let mut params = Params {
        shape: [1; 8],
        src_strides: [0; 8],
        dst_strides: [0; 8],
        total: (total / unit) as u32,
        src_offset: (src_offset / unit) as u32,
        dst_offset: (dst_offset / unit) as u32,
        src_outer: axes[0].1 as u32,
        dst_outer: axes[0].2 as u32,
        _pad: [0; 3],
    };
    for (a, &(e, s, d)) in axes.iter().enumerate() {
        let slot = MAX_RANK - axes.len() + a;
        params.shape[slot] = e as u32;
        params.src_strides[slot] = s as u32;
        params.dst_strides[slot] = d as u32;
    }
    let entry = format!("{entry}_{}", axes.len());
    let label = format!("{entry} {shape:?} src {src_offset}+{src_strides:?} dst {dst_offset}+{dst_strides:?}");
    let (src_slot, dst_slot) = if vec4 { (3, 4) } else { (0, 1) };
    let kernel = Kernel::new("copy", entry, label)
        .read(src_slot, "src", src)
        .write(dst_slot, "dst", dst)
        .uniform(2, &params)
        .grid(grid_1d(total / unit, 256));
    ctx.launch(kernel).await
}
