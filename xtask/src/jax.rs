//! JAX for the export tests: a virtual environment in `<target>/jax-venv`, made with
//! `python3 -m venv` and filled from PyPI with the versions pinned in tests/jax-requirements.txt.
//! It is reused while its copy of that file matches, so only the first run (or a change of
//! pins) downloads anything.
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{output_of, root, run, step, target_dir, Res};

/// The pinned versions, relative to the workspace root.
const REQUIREMENTS: &str = "tests/jax-requirements.txt";
/// The copy of the requirements a venv was filled from, inside the venv.
const STAMP: &str = "shardlab-requirements.txt";

pub fn venv_dir() -> PathBuf {
    target_dir().join("jax-venv")
}

fn venv_python(venv: &Path) -> PathBuf {
    if cfg!(windows) {
        venv.join("Scripts").join("python.exe")
    } else {
        venv.join("bin").join("python")
    }
}

fn runs(python: &Path, code: &str) -> bool {
    output_of(python, &["-c", code]).is_some()
}

/// The venv's Python with the pinned JAX installed, creating or refilling the venv when needed.
pub fn python() -> Res<PathBuf> {
    let req_path = root().join(REQUIREMENTS);
    let requirements =
        std::fs::read_to_string(&req_path).map_err(|e| format!("cannot read {}: {e}", req_path.display()))?;
    let venv = venv_dir();
    let python = venv_python(&venv);
    let stamp = venv.join(STAMP);
    let filled = std::fs::read_to_string(&stamp).is_ok_and(|s| s == requirements);
    if filled && runs(&python, "import jax") {
        return Ok(python);
    }
    if venv.exists() && !runs(&python, "pass") {
        // A venv whose interpreter no longer starts (its base Python moved): make it anew.
        std::fs::remove_dir_all(&venv).map_err(|e| format!("cannot remove the broken {}: {e}", venv.display()))?;
    }
    if !venv.exists() {
        create(&venv)?;
    }
    step(&format!(
        "installing JAX into {} from {REQUIREMENTS} (pip; once, about 150 MB)",
        venv.display()
    ));
    let _ = std::fs::remove_file(&stamp);
    run(
        Command::new(&python)
            .args(["-m", "pip", "install", "--disable-pip-version-check", "--no-input"])
            // Wheels only: building numpy or jaxlib from source would take an hour, and fail.
            .arg("--only-binary=:all:")
            .arg("-r")
            .arg(&req_path),
        "pip install",
    )
    .map_err(|e| {
        format!(
            "{e}; PyPI must be reachable and have wheels of {REQUIREMENTS} for this Python \
             (`{} -m pip install -r {REQUIREMENTS}` shows why)",
            python.display()
        )
    })?;
    if !runs(&python, "import jax") {
        return Err(format!(
            "pip installed {REQUIREMENTS} but `{} -c \"import jax\"` fails; remove {} and run again",
            python.display(),
            venv.display()
        ));
    }
    std::fs::write(&stamp, &requirements).map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
    Ok(python)
}

fn create(venv: &Path) -> Res<()> {
    let base = if cfg!(windows) { "python" } else { "python3" };
    step(&format!("creating {} ({base} -m venv)", venv.display()));
    let make = || run(Command::new(base).arg("-m").arg("venv").arg(venv), "python3 -m venv");
    if make().is_ok() {
        return Ok(());
    }
    // Debian splits venv and ensurepip into python3-venv; a half-made venv would stay broken.
    let _ = std::fs::remove_dir_all(venv);
    if crate::setup::debian_root() {
        step("installing python3-venv: apt-get install -y python3-venv");
        let install = Command::new("apt-get")
            .args(["install", "-y", "python3-venv"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success());
        if install && make().is_ok() {
            return Ok(());
        }
        let _ = std::fs::remove_dir_all(venv);
    }
    Err(format!(
        "`{base} -m venv {}` failed; install Python 3.11 or newer with its venv module \
         (`sudo apt-get install -y python3 python3-venv` on Debian or Ubuntu)",
        venv.display()
    ))
}
