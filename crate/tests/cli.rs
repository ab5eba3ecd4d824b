//! The `shardlab` command line as a user meets it: JSON lines, one-line errors, exit code 2.
mod common;

fn shardlab(args: &[&str]) -> (i32, String, String) {
    common::output(&mut common::command(args))
}

use common::TINY;

#[test]
fn train_json_prints_one_line_per_step_then_done() {
    let mut args = vec!["train", "--cpu", "--json", "--steps", "3"];
    args.extend_from_slice(TINY);
    let (code, out, err) = shardlab(&args);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 4);
    for (k, l) in lines[..3].iter().enumerate() {
        assert_eq!(l["step"], k as u64);
        assert!(l["loss"].as_f64().unwrap() > 0.0 && l["step_ms"].as_f64().is_some());
    }
    assert_eq!(lines[3]["done"], true);
    assert_eq!(lines[3]["steps"], 3);
    // Timed like the exported JAX scripts: the median after two warm-up steps.
    assert_eq!(lines[3]["mode"], "single");
    assert_eq!(lines[3]["timed_steps"], 1);
    assert_eq!(lines[3]["median_step_ms"], lines[2]["step_ms"]);
    assert!(lines[3]["final_loss"].as_f64().unwrap() < lines[0]["loss"].as_f64().unwrap());
}

#[test]
fn impossible_configurations_exit_2_with_one_line_naming_the_fix() {
    let cases: &[(&[&str], &str)] = &[
        (&["train", "--cpu", "--d-model", "30", "--heads", "4"], "--heads"),
        (&["train", "--cpu", "--data", "text"], "--text FILE"),
        (&["train", "--cpu", "--vocab", "2", "--data", "copy"], "--vocab"),
        (&["train", "--cpu", "--lr=-1"], "--lr"),
        (&["train", "--cpu", "--steps", "0"], "--steps"),
        (&["train", "--cpu", "--dropout", "1.5"], "--dropout"),
        (&["train", "--no-such-flag"], "--no-such-flag"),
    ];
    for (args, needle) in cases {
        let (code, _, err) = shardlab(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: error should mention {needle}: {err}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}

#[test]
fn text_files_that_cannot_be_a_corpus_are_rejected_clearly() {
    let dir = common::temp_dir("cli", "text");
    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let binary = dir.join("blob.bin");
    std::fs::write(&binary, [0u8, 159, 146, 150, 0, 1]).unwrap();
    let short = dir.join("short.txt");
    std::fs::write(&short, "hi").unwrap();
    for (path, needle) in [(&empty, "empty"), (&binary, "binary"), (&short, "too short")] {
        let mut args = vec!["train", "--cpu", "--data", "text", "--text", path.to_str().unwrap()];
        args.extend_from_slice(TINY);
        let (code, _, err) = shardlab(&args);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(needle), "{}: {err}", path.display());
    }
    let ok = dir.join("ok.txt");
    std::fs::write(&ok, "the quick brown fox jumps over the lazy dog. ".repeat(4)).unwrap();
    let args = [
        "train",
        "--cpu",
        "--json",
        "--steps",
        "2",
        "--data",
        "text",
        "--text",
        ok.to_str().unwrap(),
        "--layers",
        "1",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--seq",
        "8",
        "--batch",
        "2",
        "--vocab",
        "32",
    ];
    let (code, out, err) = shardlab(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"done\":true"));
}

#[test]
fn inspect_prints_a_readable_train_step_program() {
    let mut args = vec!["inspect", "--cpu", "--steps", "1"];
    args.extend_from_slice(TINY);
    let (code, out, err) = shardlab(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("dot_general("), "{out}");
    assert!(out.contains("contracting=("));
    assert!(out.contains("adamw_update("));
    assert!(out.contains("# h0.qkv") || out.contains("h0.qkv"));
    assert!(out.contains("FLOPs per device per step"));
    assert!(
        out.contains("measured on") && out.contains("modelled on 1 x TPU v4"),
        "{out}"
    );
    assert!(out.contains("rng") && out.contains("matmul"), "{out}");
}

