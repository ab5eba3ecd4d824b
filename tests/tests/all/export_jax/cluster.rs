//! The exported script as a cluster runs it: several JAX processes on localhost (gloo CPU
//! collectives), each with its own simulated devices and its own rows of every batch; killed
//! and resumed from its checkpoints; refusing bad launch settings with one line.
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shardlab::ir::CpOrder;
use shardlab::plan::{Mode, Parallelism, Schedule, Zero};

use super::*;

/// A launch's wall-clock limit: a process whose peer died waits for it in a collective.
const LIMIT: Duration = Duration::from_secs(300);

fn script_file(name: &str, script: &str) -> PathBuf {
    write_script(name, script)
}

fn python(script: &Path, args: &[String]) -> Command {
    let mut c = Command::new(shardlab_tests::python_program());
    c.arg(script)
        .args(args)
        .env_remove("XLA_FLAGS")
        .env("JAX_PLATFORMS", "cpu");
    c
}

/// A free port on localhost for the coordinator.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits for `child` until [`LIMIT`] after `start`: its status and streams, or, past that, Err
/// with what it wrote to stderr (it is killed).
fn finish(mut child: Child, start: Instant) -> Result<(bool, String, String), String> {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            return Ok((
                status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `script` as `processes` processes of `devices` CPU devices each; returns process 0's
/// stdout after checking that every process succeeded and that only process 0 printed. JAX's
/// gloo collectives on the CPU now and then stall two processes while they set up a group's
/// communicator (seen beside other tests, never alone): a launch that stalls is killed and run
/// once more on a fresh port, which the test's stderr says.
fn launch(name: &str, script: &Path, processes: usize, devices: usize, extra: &[&str]) -> String {
    try_launch(name, script, processes, devices, extra).unwrap_or_else(|stderr| {
        eprintln!("{name}: stalled for {LIMIT:?} (stderr below); launching it again\n{stderr}");
        try_launch(name, script, processes, devices, extra)
            .unwrap_or_else(|stderr| panic!("{name}: still running after {LIMIT:?}, twice; stderr:\n{stderr}"))
    })
}

/// One launch of [`launch`]: Err with the stderr of the process that was still running after
/// [`LIMIT`] (every process is then killed).
fn try_launch(name: &str, script: &Path, processes: usize, devices: usize, extra: &[&str]) -> Result<String, String> {
    let port = free_port();
    let start = Instant::now();
    let mut children: Vec<Child> = (0..processes)
        .map(|i| {
            let mut args: Vec<String> = vec!["--local-devices".into(), devices.to_string()];
            if processes > 1 {
                args.extend([
                    "--coordinator".into(),
                    format!("127.0.0.1:{port}"),
                    "--num-processes".into(),
                    processes.to_string(),
                    "--process-id".into(),
                    i.to_string(),
                ]);
            }
            args.extend(extra.iter().map(|s| s.to_string()));
            python(script, &args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut first = String::new();
    let mut i = 0;
    while !children.is_empty() {
        let child = children.remove(0);
        let (ok, stdout, stderr) = match finish(child, start) {
            Ok(done) => done,
            Err(stderr) => {
                for mut rest in children {
                    let _ = rest.kill();
                    let _ = rest.wait();
                }
                return Err(stderr);
            }
        };
        assert!(ok, "{name}: process {i} of {processes} failed:\n{stdout}\n{stderr}");
        if i == 0 {
            first = stdout;
        } else {
            assert!(stdout.is_empty(), "{name}: process {i} printed:\n{stdout}");
        }
        i += 1;
    }
    Ok(first)
}

/// The losses of the step lines and the done line's final loss.
fn losses_of(name: &str, stdout: &str) -> Vec<f64> {
    let mut losses = vec![];
    for line in stdout.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{name}: `{line}` is not JSON: {e}"));
        if let Some(l) = v["loss"].as_f64() {
            losses.push(l);
        } else if let Some(l) = v["final_loss"].as_f64() {
            losses.push(l);
        }
    }
    losses
}

/// A composition of issue 48 on 8 devices, in one mode, with the options that refine it, and
/// how many processes run it.
struct Composed {
    mesh: &'static str,
    mode: Mode,
    processes: usize,
    sequence_parallel: bool,
    order: CpOrder,
    schedule: Schedule,
    layout: RngLayout,
}

const fn composed(mesh: &'static str, mode: Mode, processes: usize) -> Composed {
    Composed {
        mesh,
        mode,
        processes,
        sequence_parallel: false,
        order: CpOrder::Contiguous,
        schedule: Schedule::Gpipe,
        layout: RngLayout::Partitionable,
    }
}

/// Meshes of three kinds of axes (tests/tests/all/compositions.rs holds them to the one-device
/// run): pipelines in shard_map mode, the others in both, and a ring in explicit mode.
/// Together they cover dp, fsdp, tp (with sequence parallelism and without), a pipeline under
/// both schedules and a ring in both orders (zig-zag in shard_map's ring and in jit's reordered
/// sequence), in every mode where the mode expresses them, and
/// both RNG layouts; a pipeline, a ring and each mode across two processes (each compiles the
/// step: the others run as one process, which costs half).
const COMPOSITIONS: [Composed; 7] = [
    composed("dp=2,tp=2,pp=2", Mode::ShardMap, 2),
    composed("fsdp=4,tp=2", Mode::ShardMap, 1),
    Composed {
        layout: RngLayout::Original,
        ..composed("fsdp=4,tp=2", Mode::Auto, 2)
    },
    Composed {
        order: CpOrder::Zigzag,
        layout: RngLayout::Original,
        ..composed("dp=2,cp=2,tp=2", Mode::ShardMap, 2)
    },
    Composed {
        order: CpOrder::Zigzag,
        ..composed("dp=2,cp=2,tp=2", Mode::Auto, 1)
    },
    composed("dp=2,cp=2,tp=2", Mode::Explicit, 2),
    Composed {
        sequence_parallel: true,
        schedule: Schedule::OneFOneB,
        ..composed("tp=4,pp=2", Mode::ShardMap, 1)
    },
];

impl Composed {
    fn name(&self) -> String {
        let sp = if self.sequence_parallel { " sp" } else { "" };
        format!("{} {}{sp}, {} process(es)", self.mode.name(), self.mesh, self.processes)
    }

    /// The golden model with two blocks and a batch of 8 (every mesh above splits it),
    /// dropout 0.1 with each device drawing its block of the one-device run's masks
    /// (`--dropout-key global`), AdamW; a pipeline runs two microbatches.
    fn options(&self) -> TrainerOptions {
        let par = Parallelism::new(mesh(self.mesh), Zero::Off, self.sequence_parallel).unwrap();
        let pipeline = par.is_pipeline();
        let parallel = match self.mode {
            Mode::Auto => Parallel::Auto { par, specs: vec![] },
            Mode::Explicit => Parallel::Explicit {
                par,
                axis_types: vec![],
                specs: vec![],
            },
            _ => Parallel::ShardMap {
                par,
                dropout_key: DropoutKey::Global,
            },
        };
        let mut opts = golden_batch8(parallel);
        opts.config.layers = 2;
        opts.config.dropout = 0.1;
        opts.optimizer = Optimizer::AdamW { lr: 1e-2 };
        opts.seed = 3;
        opts.rng_layout = self.layout;
        opts.cp_order = self.order;
        opts.schedule = self.schedule;
        opts.microbatches = if pipeline { 2 } else { 1 };
        opts
    }
}

const CLUSTER_STEPS: u64 = 3;

/// Issue 48's compositions exported and run as a cluster runs them, to shardlab's losses:
/// two JAX processes of 4 CPU devices each (gloo collectives, every process making only its
/// own rows), or one process of 8.
#[test]
fn composed_meshes_train_to_shardlabs_losses_in_both_modes_across_processes() {
    jax_or_skip!();
    for c in &COMPOSITIONS {
        let name = c.name();
        let opts = c.options();
        let file: String = name.chars().filter(char::is_ascii_alphanumeric).collect();
        let path = script_file(&format!("cluster_{file}"), &jax_script(&opts, CLUSTER_STEPS).unwrap());
        let got = losses_of(&name, &launch(&name, &path, c.processes, 8 / c.processes, &[]));
        assert_losses_close(&name, &got, &shardlab_losses(&opts, CLUSTER_STEPS), 1e-4);
        shardlab_tests::remove_script(&path);
    }
}

/// `script` with JAX's persistent compilation cache in `jax-cache` beside it: the runs of one
/// script after the first load its compiled step instead of compiling it again.
fn cached(script: &Path, args: &[String]) -> Command {
    let mut c = python(script, args);
    c.env("JAX_COMPILATION_CACHE_DIR", script.with_file_name("jax-cache"))
        .env("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        .env("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0");
    c
}

/// A run's lines until it printed `until` step lines, then killed (SIGKILL).
fn run_and_kill(script: &Path, args: &[String], until: usize) -> Vec<f64> {
    let mut child = cached(script, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut losses = vec![];
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if let Some(l) = v["loss"].as_f64() {
            losses.push(l);
        }
        if losses.len() == until {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    losses
}

fn run_ok(name: &str, script: &Path, args: &[String]) -> String {
    let out = cached(script, args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Stopped early by a smaller --steps, then killed mid-way, then run to the end: every loss is
/// bit for bit the uninterrupted run's (dropout and AdamW: the RNG and the optimizer state
/// carry over). A run of another configuration is refused and writes nothing.
#[test]
fn a_killed_run_resumes_from_its_checkpoint_to_the_losses_of_an_uninterrupted_run() {
    jax_or_skip!();
    let mut opts = golden_batch8(shard_map(Strategy::Dp, "dp=2"));
    opts.config.dropout = 0.1;
    opts.optimizer = Optimizer::AdamW { lr: 1e-2 };
    opts.seed = 3;
    let script = script_file("resume", &jax_script(&opts, 6).unwrap());
    let dir = script.with_file_name("resume-checkpoints");
    let _ = std::fs::remove_dir_all(&dir);
    let ck = |more: &[&str]| -> Vec<String> {
        let mut a = vec!["--checkpoint-dir".to_string(), dir.display().to_string()];
        a.extend(more.iter().map(|s| s.to_string()));
        a
    };
    let whole = losses_of("uninterrupted", &run_ok("uninterrupted", &script, &[]));
    let early = losses_of("--steps 2", &run_ok("--steps 2", &script, &ck(&["--steps", "2"])));
    assert_eq!(early[..2], whole[..2], "the first two steps");
    assert_eq!(listing(&dir), ["step-2"]);
    let killed = run_and_kill(&script, &ck(&["--checkpoint-every", "1"]), 2);
    assert_eq!(killed, whole[2..4], "resumed at step 2, killed after step 3");
    let last = run_ok("resumed", &script, &ck(&[]));
    let resumed: Value = serde_json::from_str(last.lines().next().unwrap()).unwrap();
    let from = resumed["step"].as_u64().unwrap() as usize;
    assert!(resumed["resumed"] == true && (3..=5).contains(&from), "{last}");
    assert_eq!(losses_of("resumed", &last), whole[from..], "resumed from step {from}");
    assert!(
        !listing(&dir).iter().any(|n| n.starts_with(".tmp")),
        "{:?}",
        listing(&dir)
    );

    let mut other = opts.clone();
    other.optimizer = Optimizer::AdamW { lr: 2e-2 };
    let other_script = script_file("resume_other", &jax_script(&other, 6).unwrap());
    let before = listing(&dir);
    let out = python(&other_script, &ck(&[])).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.lines().count() == 1 && err.contains("different run") && err.contains("LR 0.01 there, 0.02 here"),
        "{err}"
    );
    assert_eq!(listing(&dir), before, "a refused run writes nothing");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(script.with_file_name("jax-cache"));
    shardlab_tests::remove_script(&script);
    shardlab_tests::remove_script(&other_script);
}

#[test]
fn bad_launch_settings_get_one_line_naming_the_fix() {
    jax_or_skip!();
    let script = script_file(
        "launch_errors",
        &jax_script(&golden_options(shard_map(Strategy::Dp, "dp=2")), 2).unwrap(),
    );
    for (args, needle) in [
        (vec!["--colour", "red"], "unrecognized arguments: --colour red"),
        (
            vec!["--num-processes", "2", "--process-id", "2"],
            "--process-id 2 is out of range for --num-processes 2: give 0 to 1",
        ),
        (
            vec!["--local-devices", "1"],
            "the mesh dp=2 needs 2 devices but 1 process(es) found 1 device(s)",
        ),
        (
            vec!["--checkpoint-every", "2"],
            "--checkpoint-every needs --checkpoint-dir",
        ),
        (vec!["--coordinator", "nohost"], "--coordinator nohost: give HOST:PORT"),
    ] {
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        let out = python(&script, &args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
        assert!(lines.len() == 1 && lines[0].contains(needle), "{args:?}: {err}");
    }
    shardlab_tests::remove_script(&script);
}
