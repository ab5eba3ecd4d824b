//! The file `--trace FILE` of `plan` and `bench train` writes: created before any work starts,
//! so a path that cannot be written fails at once instead of after a long benchmark.
use std::io::Write;
use std::path::{Path, PathBuf};

use shardlab::profile::Trace;

pub struct TraceFile {
    path: PathBuf,
    file: std::fs::File,
}

impl TraceFile {
    pub fn create(path: &Path) -> Result<Self, String> {
        let file = std::fs::File::create(path).map_err(|e| {
            format!(
                "cannot write the trace to {}: {e}; give --trace a file in a directory that exists and is writable",
                path.display()
            )
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `trace` as Chrome trace-event JSON.
    pub fn write(mut self, trace: &Trace) -> Result<(), String> {
        let text = serde_json::to_string(&trace.to_json()).map_err(|e| e.to_string())?;
        self.file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|e| format!("cannot write the trace to {}: {e}", self.path.display()))
    }
}
