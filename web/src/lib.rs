//! The page's handle over the core library: it opens the GPU, describes the adapter and runs the
//! kernel self-test. No model logic lives here; every method forwards to `shardlab` and returns
//! JSON, so the page's JavaScript only renders.
use std::rc::Rc;

use shardlab::gpu::GpuContext;
use wasm_bindgen::prelude::*;

#[wasm_bindgen(start)]
pub fn start() {
    // Panics print their message and location to the console instead of "unreachable".
    console_error_panic_hook::set_once();
}

/// One GPU context (adapter, device, queue, pipeline cache) for the page's lifetime.
#[wasm_bindgen]
pub struct Shardlab {
    ctx: Rc<GpuContext>,
}

#[wasm_bindgen]
impl Shardlab {
    /// Opens the best WebGPU adapter and a device with its limits (`await Shardlab.create()`).
    pub async fn create() -> Result<Shardlab, JsError> {
        let ctx = GpuContext::new().await.map_err(|e| JsError::new(&e.to_string()))?;
        Ok(Shardlab { ctx: Rc::new(ctx) })
    }

    /// The adapter: name, backend, device type, features and key limits, as JSON.
    pub fn adapter(&self) -> Result<String, JsError> {
        serde_json::to_string(&self.ctx.summary).map_err(|e| JsError::new(&e.to_string()))
    }

    /// Runs the kernel self-test (every pipeline, every kernel against its CPU twin) and resolves
    /// to its report as JSON. A failing kernel is a line of the report, not a rejection.
    pub fn selftest(&self) -> js_sys::Promise {
        let ctx = self.ctx.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let report = shardlab::selftest::run(&ctx).await;
            let json = serde_json::to_string(&report).map_err(|e| JsError::new(&e.to_string()))?;
            Ok(JsValue::from_str(&json))
        })
    }

    /// The first asynchronous GPU error (validation, out of memory, device lost) since the last
    /// call, or null.
    pub fn take_error(&self) -> Option<String> {
        self.ctx.check().err().map(|e| e.to_string())
    }

    /// The shardlab version the page was built from.
    pub fn version() -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }
}
