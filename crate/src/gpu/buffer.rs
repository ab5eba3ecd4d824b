/// A storage buffer of `len` 4-byte elements (f32, or u32 for tokens and random bits).
///
/// A tensor sharded over simulated devices is one such buffer holding every
/// device's local block one after another (`[device, local...]`).
///
/// It may be a *view*: `len` elements from byte `offset` of a larger buffer (an arena that
/// packs several tensors, so one dispatch can update them all); kernels bind just that range.
pub struct GpuBuffer {
    pub buffer: wgpu::Buffer,
    pub len: usize,
    pub name: String,
    /// Byte offset of element 0 in `buffer` (0 unless a view).
    pub offset: u64,
    size: u64,
}

impl GpuBuffer {
    pub(crate) fn new(buffer: wgpu::Buffer, len: usize, name: &str) -> Self {
        Self {
            size: buffer.size(),
            buffer,
            len,
            name: name.to_string(),
            offset: 0,
        }
    }

    /// `len` elements of this buffer from element `start`, as a buffer of their own. `start`
    /// must be a multiple of the adapter's `min_storage_buffer_offset_alignment` (in bytes / 4)
    /// for kernels to bind it.
    pub fn view(&self, name: &str, start: usize, len: usize) -> Result<GpuBuffer, super::GpuError> {
        if start + len > self.len || len == 0 {
            return Err(super::GpuError::Invalid(format!(
                "view `{name}` of {len} elements from element {start}: `{}` holds {} elements",
                self.name, self.len
            )));
        }
        Ok(Self {
            buffer: self.buffer.clone(),
            len,
            name: name.to_string(),
            offset: self.offset + 4 * start as u64,
            size: 4 * len as u64,
        })
    }

    /// Bytes a kernel sees (a view's range; a whole buffer's allocation).
    pub fn bytes(&self) -> u64 {
        self.size
    }

    /// Whether this is a range of a larger buffer.
    pub fn is_view(&self) -> bool {
        self.offset != 0 || self.size != self.buffer.size()
    }

    /// The binding of exactly this buffer's range.
    pub fn binding(&self) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: self.offset,
            size: wgpu::BufferSize::new(self.size),
        })
    }

    /// Byte range `[start, end)` in the underlying buffer.
    pub fn range(&self) -> (u64, u64) {
        (self.offset, self.offset + self.size)
    }
}
