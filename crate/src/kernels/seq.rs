//! Rows by sequence position (shaders/seq.wgsl), with its CPU twin in [`crate::reference::seq`]:
//! every device's block at once, each device's rows at its own positions.
use super::check::{need, positive};
use crate::gpu::{grid_1d, Dispatch, GpuBuffer, GpuContext, GpuError, Kernel};
use crate::ir::Runs;
pub use crate::reference::seq::SeqShape;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    devices: u32,
    outer: u32,
    n: u32,
    len: u32,
    inner: u32,
    chunk: u32,
    pad: [u32; 2],
}

/// Which way the rows go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// (outer, n, inner) -> (outer, len, inner).
    Take,
    /// (outer, len, inner) -> (outer, n, inner), zeros elsewhere.
    Put,
}

/// `dst[d] = take(src[d])` (or `put`) for every device d, with device d's rows at `runs[d]`.
pub async fn rows(
    ctx: &GpuContext,
    src: &GpuBuffer,
    dst: &GpuBuffer,
    s: &SeqShape,
    runs: &[Runs],
    direction: Direction,
) -> Result<Dispatch, GpuError> {
    let kname = "seq::rows";
    for (what, v) in [("outer", s.outer), ("n", s.n), ("len", s.len), ("inner", s.inner)] {
        positive(kname, what, v)?;
    }
    let first = runs
        .first()
        .ok_or_else(|| GpuError::Invalid(format!("{kname}: no runs given; give one per device")))?;
    let fits = |r: &Runs| r.chunk == first.chunk && (0..s.len).all(|i| r.pos(i) < s.n);
    if !runs.iter().all(fits) || first.chunk > s.len {
        return Err(GpuError::Invalid(format!(
            "{kname}: every device's {} rows must lie in 0..{} and share one chunk",
            s.len, s.n
        )));
    }
    let devices = runs.len();
    let (whole, block) = (devices * s.outer * s.n * s.inner, devices * s.outer * s.len * s.inner);
    let (src_len, dst_len, entry) = match direction {
        Direction::Take => (whole, block, "take"),
        Direction::Put => (block, whole, "put"),
    };
    need(kname, "src", src, src_len)?;
    need(kname, "dst", dst, dst_len)?;
    let u = |x: usize| u32::try_from(x).map_err(|_| GpuError::Invalid(format!("{kname}: {x} does not fit in 32 bits")));
    let params = Params {
        devices: u(devices)?,
        outer: u(s.outer)?,
        n: u(s.n)?,
        len: u(s.len)?,
        inner: u(s.inner)?,
        chunk: u(first.chunk)?,
        pad: [0; 2],
    };
    let starts: Vec<u32> = runs.iter().flat_map(|r| r.starts).map(u).collect::<Result<_, _>>()?;
    let label = format!("seq {entry} {devices}x({}, {}->{}, {})", s.outer, s.n, s.len, s.inner);
    let kernel = Kernel::new("seq", entry, label.clone())
        .read(0, "src", src)
        .write(1, "dst", dst)
        .read_owned(2, "starts", ctx.upload(&format!("{label} starts"), &starts)?)
        .uniform(3, &params)
        .grid(grid_1d(dst_len, 256));
    ctx.launch(kernel).await
}
