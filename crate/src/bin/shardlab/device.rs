//! The device profiles `--device NAME` names: a preset, or `this` (the local adapter,
//! calibrated once and cached per adapter as JSON).
use std::path::PathBuf;

use shardlab::gpu::GpuContext;
use shardlab::profile::{calibrate, device_preset, presets, Calibration, DeviceProfile};

/// The directory of cached calibrations and tunings: $SHARDLAB_CACHE_DIR, else
/// $XDG_CACHE_HOME/shardlab, else ~/.cache/shardlab.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("SHARDLAB_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("shardlab"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("shardlab"))
}

/// One adapter: its name, backend and driver, as a file name.
pub fn adapter_id(ctx: &GpuContext) -> String {
    let s = &ctx.summary;
    format!("{}-{}-{}", s.name, s.backend, s.driver)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// The cache file of one adapter's calibration.
fn cache_file(ctx: &GpuContext) -> Option<PathBuf> {
    let id = adapter_id(ctx);
    // v7: the sg matmul variant, so matmuls cost less than a v6 file says (v6: packs load vec4s;
    // v5: the step fit over eight reference steps, robust to outliers); older files are measured
    // again.
    cache_dir().map(|d| d.join(format!("profile-v7-{id}.json")))
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
        let written = f
            .parent()
            .map(std::fs::create_dir_all)
            .transpose()
            .and_then(|_| std::fs::write(f, serde_json::to_string_pretty(&c).unwrap_or_default()));
        if let Err(e) = written {
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
