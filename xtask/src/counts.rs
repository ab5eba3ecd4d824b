//! Test counts for the summary: read from cargo's and node's result lines, and from the skip
//! log that the Rust tests append to when a missing GPU or JAX was allowed
//! (tests/src/skip.rs writes it: `<need>\t<test>\t<why>` per line).
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::util::{target_dir, Res};

/// The variable naming the skip log, as tests/src/skip.rs reads it.
pub const SKIP_LOG_VAR: &str = "SHARDLAB_SKIP_LOG";

#[derive(Default, Debug, PartialEq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
}

impl Counts {
    /// A step that is a single check (rustfmt, a clippy run, the page build) counts as one test.
    pub fn check(ok: bool) -> Counts {
        Counts {
            passed: ok as u64,
            failed: !ok as u64,
            skipped: 0,
        }
    }

    /// Adds the counts of cargo's `test result: ok. 3 passed; 0 failed; 1 ignored; ...`.
    pub fn scan_cargo(&mut self, line: &str) {
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
    pub fn scan_node(&mut self, line: &str) {
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

    /// Moves the tests that libtest saw pass but that returned early for want of a GPU or
    /// JAX from passed to skipped (never more than passed, as a skipped test cannot fail).
    pub fn move_skips(&mut self, skips: &Skips) {
        let n = skips.total().min(self.passed);
        self.passed -= n;
        self.skipped += n;
    }

    pub fn add(&mut self, other: &Counts) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.skipped += other.skipped;
    }
}

/// The tests that recorded a skip, per need (`gpu`, `jax`), each test once.
#[derive(Default, Debug, PartialEq)]
pub struct Skips(BTreeMap<String, BTreeSet<String>>);

impl Skips {
    pub fn parse(log: &str) -> Skips {
        let mut skips = Skips::default();
        for line in log.lines() {
            let mut fields = line.splitn(3, '\t');
            if let (Some(need), Some(test)) = (fields.next(), fields.next()) {
                skips.0.entry(need.to_string()).or_default().insert(test.to_string());
            }
        }
        skips
    }

    pub fn total(&self) -> u64 {
        self.0.values().map(|tests| tests.len() as u64).sum()
    }

    /// `72 without a GPU adapter (SHARDLAB_ALLOW_NO_GPU=1)`, one part per need; None without skips.
    pub fn describe(&self) -> Option<String> {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(need, tests)| match need.as_str() {
                "gpu" => format!("{} without a GPU adapter (SHARDLAB_ALLOW_NO_GPU=1)", tests.len()),
                "jax" => format!("{} without JAX (SHARDLAB_ALLOW_NO_JAX=1)", tests.len()),
                "llvmpipe" => format!("{} that check lavapipe, on another adapter", tests.len()),
                "subgroups" => format!("{} without subgroup matmuls on this adapter", tests.len()),
                "avx512" => format!("{} that need AVX-512 for 16-lane lavapipe", tests.len()),
                other => format!("{} without {other}", tests.len()),
            })
            .collect();
        (!parts.is_empty()).then(|| format!("skipped {}", parts.join(", ")))
    }
}

/// A fresh, empty skip log for one step, under `<target>/test-skips/`.
pub fn new_skip_log(step: &str) -> Res<PathBuf> {
    let dir = target_dir().join("test-skips");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join(format!("{step}.log"));
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!("cannot remove the old {}: {e}", path.display()))
        }
        _ => {}
    }
    Ok(path)
}

/// The skips recorded in `path` (none when the tests wrote nothing).
pub fn read_skips(path: &Path) -> Res<Skips> {
    match std::fs::read_to_string(path) {
        Ok(log) => Ok(Skips::parse(&log)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Skips::default()),
        Err(e) => Err(format!("cannot read the skip log {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn recorded_skips_move_from_passed_to_skipped_once_per_test() {
        let log = "gpu\tall-1a2b collectives::all_gather\tno adapter\n\
                   gpu\tall-1a2b collectives::all_gather\tno adapter\n\
                   gpu\tall-1a2b training::learns\tno adapter\n\
                   jax\tall-1a2b export_jax::single\tNo module named 'jax'\n\
                   gpu\tother-9f collectives::all_gather\tno adapter\n";
        let skips = Skips::parse(log);
        assert_eq!(skips.total(), 4);
        assert_eq!(
            skips.describe().unwrap(),
            "skipped 3 without a GPU adapter (SHARDLAB_ALLOW_NO_GPU=1), 1 without JAX (SHARDLAB_ALLOW_NO_JAX=1)"
        );
        let mut c = Counts {
            passed: 10,
            failed: 1,
            skipped: 2,
        };
        c.move_skips(&skips);
        assert_eq!(
            c,
            Counts {
                passed: 6,
                failed: 1,
                skipped: 6
            }
        );
        assert_eq!(Skips::parse("").describe(), None);
    }
}
