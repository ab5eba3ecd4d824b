//! What the command-line tests share: the binary under test on the Vulkan backend by default,
//! its output read whole, and fresh temporary directories.
// Each test binary includes this module and uses its own part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The smallest model the CLI tests train: one block, d_model 16, batch 2.
pub const TINY: &[&str] = &[
    "--layers",
    "1",
    "--d-model",
    "16",
    "--heads",
    "2",
    "--seq",
    "8",
    "--batch",
    "2",
    "--vocab",
    "16",
];

/// `shardlab ARGS`, on Vulkan (lavapipe here) unless $WGPU_BACKEND names another backend.
pub fn command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shardlab"));
    c.args(args).env(
        "WGPU_BACKEND",
        std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan".into()),
    );
    c
}

/// Runs `cmd` to its end: (exit code, stdout, stderr).
pub fn output(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("run shardlab");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An empty directory of this test process, `shardlab-{suite}-{name}-{pid}` in the temp dir,
/// removed with what it holds when dropped (so test runs do not pile up folders in /tmp).
pub fn temp_dir(suite: &str, name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("shardlab-{suite}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a temporary directory");
    TempDir(dir)
}

/// A test's scratch directory ([`temp_dir`]); read as a [`Path`].
pub struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TempDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
