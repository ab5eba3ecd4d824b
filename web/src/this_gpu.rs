//! "this GPU" as a device kind of the modelled chart: the cost model's `this` profile,
//! calibrated in the page by the core's microbenchmarks (`profile::calibrate_quick`) or
//! installed from the page's cache of an earlier calibration (the JavaScript keeps it per
//! adapter in localStorage). Nothing here measures or prices; it holds the profile.
use std::cell::RefCell;

use serde_json::{json, Value};
use shardlab::gpu::GpuContext;
use shardlab::profile::{calibrate_quick, Calibration, DeviceProfile};

/// The name `Settings::device` gives this GPU.
pub const THIS: &str = "this";

thread_local! {
    static PROFILE: RefCell<Option<DeviceProfile>> = const { RefCell::new(None) };
}

/// The installed `this` profile, if the page has calibrated or installed one.
pub fn profile() -> Option<DeviceProfile> {
    PROFILE.with(|p| p.borrow().clone())
}

fn install(c: &Calibration) {
    PROFILE.with(|p| *p.borrow_mut() = Some(c.profile.clone()));
}

/// Installs a calibration the page cached (its JSON as `calibrate` returned it):
/// `{"ok":true,"label"}` or `{"ok":false,"error"}` (the page then calibrates again).
pub fn install_json(calibration_json: &str) -> Value {
    match serde_json::from_str::<Calibration>(calibration_json) {
        Ok(c) if c.profile.name == THIS => {
            install(&c);
            json!({"ok": true, "label": c.profile.label})
        }
        Ok(c) => json!({"ok": false, "error": format!("a calibration of `{}`, not of this GPU", c.profile.name)}),
        Err(e) => json!({"ok": false, "error": format!("the cached calibration is not readable: {e}")}),
    }
}

/// Calibrates this GPU now and installs it: `{"ok":true,"calibration":{...}}` (what the page
/// caches) or `{"ok":false,"error"}`.
pub async fn calibrate(ctx: &GpuContext) -> Value {
    match calibrate_quick(ctx).await {
        Ok(c) => {
            install(&c);
            json!({"ok": true, "calibration": c})
        }
        Err(e) => json!({"ok": false, "error": format!("calibrating this GPU failed: {e}")}),
    }
}
