//! Argument checks every launcher shares: buffer sizes and positive dimensions, each failing
//! with a message that names the kernel and the argument.
use crate::gpu::{GpuBuffer, GpuError};

/// Errors unless `buf` holds at least `len` elements.
pub(crate) fn need(kernel: &str, what: &str, buf: &GpuBuffer, len: usize) -> Result<(), GpuError> {
    if buf.len < len {
        return Err(GpuError::Invalid(format!(
            "{kernel}: `{what}` (buffer `{}`) holds {} elements but the shape needs {len}; allocate it with the \
             shape's size",
            buf.name, buf.len
        )));
    }
    Ok(())
}

/// Errors when a size that must be positive is 0.
pub(crate) fn positive(kernel: &str, what: &str, v: usize) -> Result<(), GpuError> {
    if v == 0 {
        return Err(GpuError::Invalid(format!("{kernel}: {what} must be at least 1")));
    }
    Ok(())
}

/// Errors unless `n` (all devices' elements or rows) splits evenly over `devices` (>= 1).
pub(crate) fn per_device(kernel: &str, what: &str, n: usize, devices: usize) -> Result<usize, GpuError> {
    positive(kernel, "devices", devices)?;
    if !n.is_multiple_of(devices) {
        return Err(GpuError::Invalid(format!(
            "{kernel}: {n} {what} do not split evenly over {devices} devices; the count is of all devices' {what} \
             (devices x {what} per device)"
        )));
    }
    Ok(n / devices)
}

/// Label suffix naming the device count when there is more than one.
pub(crate) fn on_devices(devices: usize) -> String {
    if devices == 1 {
        String::new()
    } else {
        format!(" on {devices} devices")
    }
}

/// Whether `n` elements in each of `bufs` can be read and written as vec4s: `n` a multiple of 4
/// and every binding starting on 16 bytes. The launchers with a vec4 form (the `*4` entry
/// points) take it when this holds; on lavapipe every storage access is a per-lane loop, so a
/// vec4 moves four elements for the price of one.
pub(crate) fn vec4_ok(n: usize, bufs: &[&GpuBuffer]) -> bool {
    n.is_multiple_of(4) && bufs.iter().all(|b| b.offset.is_multiple_of(16))
}
