//! The device profiles `--device NAME` names: a preset, or `this` (the local adapter,
//! calibrated once and cached per adapter as JSON).
use std::path::PathBuf;

use shardlab::gpu::GpuContext;
use shardlab::profile::{calibrate, device_preset, presets, Calibration, DeviceProfile};

/// The cache file of one adapter's calibration.
fn cache_file(ctx: &GpuContext) -> Option<PathBuf> {
    // v7: the sg matmul variant, so matmuls cost less than a v6 file says (v6: packs load vec4s;
    // v5: the step fit over eight reference steps, robust to outliers); older files are measured
    // again.
    crate::cache::file(ctx, "profile-v7")
}

/// The calibration of the local adapter: read from the cache unless `recalibrate`, else
/// measured and written back. Also says whether it came from the cache.
pub fn this_calibration(recalibrate: bool) -> Result<(Calibration, bool), String> {
    // With the matmul choices cached for this adapter: calibration times the kernels `train`
    // and `bench` run, and does not tune every class anew.
    let tuned = crate::tuning_cache::open(crate::tuning_cache::RetuneArg::default())
        .map_err(|e| format!("device `this` needs a GPU adapter: {e}"))?;
    let ctx = &tuned.ctx;
    let file = cache_file(ctx);
    if !recalibrate {
        if let Some(f) = &file {
            if let Ok(text) = std::fs::read_to_string(f) {
                if let Ok(c) = serde_json::from_str::<Calibration>(&text) {
                    return Ok((c, true));
                }
            }
        }
    }
    let c = pollster::block_on(calibrate(ctx)).map_err(|e| format!("calibration failed: {e}"))?;
    if let Some(f) = &file {
        // A cache that cannot be written only costs a recalibration next time.
        if let Err(e) = crate::cache::write(f, &serde_json::to_string_pretty(&c).unwrap_or_default()) {
            eprintln!("note: could not cache the calibration in {}: {e}", f.display());
        }
    }
    Ok((c, false))
}

/// Every device name `--device` accepts.
pub fn names() -> Vec<String> {
    std::iter::once("this".to_string())
        .chain(presets().into_iter().map(|p| p.name))
        .collect()
}

/// The profile `--device name` names.
pub fn profile(name: &str) -> Result<DeviceProfile, String> {
    if name == "this" {
        return Ok(this_calibration(false)?.0.profile);
    }
    device_preset(name).ok_or_else(|| format!("--device {name}: unknown device; use one of {}", names().join(", ")))
}
