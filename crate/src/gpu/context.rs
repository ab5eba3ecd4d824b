use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{Dispatch, DispatchTimes, GpuBuffer, GpuError, PipelineCache};

/// What `shardlab info` and the page show about the adapter.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub timestamp_query: bool,
    pub shader_f16: bool,
    pub subgroups: bool,
    /// Whether the device runs 8x8 f32 cooperative matrices (wgpu's experimental feature, on an
    /// adapter that lists an 8x8x8 f32 configuration): the `coop8` matmul.
    pub cooperative_matrix: bool,
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
    pub max_compute_workgroup_size_x: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_workgroups_per_dimension: u32,
    pub max_storage_buffers_per_shader_stage: u32,
}

impl AdapterSummary {
    /// The adapter's identity: name, backend and driver. What is measured or tuned on one
    /// adapter is cached under it, and a cache of another identity is not read.
    pub fn identity(&self) -> String {
        format!("{} ({}, {})", self.name, self.backend, self.driver)
    }

    /// Whether the adapter runs shaders on the CPU (lavapipe, SwiftShader): a workgroup per
    /// thread, and every storage access a loop over the lanes, so kernels shape their launches
    /// for it.
    pub fn is_cpu(&self) -> bool {
        self.device_type.eq_ignore_ascii_case("cpu")
    }
}

/// One adapter, device and queue, shared by every executor of a session.
///
/// Errors that wgpu reports asynchronously (validation, out of memory, device
/// lost) are collected here and surface from [`GpuContext::check`] and from
/// every readback, so they come back as values instead of panics.
pub struct GpuContext {
    pub instance: wgpu::Instance,
    pub adapter: wgpu::Adapter,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub summary: AdapterSummary,
    pub pipelines: PipelineCache,
    /// State the layers above keep per adapter, one value per type (the kernels keep their
    /// tuned choices here). The runtime holds it without knowing its type, so it imports
    /// nothing above it.
    state: Mutex<HashMap<TypeId, Box<dyn Any + Send>>>,
    errors: Arc<Mutex<Vec<GpuError>>>,
    lost: Arc<Mutex<Option<String>>>,
}

/// Whether `adapter` runs the `coop8` matmul: wgpu's cooperative matrices with an 8x8x8 f32
/// configuration at subgroup scope (Apple GPUs' simdgroup matrices; Vulkan drivers that list it).
/// wgpu turns the feature on for any configuration, and most Vulkan drivers list f16 ones only.
fn offers_coop8(adapter: &wgpu::Adapter) -> bool {
    let f32 = wgpu::CooperativeScalarType::F32;
    adapter
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        && adapter.features().contains(wgpu::Features::SUBGROUP)
        && adapter
            .cooperative_matrix_properties()
            .iter()
            .any(|c| (c.m_size, c.n_size, c.k_size) == (8, 8, 8) && c.ab_type == f32 && c.cr_type == f32)
}

/// The token that lets a device use wgpu's experimental features: only where `features` holds one
/// (cooperative matrices, [`offers_coop8`]).
fn experimental(features: wgpu::Features) -> wgpu::ExperimentalFeatures {
    if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        // SAFETY: wgpu marks experimental features unsafe as still maturing; the one asked for
        // here is used by one shader (matmul_coop.wgsl), whose results the autotuner checks
        // against the naive kernel before it ever picks it.
        unsafe { wgpu::ExperimentalFeatures::enabled() }
    } else {
        wgpu::ExperimentalFeatures::disabled()
    }
}

