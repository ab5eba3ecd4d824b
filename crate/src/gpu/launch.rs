//! The one way to launch a kernel: a [`Kernel`] describes it (shader, entry point, bindings,
//! uniform, grid) and [`GpuContext::launch`] turns it into a [`Dispatch`], checking on the way
//! that no written buffer aliases another binding.
use std::sync::Arc;

use super::{Dispatch, GpuBuffer, GpuContext, GpuError, Work};

/// What one binding of a kernel holds.
pub enum Resource<'a> {
    /// A storage buffer the caller owns.
    Buffer(&'a GpuBuffer),
    /// A buffer the launcher made for this dispatch alone (a group table, packed operands): the
    /// dispatch keeps it alive.
    Owned(GpuBuffer),
    /// A storage texture view (matmul's tex16 variant).
    Texture(&'a wgpu::TextureView),
}

/// One `@binding` of group 0.
pub struct Binding<'a> {
    pub slot: u32,
    /// The argument's name, for error messages (`x`, `out`, ...).
    pub name: &'static str,
    pub resource: Resource<'a>,
    /// Whether the kernel writes it: a written buffer may not appear in a second binding.
    pub written: bool,
}

/// A kernel launch, described: the launchers in [`crate::kernels`] build one and hand it to
/// [`GpuContext::launch`].
pub struct Kernel<'a> {
    pub shader: &'static str,
    pub entry: String,
    /// What the launch computes, e.g. `matmul 64x256x64`; shown in per-op timings and errors.
    pub label: String,
    pub bindings: Vec<Binding<'a>>,
    /// The uniform's binding and bytes (the kernel's shape constants).
    pub uniform: Option<(u32, Vec<u8>)>,
    pub grid: [u32; 3],
}

impl<'a> Kernel<'a> {
    pub fn new(shader: &'static str, entry: impl Into<String>, label: impl Into<String>) -> Self {
        Self {
            shader,
            entry: entry.into(),
            label: label.into(),
            bindings: Vec::new(),
            uniform: None,
            grid: [1, 1, 1],
        }
    }

    fn bind(mut self, slot: u32, name: &'static str, resource: Resource<'a>, written: bool) -> Self {
        self.bindings.push(Binding {
            slot,
            name,
            resource,
            written,
        });
        self
    }

    /// A buffer the kernel only reads.
    pub fn read(self, slot: u32, name: &'static str, buf: &'a GpuBuffer) -> Self {
        self.bind(slot, name, Resource::Buffer(buf), false)
    }

    /// A buffer the kernel writes (or reads and writes).
    pub fn write(self, slot: u32, name: &'static str, buf: &'a GpuBuffer) -> Self {
        self.bind(slot, name, Resource::Buffer(buf), true)
    }

    /// A buffer made for this launch that the kernel only reads; the dispatch keeps it alive.
    pub fn read_owned(self, slot: u32, name: &'static str, buf: GpuBuffer) -> Self {
        self.bind(slot, name, Resource::Owned(buf), false)
    }

    /// A buffer made for this launch that the kernel writes: a stand-in for an output that an
    /// entry point binds but this launch does not use; the dispatch keeps it alive.
    pub fn write_owned(self, slot: u32, name: &'static str, buf: GpuBuffer) -> Self {
        self.bind(slot, name, Resource::Owned(buf), true)
    }

    /// A storage texture view.
    pub fn texture(self, slot: u32, name: &'static str, view: &'a wgpu::TextureView, written: bool) -> Self {
        self.bind(slot, name, Resource::Texture(view), written)
    }

    pub fn uniform<P: bytemuck::Pod>(mut self, slot: u32, params: &P) -> Self {
        self.uniform = Some((slot, bytemuck::bytes_of(params).to_vec()));
        self
    }

    pub fn grid(mut self, grid: [u32; 3]) -> Self {
        self.grid = grid;
        self
    }

    /// Refuses a written buffer bound twice: WebGPU forbids a writable binding overlapping
    /// another binding of the same dispatch, and a buffer written through one binding and only
    /// read through another (two read-only bindings of one buffer are fine, and so are written
    /// bindings of disjoint ranges of one arena).
    pub fn check_aliasing(&self) -> Result<(), GpuError> {
        for (i, a) in self.bindings.iter().enumerate() {
            let Some((ab, ar)) = buffer(a) else { continue };
            for b in &self.bindings[i + 1..] {
                let Some((bb, br)) = buffer(b) else { continue };
                let overlap = ar.0 < br.1 && br.0 < ar.1;
                if (a.written || b.written) && ab == bb && (overlap || a.written != b.written) {
                    let name = match &a.resource {
                        Resource::Buffer(g) => g.name.as_str(),
                        _ => a.name,
                    };
                    return Err(GpuError::Invalid(format!(
                        "{}: buffer `{name}` is bound twice, as `{}` and as `{}`; WebGPU forbids a written buffer \
                         aliasing another binding (an output that is also an input is the same buffer bound \
                         twice): pass a separate output buffer",
                        self.label, a.name, b.name
                    )));
                }
            }
        }
        Ok(())
    }
}

/// The buffer a binding holds and its byte range (none for a texture).
fn buffer<'b>(b: &'b Binding<'_>) -> Option<(&'b wgpu::Buffer, (u64, u64))> {
    match &b.resource {
        Resource::Buffer(g) => Some((&g.buffer, g.range())),
        Resource::Owned(g) => Some((&g.buffer, g.range())),
        Resource::Texture(_) => None,
    }
}

impl GpuContext {
    /// Builds the [`Dispatch`] of `kernel`: the pipeline from the cache, the uniform, the bind
    /// group (auto layout: exactly the bindings the entry point uses).
    pub async fn launch(&self, kernel: Kernel<'_>) -> Result<Dispatch, GpuError> {
        let pipeline = self.pipeline(kernel.shader, &kernel.entry).await?;
        self.launch_with(pipeline, kernel)
    }

    /// [`GpuContext::launch`] with the pipeline already at hand: synchronous, so a launcher can
    /// build several dispatches inside one error scope.
    pub fn launch_with(&self, pipeline: Arc<wgpu::ComputePipeline>, kernel: Kernel<'_>) -> Result<Dispatch, GpuError> {
        kernel.check_aliasing()?;
        let Kernel {
            label,
            bindings,
            uniform,
            grid,
            ..
        } = kernel;
        let uniform = uniform.map(|(slot, bytes)| {
            use wgpu::util::DeviceExt;
            let buffer = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(&label),
                contents: &bytes,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            });
            (slot, buffer)
        });
        let mut entries: Vec<wgpu::BindGroupEntry> = bindings
            .iter()
            .map(|b| wgpu::BindGroupEntry {
                binding: b.slot,
                resource: match &b.resource {
                    Resource::Buffer(g) => g.binding(),
                    Resource::Owned(g) => g.binding(),
                    Resource::Texture(v) => wgpu::BindingResource::TextureView(v),
                },
            })
            .collect();
        if let Some((slot, buffer)) = &uniform {
            entries.push(wgpu::BindGroupEntry {
                binding: *slot,
                resource: buffer.as_entire_binding(),
            });
        }
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&label),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut keep: Vec<wgpu::Buffer> = uniform.into_iter().map(|(_, b)| b).collect();
        keep.extend(bindings.into_iter().filter_map(|b| match b.resource {
            Resource::Owned(g) => Some(g.buffer),
            _ => None,
        }));
        Ok(Dispatch {
            label,
            work: Work::Compute {
                pipeline,
                bind_group,
                workgroups: grid,
            },
            uniforms: keep,
        })
    }
}
