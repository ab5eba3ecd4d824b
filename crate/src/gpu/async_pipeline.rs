//! Web only: compute pipelines compiled with `createComputePipelineAsync`. wgpu creates pipelines
//! with the synchronous `createComputePipeline`, which the browser compiles in order with the queue's
//! work: on SwiftShader one matmul pipeline holds every later submission for seconds. Compiled
//! asynchronously, pipelines build beside training (and beside each other); wgpu then adopts the
//! result: the device's own `createComputePipeline` hands out the pipeline compiled under the label
//! asked for, and creates any other as before.
use js_sys::{Function, Map, Object, Promise, Reflect};
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

/// Per device (properties of the JS device object, so a new device starts empty): compiled
/// pipelines waiting for wgpu to adopt them, compiles in flight, and the shader modules.
const READY: &str = "__shardlabReady";
const PENDING: &str = "__shardlabPending";
const MODULES: &str = "__shardlabModules";

fn map(device: &JsValue, name: &str) -> Map {
    if let Ok(m) = Reflect::get(device, &name.into()).and_then(|m| m.dyn_into::<Map>()) {
        return m;
    }
    let m = Map::new();
    let _ = Reflect::set(device, &name.into(), &m);
    m
}

/// Installs, once per device, the `createComputePipeline` that adopts compiled pipelines.
fn install(device: &JsValue) {
    if Reflect::has(device, &READY.into()).unwrap_or(false) {
        return;
    }
    let ready = map(device, READY);
    let original = Reflect::get(device, &"createComputePipeline".into())
        .ok()
        .and_then(|f| f.dyn_into::<Function>().ok());
    let Some(original) = original else { return };
    let this = device.clone();
    let adopt = Closure::<dyn Fn(JsValue) -> JsValue>::new(move |desc: JsValue| {
        let label = Reflect::get(&desc, &"label".into()).unwrap_or(JsValue::UNDEFINED);
        let compiled = ready.get(&label);
        if !compiled.is_undefined() {
            ready.delete(&label);
            return compiled;
        }
        original.call1(&this, &desc).unwrap_or(JsValue::UNDEFINED)
    });
    let _ = Reflect::set(device, &"createComputePipeline".into(), adopt.as_ref());
    // The device holds the function for its lifetime.
    adopt.forget();
}

/// Compiles `entry` of the WGSL `source` (module `shader`) asynchronously under `label`, sharing a
/// compile already in flight for the same label; resolves to the JS pipeline, or the browser's
/// message when it refuses the shader.
pub async fn compile(
    device: &JsValue,
    shader: &str,
    source: &str,
    entry: &str,
    label: &str,
) -> Result<JsValue, String> {
    install(device);
    let pending = map(device, PENDING);
    let key = JsValue::from_str(label);
    let promise = match pending.get(&key).dyn_into::<Promise>() {
        Ok(p) => p,
        Err(_) => {
            let p = start(device, shader, source, entry, label).map_err(|e| message(&e))?;
            pending.set(&key, &p);
            p
        }
    };
    let result = JsFuture::from(promise).await;
    pending.delete(&key);
    result.map_err(|e| message(&e))
}

fn start(device: &JsValue, shader: &str, source: &str, entry: &str, label: &str) -> Result<Promise, JsValue> {
    let modules = map(device, MODULES);
    let mut module = modules.get(&shader.into());
    if module.is_undefined() {
        let desc = Object::new();
        Reflect::set(&desc, &"code".into(), &source.into())?;
        Reflect::set(&desc, &"label".into(), &shader.into())?;
        let create: Function = Reflect::get(device, &"createShaderModule".into())?.dyn_into()?;
        module = create.call1(device, &desc)?;
        modules.set(&shader.into(), &module);
    }
    let stage = Object::new();
    Reflect::set(&stage, &"module".into(), &module)?;
    Reflect::set(&stage, &"entryPoint".into(), &entry.into())?;
    let desc = Object::new();
    Reflect::set(&desc, &"label".into(), &label.into())?;
    Reflect::set(&desc, &"layout".into(), &"auto".into())?;
    Reflect::set(&desc, &"compute".into(), &stage)?;
    let create: Function = Reflect::get(device, &"createComputePipelineAsync".into())?.dyn_into()?;
    create.call1(device, &desc)?.dyn_into::<Promise>()
}

/// Hands a compiled pipeline to the device's `createComputePipeline` for the next creation under
/// `label` (see `install`).
pub fn offer(device: &JsValue, label: &str, pipeline: &JsValue) {
    map(device, READY).set(&label.into(), pipeline);
}

/// Whether a pipeline offered under `label` is still waiting (wgpu did not adopt it).
pub fn take_unadopted(device: &JsValue, label: &str) -> bool {
    map(device, READY).delete(&label.into())
}

fn message(e: &JsValue) -> String {
    Reflect::get(e, &"message".into())
        .ok()
        .and_then(|m| m.as_string())
        .or_else(|| e.as_string())
        .unwrap_or_else(|| format!("{e:?}"))
}
