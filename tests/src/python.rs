//! The Python that runs exported JAX scripts: `SHARDLAB_PYTHON` (set by `cargo xtask test jax`
//! to its virtual environment), else target/jax-venv's when `cargo xtask test jax` made it,
//! else `python3`. A missing Python or JAX fails the test unless `SHARDLAB_ALLOW_NO_JAX=1`.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::skip::{unavailable, Need};

/// Names the Python interpreter the export tests run.
pub const PYTHON_VAR: &str = "SHARDLAB_PYTHON";

/// Set by `cargo xtask test` in its native step, which runs before the jax step has made the
/// venv on a bare machine: a test there that reaches for Python would pass on a warm machine and
/// fail in CI, so it fails everywhere.
pub const NO_PYTHON_VAR: &str = "SHARDLAB_NO_PYTHON";

/// The interpreter to run, whether or not it exists.
pub fn python_program() -> &'static Path {
    assert!(
        std::env::var_os(NO_PYTHON_VAR).is_none(),
        "this test runs Python in the native step, before the jax step makes the venv: put it in a \
         `mod under_jax` (or `export_jax::`) so that the jax step runs it"
    );
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        if let Some(p) = std::env::var_os(PYTHON_VAR).filter(|p| !p.is_empty()) {
            return PathBuf::from(p);
        }
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target"));
        let venv = if cfg!(windows) {
            target.join("jax-venv").join("Scripts").join("python.exe")
        } else {
            target.join("jax-venv").join("bin").join("python")
        };
        if venv.is_file() {
            venv
        } else {
            PathBuf::from("python3")
        }
    })
}

/// Why `python -c <code>` fails, or None when it exits 0.
fn fails(code: &str) -> Option<String> {
    let program = python_program();
    match Command::new(program).args(["-c", code]).output() {
        Err(e) => Some(format!("`{}` cannot be started ({e})", program.display())),
        Ok(o) if !o.status.success() => Some(format!(
            "`{} -c \"{code}\"` failed: {}",
            program.display(),
            String::from_utf8_lossy(&o.stderr).trim().lines().last().unwrap_or("")
        )),
        Ok(_) => None,
    }
}

/// The interpreter, or None when it cannot be started and a skip is allowed (then recorded).
pub fn python() -> Option<&'static Path> {
    static MISSING: OnceLock<Option<String>> = OnceLock::new();
    match MISSING.get_or_init(|| fails("pass")) {
        None => Some(python_program()),
        Some(why) => {
            unavailable(Need::Jax, why);
            None
        }
    }
}

/// The interpreter when it imports JAX, or None when it cannot and a skip is allowed (then recorded).
pub fn jax_python() -> Option<&'static Path> {
    static MISSING: OnceLock<Option<String>> = OnceLock::new();
    match MISSING.get_or_init(|| fails("import jax")) {
        None => Some(python_program()),
        Some(why) => {
            unavailable(Need::Jax, why);
            None
        }
    }
}

/// Writes `script` to `<temp>/shardlab-<dir>-<pid>/<name>.py` and runs it with [`python_program`]
/// on `devices` simulated CPU devices (XLA's host platform); returns its stdout, after failing
/// the test with both streams if the script failed. A script that ran is removed (and the folder
/// with the last of them); one that failed stays for reading.
pub fn run_jax_script(dir: &str, name: &str, script: &str, devices: usize) -> String {
    let dir = std::env::temp_dir().join(format!("shardlab-{dir}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.py"));
    std::fs::write(&path, script).unwrap();
    let out = Command::new(python_program())
        .arg(&path)
        .env("XLA_FLAGS", format!("--xla_force_host_platform_device_count={devices}"))
        .env("JAX_PLATFORMS", "cpu")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name}: the script failed ({}, kept at {}):\n{stdout}\n{}",
        out.status,
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    remove_script(&path);
    stdout
}

/// Removes a script that ran, and its folder once it holds nothing else (other tests of this
/// process may still be writing theirs to it).
pub fn remove_script(path: &std::path::Path) {
    let _ = std::fs::remove_file(path);
    if let Some(dir) = path.parent() {
        let _ = std::fs::remove_dir(dir);
    }
}
