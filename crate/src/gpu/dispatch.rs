use std::sync::Arc;

/// One kernel launch with everything bound: built once when a program is planned,
/// replayed every step (no pipeline, layout or bind group is created per step).
pub struct Dispatch {
    /// What this launch computes, e.g. `matmul 64x256x64`; shown in per-op timings.
    pub label: String,
    pub pipeline: Arc<wgpu::ComputePipeline>,
    pub bind_group: wgpu::BindGroup,
    pub workgroups: [u32; 3],
    /// Keeps the launch's uniform buffers alive as long as the dispatch.
    pub uniforms: Vec<wgpu::Buffer>,
}

impl Dispatch {
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        let [x, y, z] = self.workgroups;
        pass.dispatch_workgroups(x, y, z);
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
