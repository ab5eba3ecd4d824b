//! `cargo xtask test`: everything CI runs, in order: install checks, rustfmt, the native tests
//! (GPU tests on lavapipe), the page build, and the browser tests against a local server.
//! Every step runs even when an earlier one failed; the summary names each, and the last line
//! counts all tests (`summary: N passed, N failed, N skipped`).
use std::process::Command;

use crate::server::Server;
use crate::util::{cargo, run, run_scanned, step, target_dir, Res};
use crate::{setup, site};

#[derive(Default, Debug, PartialEq)]
struct Counts {
    passed: u64,
    failed: u64,
    skipped: u64,
}

impl Counts {
    /// Adds the counts of cargo's `test result: ok. 3 passed; 0 failed; 1 ignored; ...`.
    fn scan_cargo(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(label), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match label {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.skipped += n,
                _ => {}
            }
        }
    }

    /// Adds the counts of node's test runner summary (`ℹ pass 3` with the spec reporter, `# pass 3` with tap).
    fn scan_node(&mut self, line: &str) {
        let line = line.trim_start_matches(['#', 'ℹ', ' ']);
        let mut words = line.split_whitespace();
        let (Some(label), Some(n), None) = (words.next(), words.next(), words.next()) else {
            return;
        };
        let Ok(n) = n.parse::<u64>() else { return };
        match label {
            "pass" => self.passed += n,
            "fail" | "cancelled" => self.failed += n,
            "skipped" | "todo" => self.skipped += n,
            _ => {}
        }
    }

    fn add(&mut self, other: &Counts) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.skipped += other.skipped;
    }
}

enum Outcome {
    Ok,
    Failed(String),
    Skipped(String),
}

pub fn main(args: &[String]) -> Res<()> {
    if let Some(arg) = args.first() {
        return Err(format!("`cargo xtask test` takes no arguments (got `{arg}`)"));
    }
    step("checking tools");
    setup::system_packages()?;
    setup::rustfmt()?;
    let wasm_bindgen = setup::wasm_tools()?;
    setup::npm_packages()?;
    test_environment()?;

    let mut steps: Vec<(&str, Outcome)> = Vec::new();
    let mut total = Counts::default();

    step("cargo fmt --all -- --check");
    let fmt = run(cargo().args(["fmt", "--all", "--", "--check"]), "rustfmt check")
        .map_err(|e| format!("{e}; `cargo fmt --all` fixes it"));
    total.add(&check_counts(fmt.is_ok()));
    steps.push(("rustfmt", outcome(fmt)));

    step("native tests: cargo test --workspace --exclude shardlab-web");
    let mut counts = Counts::default();
    let ok = run_scanned(
        cargo().args(["test", "--workspace", "--exclude", "shardlab-web", "--no-fail-fast"]),
        "cargo test",
        |l| counts.scan_cargo(l),
    );
    steps.push(("native tests (cargo test)", runner_outcome(ok, &mut counts)));
    total.add(&counts);

    let page = site::build(&wasm_bindgen);
    total.add(&check_counts(page.is_ok()));
    match page {
        Ok(dir) => {
            steps.push(("page build", Outcome::Ok));
            step("browser tests: node --test in tests/browser (Chromium, WebGPU on SwiftShader)");
            let mut counts = Counts::default();
            let ok = browser_tests(dir, &mut counts);
            steps.push(("browser tests (node --test)", runner_outcome(ok, &mut counts)));
            total.add(&counts);
        }
        Err(e) => {
            steps.push(("page build", Outcome::Failed(e)));
            steps.push((
                "browser tests (node --test)",
                Outcome::Skipped("the page did not build".into()),
            ));
        }
    }

    step("summary");
    let mut failed_steps = Vec::new();
    for (name, outcome) in &steps {
        match outcome {
            Outcome::Ok => println!("  ok       {name}"),
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
    println!(
        "summary: {} passed, {} failed, {} skipped",
        total.passed, total.failed, total.skipped
    );
    if failed_steps.is_empty() {
        Ok(())
    } else {
        // Already reported above; an empty message exits non-zero without repeating it.
        Err(String::new())
    }
}

/// A step that is a single check (rustfmt, the page build) counts as one test.
fn check_counts(ok: bool) -> Counts {
    Counts {
        passed: ok as u64,
        failed: !ok as u64,
        skipped: 0,
    }
}

fn outcome(r: Res<()>) -> Outcome {
    match r {
        Ok(()) => Outcome::Ok,
        Err(e) => Outcome::Failed(e),
    }
}

/// A test runner's outcome; a runner that failed without reporting a failed test (a build
/// error, a crash) counts as one failure, so the summary line agrees with the exit code.
fn runner_outcome(ok: Res<bool>, counts: &mut Counts) -> Outcome {
    match ok {
        Ok(true) if counts.failed == 0 => Outcome::Ok,
        Ok(_) if counts.failed > 0 => Outcome::Failed(format!("{} failed", counts.failed)),
        Ok(_) => {
            counts.failed += 1;
            Outcome::Failed("the runner failed before any test failed (see its output above)".into())
        }
        Err(e) => {
            counts.failed += 1;
            Outcome::Failed(e)
        }
    }
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
fn browser_tests(site: std::path::PathBuf, counts: &mut Counts) -> Res<bool> {
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

#[cfg(test)]
mod tests {
    use super::Counts;

    #[test]
    fn counts_add_up_cargo_and_node_summaries() {
        let mut c = Counts::default();
        c.scan_cargo("test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s");
        c.scan_cargo("test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s");
        c.scan_cargo("running 3 tests");
        c.scan_node("ℹ pass 4");
        c.scan_node("# fail 1");
        c.scan_node("ℹ skipped 2");
        c.scan_node("ℹ duration_ms 1234.5");
        c.scan_node("✔ pass 2 things (3ms)");
        assert_eq!(
            c,
            Counts {
                passed: 9,
                failed: 2,
                skipped: 3
            }
        );
    }
}
