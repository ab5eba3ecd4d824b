//! Paths and process helpers shared by the commands.
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Every failure is a message that says what went wrong and how to fix it.
pub type Res<T> = Result<T, String>;

/// The workspace root (xtask/ is one level below it).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` when set (child cargo commands inherit it), else target/.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                std::env::current_dir().unwrap_or_else(|_| root()).join(dir)
            }
        }
        _ => root().join("target"),
    }
}

/// The cargo that runs this xtask, so child builds use the same toolchain.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Prints a step header.
pub fn step(title: &str) {
    println!("\n==> {title}");
    let _ = std::io::stdout().flush();
}

fn program_name(cmd: &Command) -> String {
    cmd.get_program().to_string_lossy().into_owned()
}

/// Runs `cmd` with inherited output; a non-zero exit is an error naming `what`.
pub fn run(cmd: &mut Command, what: &str) -> Res<()> {
    let status = cmd
        .status()
        .map_err(|e| format!("could not start `{}` for {what}: {e}", program_name(cmd)))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

/// Runs `cmd`, echoing its stdout line by line while handing each line to `scan`
/// (stderr is inherited). Returns whether it exited successfully.
pub fn run_scanned(cmd: &mut Command, what: &str, mut scan: impl FnMut(&str)) -> Res<bool> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start `{}` for {what}: {e}", program_name(cmd)))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut out = std::io::stdout();
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
        scan(&line);
    }
    let status = child.wait().map_err(|e| format!("{what}: {e}"))?;
    Ok(status.success())
}

/// The trimmed stdout of a command that succeeded, or None (not installed, or failed).
pub fn output_of(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A program on PATH, or in one of `extra` directories.
pub fn find_program(name: &str, extra: &[PathBuf]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(extra.iter().cloned())
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// `$CARGO_HOME/bin` (default ~/.cargo/bin), where `cargo install` puts programs.
pub fn cargo_bin_dir() -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        return Some(PathBuf::from(home).join("bin"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo").join("bin"))
}

/// Human-readable byte count.
pub fn human_bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.2} MiB", n as f64 / (1u64 << 20) as f64)
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}
