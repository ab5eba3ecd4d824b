//! The command line's cache: one directory, one file per adapter and kind (the calibration,
//! the matmul choices), named by the adapter's identity, and every file written aside and
//! renamed, so a reader in another process never sees half of one.
use std::path::{Path, PathBuf};

use shardlab::gpu::GpuContext;

/// $SHARDLAB_CACHE_DIR, else $XDG_CACHE_HOME/shardlab, else ~/.cache/shardlab.
pub fn dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("SHARDLAB_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("shardlab"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("shardlab"))
}

/// The cache file `<kind>-<adapter>.json` of `ctx`'s adapter (`kind` carries the format's
/// version, so a file of another version is another file).
pub fn file(ctx: &GpuContext, kind: &str) -> Option<PathBuf> {
    let id: String = ctx
        .summary
        .identity()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    dir().map(|d| d.join(format!("{kind}-{id}.json")))
}

/// Writes `text` to `file`: to a file beside it first, then renamed over it.
pub fn write(file: &Path, text: &str) -> std::io::Result<()> {
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = file.with_extension(format!("json.{}", std::process::id()));
    let written = std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, file));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
