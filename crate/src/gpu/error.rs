use thiserror::Error;

/// Every way the GPU runtime can fail, each with a message a user can act on.
#[derive(Debug, Error, Clone)]
pub enum GpuError {
    #[error("no GPU adapter found ({0}); on Debian install lavapipe with `apt-get install -y mesa-vulkan-drivers`, or use the CPU reference executor")]
    NoAdapter(String),
    #[error("the GPU adapter refused to create a device: {0}")]
    RequestDevice(String),
    #[error("tensor `{name}` needs {bytes} bytes, over this adapter's {limit_name} of {limit} bytes; use a smaller model or batch, or shard it over more devices")]
    TooLarge {
        name: String,
        bytes: u64,
        limit_name: &'static str,
        limit: u64,
    },
    #[error("shader `{shader}` failed to compile: {message}")]
    Shader { shader: String, message: String },
    #[error("unknown shader `{0}` (not in shaders/)")]
    UnknownShader(String),
    #[error("GPU validation error in {context}: {message}")]
    Validation { context: String, message: String },
    #[error("the GPU ran out of memory in {context}: {message}; use a smaller model or batch")]
    OutOfMemory { context: String, message: String },
    #[error("the GPU device was lost ({0}); restart training to create a new device")]
    DeviceLost(String),
    #[error("reading back `{name}` failed: {message}")]
    Readback { name: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

impl GpuError {
    pub(crate) fn from_wgpu(context: &str, e: wgpu::Error) -> Self {
        match e {
            wgpu::Error::OutOfMemory { .. } => GpuError::OutOfMemory {
                context: context.to_string(),
                message: e.to_string(),
            },
            other => GpuError::Validation {
                context: context.to_string(),
                message: format_wgpu_error(&other),
            },
        }
    }
}

/// wgpu's Display of a validation error is terse; its source chain holds the detail.
fn format_wgpu_error(e: &wgpu::Error) -> String {
    use std::error::Error as _;
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        let text = inner.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        src = inner.source();
    }
    s
}
