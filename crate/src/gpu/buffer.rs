/// A storage buffer of `len` 4-byte elements (f32, or u32 for tokens and random bits).
///
/// A tensor sharded over simulated devices is one such buffer holding every
/// device's local block one after another (`[device, local...]`).
pub struct GpuBuffer {
    pub buffer: wgpu::Buffer,
    pub len: usize,
    pub name: String,
}

impl GpuBuffer {
    pub(crate) fn new(buffer: wgpu::Buffer, len: usize, name: &str) -> Self {
        Self {
            buffer,
            len,
            name: name.to_string(),
        }
    }

    pub fn bytes(&self) -> u64 {
        self.buffer.size()
    }
}
