//! The matmul autotuner's choices, cached per adapter beside the calibration
//! (`<cache dir>/matmul-v<TuningCache::VERSION>-<adapter>.json`), so that separate processes
//! run the same kernels instead of each timing them anew under whatever load there is.
//! `--retune` times them again.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use shardlab::gpu::GpuContext;
use shardlab::kernels::{Tuning, TuningCache};

/// The flag of every command that tunes matmuls.
#[derive(clap::Args, Clone, Copy, Default)]
pub struct RetuneArg {
    /// Time the matmul variants again instead of using the choices cached for this adapter
    /// (and cache the new ones).
    #[arg(long)]
    pub retune: bool,
}

/// A GPU context with the cached choices loaded; the choices it tunes are cached when it is
/// dropped.
pub struct TunedContext {
    pub ctx: Arc<GpuContext>,
    file: Option<PathBuf>,
}

fn cache_file(ctx: &GpuContext) -> Option<PathBuf> {
    crate::cache::file(ctx, &format!("matmul-v{}", TuningCache::VERSION))
}

/// The cache in `file`, or why it cannot be used (None when there is none).
fn read(file: &Path, adapter: &str) -> Option<Result<TuningCache, String>> {
    let text = std::fs::read_to_string(file).ok()?;
    Some(
        serde_json::from_str::<TuningCache>(&text)
            .map_err(|e| format!("it is not a tuning cache ({e})"))
            .and_then(|c| {
                // Checked whole on a scratch copy, so a refused file changes nothing.
                shardlab::kernels::Tuning::default().load_cache(&c, adapter).map(|_| c)
            }),
    )
}

/// The local adapter, with the matmul choices cached for it unless `retune`. A cache that
/// cannot be used is ignored with a one-line notice.
pub fn open(retune: RetuneArg) -> Result<TunedContext, String> {
    let ctx = Arc::new(GpuContext::new_blocking().map_err(|e| e.to_string())?);
    let file = cache_file(&ctx);
    if let (false, Some(f)) = (retune.retune, &file) {
        match read(f, &ctx.summary.identity()) {
            None => {}
            Some(Ok(cache)) => {
                Tuning::with(&ctx, |t| t.load_cache(&cache, &ctx.summary.identity()));
            }
            Some(Err(why)) => eprintln!(
                "note: ignoring the matmul tuning cache {}: {why}; tuning again",
                f.display()
            ),
        }
    }
    Ok(TunedContext { ctx, file })
}

impl Drop for TunedContext {
    fn drop(&mut self) {
        let Some(file) = &self.file else { return };
        let adapter = self.ctx.summary.identity();
        let Some(mut tuning) = Tuning::with(&self.ctx, |t| t.clone()) else {
            return;
        };
        if tuning.tuned == 0 {
            return;
        }
        // Choices this process did not make (other shapes, other commands) are kept.
        let mut merged = Tuning::default();
        if let Some(Ok(old)) = read(file, &adapter) {
            let _ = merged.load_cache(&old, &adapter);
        }
        merged.matmul.extend(tuning.matmul.drain());
        let text = serde_json::to_string_pretty(&merged.to_cache(&adapter)).unwrap_or_default();
        let written = crate::cache::write(file, &text);
        match written {
            Ok(()) => eprintln!(
                "note: tuned the matmul for {} shape class(es) on this adapter; cached in {} (--retune redoes it)",
                tuning.tuned,
                file.display()
            ),
            Err(e) => eprintln!("note: could not cache the matmul tuning in {}: {e}", file.display()),
        }
    }
}
