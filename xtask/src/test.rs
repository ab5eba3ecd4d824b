//! `cargo xtask test [STEP...]`: everything CI runs, in order: rustfmt, clippy, rustdoc, the
//! native tests (GPU tests on lavapipe), the export tests under JAX, the page build, and the
//! browser tests against a local server; or only the named steps, for a quick loop. Each step
//! installs what it needs and runs even when an earlier one failed; the summary names each,
//! and the last line counts all tests (`summary: N passed, N failed, N skipped`).
use std::path::PathBuf;
use std::process::Command;

use crate::counts::{new_skip_log, read_skips, Counts, Skips, SKIP_LOG_VAR};
use crate::server::Server;
use crate::steps::Step;
use crate::util::{cargo, run, run_scanned, step, target_dir, Res};
use crate::{jax, setup, site, steps};

const WEB_PACKAGE: &str = "shardlab-web";
/// The export tests' module in the test binary: they run in the jax step, not the native one.
const EXPORT_TESTS: &str = "export_jax::";
/// The tests of `shardlab bench peers` and of the device benchmark's dry run, which run JAX as
/// the peer (crate/tests/peers.rs, xtask/src/device_bench.rs).
const PEER_TESTS: &str = "under_jax::";

enum Outcome {
    Ok(Option<String>),
    Failed(String),
    Skipped(String),
}

/// The outcome of every check and test runner, and the tests counted.
#[derive(Default)]
struct Report {
    steps: Vec<(&'static str, Outcome)>,
    total: Counts,
}

impl Report {
    /// A single check (rustfmt, a clippy run, the page build) counts as one test.
    fn check(&mut self, name: &'static str, result: Res<()>) {
        self.total.add(&Counts::check(result.is_ok()));
        let outcome = match result {
            Ok(()) => Outcome::Ok(None),
            Err(e) => Outcome::Failed(e),
        };
        self.steps.push((name, outcome));
    }

    /// A test runner's outcome; a runner that failed without reporting a failed test (a build
    /// error, a crash) counts as one failure, so the summary line agrees with the exit code.
    /// Tests that recorded a skip move from passed to skipped.
    fn runner(&mut self, name: &'static str, ok: Res<bool>, mut counts: Counts, skips: Res<Skips>) {
        let (note, skip_error) = match &skips {
            Ok(s) => {
                counts.move_skips(s);
                (s.describe(), None)
            }
            Err(e) => (None, Some(e.clone())),
        };
        let outcome = match ok {
            Ok(true) if counts.failed == 0 && skip_error.is_none() => Outcome::Ok(note),
            Ok(_) if counts.failed > 0 => {
                let mut why = format!("{} failed", counts.failed);
                if let Some(note) = note {
                    why += &format!("; {note}");
                }
                Outcome::Failed(why)
            }
            Ok(true) => {
                counts.failed += 1;
                Outcome::Failed(skip_error.unwrap_or_default())
            }
            Ok(false) => {
                counts.failed += 1;
                Outcome::Failed("the runner failed before any test failed (see its output above)".into())
            }
            Err(e) => {
                counts.failed += 1;
                Outcome::Failed(e)
            }
        };
        self.total.add(&counts);
        self.steps.push((name, outcome));
    }

    /// A step that could not start (a tool it needs is missing) counts as one failure.
    fn failed(&mut self, name: &'static str, why: String) {
        self.check(name, Err(why));
    }

    fn skipped(&mut self, name: &'static str, why: &str) {
        self.steps.push((name, Outcome::Skipped(why.into())));
    }

