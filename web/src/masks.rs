//! The same-key caveat in numbers: how many dropout mask bits the data-parallel devices share,
//! with the same key on every device and with `fold_in(key, axis_index('dp'))`. The masks are
//! the core's own Threefry bits, drawn as the shard_map body draws them.
use serde_json::{json, Value};
use shardlab::ir::RngLayout;
use shardlab::rng::{original_bits_at, partitionable_bits_at, uniform_from_bits, Key};

use crate::settings::Settings;

/// Mask elements compared per device: enough for a share to three digits, quick on wasm.
const SAMPLE: u64 = 1 << 14;

/// Keep bits of the first `SAMPLE` elements of one device's local mask of `local` elements.
fn keep_bits(key: Key, layout: RngLayout, local: u64, keep: f32) -> Vec<bool> {
    (0..local.min(SAMPLE))
        .map(|i| {
            let bits = match layout {
                RngLayout::Original => original_bits_at(key, local, i),
                RngLayout::Partitionable => partitionable_bits_at(key, i),
            };
            uniform_from_bits(bits) < keep
        })
        .collect()
}

/// Mean share of identical keep bits between device 0 and every other data-parallel device.
fn shared(masks: &[Vec<bool>]) -> f64 {
    let first = &masks[0];
    let others = &masks[1..];
    let same: usize = others
        .iter()
        .map(|m| m.iter().zip(first).filter(|(a, b)| a == b).count())
        .sum();
    same as f64 / (others.len() * first.len()).max(1) as f64
}

/// `{"devices", "elements", "same_key", "fold_in"}` for the first dropout mask of a step, or
/// `{"devices": n}` alone when there is nothing to compare (dropout off or one dp device).
pub fn overlap(settings: &Settings, dp: usize) -> Value {
    if settings.dropout == 0.0 || dp < 2 {
        return json!({"devices": dp});
    }
    // The first dropout site's local activation: [batch / dp, seq, d_model] (checked sizes).
    let local = (settings.batch / dp) as u64 * settings.seq as u64 * settings.d_model as u64;
    let keep = 1.0 - settings.dropout as f32;
    let layout = settings.rng_layout();
    let key = Key::from_seed(0).fold_in(0);
    let same: Vec<Vec<bool>> = (0..dp).map(|_| keep_bits(key, layout, local, keep)).collect();
    let folded: Vec<Vec<bool>> = (0..dp as u32)
        .map(|d| keep_bits(key.fold_in(d), layout, local, keep))
        .collect();
    json!({
        "devices": dp,
        "elements": local.min(SAMPLE),
        "same_key": shared(&same),
        "fold_in": shared(&folded),
    })
}