#[test]
fn inspect_json_reports_collectives_memory_and_modelled_times_for_shard_map() {
    let mut args = vec![
        "inspect",
        "--json",
        "--cpu",
        "--steps",
        "1",
        "--mode",
        "shard_map",
        "--strategy",
        "fsdp",
        "--mesh",
        "dp=2",
    ];
    args.extend_from_slice(TINY);
    let (code, out, err) = shardlab(&args);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["devices"], 2);
    assert!(v["collectives"]["all-gather"]["count"].as_u64().unwrap() > 0);
    assert!(v["collectives"]["reduce-scatter"]["bytes"].as_u64().unwrap() > 0);
    for k in ["params", "optimizer_state", "activations", "total"] {
        assert!(v["peak_bytes_per_device"][k].as_u64().is_some(), "{k}");
    }
    assert!(v["flops_per_device"].as_u64().unwrap() > 0);
    assert!(v["rng_bits_per_device"].as_u64().is_some());
    assert_eq!(v["modelled"]["device"], "tpu_v4");
    assert_eq!(v["modelled"]["devices"], 2);
    assert!(v["modelled"]["step_ms"].as_f64().unwrap() > 0.0);
    assert!(v["modelled"]["breakdown_ms"]["collectives"].as_f64().unwrap() > 0.0);
    assert!(v["program"].as_str().unwrap().contains("psum_scatter("));
}