    fn finish(self) -> Res<()> {
        step("summary");
        let mut failed_steps = Vec::new();
        for (name, outcome) in &self.steps {
            match outcome {
                Outcome::Ok(None) => println!("  ok       {name}"),
                Outcome::Ok(Some(note)) => println!("  ok       {name}: {note}"),
                Outcome::Failed(why) => {
                    println!("  FAILED   {name}: {why}");
                    failed_steps.push(*name);
                }
                Outcome::Skipped(why) => println!("  skipped  {name}: {why}"),
            }
        }
        if !failed_steps.is_empty() {
            println!("failed: {}", failed_steps.join(", "));
        }
        // The last line, read by CI: every test counted.
        let t = &self.total;
        println!(
            "summary: {} passed, {} failed, {} skipped",
            t.passed, t.failed, t.skipped
        );
        if failed_steps.is_empty() {
            Ok(())
        } else {
            // Already reported above; an empty message exits non-zero without repeating it.
            Err(String::new())
        }
    }
}

pub fn main(args: &[String]) -> Res<()> {
    let selected = steps::parse(args)?;
    test_environment()?;
    let mut report = Report::default();
    let mut page: Option<Res<PathBuf>> = None;
    for s in selected {
        match s {
            Step::Fmt => fmt(&mut report),
            Step::Clippy => clippy(&mut report),
            Step::Doc => doc(&mut report),
            Step::Native => native(&mut report),
            Step::Jax => jax_tests(&mut report),
            Step::Page => page = Some(page_build(&mut report)),
            Step::Browser => match page.take() {
                Some(Ok(dir)) => browser(&mut report, dir),
                _ => report.skipped("browser tests (node --test)", "the page did not build"),
            },
        }
    }
    report.finish()
}

fn fmt(report: &mut Report) {
    step("cargo fmt --all -- --check");
    let result = setup::rustfmt().and_then(|()| {
        run(cargo().args(["fmt", "--all", "--", "--check"]), "rustfmt check")
            .map_err(|e| format!("{e}; `cargo fmt --all` fixes it"))
    });
    report.check("rustfmt", result);
}

fn clippy(report: &mut Report) {
    if let Err(e) = setup::clippy() {
        return report.failed("clippy", e);
    }
    step("clippy, native crates: cargo clippy --workspace --exclude shardlab-web --all-targets -- -D warnings");
    let native = run(
        cargo().args([
            "clippy",
            "--workspace",
            "--exclude",
            WEB_PACKAGE,
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
        "clippy (native crates)",
    );
    report.check("clippy (native crates)", native);
    step("clippy, wasm crate: cargo clippy -p shardlab-web --target wasm32-unknown-unknown -- -D warnings");
    let wasm = setup::wasm_target().and_then(|()| {
        run(
            cargo().args([
                "clippy",
                "-p",
                WEB_PACKAGE,
                "--target",
                "wasm32-unknown-unknown",
                "--",
                "-D",
                "warnings",
            ]),
            "clippy (wasm crate)",
        )
    });
    report.check("clippy (wasm crate, wasm32)", wasm);
}

fn doc(report: &mut Report) {
    step("rustdoc: cargo doc --workspace --exclude shardlab-web --no-deps, RUSTDOCFLAGS=\"-D warnings\"");
    // Added to the caller's flags, not replacing them.
    let mut flags = std::env::var("RUSTDOCFLAGS").unwrap_or_default();
    flags = format!("{flags} -D warnings").trim().to_string();
    let result = run(
        cargo()
            .args(["doc", "--workspace", "--exclude", WEB_PACKAGE, "--no-deps"])
            .env("RUSTDOCFLAGS", flags),
        "cargo doc",
    );
    report.check("rustdoc", result);
}

/// Where shardlab keeps calibrations and tunings (crate/src/bin/shardlab/device.rs).
const CACHE_DIR_VAR: &str = "SHARDLAB_CACHE_DIR";

/// Runs `cmd` (a `cargo test`) with a fresh skip log, counting its results and its skips.
fn cargo_tests(report: &mut Report, name: &'static str, log_name: &str, cmd: &mut Command) {
    let log = match new_skip_log(log_name) {
        Ok(log) => log,
        Err(e) => return report.failed(name, e),
    };
    // The tests' calibrations and matmul tunings go to a cache of their own, so a run
    // neither reads nor overwrites the user's (unless they name one).
    if std::env::var_os(CACHE_DIR_VAR).is_none() {
        cmd.env(CACHE_DIR_VAR, crate::util::root().join("target").join("test-cache"));
    }
    let mut counts = Counts::default();
    let ok = run_scanned(cmd.env(SKIP_LOG_VAR, &log), "cargo test", |l| counts.scan_cargo(l));
    report.runner(name, ok, counts, read_skips(&log));
}

fn native(report: &mut Report) {
    const NAME: &str = "native tests (cargo test)";
    if let Err(e) = setup::system_packages(false) {
        return report.failed(NAME, e);
    }
    step("native tests: cargo test --workspace --exclude shardlab-web (the export and peer tests run in the jax step)");
    cargo_tests(
        report,
        NAME,
        "native",
        cargo()
            .args([
                "test",
                "--workspace",
                "--exclude",
                WEB_PACKAGE,
                "--no-fail-fast",
                "--",
                "--skip",
                EXPORT_TESTS,
                "--skip",
                PEER_TESTS,
            ])
            .env("SHARDLAB_NO_PYTHON", "1"),
    );
    // The page's crate is wasm-only in the build, but its settings, editor and task logic are
    // plain Rust with unit tests: run them natively.
    const WEB_NAME: &str = "the page's unit tests (cargo test)";
    step("the page's unit tests: cargo test -p shardlab-web --lib --features shardlab/native");
    cargo_tests(
        report,
        WEB_NAME,
        "web",
        cargo().args([
            "test",
            "-p",
            WEB_PACKAGE,
            "--lib",
            "--features",
            "shardlab/native",
            "--no-fail-fast",
        ]),
    );
}

fn jax_tests(report: &mut Report) {
    const NAME: &str = "export tests under JAX (cargo test)";
    step("JAX: the virtual environment in target/jax-venv");
    let mut cmd = cargo();
    cmd.args([
        "test",
        "-p",
        "shardlab-tests",
        "-p",
        "shardlab",
        "-p",
        "xtask",
        "--tests",
        "--no-fail-fast",
        "--",
        EXPORT_TESTS,
        PEER_TESTS,
    ]);
    match jax::python() {
        Ok(python) => {
            println!("JAX from {}", python.display());
            cmd.env("SHARDLAB_PYTHON", python);
        }
        // With the skip allowed, the tests still run and record their skips.
        Err(e) if std::env::var("SHARDLAB_ALLOW_NO_JAX").as_deref() == Ok("1") => {
            println!("note: no JAX ({e}); SHARDLAB_ALLOW_NO_JAX=1 counts the tests that need it as skipped")
        }
        Err(e) => return report.failed(NAME, e),
    }
    step(
        "export and peer tests: cargo test -p shardlab-tests -p shardlab -p xtask --tests -- export_jax:: under_jax::",
    );
    cargo_tests(report, NAME, "jax", &mut cmd);
}

fn page_build(report: &mut Report) -> Res<PathBuf> {
    let dir = setup::wasm_tools().and_then(|wasm_bindgen| {
        // wasm-opt comes from the browser tests' npm packages.
        setup::npm_packages()?;
        site::build(&wasm_bindgen)
    });
    report.check("page build", dir.as_ref().map(|_| ()).map_err(Clone::clone));
    dir
}

fn browser(report: &mut Report, site: PathBuf) {
    const NAME: &str = "browser tests (node --test)";
    if let Err(e) = setup::system_packages(true).and_then(|()| setup::npm_packages()) {
        return report.failed(NAME, e);
    }
    step("browser tests: node --test in tests/browser (Chromium, WebGPU on SwiftShader)");
    let mut counts = Counts::default();
    let ok = browser_tests(site, &mut counts);
    report.runner(NAME, ok, counts, Ok(Skips::default()));
}

/// Native wgpu on lavapipe: the Vulkan backend, and a private XDG_RUNTIME_DIR (Mesa and Chromium
/// want one, mode 0700). Children inherit both; values the caller set are kept.
fn test_environment() -> Res<()> {
    if cfg!(target_os = "linux") && std::env::var_os("WGPU_BACKEND").is_none() {
        std::env::set_var("WGPU_BACKEND", "vulkan");
    }
    let runtime_ok = std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| std::path::Path::new(&d).is_dir());
    if !runtime_ok {
        let dir = target_dir().join("xdg-runtime");
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("cannot chmod {}: {e}", dir.display()))?;
        }
        std::env::set_var("XDG_RUNTIME_DIR", &dir);
    }
    Ok(())
}

/// Serves the page on a free port and runs `node --test` in tests/browser against it.
fn browser_tests(site: PathBuf, counts: &mut Counts) -> Res<bool> {
    let server = Server::start(site, 0)?;
    let artifacts = target_dir().join("browser-artifacts");
    println!("page served at {}; artifacts in {}", server.url(), artifacts.display());
    run_scanned(
        Command::new("node")
            .args(["--test", "--test-reporter=spec"])
            .current_dir(setup::browser_dir())
            .env("SHARDLAB_URL", server.url())
            .env("SHARDLAB_CHROMIUM", setup::chromium_path())
            .env("SHARDLAB_ARTIFACTS", &artifacts),
        "node --test",
        |l| counts.scan_node(l),
    )
}
