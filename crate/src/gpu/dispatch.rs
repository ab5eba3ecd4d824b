use std::sync::Arc;

/// One step of a program on the queue with everything bound: built once when a program is
/// planned, replayed every step (no pipeline, layout or bind group is created per step).
pub struct Dispatch {
    /// What this launch computes, e.g. `matmul 64x256x64`; shown in per-op timings.
    pub label: String,
    pub work: Work,
    /// Keeps the launch's uniform buffers alive as long as the dispatch.
    pub uniforms: Vec<wgpu::Buffer>,
}

/// What a [`Dispatch`] does.
pub enum Work {
    /// A compute pipeline over a grid of workgroups.
    Compute {
        pipeline: Arc<wgpu::ComputePipeline>,
        bind_group: wgpu::BindGroup,
        workgroups: [u32; 3],
    },
    /// A buffer's bytes copied into a texture: a matmul operand whose memory already is its
    /// packed texture's layout. A copy, not a compute pass: lavapipe does it as a memcpy, where
    /// a pack pass pays a texture store (~13 ns) per texel.
    CopyToTexture(TextureCopy),
}

/// Rows of `bytes_per_row` bytes from `buffer` at `offset` into texels (0, 0) .. (width, rows) of
/// `texture`.
pub struct TextureCopy {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub bytes_per_row: u32,
    pub width: u32,
    pub rows: u32,
    pub texture: wgpu::Texture,
}

impl Dispatch {
    /// A compute dispatch in `pass`; false (nothing encoded) for a copy, which needs the encoder.
    fn encode_compute(&self, pass: &mut wgpu::ComputePass<'_>) -> bool {
        let Work::Compute {
            pipeline,
            bind_group,
            workgroups: [x, y, z],
        } = &self.work
        else {
            return false;
        };
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, bind_group, &[]);
        pass.dispatch_workgroups(*x, *y, *z);
        true
    }

    /// A copy into `encoder`, outside any pass; false for a compute dispatch.
    fn encode_copy(&self, encoder: &mut wgpu::CommandEncoder) -> bool {
        let Work::CopyToTexture(c) = &self.work else {
            return false;
        };
        encoder.copy_buffer_to_texture(
            wgpu::TexelCopyBufferInfo {
                buffer: &c.buffer,
                layout: wgpu::TexelCopyBufferLayout {
                    offset: c.offset,
                    bytes_per_row: Some(c.bytes_per_row),
                    rows_per_image: Some(c.rows),
                },
            },
            wgpu::TexelCopyTextureInfo {
                texture: &c.texture,
                mip_level: 0,
                origin: wgpu::Origin3d::ZERO,
                aspect: wgpu::TextureAspect::All,
            },
            wgpu::Extent3d {
                width: c.width,
                height: c.rows,
                depth_or_array_layers: 1,
            },
        );
        true
    }

    /// Whether this is a copy rather than a compute dispatch.
    pub fn is_copy(&self) -> bool {
        matches!(self.work, Work::CopyToTexture(_))
    }
}

/// Encodes `dispatches` in order: runs of compute dispatches share one compute pass (`label`),
/// and a copy ends the pass before it.
pub fn encode_all<'a>(
    encoder: &mut wgpu::CommandEncoder,
    dispatches: impl IntoIterator<Item = &'a Dispatch>,
    label: &str,
) {
    let mut pass: Option<wgpu::ComputePass<'static>> = None;
    for d in dispatches {
        if d.is_copy() {
            drop(pass.take());
            d.encode_copy(encoder);
            continue;
        }
        let p = pass.get_or_insert_with(|| {
            encoder
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some(label),
                    timestamp_writes: None,
                })
                .forget_lifetime()
        });
        d.encode_compute(p);
    }
}

/// Encodes one dispatch alone between timestamps `2 i` and `2 i + 1` of `set`: a compute
/// dispatch in its own pass; a copy between two empty passes that carry the timestamps.
pub fn encode_timed(encoder: &mut wgpu::CommandEncoder, d: &Dispatch, set: &wgpu::QuerySet, i: u32) {
    let stamp = |begin: bool, end: bool| wgpu::ComputePassTimestampWrites {
        query_set: set,
        beginning_of_pass_write_index: begin.then_some(2 * i),
        end_of_pass_write_index: end.then_some(2 * i + 1),
    };
    let copy = d.is_copy();
    {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(&d.label),
            timestamp_writes: Some(stamp(true, !copy)),
        });
        d.encode_compute(&mut pass);
    }
    if copy {
        d.encode_copy(encoder);
        encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(&d.label),
            timestamp_writes: Some(stamp(false, true)),
        });
    }
}

/// Workgroup counts covering `invocations` threads in groups of `workgroup_size`,
/// folded into y when x would pass the 65535 limit. Kernels recover the linear id as
/// `gid.x + gid.y * num_workgroups.x * workgroup_size`.
pub fn grid_1d(invocations: usize, workgroup_size: u32) -> [u32; 3] {
    let groups = invocations.div_ceil(workgroup_size as usize).max(1);
    if groups <= 65535 {
        [groups as u32, 1, 1]
    } else {
        let y = groups.div_ceil(65535);
        [groups.div_ceil(y) as u32, y as u32, 1]
    }
}
