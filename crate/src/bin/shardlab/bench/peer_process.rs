//! The peer of `bench peers`: a Python process running shardlab::bench::peers::DRIVER, asked for
//! one JAX train step or one numpy matmul at a time over its stdin and stdout.
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::Value;

/// How long the peer gets after a measurement before shardlab measures. BLAS and XLA thread pools
/// spin for a while after their work (OpenBLAS about 0.1 s): measured straight after numpy's
/// matmul, shardlab's n = 1024 matmul took 101 ms against 57 ms after a pause, because those
/// spinning threads held both cores.
pub const SETTLE: std::time::Duration = std::time::Duration::from_millis(250);

/// The fix for a Python without JAX, named in every such error.
const FIX: &str = "run `cargo xtask test jax` (it installs the pinned JAX in target/jax-venv, used by default), \
                   or pass --python PATH (or set SHARDLAB_PYTHON) to a Python with jax and numpy";

/// The Python to run: --python, else $SHARDLAB_PYTHON, else the jax-venv that `cargo xtask test jax`
/// makes in the target directory this binary was built in, else `python3`.
pub fn python(flag: Option<PathBuf>) -> PathBuf {
    if let Some(p) = flag {
        return p;
    }
    if let Some(p) = std::env::var_os("SHARDLAB_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let venv = std::env::current_exe().ok().and_then(|exe| {
        // target/<profile>/shardlab, or target/<profile>/deps/... under cargo test.
        exe.ancestors()
            .skip(1)
            .take(3)
            .map(|d| d.join("jax-venv").join("bin").join("python"))
            .find(|p| p.is_file())
    });
    venv.unwrap_or_else(|| PathBuf::from("python3"))
}

/// The versions of JAX and numpy `python` imports, or the one-line error naming the fix.
pub fn check(python: &Path) -> Result<(String, String), String> {
    let out = Command::new(python)
        .args(["-c", "import jax, numpy; print(jax.__version__, numpy.__version__)"])
        .env("JAX_PLATFORMS", "cpu")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            format!(
                "bench peers needs Python with JAX: `{}` cannot be started ({e}); {FIX}",
                python.display()
            )
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    match (out.status.success(), words.next(), words.next()) {
        (true, Some(jax), Some(np)) => Ok((jax.to_string(), np.to_string())),
        _ => {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.trim().lines().last().unwrap_or("no output").to_string();
            Err(format!(
                "bench peers needs Python with JAX: `{} -c \"import jax, numpy\"` failed ({last}); {FIX}",
                python.display()
            ))
        }
    }
}

/// A running peer; killed when dropped.
pub struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr_file: PathBuf,
    what: String,
}

impl Peer {
    /// Starts `python driver arg` (arg: an exported script, or `numpy`) with `devices` simulated
    /// CPU devices, and waits until it is ready. Its stderr goes to `stderr_file`, quoted on failure.
    pub fn start(
        python: &Path,
        driver: &Path,
        arg: &str,
        devices: usize,
        stderr_file: PathBuf,
    ) -> Result<Self, String> {
        let what = format!("`{} {} {arg}`", python.display(), driver.display());
        let err =
            std::fs::File::create(&stderr_file).map_err(|e| format!("cannot create {}: {e}", stderr_file.display()))?;
        let mut cmd = Command::new(python);
        cmd.arg(driver)
            .arg(arg)
            .env("JAX_PLATFORMS", "cpu")
            .env_remove("XLA_FLAGS")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err);
        if devices > 1 {
            cmd.env("XLA_FLAGS", format!("--xla_force_host_platform_device_count={devices}"));
        }
        let mut child = cmd.spawn().map_err(|e| format!("cannot start {what}: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err(format!("{what}: no pipes to the process"));
        };
        let mut peer = Peer {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            stderr_file,
            what,
        };
        peer.answer()?;
        Ok(peer)
    }

    /// One measurement as `bench peers` takes it: `request` twice in a row (the first wakes the
    /// peer's threads after shardlab's work), the second's `ms`, returned after [`SETTLE`].
    pub fn measured_ms(&mut self, request: &str) -> Result<f64, String> {
        self.ms(request)?;
        let ms = self.ms(request)?;
        std::thread::sleep(SETTLE);
        Ok(ms)
    }

    /// One request, its answer's `ms`.
    pub fn ms(&mut self, request: &str) -> Result<f64, String> {
        writeln!(self.stdin, "{request}")
            .and_then(|_| self.stdin.flush())
            .map_err(|e| self.failed(&format!("cannot send `{request}` ({e})")))?;
        let v = self.answer()?;
        v["ms"]
            .as_f64()
            .filter(|ms| ms.is_finite() && *ms > 0.0)
            .ok_or_else(|| self.failed(&format!("answered `{request}` without a time: {v}")))
    }

    /// The next JSON line, or the peer's error.
    fn answer(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        loop {
            line.clear();
            match self.stdout.read_line(&mut line) {
                Ok(0) => return Err(self.failed("ended")),
                Err(e) => return Err(self.failed(&format!("cannot be read ({e})"))),
                // Libraries may print lines of their own; the driver's are JSON objects.
                Ok(_) if !line.trim_start().starts_with('{') => continue,
                Ok(_) => break,
            }
        }
        let v: Value =
            serde_json::from_str(line.trim()).map_err(|e| self.failed(&format!("wrote `{}` ({e})", line.trim())))?;
        match v["error"].as_str() {
            Some(e) => Err(self.failed(e)),
            None => Ok(v),
        }
    }

    /// An error that names the process and the last line of its stderr.
    fn failed(&self, what: &str) -> String {
        let err = std::fs::read_to_string(&self.stderr_file).unwrap_or_default();
        match err.trim().lines().last() {
            Some(last) => format!("{} {what}; its last message: {last}", self.what),
            None => format!("{} {what}", self.what),
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        // It exits on `quit`; a peer stuck in a step is ended.
        for _ in 0..50 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
