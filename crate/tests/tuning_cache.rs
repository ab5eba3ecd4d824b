//! The matmul tuning cache across processes: `train` on the GPU caches the autotuner's choices
//! per adapter, a second process takes them instead of tuning again, `--retune` tunes again,
//! and a corrupt or foreign cache file is ignored with one notice. Each test has its own cache
//! directory ($SHARDLAB_CACHE_DIR). Without a GPU adapter the tests fail unless
//! SHARDLAB_ALLOW_NO_GPU=1.
use std::path::{Path, PathBuf};

mod common;

const TUNED: &str = "tuned the matmul for";
const IGNORED: &str = "ignoring the matmul tuning cache";

struct Run {
    code: i32,
    err: String,
}

fn train(cache: &Path, extra: &[&str]) -> Run {
    let out = common::command(&["train", "--json", "--steps", "1"])
        .args(common::TINY)
        .args(extra)
        .env("SHARDLAB_CACHE_DIR", cache)
        .output()
        .expect("run shardlab");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    Run {
        code: out.status.code().unwrap_or(-1),
        err,
    }
}

fn cache_dir(name: &str) -> common::TempDir {
    common::temp_dir("tuning", name)
}

/// The one matmul cache file in `dir`.
fn cache_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let prefix = format!("matmul-v{}-", shardlab::kernels::TuningCache::VERSION);
            name.starts_with(&prefix) && name.ends_with(".json")
        })
        .collect();
    assert_eq!(files.len(), 1, "one matmul cache file per adapter: {files:?}");
    files[0].clone()
}

/// The first run on a fresh cache directory; None when there is no adapter and that is allowed.
fn first_run(dir: &Path) -> Option<Run> {
    let r = train(dir, &[]);
    if r.code != 0 && std::env::var("SHARDLAB_ALLOW_NO_GPU").as_deref() == Ok("1") {
        eprintln!("skipped: no GPU adapter ({})", r.err.trim());
        return None;
    }
    assert_eq!(r.code, 0, "{}", r.err);
    Some(r)
}

fn notices(err: &str, what: &str) -> usize {
    err.lines().filter(|l| l.contains(what)).count()
}

#[test]
fn a_second_process_takes_the_cached_choices_and_retune_times_them_again() {
    let dir = cache_dir("reuse");
    let Some(first) = first_run(&dir) else { return };
    assert_eq!(notices(&first.err, TUNED), 1, "{}", first.err);
    let file = cache_file(&dir);
    let cache: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let choices = cache["matmul"].as_object().expect("choices per shape class");
    assert!(!choices.is_empty());
    assert!(choices.keys().all(|k| k.starts_with("matmul/")), "{cache}");

    // Plant a choice the autotuner would not make: the second process runs it as cached.
    let planted: serde_json::Map<String, serde_json::Value> =
        choices.keys().map(|k| (k.clone(), "naive".into())).collect();
    let mut planted_cache = cache.clone();
    planted_cache["matmul"] = planted.into();
    let text = serde_json::to_string_pretty(&planted_cache).unwrap();
    std::fs::write(&file, &text).unwrap();
    let second = train(&dir, &[]);
    assert_eq!(second.code, 0, "{}", second.err);
    assert_eq!(notices(&second.err, TUNED), 0, "no re-tune: {}", second.err);
    assert_eq!(notices(&second.err, IGNORED), 0, "{}", second.err);
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        text,
        "the cache is left as it was"
    );

    let third = train(&dir, &["--retune"]);
    assert_eq!(third.code, 0, "{}", third.err);
    assert_eq!(notices(&third.err, TUNED), 1, "--retune tunes again: {}", third.err);
    let retuned: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(
        retuned["matmul"].as_object().unwrap().len(),
        choices.len(),
        "the same classes, timed again: {retuned}"
    );
}

#[test]
fn a_corrupt_or_foreign_tuning_cache_is_ignored_with_one_notice() {
    let dir = cache_dir("corrupt");
    if first_run(&dir).is_none() {
        return;
    }
    let file = cache_file(&dir);
    let good = std::fs::read_to_string(&file).unwrap();
    let mut foreign: serde_json::Value = serde_json::from_str(&good).unwrap();
    foreign["adapter"] = "another GPU (Metal, 1.0)".into();
    for (bad, why) in [
        ("{\"version\": 1, \"matmul\": [tr".to_string(), "not a tuning cache"),
        (foreign.to_string(), "another GPU"),
    ] {
        std::fs::write(&file, &bad).unwrap();
        let r = train(&dir, &[]);
        assert_eq!(r.code, 0, "{}", r.err);
        assert_eq!(notices(&r.err, IGNORED), 1, "{}", r.err);
        let notice = r.err.lines().find(|l| l.contains(IGNORED)).unwrap();
        assert!(notice.contains(why), "{notice}");
        assert_eq!(notices(&r.err, TUNED), 1, "tuned anew: {}", r.err);
        let rewritten: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_ne!(
            rewritten["adapter"], "another GPU (Metal, 1.0)",
            "rewritten for this adapter"
        );
    }
}
