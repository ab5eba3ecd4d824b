use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{GpuContext, GpuError};
use crate::shaders;

/// Compute pipelines by (shader file, entry point): each is compiled once per context.
#[derive(Default)]
pub struct PipelineCache {
    modules: Mutex<HashMap<&'static str, Arc<wgpu::ShaderModule>>>,
    pipelines: Mutex<HashMap<(String, String), Arc<wgpu::ComputePipeline>>>,
}

impl PipelineCache {
    pub fn len(&self) -> usize {
        self.pipelines.lock().map(|p| p.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl GpuContext {
    /// The shader module of `shaders/<name>.wgsl`, compiled once. Compile errors come back as
    /// [`GpuError::Shader`] (captured with an error scope, so this awaits on the web).
    pub async fn module(&self, name: &str) -> Result<Arc<wgpu::ShaderModule>, GpuError> {
        let (key, source) = shaders::get(name).ok_or_else(|| GpuError::UnknownShader(name.into()))?;
        if let Some(m) = self.pipelines.modules.lock().unwrap().get(key) {
            return Ok(m.clone());
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(key),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        if let Some(e) = scope.pop().await {
            return Err(GpuError::Shader {
                shader: key.into(),
                message: e.to_string(),
            });
        }
        let module = Arc::new(module);
        self.pipelines.modules.lock().unwrap().insert(key, module.clone());
        Ok(module)
    }

    /// The compute pipeline for `entry` in `shaders/<shader>.wgsl` (auto layout), compiled once.
    pub async fn pipeline(&self, shader: &str, entry: &str) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        let key = (shader.to_string(), entry.to_string());
        if let Some(p) = self.pipelines.pipelines.lock().unwrap().get(&key) {
            return Ok(p.clone());
        }
        let module = self.module(shader).await?;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let label = format!("{shader}::{entry}");
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = scope.pop().await {
            return Err(GpuError::Shader {
                shader: label,
                message: e.to_string(),
            });
        }
        let pipeline = Arc::new(pipeline);
        self.pipelines.pipelines.lock().unwrap().insert(key, pipeline.clone());
        Ok(pipeline)
    }

    /// Native convenience for tests and the CLI.
    #[cfg(feature = "native")]
    pub fn pipeline_blocking(&self, shader: &str, entry: &str) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        pollster::block_on(self.pipeline(shader, entry))
    }
}
