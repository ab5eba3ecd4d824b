//! The page's handle over the core library: it opens the GPU, describes the adapter, runs the
//! kernel self-test, and trains the model in JAX's three modes (automatic, explicit, shard_map),
//! any set of them in turn (`modes::Modes`). No model logic lives
//! here; every method forwards to `shardlab` and returns JSON, so the page's JavaScript only
//! renders. Errors come back as values (`{"ok":false,...}`), never as panics or rejections.
mod editor;
mod field_error;
mod masks;
mod modes;
mod moe;
mod picture;
mod plan;
mod predict;
mod sample;
mod session;
mod settings;
mod single;
mod story;
mod strategy;
mod task;
mod this_gpu;
mod timeline;
mod values;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use serde_json::json;
use shardlab::gpu::GpuContext;
use wasm_bindgen::prelude::*;

use session::Inner;
use settings::{Preset, Settings};

#[wasm_bindgen(start)]
pub fn start() {
    // Panics print their message and location to the console instead of "unreachable".
    console_error_panic_hook::set_once();
}

/// One GPU context (adapter, device, queue, pipeline cache) for the page's lifetime (a new one
/// after the device is lost), and the current training run.
#[wasm_bindgen]
pub struct Shardlab {
    inner: Rc<RefCell<Inner>>,
}

#[wasm_bindgen]
impl Shardlab {
    /// Opens the best WebGPU adapter and a device with its limits (`await Shardlab.create()`).
    pub async fn create() -> Result<Shardlab, JsError> {
        let ctx = GpuContext::new().await.map_err(|e| JsError::new(&e.to_string()))?;
        #[allow(clippy::arc_with_non_send_sync)] // the core's Backend::Gpu holds an Arc
        let ctx = Arc::new(ctx);
        session::prewarm(&ctx);
        Ok(Shardlab {
            inner: Rc::new(RefCell::new(Inner::new(ctx))),
        })
    }

    /// The adapter: name, backend, device type, features and key limits, as JSON.
    pub fn adapter(&self) -> Result<String, JsError> {
        serde_json::to_string(&self.inner.borrow().ctx.summary).map_err(|e| JsError::new(&e.to_string()))
    }

