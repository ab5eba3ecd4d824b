//! Tests that cannot run do not pass: a test whose machine lacks what it needs (a GPU adapter,
//! Python with JAX) fails, unless the matching `SHARDLAB_ALLOW_NO_*` variable is `1`. Then it
//! returns early and records the skip in the file named by [`SKIP_LOG_VAR`], one line per
//! test, so `cargo xtask test` counts it as skipped rather than passed. A test of what only
//! some adapters have (lavapipe's subgroups, AVX-512 lanes) is skipped on the others
//! ([`adapter_lacks`]): there is nothing wrong with such a machine, and nothing was checked.
use std::io::Write;

/// Names the file that skips are appended to (set by `cargo xtask test`; unset, skips are only printed).
pub const SKIP_LOG_VAR: &str = "SHARDLAB_SKIP_LOG";

/// What a test needs and a machine may lack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// A wgpu adapter (a GPU, or lavapipe on the CPU).
    Gpu,
    /// A Python interpreter with JAX, to run exported scripts.
    Jax,
    /// lavapipe (Mesa's llvmpipe), whose subgroups are the lanes of one CPU vector.
    Llvmpipe,
    /// An adapter that offers the subgroup matmul variants.
    Subgroups,
    /// lavapipe on a CPU with AVX-512, for 16-lane subgroups.
    Avx512,
}

impl Need {
    /// The variable that, set to `1`, turns this need's failures into counted skips.
    pub fn allow_var(self) -> &'static str {
        match self {
            Need::Gpu => "SHARDLAB_ALLOW_NO_GPU",
            Need::Jax => "SHARDLAB_ALLOW_NO_JAX",
            // Never needed: such a skip is always allowed.
            Need::Llvmpipe | Need::Subgroups | Need::Avx512 => "",
        }
    }

    /// The word `cargo xtask test` reads in the skip log.
    pub fn key(self) -> &'static str {
        match self {
            Need::Gpu => "gpu",
            Need::Jax => "jax",
            Need::Llvmpipe => "llvmpipe",
            Need::Subgroups => "subgroups",
            Need::Avx512 => "avx512",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Need::Gpu => "a GPU adapter",
            Need::Jax => "Python with JAX",
            Need::Llvmpipe => "lavapipe",
            Need::Subgroups => "subgroup matmuls",
            Need::Avx512 => "lavapipe with AVX-512",
        }
    }

    fn fix(self) -> &'static str {
        match self {
            Need::Gpu => "make an adapter available (a GPU driver, or lavapipe with WGPU_BACKEND=vulkan)",
            Need::Jax => {
                "run `cargo xtask test jax` (it installs JAX in target/jax-venv), or point SHARDLAB_PYTHON at a \
                 Python with the versions in tests/jax-requirements.txt"
            }
            Need::Llvmpipe | Need::Subgroups | Need::Avx512 => "run it where the adapter has it",
        }
    }
}

/// Called by a test that cannot run because `need` is missing (`why` says how it was looked
/// for): panics, failing the test, unless skipping is allowed; then records the skip and
/// returns, and the caller returns from the test.
#[track_caller]
pub fn unavailable(need: Need, why: &str) {
    let var = need.allow_var();
    if std::env::var(var).as_deref() != Ok("1") {
        panic!(
            "this test needs {} and found none: {why}. Fix: {}; or set {var}=1 to count such tests as skipped",
            need.what(),
            need.fix()
        );
    }
    eprintln!("skipped: no {}: {why} ({var}=1)", need.what());
    if let Err(e) = record(need, why) {
        panic!("cannot record the skip in ${SKIP_LOG_VAR}: {e}");
    }
}

/// Called by a test of what only some adapters have, on one that lacks it (`need`; `why` says
/// what the adapter is): records the skip and returns, and the caller returns from the test.
pub fn adapter_lacks(need: Need, why: &str) {
    eprintln!("skipped: not {} here: {why}", need.what());
    if let Err(e) = record(need, why) {
        panic!("cannot record the skip in ${SKIP_LOG_VAR}: {e}");
    }
}

/// Appends `<key>\t<test>\t<why>` to the skip log. The test is named by the executable and
/// libtest's thread name (the test's path), so a test that asks twice is counted once.
fn record(need: Need, why: &str) -> std::io::Result<()> {
    let Some(path) = std::env::var_os(SKIP_LOG_VAR) else {
        return Ok(());
    };
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let thread = std::thread::current();
    let test = match thread.name() {
        // A test run on the main thread (one test thread) has no name of its own: count each call.
        None | Some("main") => {
            static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            format!("main#{}", CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
        }
        Some(name) => name.to_string(),
    };
    let why = why.replace(['\t', '\n', '\r'], " ");
    let line = format!("{}\t{exe} {test}\t{why}\n", need.key());
    // One write of the whole line in append mode, so concurrent tests never interleave lines.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(line.as_bytes())
}
