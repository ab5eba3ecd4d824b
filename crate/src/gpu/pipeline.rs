use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{now_ms, GpuContext, GpuError};
use crate::shaders;

/// Compute pipelines by (shader file, entry point): each is compiled once per context.
#[derive(Default)]
pub struct PipelineCache {
    modules: Mutex<HashMap<&'static str, Arc<wgpu::ShaderModule>>>,
    pipelines: Mutex<HashMap<(String, String), Arc<wgpu::ComputePipeline>>>,
    clock: Mutex<BuildClock>,
}

/// Where building took its time, summed over the context's life: what the page reports with a
/// trainer's build time (the difference of two readings).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct BuildClock {
    /// Shader modules and pipelines compiled.
    pub modules: usize,
    pub pipelines: usize,
    /// Milliseconds callers waited for them (creation and its error scope; on the web, compiles
    /// that run side by side each count their own wait).
    pub modules_ms: f64,
    pub pipelines_ms: f64,
    /// Milliseconds the matmul autotuner spent timing variants (its pipelines included).
    pub tuning_ms: f64,
}

impl BuildClock {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &BuildClock) -> BuildClock {
        BuildClock {
            modules: self.modules - earlier.modules,
            pipelines: self.pipelines - earlier.pipelines,
            modules_ms: self.modules_ms - earlier.modules_ms,
            pipelines_ms: self.pipelines_ms - earlier.pipelines_ms,
            tuning_ms: self.tuning_ms - earlier.tuning_ms,
        }
    }
}

impl PipelineCache {
    pub fn len(&self) -> usize {
        self.pipelines.lock().map(|p| p.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The build clock so far.
    pub fn clock(&self) -> BuildClock {
        self.clock.lock().map(|c| *c).unwrap_or_default()
    }

    /// Adds `ms` of the autotuner's timing runs.
    pub fn add_tuning_ms(&self, ms: f64) {
        if let Ok(mut c) = self.clock.lock() {
            c.tuning_ms += ms;
        }
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
        let t0 = now_ms();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        // The browser compiles the WGSL itself and wants every extension enabled in it.
        #[cfg(target_arch = "wasm32")]
        let source = shaders::for_browser(key, source);
        let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(key),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        // Cached before the scope resolves, so callers meanwhile share it rather than compile it again.
        let module = Arc::new(module);
        self.pipelines.modules.lock().unwrap().insert(key, module.clone());
        if let Some(e) = scope.pop().await {
            self.pipelines.modules.lock().unwrap().remove(key);
            return Err(GpuError::Shader {
                shader: key.into(),
                message: e.to_string(),
            });
        }
        if let Ok(mut c) = self.pipelines.clock.lock() {
            c.modules += 1;
            c.modules_ms += now_ms() - t0;
        }
        Ok(module)
    }

    /// The compute pipeline for `entry` in `shaders/<shader>.wgsl` (auto layout), compiled once.
    pub async fn pipeline(&self, shader: &str, entry: &str) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        let key = (shader.to_string(), entry.to_string());
        if let Some(p) = self.pipelines.pipelines.lock().unwrap().get(&key) {
            return Ok(p.clone());
        }
        let module = self.module(shader).await?;
        let t0 = now_ms();
        let label = format!("{shader}::{entry}");
        // On the web: compiled asynchronously first, then adopted by the creation below.
        #[cfg(target_arch = "wasm32")]
        let offered = match self.device.as_webgpu() {
            Some(raw) => {
                let device: &wasm_bindgen::JsValue = raw.as_ref();
                let (name, source) = shaders::get(shader).ok_or_else(|| GpuError::UnknownShader(shader.into()))?;
                let source = shaders::for_browser(name, source);
                let compiled = super::async_pipeline::compile(device, name, &source, entry, &label)
                    .await
                    .map_err(|message| GpuError::Shader {
                        shader: label.clone(),
                        message,
                    })?;
                // Another caller awaiting the same compile adopted it already.
                if let Some(p) = self.pipelines.pipelines.lock().unwrap().get(&key) {
                    return Ok(p.clone());
                }
                super::async_pipeline::offer(device, &label, &compiled);
                Some(device.clone())
            }
            None => None,
        };
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        // Not adopted (the browser's API changed under us): the creation above compiled it anew.
        #[cfg(target_arch = "wasm32")]
        if let Some(device) = offered {
            super::async_pipeline::take_unadopted(&device, &label);
        }
        // Cached before the scope resolves, so callers meanwhile share it.
        let pipeline = Arc::new(pipeline);
        self.pipelines
            .pipelines
            .lock()
            .unwrap()
            .insert(key.clone(), pipeline.clone());
        if let Some(e) = scope.pop().await {
            self.pipelines.pipelines.lock().unwrap().remove(&key);
            return Err(GpuError::Shader {
                shader: label,
                message: e.to_string(),
            });
        }
        if let Ok(mut c) = self.pipelines.clock.lock() {
            c.pipelines += 1;
            c.pipelines_ms += now_ms() - t0;
        }
        Ok(pipeline)
    }

    /// Native convenience for tests and the CLI.
    #[cfg(feature = "native")]
    pub fn pipeline_blocking(&self, shader: &str, entry: &str) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        pollster::block_on(self.pipeline(shader, entry))
    }
}