#[test]
fn shard_map_flags_that_do_not_fit_exit_2_naming_the_fix() {
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "train",
                "--cpu",
                "--mode",
                "shard_map",
                "--strategy",
                "dp",
                "--mesh",
                "tp=2",
            ],
            "'dp'",
        ),
        (
            &[
                "train",
                "--cpu",
                "--mode",
                "shard_map",
                "--strategy",
                "dp",
                "--mesh",
                "dp=3",
            ],
            "--batch",
        ),
        (
            &[
                "train",
                "--cpu",
                "--mode",
                "shard_map",
                "--strategy",
                "tp",
                "--mesh",
                "tp=3",
            ],
            "--heads",
        ),
        (&["train", "--cpu", "--mode", "shard_map", "--mesh", "dp=0"], "--mesh"),
        (&["train", "--cpu", "--mesh", "dp=2"], "--mode shard_map"),
    ];
    for (args, needle) in cases {
        let (code, _, err) = shardlab(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: should mention {needle}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn export_jax_writes_a_python_script_for_the_same_run() {
    let dir = common::temp_dir("cli", "export");
    let out = dir.join("run.py");
    let mut args = vec![
        "export",
        "jax",
        "--mode",
        "shard_map",
        "--strategy",
        "dp",
        "--mesh",
        "dp=2",
        "--steps",
        "3",
    ];
    args.extend_from_slice(TINY);
    args.extend_from_slice(&["-o", out.to_str().unwrap()]);
    let (code, _, err) = shardlab(&args);
    assert_eq!(code, 0, "{err}");
    let script = std::fs::read_to_string(&out).unwrap();
    assert!(
        script.contains("shard_map") && script.contains("psum"),
        "{}",
        &script[..300.min(script.len())]
    );
    let (code, _, err) = shardlab(&[
        "export",
        "jax",
        "--mode",
        "shard_map",
        "--strategy",
        "tp",
        "--mesh",
        "dp=2",
    ]);
    assert_eq!(code, 2, "a mesh without 'tp' must be refused: {err}");
    assert!(err.contains("tp"), "{err}");
}

/// The ~400M-parameter configuration of the JAX report (GPT-2 medium shape).
const MEDIUM: &[&str] = &[
    "--layers",
    "24",
    "--d-model",
    "1024",
    "--heads",
    "16",
    "--seq",
    "1024",
    "--batch",
    "32",
    "--vocab",
    "50304",
    "--dropout",
    "0.1",
];

#[test]
fn plan_prices_a_400m_model_on_tpu_v4_without_running_it() {
    let mut args = vec![
        "plan", "--json", "--device", "tpu_v4", "--mode", "auto", "--mesh", "dp=4",
    ];
    args.extend_from_slice(MEDIUM);
    let started = std::time::Instant::now();
    let (code, out, err) = shardlab(&args);
    assert_eq!(code, 0, "{err}");
    assert!(started.elapsed().as_secs() < 60, "plan took {:?}", started.elapsed());
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(v["device"], "tpu_v4");
    assert_eq!(v["devices"], 4);
    assert_eq!(v["mode"], "auto");
    let step_ms = v["step_ms"].as_f64().unwrap();
    assert!(step_ms > 0.0 && step_ms.is_finite(), "{v}");
    let breakdown: f64 = v["breakdown_ms"]
        .as_object()
        .unwrap()
        .values()
        .map(|x| x.as_f64().unwrap())
        .sum();
    assert!((breakdown - step_ms).abs() < 1e-6 * step_ms, "{breakdown} vs {step_ms}");
    let bytes = &v["bytes_per_device"];
    // About 400M parameters, replicated under dp: 1.4 to 1.8 GB of f32 per device.
    let params = bytes["params"].as_u64().unwrap();
    assert!((1_400_000_000..1_800_000_000).contains(&params), "{params}");
    assert_eq!(bytes["optimizer_state"].as_u64().unwrap(), 2 * params);
    assert!(bytes["total"].as_u64().unwrap() > 3 * params);
    assert!(v["capacity_bytes"].as_u64().unwrap() > 0);
    assert!(v["fits"].is_boolean());
    assert!(v["collectives"]["all-reduce"]["count"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn plan_scales_to_hundreds_of_devices() {
    let mut args = vec![
        "plan",
        "--json",
        "--device",
        "h100",
        "--mode",
        "shard_map",
        "--strategy",
        "fsdp",
        "--mesh",
        "dp=256",
    ];
    args.extend_from_slice(&MEDIUM[..MEDIUM.len() - 6]);
    args.extend_from_slice(&["--batch", "256", "--vocab", "50304"]);
    let (code, out, err) = shardlab(&args);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(v["devices"], 256);
    assert!(v["collectives"]["all-gather"]["count"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn plan_rejects_unknown_devices_and_bad_flags_with_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["plan", "--device", "tpu_v9"], "tpu_v4"),
        (&["inspect", "--cpu", "--device", "tpu_v9"], "tpu_v4"),
        (
            &["plan", "--device", "h100", "--d-model", "30", "--heads", "4"],
            "--heads",
        ),
        (&["plan", "--device", "h100", "--mode", "auto", "--mesh", "dp=3"], "dp"),
        (&["plan", "--mode", "auto"], "--device"),
    ];
    for (args, needle) in cases {
        let (code, out, err) = shardlab(args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(
            err.trim().lines().filter(|l| l.starts_with("error")).count(),
            1,
            "{args:?}: {err}"
        );
    }
}

#[test]
fn plan_writes_its_timeline_as_a_chrome_trace_and_can_switch_overlap_off() {
    let dir = common::temp_dir("cli", "trace");
    let file = dir.join("seed.json");
    let base = [
        "plan",
        "--json",
        "--preset",
        "seed",
        "--device",
        "h100",
        "--mode",
        "shard_map",
        "--mesh",
        "dp=4",
    ];
    let mut args = base.to_vec();
    args.extend(["--trace", file.to_str().unwrap()]);
    let (code, out, err) = shardlab(&args);
    assert_eq!(code, 0, "{err}");
    let on: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let trace: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let named = |what: &str| events.iter().filter(|e| e["ph"] == "M" && e["name"] == what).count();
    // One process per device, a compute and a communication thread each.
    assert_eq!((named("process_name"), named("thread_name")), (4, 8));
    assert!(events.iter().any(|e| e["ph"] == "X" && e["name"] == "psum"));
    let mut args = base.to_vec();
    args.push("--no-overlap");
    let (code, out, err) = shardlab(&args);
    assert_eq!(code, 0, "{err}");
    let off: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let ms = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    assert_eq!(
        (on["overlap"].as_bool(), off["overlap"].as_bool()),
        (Some(true), Some(false))
    );
    assert!((ms(&off, "step_ms") - ms(&off, "serial_ms")).abs() < 1e-9 * ms(&off, "step_ms"));
    assert!(ms(&on, "step_ms") < ms(&off, "step_ms"), "{on} {off}");
    assert_eq!(ms(&on, "serial_ms"), ms(&off, "serial_ms"));
}

#[test]
fn a_trace_that_cannot_be_written_or_has_nothing_to_trace_exits_2() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["plan", "--device", "h100", "--trace", "/nonexistent-dir/t.json"],
            "--trace",
        ),
        (&["bench", "train", "--trace", "t.json"], "--ops"),
    ];
    for (args, needle) in cases {
        let (code, out, err) = shardlab(args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn every_page_preset_plans_from_the_command_line_on_its_mesh() {
    // The pipeline runs in shard_map mode only: automatic mode is refused (hostile.rs).
    for (preset, devices, mode) in [
        ("seed", 8, "auto"),
        ("dp", 4, "auto"),
        ("fsdp", 4, "auto"),
        ("tp", 2, "auto"),
        ("dp_tp", 4, "auto"),
        ("pp", 4, "shard_map"),
        ("moe", 4, "auto"),
    ] {
        let (code, out, err) = shardlab(&["plan", "--json", "--preset", preset, "--mode", mode, "--device", "h100"]);
        assert_eq!(code, 0, "--preset {preset}: {err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["devices"], devices, "--preset {preset}: {out}");
    }
}

#[test]
fn the_pipeline_preset_brings_its_microbatches_and_an_explicit_count_wins() {
    let microbatches = |more: &[&str]| {
        let mut args = vec!["export", "jax", "--preset", "pp", "--mode", "shard_map"];
        args.extend_from_slice(more);
        let (code, out, err) = shardlab(&args);
        assert_eq!(code, 0, "{more:?}: {err}");
        let line = out
            .lines()
            .find(|l| l.starts_with("MICROBATCHES = "))
            .expect("the script's microbatches");
        line["MICROBATCHES = ".len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(microbatches(&[]), "4");
    assert_eq!(microbatches(&["--microbatches", "2"]), "2");
}

/// Gradient accumulation with dropout where the sequence is split: each microbatch's masks
/// are the device's blocks of the one-device run's, so the losses are its losses.
#[test]
fn microbatches_with_dropout_over_a_split_sequence_train_the_one_device_losses() {
    // TINY with a batch of 4: two rows a 'dp' device, one a microbatch.
    let mut tiny = TINY.to_vec();
    let batch = tiny.iter().position(|a| *a == "--batch").expect("TINY sets --batch") + 1;
    tiny[batch] = "4";
    let losses = |parallel: &[&str]| -> Vec<f64> {
        let mut args = vec!["train", "--cpu", "--json", "--steps", "3", "--microbatches", "2"];
        args.extend_from_slice(&["--dropout", "0.1", "--rng", "original"]);
        args.extend_from_slice(parallel);
        args.extend_from_slice(&tiny);
        let (code, out, err) = shardlab(&args);
        assert_eq!(code, 0, "{parallel:?}: {err}");
        out.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter_map(|l| l["loss"].as_f64())
            .collect()
    };
    let one = losses(&[]);
    assert_eq!(one.len(), 3);
    for parallel in [
        &[
            "--mode",
            "shard_map",
            "--strategy",
            "dp_cp",
            "--mesh",
            "dp=2,cp=2",
            "--cp-order",
            "zigzag",
        ][..],
        &["--mode", "shard_map", "--strategy", "cp", "--mesh", "cp=2"],
        &["--mode", "auto", "--strategy", "cp", "--mesh", "cp=2"],
        &[
            "--mode",
            "auto",
            "--strategy",
            "cp",
            "--mesh",
            "cp=2",
            "--cp-order",
            "zigzag",
        ],
        &["--mode", "shard_map", "--strategy", "tp_sp", "--mesh", "tp=2"],
    ] {
        let got = losses(parallel);
        assert_eq!(got.len(), one.len(), "{parallel:?}");
        for (k, (a, b)) in got.iter().zip(&one).enumerate() {
            assert!((a - b).abs() <= 1e-5, "{parallel:?}: loss {k}: {a} vs one device {b}");
        }
    }
}

#[test]
fn a_spec_may_name_an_intermediate_as_the_planner_matches_names() {
    let base = ["plan", "--json", "--preset", "dp", "--mode", "auto", "--device", "h100"];
    let mut args = base.to_vec();
    args.extend(["--spec", "h0.att=P()"]);
    let (code, _, err) = shardlab(&args);
    assert_eq!(code, 0, "{err}");
    let mut args = base.to_vec();
    args.extend(["--spec", "h0.w_fc.m=P()"]);
    let (code, _, err) = shardlab(&args);
    assert_eq!(code, 2);
    assert!(err.contains("give `h0.w_fc` the spec"), "{err}");
}

/// `bench compare` races every mode on a zig-zag ring: automatic and explicit mode on the
/// reordered sequence, shard_map mode on the ring's chunks.
#[test]
fn bench_compare_races_every_mode_on_a_zigzag_ring() {
    let mut args = vec![
        "bench",
        "compare",
        "--cpu",
        "--steps",
        "1",
        "--strategy",
        "cp",
        "--mesh",
        "cp=2",
    ];
    args.extend_from_slice(&["--cp-order", "zigzag"]);
    args.extend_from_slice(TINY);
    let (code, out, err) = shardlab(&args);
    assert_eq!(code, 0, "{err}");
    for mode in ["auto", "explicit", "shard_map"] {
        assert!(out.lines().any(|l| l.starts_with(mode)), "{mode}: {out}");
    }
}