impl GpuContext {
    /// Finds the best adapter (honouring `WGPU_BACKEND` and `WGPU_ADAPTER_NAME` natively)
    /// and opens a device with the adapter's own limits and the optional features we use.
    pub async fn new() -> Result<Self, GpuError> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = Self::pick_adapter(&instance).await?;
        let mut features = adapter.features()
            & (wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP);
        if offers_coop8(&adapter) {
            features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        let limits = adapter.limits();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("shardlab device"),
                required_features: features,
                required_limits: limits.clone(),
                experimental_features: experimental(features),
                ..Default::default()
            })
            .await
            .map_err(|e| GpuError::RequestDevice(e.to_string()))?;

        let errors: Arc<Mutex<Vec<GpuError>>> = Arc::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(GpuError::from_wgpu("a GPU command", e));
            }
        }));
        let lost: Arc<Mutex<Option<String>>> = Arc::default();
        let lost_sink = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut l) = lost_sink.lock() {
                *l = Some(format!("{reason:?}: {msg}"));
            }
        });

        let info = adapter.get_info();
        let summary = AdapterSummary {
            name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
            timestamp_query: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            cooperative_matrix: features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
            max_buffer_size: limits.max_buffer_size,
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size as u64,
            max_compute_workgroup_size_x: limits.max_compute_workgroup_size_x,
            max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
            max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
            max_compute_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
            max_storage_buffers_per_shader_stage: limits.max_storage_buffers_per_shader_stage,
        };
        Ok(Self {
            instance,
            adapter,
            device,
            queue,
            summary,
            pipelines: PipelineCache::default(),
            state: Mutex::default(),
            errors,
            lost,
        })
    }

    async fn pick_adapter(instance: &wgpu::Instance) -> Result<wgpu::Adapter, GpuError> {
        #[cfg(not(target_arch = "wasm32"))]
        if let Ok(name) = std::env::var("WGPU_ADAPTER_NAME") {
            let wanted = name.to_lowercase();
            for a in instance.enumerate_adapters(wgpu::Backends::all()).await {
                if a.get_info().name.to_lowercase().contains(&wanted) {
                    return Ok(a);
                }
            }
            return Err(GpuError::NoAdapter(format!(
                "no adapter name contains `{name}` (WGPU_ADAPTER_NAME)"
            )));
        }
        instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
            .map_err(|e| GpuError::NoAdapter(e.to_string()))
    }

    /// Native convenience: [`GpuContext::new`] without an executor.
    #[cfg(feature = "native")]
    pub fn new_blocking() -> Result<Self, GpuError> {
        pollster::block_on(Self::new())
    }

    /// Runs `f` on this context's value of type `T`, made by `T::default()` on first use.
    /// `None` only when an earlier `f` panicked while holding it. `f` must not call `with_state`
    /// again (the state is locked while it runs).
    pub fn with_state<T: Any + Send + Default, R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let mut state = self.state.lock().ok()?;
        let value = state
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Box::new(T::default()))
            .downcast_mut::<T>()?;
        Some(f(value))
    }

    /// Returns the first error wgpu reported since the last check, or device loss.
    pub fn check(&self) -> Result<(), GpuError> {
        if let Some(reason) = self.lost.lock().ok().and_then(|l| l.clone()) {
            return Err(GpuError::DeviceLost(reason));
        }
        let mut errs = self
            .errors
            .lock()
            .map_err(|_| GpuError::Invalid("error sink poisoned".into()))?;
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.remove(0))
        }
    }

    pub fn limits(&self) -> wgpu::Limits {
        self.device.limits()
    }

    /// The subgroup size where the subgroup kernels (matmul's sg variants, attention_sg) can run:
    /// subgroups on, and every subgroup 8 or 16 invocations (their entry points make a workgroup
    /// of exactly one subgroup). lavapipe: 8, or 16 with 512-bit vectors.
    pub fn subgroup_lanes(&self) -> Option<u32> {
        let info = self.adapter.get_info();
        let fixed = info.subgroup_min_size == info.subgroup_max_size;
        let lanes = info.subgroup_max_size;
        (self.device.features().contains(wgpu::Features::SUBGROUP) && fixed && matches!(lanes, 8 | 16)).then_some(lanes)
    }

    /// Checks that a buffer of `bytes` for tensor `name` fits this adapter, before allocating it.
    pub fn check_size(&self, name: &str, bytes: u64) -> Result<(), GpuError> {
        let limits = self.device.limits();
        if bytes > limits.max_buffer_size {
            return Err(GpuError::TooLarge {
                name: name.into(),
                bytes,
                limit_name: "max_buffer_size",
                limit: limits.max_buffer_size,
            });
        }
        if bytes > limits.max_storage_buffer_binding_size {
            return Err(GpuError::TooLarge {
                name: name.into(),
                bytes,
                limit_name: "max_storage_buffer_binding_size",
                limit: limits.max_storage_buffer_binding_size,
            });
        }
        Ok(())
    }

    /// A zeroed storage buffer of `len` 4-byte elements (f32 or u32).
    pub fn zeros(&self, name: &str, len: usize) -> Result<GpuBuffer, GpuError> {
        let bytes = (len.max(1) * 4) as u64;
        self.check_size(name, bytes)?;
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(name),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(GpuBuffer::new(buffer, len, name))
    }

    /// A storage buffer holding `data` (f32 or u32).
    pub fn upload<T: bytemuck::Pod>(&self, name: &str, data: &[T]) -> Result<GpuBuffer, GpuError> {
        assert_eq!(std::mem::size_of::<T>(), 4, "GPU buffers hold 4-byte elements");
        let buf = self.zeros(name, data.len())?;
        self.write(&buf, data);
        Ok(buf)
    }

    /// Overwrites a buffer's contents from the host (queued; ordered before later submits).
    pub fn write<T: bytemuck::Pod>(&self, buf: &GpuBuffer, data: &[T]) {
        debug_assert!(std::mem::size_of_val(data) <= buf.bytes() as usize);
        if !data.is_empty() {
            self.queue
                .write_buffer(&buf.buffer, buf.offset, bytemuck::cast_slice(data));
        }
    }

    /// Encodes `dispatches` into one compute pass and submits them.
    pub fn run(&self, dispatches: &[Dispatch]) -> wgpu::SubmissionIndex {
        let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("shardlab step"),
        });
        super::encode_all(&mut encoder, dispatches, "shardlab dispatches");
        self.queue.submit([encoder.finish()])
    }

    /// Like [`GpuContext::run`], but one pass per dispatch with timestamp queries around each,
    /// so every dispatch gets its own GPU time. Falls back to `None` when the adapter has none.
    pub async fn run_timed(&self, dispatches: &[Dispatch]) -> Result<Option<DispatchTimes>, GpuError> {
        if !self.summary.timestamp_query || dispatches.is_empty() {
            self.run(dispatches);
            self.finish().await?;
            return Ok(None);
        }
        // Query sets hold at most 4096 queries; time in chunks.
        let mut times = DispatchTimes::default();
        for chunk in dispatches.chunks(2048) {
            let n = chunk.len() as u32;
            let set = self.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("shardlab timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: 2 * n,
            });
            let resolve = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("shardlab timestamp resolve"),
                size: 16 * n as u64,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("shardlab timed step"),
            });
            for (i, d) in chunk.iter().enumerate() {
                super::encode_timed(&mut encoder, d, &set, i as u32);
            }
            encoder.resolve_query_set(&set, 0..2 * n, &resolve, 0);
            self.queue.submit([encoder.finish()]);
            let raw: Vec<u64> = self.read_raw::<u64>("timestamps", (&resolve, 0), 16 * n as u64).await?;
            let period = self.queue.get_timestamp_period() as f64;
            for (i, d) in chunk.iter().enumerate() {
                let ns = raw[2 * i + 1].saturating_sub(raw[2 * i]) as f64 * period;
                times.per_dispatch.push((d.label.clone(), ns / 1e6));
            }
        }
        Ok(Some(times))
    }

    /// Waits until the GPU has finished all submitted work, then reports any error.
    pub async fn finish(&self) -> Result<(), GpuError> {
        let (tx, rx) = futures_channel::oneshot::channel();
        self.queue.on_submitted_work_done(move || {
            let _ = tx.send(());
        });
        self.poll_wait();
        rx.await
            .map_err(|_| GpuError::DeviceLost("the queue was dropped".into()))?;
        self.check()
    }

    /// Native: blocks until pending callbacks have run. Web: the browser drives callbacks.
    fn poll_wait(&self) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
        }
    }

    /// Copies a buffer back to the host as `T`s (awaits `map_async`; never blocks on the web).
    pub async fn read<T: bytemuck::Pod>(&self, buf: &GpuBuffer) -> Result<Vec<T>, GpuError> {
        let mut v = self
            .read_raw::<T>(&buf.name, (&buf.buffer, buf.offset), buf.bytes())
            .await?;
        v.truncate(buf.len * 4 / std::mem::size_of::<T>());
        Ok(v)
    }

    /// Copies several buffers back to the host in one submission and one map, so that reading
    /// many small buffers (a step's routing counts) costs one round trip.
    pub async fn read_all<T: bytemuck::Pod>(&self, bufs: &[&GpuBuffer]) -> Result<Vec<Vec<T>>, GpuError> {
        let spans: Vec<(&wgpu::Buffer, u64, u64)> = bufs.iter().map(|b| (&b.buffer, b.offset, b.bytes())).collect();
        let name = bufs.iter().map(|b| b.name.as_str()).collect::<Vec<_>>().join(", ");
        let mut all = self.read_spans::<T>(&name, &spans).await?;
        for (v, b) in all.iter_mut().zip(bufs) {
            v.truncate(b.len * 4 / std::mem::size_of::<T>());
        }
        Ok(all)
    }

    /// Native convenience for tests and the CLI.
    #[cfg(feature = "native")]
    pub fn read_blocking<T: bytemuck::Pod>(&self, buf: &GpuBuffer) -> Result<Vec<T>, GpuError> {
        pollster::block_on(self.read(buf))
    }

    /// `bytes` of buffer `src.0` from byte `src.1`.
    async fn read_raw<T: bytemuck::Pod>(
        &self,
        name: &str,
        src: (&wgpu::Buffer, u64),
        bytes: u64,
    ) -> Result<Vec<T>, GpuError> {
        let mut one = self.read_spans::<T>(name, &[(src.0, src.1, bytes)]).await?;
        Ok(one.remove(0))
    }

    /// Each span's `bytes` of its buffer from its byte offset, through one staging buffer.
    async fn read_spans<T: bytemuck::Pod>(
        &self,
        name: &str,
        spans: &[(&wgpu::Buffer, u64, u64)],
    ) -> Result<Vec<Vec<T>>, GpuError> {
        // Every span starts at a multiple of the copy alignment in the staging buffer.
        let align = wgpu::COPY_BUFFER_ALIGNMENT;
        let mut at = Vec::with_capacity(spans.len());
        let mut total = 0;
        for &(_, _, bytes) in spans {
            at.push(total);
            total += bytes.div_ceil(align) * align;
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("shardlab readback"),
            size: total.max(align),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("shardlab readback copy"),
        });
        for (&(buffer, offset, bytes), &to) in spans.iter().zip(&at) {
            encoder.copy_buffer_to_buffer(buffer, offset, &staging, to, bytes);
        }
        self.queue.submit([encoder.finish()]);
        let (tx, rx) = futures_channel::oneshot::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.poll_wait();
        let mapped = rx.await.map_err(|_| GpuError::Readback {
            name: name.into(),
            message: "the map callback was dropped".into(),
        })?;
        self.check()?;
        mapped.map_err(|e| GpuError::Readback {
            name: name.into(),
            message: e.to_string(),
        })?;
        let data = {
            let view = staging.get_mapped_range(..).map_err(|e| GpuError::Readback {
                name: name.into(),
                message: e.to_string(),
            })?;
            spans
                .iter()
                .zip(&at)
                .map(|(&(_, _, bytes), &to)| {
                    bytemuck::cast_slice::<u8, T>(&view[to as usize..(to + bytes) as usize]).to_vec()
                })
                .collect()
        };
        staging.unmap();
        Ok(data)
    }
}
