//! The device profiles `--device NAME` names: a preset, or `this` (the local adapter,
//! calibrated once and cached per adapter as JSON).
use std::path::PathBuf;

use shardlab::gpu::GpuContext;
use shardlab::profile::{calibrate, device_preset, presets, Calibration, DeviceProfile, NOISY_SPREAD};

/// The cache file of one adapter's calibration.
fn cache_file(ctx: &GpuContext) -> Option<PathBuf> {
    // v10: attention on CPU adapters with subgroups runs the subgroup kernels (v9: no work scale,
    // the launch cost inside a step fitted to small reference steps; v8: the
    // calibration records when it was made and how far its rounds spread, and a noisy one is
    // not kept; v7: the sg matmul variant; v6: packs load vec4s; v5: the step fit over eight
    // reference steps, robust to outliers); older files are measured again.
    crate::cache::file(ctx, "profile-v10")
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
                    // A noisy calibration is never written; one that is (by hand) is said at every use.
                    if c.noisy() {
                        eprintln!("note: {}", noisy_words(&c));
                    }
                    return Ok((c, true));
                }
            }
        }
    }
    let mut c = pollster::block_on(calibrate(ctx)).map_err(|e| format!("calibration failed: {e}"))?;
    c.made_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs());
    if c.noisy() {
        eprintln!("note: {}; it is used for this run only, not cached", noisy_words(&c));
    } else if let Some(f) = &file {
        // A cache that cannot be written only costs a recalibration next time.
        if let Err(e) = crate::cache::write(f, &serde_json::to_string_pretty(&c).unwrap_or_default()) {
            eprintln!("note: could not cache the calibration in {}: {e}", f.display());
        }
    }
    Ok((c, false))
}

/// Why a calibration is not to be trusted, and what to do.
fn noisy_words(c: &Calibration) -> String {
    format!(
        "the calibration of this adapter ({}) was made on a busy machine (over {:.0}%): run `shardlab calibrate \
         --recalibrate` when the machine is quieter",
        made_text(c),
        100.0 * NOISY_SPREAD
    )
}

/// When and under what spread a calibration was made, in words: `made 2026-12-04 11:20 UTC,
/// rounds spread 3.1%`.
pub fn made_text(c: &Calibration) -> String {
    let when = c.made_unix_s.map_or("made at an unknown time".to_string(), |s| {
        format!("made {}", utc_text(s))
    });
    format!("{when}, rounds spread {:.1}%", 100.0 * c.spread)
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM UTC` (the civil calendar from days, as Howard
/// Hinnant's days_from_civil inverts it).
fn utc_text(secs: u64) -> String {
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60
    )
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

#[cfg(test)]
mod tests {
    #[test]
    fn utc_text_reads_the_civil_date() {
        assert_eq!(super::utc_text(0), "1970-01-01 00:00 UTC");
        // 2024-02-29 12:34 UTC, a leap day.
        assert_eq!(super::utc_text(1_709_210_040), "2024-02-29 12:34 UTC");
    }
}
