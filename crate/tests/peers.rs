//! `shardlab bench peers`: shardlab against JAX and numpy at tiny sizes, run for real. Needs
//! Python with JAX (the venv of `cargo xtask test jax`, found by the binary itself, or
//! $SHARDLAB_PYTHON); without it the test fails unless SHARDLAB_ALLOW_NO_JAX=1, then it is
//! recorded as skipped like the export tests' (tests/src/skip.rs).
use std::io::Write;

mod common;

fn record_skip(why: &str) {
    eprintln!("skipped: no Python with JAX: {why} (SHARDLAB_ALLOW_NO_JAX=1)");
    if let Some(path) = std::env::var_os("SHARDLAB_SKIP_LOG") {
        let exe = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_default();
        let test = std::thread::current().name().unwrap_or("main").to_string();
        let line = format!("jax\t{exe} {test}\t{}\n", why.replace(['\t', '\n', '\r'], " "));
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .expect("record the skip in $SHARDLAB_SKIP_LOG");
    }
}

/// The number in a table cell such as `12.34` or `3.17x`.
fn number(cell: &str) -> f64 {
    cell.trim_end_matches('x')
        .parse()
        .unwrap_or_else(|e| panic!("`{cell}` is not a number: {e}"))
}

/// Named `under_jax::` so that `cargo xtask test` runs it in its JAX step, with the venv.
mod under_jax {
    use super::*;

    #[test]
    fn bench_peers_prints_each_configuration_with_the_ratio_of_its_measured_medians() {
        let out = common::command(&["bench", "peers", "--tiny", "--steps", "1"])
            .output()
            .expect("run shardlab");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        if out.status.code() == Some(2) && stderr.contains("needs Python with JAX") {
            if std::env::var("SHARDLAB_ALLOW_NO_JAX").as_deref() == Ok("1") {
                record_skip(stderr.trim());
                return;
            }
            panic!("this test needs Python with JAX: {stderr}");
        }
        assert!(out.status.success(), "bench peers failed: {stderr}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert!(lines[0].contains("vs JAX") && lines[0].contains("numpy"), "{stdout}");
        let header: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            header,
            ["config", "shardlab", "ms", "peer", "peer", "ms", "ratio", "goal", "met", "floor", "detail"],
            "{stdout}"
        );
        let rows = [
            ("tiny", "jax", 4.0),
            ("tiny seed auto dp=2", "jax", 5.0),
            ("tiny seed shard_map dp=2", "jax", 5.0),
            ("matmul n=64", "numpy", 4.0),
        ];
        assert_eq!(lines.len(), 2 + rows.len() + 2, "{stdout}");
        for (line, (name, peer, goal)) in lines[2..].iter().zip(rows) {
            assert!(line.starts_with(name), "row `{line}` should be {name}");
            let cells: Vec<&str> = line[name.len()..].split_whitespace().collect();
            let (ours, who, theirs, ratio) = (number(cells[0]), cells[1], number(cells[2]), number(cells[3]));
            assert_eq!(who, peer, "{line}");
            assert!(ours > 0.0 && theirs > 0.0, "{line}: measured times are positive");
            // Both times print 4 significant digits, the ratio 2 decimals.
            let want = ours / theirs;
            assert!(
                (ratio - want).abs() <= 0.006 + 0.003 * want,
                "{line}: ratio {ratio} is not {ours} / {theirs} = {want}"
            );
            assert_eq!(cells[4], format!("<={goal}x"), "{line}");
            // The verdict follows the unrounded ratio: a row printed at the goal itself (`4.00x`
            // for 4.004) may say either.
            if (ratio - goal).abs() > 0.005 {
                assert_eq!(cells[5], if ratio <= goal { "yes" } else { "no" }, "{line}");
            } else {
                assert!(matches!(cells[5], "yes" | "no"), "{line}");
            }
            // The floor: shardlab's least time on this adapter's ceilings, over the peer's.
            assert!(number(cells[6]) > 0.0, "{line}: a positive floor ratio");
            if peer == "numpy" {
                assert!(line.contains("GFLOP/s") && line.contains("% of numpy"), "{line}");
            }
        }
        assert!(lines[lines.len() - 2].contains("medians of 1 alternated"), "{stdout}");
        assert!(lines[lines.len() - 1].starts_with("(floor = "), "{stdout}");
    }
}