    /// Runs the kernel self-test (every pipeline, every kernel against its CPU twin) and resolves
    /// to its report as JSON. A failing kernel is a line of the report, not a rejection.
    pub fn selftest(&self) -> js_sys::Promise {
        let ctx = self.inner.borrow().ctx.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let report = shardlab::selftest::run(&ctx).await;
            let json = serde_json::to_string(&report).map_err(|e| JsError::new(&e.to_string()))?;
            Ok(JsValue::from_str(&json))
        })
    }

    /// The first asynchronous GPU error (validation, out of memory, device lost) since the last
    /// call, or null.
    pub fn take_error(&self) -> Option<String> {
        self.inner.borrow().ctx.check().err().map(|e| e.to_string())
    }

    /// The shardlab version the page was built from.
    pub fn version() -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }

    /// Every preset's settings (the core's presets, `shardlab::plan::Preset`), the default one,
    /// which presets are pipelines, the pipeline schedules, the bounds of the numeric controls
    /// (`shardlab::plan::PAGE_LIMITS`) and the cost model's device presets, as JSON:
    /// `{"default":"dp","order":["seed",...],"presets":{"seed":{...}},"pipelines":["pp"],
    /// "schedules":["gpipe","1f1b"],"limits":{"layers":{"min":1,"max":12},...},
    /// "max_devices":64,"devices":[{"name",...}]}`.
    pub fn presets() -> String {
        let presets: serde_json::Map<String, serde_json::Value> = Preset::ALL
            .into_iter()
            .map(|p| {
                (
                    p.name().to_string(),
                    serde_json::to_value(Settings::preset(p)).unwrap_or_default(),
                )
            })
            .collect();
        let limits: serde_json::Map<String, serde_json::Value> = shardlab::plan::PAGE_LIMITS
            .iter()
            .map(|l| (l.setting.key(), json!({"min": l.min, "max": l.max})))
            .collect();
        json!({
            "default": Preset::Dp.name(),
            "order": Preset::ALL.map(Preset::name),
            "presets": presets,
            "pipelines": Preset::ALL
                .into_iter()
                .filter(|p| p.parallelism().is_pipeline())
                .map(Preset::name)
                .collect::<Vec<_>>(),
            "schedules": shardlab::plan::Schedule::ALL.map(shardlab::plan::Schedule::name),
            "limits": limits,
            "max_devices": shardlab::plan::PAGE_MAX_DEVICES,
            // The mesh's axis kinds, each with what it splits, and ZeRO's stages on dp.
            "axes": shardlab::plan::AxisKind::ALL
                .into_iter()
                .map(|k| json!({"name": k.name(), "splits": k.splits()}))
                .collect::<Vec<_>>(),
            "zero_stages": shardlab::plan::Zero::ALL.map(shardlab::plan::Zero::name),
            "devices": shardlab::profile::presets(),
        })
        .to_string()
    }

    /// Checks the settings with the core and builds both modes' per-device programs (the
    /// trainers are built on the first step). Resolves to `{"ok":true,"settings",...}` or
    /// `{"ok":false,"errors":[{"field","message"}]}`; a step in flight is discarded. With
    /// `resume`, settings equal to the previous run's resume that run (`"resumed":true`).
    pub fn configure(&self, settings_json: &str, resume: bool) -> String {
        self.inner.borrow_mut().configure(settings_json, resume).to_string()
    }

    /// One train step of the current mode, or one of each in turn in `both` mode. Resolves to
    /// `{"ok":true,"step":k,"modes":{"auto":{loss, step_ms, tokens_per_s, modelled_ms, ...}}}`
    /// or `{"ok":false,"error":...}` (the run then restarts from step 0 on the next call).
    pub fn step(&self) -> js_sys::Promise {
        let inner = self.inner.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let v = session::step(&inner, false, false).await;
            Ok(JsValue::from_str(&v.to_string()))
        })
    }

    /// Like `step`, but measures where the time goes: each mode's answer gets a `breakdown`
    /// (forward / backward / update wall times, and ms per category). `full`: from five split
    /// runs of each op, with each category's floor (the device's ceilings, measured on the
    /// first such step); else from three without floors, a quick look (the story's).
    /// Its step time is not comparable with plain steps'.
    pub fn step_profiled(&self, full: bool) -> js_sys::Promise {
        let inner = self.inner.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let v = session::step(&inner, true, full).await;
            Ok(JsValue::from_str(&v.to_string()))
        })
    }

    /// The current settings as a runnable JAX script for `mode` (`auto`: jit with the same
    /// shardings; `shard_map`: the same per-device body): `{"ok":true,"script","filename"}`.
    pub fn export_jax(&self, mode: &str, steps: u32) -> String {
        self.inner.borrow().export_jax(mode, steps as u64).to_string()
    }

    /// Both modes' per-device programs: text, highlighted lines, summary, the automatic mode's
    /// inserted ops with their rules, and where each parameter's blocks live.
    pub fn programs(&self) -> String {
        self.inner.borrow().programs().to_string()
    }

    /// Both modes' modelled timelines on the chosen device, with overlap on or off, and the
    /// same as a Chrome trace-event file (`timeline::timelines`); `{"ok":false,"error"}` before
    /// the settings are valid.
    pub fn timelines(&self, overlap: bool) -> String {
        self.inner.borrow().timelines(overlap).to_string()
    }

    /// Forgets the trained state (and opens a new GPU device if the old one was lost, or when
    /// `new_device` is set because the page saw it lost first); the next step starts from step 0
    /// with the same settings.
    pub fn reset(&self, new_device: bool) -> js_sys::Promise {
        let inner = self.inner.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let v = session::reset(&inner, new_device).await;
            Ok(JsValue::from_str(&v.to_string()))
        })
    }

    /// The share of identical dropout-mask bits across data-parallel devices with the same key
    /// and with fold_in, from the current settings' real Threefry masks (see `masks`).
    pub fn mask_overlap(&self) -> String {
        self.inner.borrow().mask_overlap().to_string()
    }

    /// The task's first example: `{"ok":true,"task","inputs","targets","names","learnable"}`
    /// (`sample::example`).
    pub fn example(&self) -> String {
        self.inner.borrow().example().to_string()
    }

    /// Which strategy? Every strategy, mesh, mode and remat policy for the settings' model on as
    /// many devices of their device kind as their mesh has, planned and priced by the core's
    /// search; the fastest that fit, each with the settings that load it (`strategy`).
    pub fn which_strategy(settings_json: &str) -> String {
        match serde_json::from_str::<Settings>(settings_json) {
            Ok(s) => strategy::which_strategy(&s).to_string(),
            Err(e) => json!({"ok": false, "error": format!("the settings are not valid: {e}")}).to_string(),
        }
    }

    /// The JAX report's experiment at full size (about 400M parameters, dp over a TPU v4-8)
    /// as the cost model predicts it, for every mode and both RNG layouts (`predict::scale_up`).
    pub fn scale_up() -> String {
        predict::scale_up().to_string()
    }

    /// The story's measured run for this adapter (`story::choose`): the seed preset's run at the
    /// size that shows the replicated random bits here, with the reason, priced on `device`.
    /// `adapter_json` is what the page knows of its adapter (`story::Adapter`); a GPU's choice
    /// reads its calibrated profile, so the page calibrates first.
    pub fn story_choice(adapter_json: &str, device: &str) -> String {
        match serde_json::from_str::<story::Adapter>(adapter_json) {
            Ok(a) => story::choose(&a, this_gpu::profile().as_ref(), device).to_string(),
            Err(e) => json!({"ok": false, "error": format!("the adapter is not readable: {e}")}).to_string(),
        }
    }

    /// The sharding editor's fields for the settings (`editor::groups`): parameter groups with
    /// their preset specs and suggestions, the token batch, and the with_sharding_constraints.
    pub fn spec_groups(settings_json: &str) -> String {
        match serde_json::from_str::<Settings>(settings_json) {
            Ok(s) => editor::groups(&s).to_string(),
            Err(e) => json!({"ok": false, "error": format!("the settings are not valid: {e}")}).to_string(),
        }
    }

    /// Checks one spec for the value `name` with the core's parser and shardings:
    /// `{"ok":true,"spec"}` or `{"ok":false,"error"}`.
    pub fn check_spec(settings_json: &str, name: &str, text: &str) -> String {
        editor::check_json(settings_json, name, text).to_string()
    }

    /// Where the named value's blocks live in `mode`'s program (`values::picture`).
    pub fn picture(&self, mode: &str, name: &str) -> String {
        match self.inner.borrow().plans() {
            Some((plans, mesh)) => values::picture(plans, &mesh, mode, name).to_string(),
            None => json!({"ok": false, "error": "no valid settings yet: configure first"}).to_string(),
        }
    }

    /// The device groups of a collective at instruction `instr` of `mode`'s program.
    pub fn collective_groups(&self, mode: &str, instr: u32) -> String {
        match self.inner.borrow().plans() {
            Some((plans, mesh)) => values::collective(plans, &mesh, mode, instr as usize).to_string(),
            None => json!({"ok": false, "error": "no valid settings yet: configure first"}).to_string(),
        }
    }

    /// Calibrates the cost model's `this` profile on this GPU (microbenchmarks, a few seconds)
    /// and makes it the device kind `this`: resolves to `{"ok":true,"calibration"}`, which the
    /// page caches per adapter, or `{"ok":false,"error"}`.
    pub fn calibrate(&self) -> js_sys::Promise {
        let ctx = self.inner.borrow().ctx.clone();
        let compiling = self.inner.borrow().background_compiles();
        wasm_bindgen_futures::future_to_promise(async move {
            // Microbenchmarks time by wall clock: not beside the background compiles.
            session::settled(compiling).await;
            Ok(JsValue::from_str(&this_gpu::calibrate(&ctx).await.to_string()))
        })
    }

    /// Makes a cached calibration (as `calibrate` returned it) the device kind `this`.
    pub fn install_calibration(calibration_json: &str) -> String {
        this_gpu::install_json(calibration_json).to_string()
    }

    /// docs/MODEL.md's model on one device with formula init and formula data (`single::Spec`,
    /// e.g. `{"layers":2,"d_model":128,"heads":4,"seq":64,"batch":8,"vocab":256,"dropout":0,
    /// "optimizer":"sgd","lr":0.1}`), on this GPU and apart from the page's run: what the
    /// in-browser peer benchmark trains against jax-js. `check()` says whether the spec is valid.
    pub fn single(&self, spec_json: &str) -> single::SingleRun {
        single::SingleRun::new(self.inner.borrow().ctx.clone(), spec_json)
    }

    /// Test hook: destroys the GPU device, as a driver reset or a lost GPU would.
    pub fn lose_device_for_test(&self) {
        self.inner.borrow().ctx.device.destroy();
    }
}
