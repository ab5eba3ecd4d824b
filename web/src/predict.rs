//! The cost model on the page: each mode's per-device program priced on real devices of the
//! kind the reader picks (`shardlab::profile::predict`, one device per mesh position), and the
//! JAX report's experiment at a size no browser tab could train. Nothing here prices an op;
//! it only calls the core and shapes its answer for the page.
use serde_json::{json, Value};
use shardlab::profile::{device_preset, figure_label, predict, DeviceProfile, Placement, Prediction};

use crate::plan::Plan;
use crate::settings::{Mode, Preset, Settings};
use shardlab::ir::RngLayout;
use shardlab::model::Attention;

/// One mode's modelled step as the page shows it: the core's prediction plus the rng share.
fn view(p: &Prediction) -> Value {
    let rng_ms = p.breakdown_ms.get("rng").copied().unwrap_or(0.0);
    let mut v = serde_json::to_value(p).unwrap_or_default();
    v["rng_ms"] = json!(rng_ms);
    v["rng_share"] = json!(if p.step_ms > 0.0 { rng_ms / p.step_ms } else { 0.0 });
    v["kind"] = json!("modelled");
    v["overflow"] = json!(p.overflow());
    v
}

/// The profile's estimated figures in a learner's words, each with its identifier:
/// `[{"field":"launch_s","label":"the cost of launching one kernel"}]`.
fn estimated_labels(device: &DeviceProfile) -> Vec<Value> {
    device
        .estimated
        .iter()
        .map(|f| json!({"field": f, "label": figure_label(f).unwrap_or(f.as_str())}))
        .collect()
}

/// Both modes' modelled steps on `device`: `{"device","label","devices","modes":{"auto":..}}`.
pub fn modes(plans: &[Plan], device: &DeviceProfile) -> Value {
    let modes: serde_json::Map<String, Value> = plans
        .iter()
        .map(|p| {
            let pred = predict(&p.planned.step.program, device, Placement::Real);
            (p.mode.name().to_string(), view(&pred))
        })
        .collect();
    json!({
        "device": device.name,
        "label": device.label,
        "devices": plans.first().map(|p| p.summary.devices).unwrap_or(1),
        "estimated": device.estimated,
        "estimated_labels": estimated_labels(device),
        "modes": modes,
    })
}

/// The JAX report's global batch.
pub const REPORT_BATCH: usize = 32;

/// The JAX report's experiment (about 400M parameters, dp over the 4 chips of a v4-8,
/// dropout 0.1) at full size.
pub fn report_settings(rng: RngLayout, batch: usize) -> Settings {
    Settings {
        preset: Preset::Dp,
        mesh: "dp=4".into(),
        layers: 24,
        d_model: 1024,
        heads: 16,
        seq: 1024,
        batch,
        vocab: 50304,
        dropout: 0.1,
        rng,
        device: "tpu_v4".into(),
        ..Settings::preset(Preset::Dp)
    }
}

/// The report's experiment on a TPU v4-8, for every mode (explicit beside the report's two) and
/// both RNG layouts: six modelled steps, the auto / shard_map ratio per layout, and whether it
/// fits. Only programs are built
/// (no parameter or buffer), so it takes a fraction of a second.
pub fn scale_up() -> Value {
    let Some(device) = device_preset("tpu_v4") else {
        return json!({"ok": false, "error": "the TPU v4 preset is missing from the core"});
    };
    // The global logits of batch 32 hold 6.6 GB, more bytes than a 32-bit usize counts, but
    // the core counts bytes in u64 and only needs element counts to fit usize, so wasm32 plans
    // the report's batch. Should a larger model not fit, the page plans the largest batch the
    // core accepts here and says so.
    let Some(batch) = [REPORT_BATCH, REPORT_BATCH / 2, REPORT_BATCH / 4]
        .into_iter()
        .find(|b| report_settings(RngLayout::Original, *b).config().validate().is_ok())
    else {
        return json!({"ok": false, "error": "the report's model is too large for this build's address space"});
    };
    let mut layouts = serde_json::Map::new();
    let mut params = 0;
    for rng in [RngLayout::Original, RngLayout::Partitionable] {
        let s = report_settings(rng, batch);
        params = s.config().num_params();
        let par = match s.parallelism() {
            Ok(p) => p,
            Err(e) => return json!({"ok": false, "error": e.to_string()}),
        };
        let mut modes = serde_json::Map::new();
        for mode in Mode::PARTITIONED {
            let planned = match shardlab::plan::build(&s.options(mode, &par)) {
                Ok(p) => p,
                Err(e) => return json!({"ok": false, "error": e.to_string()}),
            };
            let p = predict(&planned.step.program, &device, Placement::Real);
            modes.insert(mode.name().to_string(), view(&p));
        }
        let ms = |m: &str| modes[m]["step_ms"].as_f64().unwrap_or(0.0);
        let ratio = ms("auto") / ms("shard_map").max(1e-12);
        let fits = modes.values().all(|m| m["fits"].as_bool().unwrap_or(false));
        layouts.insert(rng.name().into(), json!({"modes": modes, "ratio": ratio, "fits": fits}));
    }
    // The same run with attention unfused (the report's flax model wrote it op by op): the
    // (B, H, T, T) scores, probabilities and mask held per layer are what do not fit.
    let mut unfused = serde_json::Map::new();
    let s = Settings {
        attention: Attention::Unfused,
        ..report_settings(RngLayout::Original, batch)
    };
    for mode in Mode::PARTITIONED {
        let planned = match s
            .parallelism()
            .and_then(|par| shardlab::plan::build(&s.options(mode, &par)))
        {
            Ok(p) => p,
            Err(e) => return json!({"ok": false, "error": e.to_string()}),
        };
        let p = predict(&planned.step.program, &device, Placement::Real);
        unfused.insert(mode.name().to_string(), view(&p));
    }
    json!({
        "ok": true,
        "device": device.name,
        "label": device.label,
        "devices": 4,
        "params": params,
        "config": {"layers": 24, "d_model": 1024, "heads": 16, "seq": 1024, "batch": batch, "vocab": 50304, "dropout": 0.1, "mesh": "dp=4"},
        "report_batch": REPORT_BATCH,
        "address_bits": usize::BITS,
        "layouts": layouts,
        "unfused": {"rng": RngLayout::Original.name(), "modes": unfused},
    })
}
