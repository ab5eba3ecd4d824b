//! `cargo xtask device-bench`: the prepared benchmark for a machine with a GPU (issue 54), one
//! command that fits a 10-minute device call. It builds shardlab (or takes `--shardlab PATH` where
//! the machine has no Rust), then runs `info`, `bench kernels` (every matmul variant at n = 2048),
//! `bench train --ops` for `small` and GPT-2 124M, `bench peers` against JAX on the same GPU
//! (GPT-2 124M included), and `bench compare` on the seed preset in both RNG layouts and on the
//! largest seed-shaped model that fits, each under a time limit within one deadline. It writes one
//! Markdown report for docs/benchmarks/ with the issue's goals read off the runs.
//!
//! JAX: `--python`, else $SHARDLAB_PYTHON, else python3, else target/jax-venv, the first that
//! imports jax. Where its JAX has no GPU and the machine has one, it installs JAX's CUDA wheels
//! from `--wheels DIR` (or the network) into target/device-bench/site; failing that, JAX runs on the
//! CPU and the report says so.
//!
//! `--dry-run` runs the same steps at tiny sizes (lavapipe, JAX on the CPU) in about a minute:
//! the plumbing, checked by this module's test.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::{cargo, output_of, root, run, step, target_dir, Res};

const USAGE: &str = "usage: cargo xtask device-bench [--dry-run] [--shardlab PATH] [--python PATH] [--wheels DIR] \
                     [--memory-budget SIZE] [--deadline SECONDS] [--out FILE]";

/// The whole run's deadline by default: the issue's 8 minutes, less the build.
const DEADLINE_S: u64 = 450;

/// What the command was asked.
#[derive(Debug, Default)]
struct Options {
    dry_run: bool,
    shardlab: Option<PathBuf>,
    python: Option<PathBuf>,
    wheels: Option<PathBuf>,
    budget: Option<String>,
    deadline_s: Option<u64>,
    out: Option<PathBuf>,
}

impl Options {
    fn parse(args: &[String]) -> Res<Options> {
        let mut o = Options::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |flag: &str| {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
            };
            match a.as_str() {
                "--dry-run" => o.dry_run = true,
                "--shardlab" => o.shardlab = Some(value(a)?.into()),
                "--python" => o.python = Some(value(a)?.into()),
                "--wheels" => o.wheels = Some(value(a)?.into()),
                "--memory-budget" => o.budget = Some(value(a)?),
                "--deadline" => {
                    let v = value(a)?;
                    o.deadline_s = Some(
                        v.parse()
                            .map_err(|_| format!("--deadline {v}: give whole seconds, e.g. --deadline 450"))?,
                    );
                }
                "--out" => o.out = Some(value(a)?.into()),
                other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
            }
        }
        Ok(o)
    }
}

/// One run of shardlab in the benchmark.
#[derive(Debug, Clone)]
struct Step {
    title: String,
    args: Vec<String>,
    /// Seconds it may take (within what is left of the deadline).
    limit_s: u64,
    /// Whether it prints JSON lines the report renders as tables.
    json: bool,
}

impl Step {
    fn new(title: &str, args: &str, limit_s: u64) -> Step {
        let args: Vec<String> = args.split_whitespace().map(str::to_string).collect();
        let json = args.iter().any(|a| a == "--json");
        Step {
            title: title.into(),
            args,
            limit_s,
            json,
        }
    }

    fn with(mut self, extra: &[String]) -> Step {
        self.args.extend_from_slice(extra);
        self
    }
}

/// A seed-shaped model: the seed preset's (dropout 0.1, AdamW 3e-3, random init, dp=8, the
/// original RNG layout) at other sizes. `(layers, d_model, heads, seq, batch)`.
type Shape = (usize, usize, usize, usize, usize);

/// The seed-shaped ladder `bench compare` climbs down, largest first: the first that fits the
/// memory budget runs. Each step of the largest does about 9 TFLOP (8 simulated devices' batch
/// of 64 sequences of 256), seconds on a GPU that runs shardlab's matmuls at 10 TFLOP/s or more.
const LADDER: [Shape; 3] = [(12, 768, 12, 256, 64), (6, 512, 8, 256, 64), (4, 256, 4, 128, 128)];
/// The dry run's: one tiny model.
const DRY_LADDER: [Shape; 1] = [(1, 32, 2, 16, 8)];

fn seed_shaped((layers, d, heads, seq, batch): Shape, rng: &str, steps: usize) -> String {
    format!(
        "bench compare --json --steps {steps} --rng {rng} --layers {layers} --d-model {d} --heads {heads} --seq {seq} \
         --batch {batch} --vocab 256 --dropout 0.1 --opt adamw --lr 3e-3 --strategy dp --mesh dp=8"
    )
}

/// The steps, in order: the issue's sizes, or tiny ones for the dry run.
fn plan(dry: bool, python: &Path, budget: &str) -> Vec<Step> {
    let budget = vec!["--memory-budget".to_string(), budget.to_string()];
    let py = vec!["--python".to_string(), python.display().to_string()];
    if dry {
        let ladder = DRY_LADDER.map(|s| {
            Step::new(
                "compare, the largest seed-shaped model that fits",
                &seed_shaped(s, "original", 1),
                60,
            )
        });
        return [
            vec![
                Step::new("adapter", "info", 30),
                Step::new("kernels", "bench kernels --json --sizes 64 --variants 64", 120),
                Step::new(
                    "train, small (dry run: tiny)",
                    "bench train --ops --steps 1 --config tiny",
                    60,
                ),
                Step::new(
                    "train, GPT-2 124M (dry run: tiny)",
                    "bench train --ops --steps 1 --config tiny",
                    60,
                )
                .with(&budget),
                // The rows the goals read: the tiny model and GPT-2's stand-in.
                Step::new(
                    "peers: shardlab against JAX",
                    "bench peers --json --tiny --gpt2 --steps 1",
                    120,
                )
                .with(&["--only", "tiny", "--only", "tiny gpt2"].map(String::from))
                .with(&py)
                .with(&budget),
                Step::new(
                    "compare, the seed preset (original layout)",
                    &seed_shaped(DRY_LADDER[0], "original", 1),
                    60,
                ),
                Step::new(
                    "compare, the seed preset (partitionable layout)",
                    &seed_shaped(DRY_LADDER[0], "partitionable", 1),
                    60,
                ),
            ],
            ladder.into_iter().map(|s| s.with(&budget)).collect(),
        ]
        .concat();
    }
    let ladder = LADDER.map(|s| {
        Step::new(
            "compare, the largest seed-shaped model that fits",
            &seed_shaped(s, "original", 3),
            150,
        )
    });
    [
        vec![
            Step::new("adapter", "info", 30),
            Step::new(
                "calibration: the cost of a dispatch and of a step's submission",
                "calibrate --recalibrate --json",
                90,
            ),
            Step::new("kernels", "bench kernels --json --variants 2048", 120),
            Step::new("train, small", "bench train --ops --steps 10 --config small", 60),
            Step::new("train, GPT-2 124M", "bench train --ops --steps 3 --config gpt2", 150).with(&budget),
            Step::new(
                "peers: shardlab against JAX",
                "bench peers --json --gpt2 --steps 5",
                200,
            )
            .with(&py)
            .with(&budget),
            Step::new(
                "compare, the seed preset (original layout)",
                "bench compare --json --preset seed --rng original --steps 10",
                60,
            ),
            Step::new(
                "compare, the seed preset (partitionable layout)",
                "bench compare --json --preset seed --rng partitionable --steps 10",
                60,
            ),
        ],
        ladder.into_iter().map(|s| s.with(&budget)).collect(),
    ]
    .concat()
}

/// What one step did.
struct Ran {
    step: Step,
    seconds: f64,
    /// The exit code; None when it was stopped at its limit or not started.
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// The JSON lines of its output.
    fn json(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
            .collect()
    }
}

/// Runs `shardlab ARGS` with a time limit, capturing its output.
fn run_step(shardlab: &Path, step: &Step, limit: Duration, envs: &[(String, String)]) -> Ran {
    let started = Instant::now();
    let mut cmd = Command::new(shardlab);
    cmd.args(&step.args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let spawned = cmd.spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            return Ran {
                step: step.clone(),
                seconds: 0.0,
                code: None,
                stdout: String::new(),
                stderr: format!("could not start {}: {e}", shardlab.display()),
            }
        }
    };
    // Drain both pipes on threads, so a chatty child never blocks on a full pipe.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut s);
            }
            s
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let code = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status.code(),
            Ok(None) if started.elapsed() < limit => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let mut stderr = err.join().unwrap_or_default();
    if code.is_none() {
        stderr.push_str(&format!("\nstopped at its limit of {} s", limit.as_secs()));
    }
    Ran {
        step: step.clone(),
        seconds: started.elapsed().as_secs_f64(),
        code,
        stdout: out.join().unwrap_or_default(),
        stderr,
    }
}

/// The Python with JAX the peers run under, its JAX's version and backend, and what was done or
/// not done about a GPU backend.
struct Jax {
    python: PathBuf,
    version: String,
    backend: String,
    /// PYTHONPATH for wheels installed here, if any.
    site: Option<PathBuf>,
    note: String,
}

fn probe(python: &Path, site: Option<&Path>) -> Option<(String, String)> {
    let mut cmd = Command::new(python);
    cmd.args([
        "-c",
        "import json, jax; print(json.dumps([jax.__version__, jax.default_backend()]))",
    ])
    .stderr(Stdio::null());
    if let Some(site) = site {
        cmd.env("PYTHONPATH", site);
    }
    let out = cmd.output().ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    Some((v[0].as_str()?.to_string(), v[1].as_str()?.to_string()))
}

/// Whether this machine has an NVIDIA GPU (nvidia-smi answers).
fn nvidia_gpu() -> Option<String> {
    output_of(
        "nvidia-smi",
        &["--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
    )
    .filter(|s| !s.is_empty())
}

fn find_jax(o: &Options) -> Res<Jax> {
    let mut candidates: Vec<PathBuf> = o.python.iter().cloned().collect();
    candidates.extend(std::env::var_os("SHARDLAB_PYTHON").map(PathBuf::from));
    candidates.push("python3".into());
    candidates.push(target_dir().join("jax-venv/bin/python"));
    let (python, (version, backend)) = candidates
        .into_iter()
        .find_map(|p| probe(&p, None).map(|v| (p, v)))
        .ok_or("no Python with JAX: give --python PATH, set SHARDLAB_PYTHON, or run `cargo xtask test jax` once")?;
    let mut jax = Jax {
        python,
        version,
        backend,
        site: None,
        note: String::new(),
    };
    if jax.backend != "cpu" || o.dry_run || nvidia_gpu().is_none() {
        jax.note = match (jax.backend.as_str(), o.dry_run) {
            ("cpu", true) => "the dry run: JAX on the CPU".into(),
            ("cpu", false) => "JAX on the CPU: this machine has no NVIDIA GPU".into(),
            _ => format!("JAX on the {}", jax.backend),
        };
        return Ok(jax);
    }
    // A GPU, and a JAX without it: its CUDA wheels, from a staged folder or the network.
    let site = target_dir().join("device-bench/site");
    let mut pip = Command::new(&jax.python);
    pip.args(["-m", "pip", "install", "-q", "--target"]).arg(&site);
    match &o.wheels {
        Some(dir) => pip.args(["--no-index", "--find-links"]).arg(dir),
        None => &mut pip,
    };
    pip.arg(format!("jax[cuda12]=={}", jax.version));
    step(&format!(
        "JAX {} has no GPU here: installing its CUDA wheels",
        jax.version
    ));
    let installed = run(&mut pip, "pip install jax[cuda12]").is_ok();
    match probe(&jax.python, Some(&site)) {
        Some((version, backend)) if installed && backend != "cpu" => {
            jax.note = format!("JAX {version} on the {backend}: its CUDA wheels installed for this run");
            jax.version = version;
            jax.backend = backend;
            jax.site = Some(site);
        }
        _ => {
            jax.note = format!(
                "JAX on the CPU: this machine has a GPU, but JAX's CUDA wheels could not be installed (no network, \
                 and {}); stage them with --wheels DIR",
                o.wheels.as_ref().map_or("no --wheels DIR".to_string(), |d| format!(
                    "none fit in {}",
                    d.display()
                ))
            );
        }
    }
    Ok(jax)
}

/// The memory budget of the large runs: `--memory-budget`, else 90% of the GPU's memory
/// (nvidia-smi), else shardlab's default.
fn budget(o: &Options) -> String {
    if let Some(b) = &o.budget {
        return b.clone();
    }
    let mib = output_of(
        "nvidia-smi",
        &["--query-gpu=memory.total", "--format=csv,noheader,nounits"],
    )
    .and_then(|s| s.lines().next()?.trim().parse::<u64>().ok());
    match mib {
        Some(m) => format!("{}MiB", m * 9 / 10),
        None => "4GiB".into(),
    }
}

fn build() -> Res<PathBuf> {
    step("building shardlab (release)");
    run(
        cargo().args(["build", "--release", "-p", "shardlab", "--bin", "shardlab"]),
        "cargo build --release -p shardlab",
    )?;
    Ok(target_dir().join("release/shardlab"))
}

/// Runs the benchmark and writes its report; returns the report's path.
pub fn main(args: &[String]) -> Res<()> {
    let o = Options::parse(args)?;
    let path = bench(&o)?;
    println!("\nwrote {}", path.display());
    Ok(())
}

fn bench(o: &Options) -> Res<PathBuf> {
    let shardlab = match &o.shardlab {
        Some(p) => p.clone(),
        None => build()?,
    };
    let jax = find_jax(o)?;
    let budget = budget(o);
    let deadline = Instant::now() + Duration::from_secs(o.deadline_s.unwrap_or(DEADLINE_S));
    let mut envs = vec![
        // The issue's peer is JAX in f32: its dots at full precision, as shardlab's.
        ("JAX_DEFAULT_MATMUL_PRECISION".to_string(), "highest".to_string()),
    ];
    if let Some(site) = &jax.site {
        envs.push(("PYTHONPATH".into(), site.display().to_string()));
    }
    let mut ran: Vec<Ran> = Vec::new();
    let mut ladder_done = false;
    for s in plan(o.dry_run, &jax.python, &budget) {
        let ladder = s.title.starts_with("compare, the largest");
        if ladder && ladder_done {
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        step(&format!("{}: shardlab {}", s.title, s.args.join(" ")));
        let r = if left.is_zero() {
            Ran {
                step: s.clone(),
                seconds: 0.0,
                code: None,
                stdout: String::new(),
                stderr: "not run: the deadline had passed".into(),
            }
        } else {
            run_step(&shardlab, &s, left.min(Duration::from_secs(s.limit_s)), &envs)
        };
        println!("{}", r.stdout.trim_end());
        if !r.ok() {
            eprintln!("{}", r.stderr.trim_end());
        }
        // A model the budget refuses is left for the next size down; one that ran (or ran out of
        // time) ends the ladder.
        ladder_done |= ladder && !refused(&r);
        ran.push(r);
    }
    let text = report(o, &shardlab, &jax, &budget, &ran);
    let out = o
        .out
        .clone()
        .unwrap_or_else(|| target_dir().join("device-bench/report.md"));
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    std::fs::write(&out, text).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    Ok(out)
}

/// Whether a run was refused for memory before it started (the trainer's closed-form check).
fn refused(r: &Ran) -> bool {
    r.code.is_some_and(|c| c != 0) && (r.stderr.contains("memory budget") || r.stderr.contains("adapter's limit"))
}

/// The report: the machine, then the goals read off the runs, then every run in full.
fn report(o: &Options, shardlab: &Path, jax: &Jax, budget: &str, ran: &[Ran]) -> String {
    let mut r = String::new();
    let commit = output_of(
        "git",
        &["-C", &root().display().to_string(), "rev-parse", "--short", "HEAD"],
    )
    .unwrap_or_else(|| "unknown (no git here)".into());
    let title = if o.dry_run {
        "Device benchmark (dry run)"
    } else {
        "Device benchmark"
    };
    r.push_str(&format!("# {title}\n\n"));
    r.push_str(&format!("- commit: `{commit}`; shardlab: `{}`\n", shardlab.display()));
    r.push_str(&format!(
        "- GPU (nvidia-smi): {}\n",
        nvidia_gpu().unwrap_or_else(|| "none".into())
    ));
    if let Some(info) = ran
        .iter()
        .find(|x| x.step.args.first().map(String::as_str) == Some("info"))
    {
        let adapter = info.stdout.lines().next().unwrap_or("").trim();
        r.push_str(&format!("- adapter: {adapter}\n"));
    }
    r.push_str(&format!(
        "- JAX {} ({}) at `{}`: {}\n- memory budget of the large runs: {budget}\n",
        jax.version,
        jax.backend,
        jax.python.display(),
        jax.note
    ));
    let total: f64 = ran.iter().map(|x| x.seconds).sum();
    r.push_str(&format!("- the runs took {total:.0} s\n\n"));
    r.push_str("## Goals\n\n");
    if o.dry_run {
        r.push_str("A dry run: tiny sizes, so these rows check the plumbing, not the goals.\n\n");
    }
    r.push_str("| goal | measured | met |\n|---|---|---|\n");
    for (goal, measured, met) in goals(ran) {
        r.push_str(&format!("| {goal} | {measured} | {met} |\n"));
    }
    for x in ran {
        r.push_str(&format!(
            "\n## {}\n\n`shardlab {}`: ",
            x.step.title,
            x.step.args.join(" ")
        ));
        match x.code {
            Some(c) => r.push_str(&format!("exit {c}, {:.1} s\n\n", x.seconds)),
            None => r.push_str(&format!("did not finish ({:.1} s)\n\n", x.seconds)),
        }
        let rows = x.json();
        if x.step.json && !rows.is_empty() {
            r.push_str(&tables(&rows));
        } else if !x.stdout.trim().is_empty() {
            r.push_str(&format!("```\n{}\n```\n", x.stdout.trim_end()));
        }
        if !x.ok() && !x.stderr.trim().is_empty() {
            r.push_str(&format!("\nstderr:\n```\n{}\n```\n", x.stderr.trim_end()));
        }
    }
    r
}

/// JSON lines as Markdown tables: one per kind of line (its `kernel` field, else one for all),
/// a column per scalar field; nested arrays of objects (peers' rows) as their own table.
fn tables(lines: &[Value]) -> String {
    let mut rows: Vec<&Value> = Vec::new();
    let mut scalars = String::new();
    for v in lines {
        match v.get("rows").and_then(Value::as_array) {
            Some(inner) => {
                for (k, x) in v.as_object().into_iter().flatten() {
                    if !x.is_array() {
                        scalars.push_str(&format!("- {k}: {}\n", cell(x)));
                    }
                }
                rows.extend(inner);
            }
            None => rows.push(v),
        }
    }
    let mut out = scalars;
    if !out.is_empty() {
        out.push('\n');
    }
    let kind = |v: &Value| v.get("kernel").map(cell).unwrap_or_default();
    let mut kinds: Vec<String> = Vec::new();
    for v in &rows {
        let k = kind(v);
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    for k in kinds {
        let group: Vec<&&Value> = rows.iter().filter(|v| kind(v) == k).collect();
        let columns: Vec<String> = group[0]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(_, x)| !x.is_object() && !x.is_array())
                    .map(|(c, _)| c.clone())
                    .collect()
            })
            .unwrap_or_default();
        out.push_str(&format!(
            "| {} |\n|{}\n",
            columns.join(" | "),
            "---|".repeat(columns.len())
        ));
        for v in group {
            let cells: Vec<String> = columns.iter().map(|c| v.get(c).map(cell).unwrap_or_default()).collect();
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
        out.push('\n');
    }
    out
}

fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(x) if n.is_f64() => format!("{x:.4}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// The issue's goals, each with what the runs measured and whether it is met.
fn goals(ran: &[Ran]) -> Vec<(String, String, String)> {
    let yes = |b: bool| if b { "yes" } else { "no" }.to_string();
    let missing = || ("not measured".to_string(), "-".to_string());
    let lines = |title: &str| -> Vec<Value> {
        ran.iter()
            .filter(|x| x.step.title.starts_with(title) && x.ok())
            .flat_map(Ran::json)
            .collect()
    };
    let mut out = Vec::new();

    // matmul: the best variant at the largest size measured, over the FMA ceiling.
    let kernels = lines("kernels");
    let fma = kernels
        .iter()
        .find(|v| v["kernel"] == "ceilings")
        .and_then(|v| v["fma_gflops"].as_f64());
    let best = kernels
        .iter()
        .filter(|v| v["kernel"] == "matmul_variant" || v["kernel"] == "matmul")
        .filter_map(|v| Some((v["n"].as_u64()?, v["gflops"].as_f64()?, cell(&v["variant"]))))
        .max_by(|a, b| (a.0, a.1).partial_cmp(&(b.0, b.1)).unwrap_or(std::cmp::Ordering::Equal));
    let (m, met) = match (fma, best) {
        (Some(f), Some((n, g, v))) => (
            format!("n = {n}: {v} {g:.0} GFLOP/s, {:.1}% of {f:.0}", 100.0 * g / f),
            yes(n >= 2048 && g >= 0.5 * f),
        ),
        _ => missing(),
    };
    out.push(("matmul at n >= 2048: >= 50% of the FMA ceiling (f32)".into(), m, met));

    // peers: GPT-2 124M and small against JAX.
    let peers = lines("peers");
    let rows: Vec<&Value> = peers
        .iter()
        .flat_map(|v| v["rows"].as_array().into_iter().flatten())
        .collect();
    for (goal, name, max) in [
        ("GPT-2 124M one-device step: <= 1.5x JAX f32", "gpt2", 1.5),
        ("`small`: <= 1.2x JAX", "", 1.2),
    ] {
        let row = rows.iter().find(|r| {
            let c = cell(&r["config"]);
            if name.is_empty() {
                c == "small" || c == "tiny"
            } else {
                c.contains(name)
            }
        });
        let (m, met) = match row.and_then(|r| Some((r["ratio"].as_f64()?, cell(&r["config"])))) {
            Some((ratio, c)) => (format!("{c}: {ratio:.2}x"), yes(ratio <= max)),
            None => missing(),
        };
        out.push((goal.into(), m, met));
    }

    // what a dispatch costs, and a step's submission: what fusing saves where launches set the step.
    let calibration = lines("calibration");
    let measured = |name: &str| {
        calibration
            .iter()
            .flat_map(|v| v["measurements"].as_array().into_iter().flatten())
            .find(|m| m["name"] == name)
            .and_then(|m| m["value"].as_f64())
    };
    let (m, met) = match (measured("launch_s"), measured("step_s")) {
        (Some(l), Some(st)) => (
            format!("{:.1} us a dispatch, {:.1} us a step's submission", 1e6 * l, 1e6 * st),
            "a measure".to_string(),
        ),
        _ => missing(),
    };
    out.push(("a dispatch's cost on this adapter (calibrated)".into(), m, met));

    // the seed's gap: auto over shard_map in the original layout, outside its spread, above 1.5x.
    for title in [
        "compare, the seed preset (original layout)",
        "compare, the largest seed-shaped model that fits",
    ] {
        let c = lines(title);
        let (m, met) = match c.first().and_then(|v| {
            Some((
                v["ratio"].as_f64()?,
                v["ratio_low"].as_f64()?,
                v["ratio_high"].as_f64()?,
            ))
        }) {
            Some((r, lo, hi)) => (
                format!("{r:.2} (pairs' quartiles {lo:.2}-{hi:.2})"),
                yes(r > 1.5 && lo > 1.0),
            ),
            None => missing(),
        };
        let which = title.trim_start_matches("compare, ");
        out.push((
            format!("the seed's gap, auto / shard_map, original layout, {which}: > 1.5x, outside its spread"),
            m,
            met,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_take_each_flag_and_name_the_usage_otherwise() {
        let args: Vec<String> = ["--dry-run", "--deadline", "90", "--memory-budget", "2GiB"]
            .map(String::from)
            .to_vec();
        let o = Options::parse(&args).unwrap();
        assert!(o.dry_run);
        assert_eq!((o.deadline_s, o.budget.as_deref()), (Some(90), Some("2GiB")));
        let e = Options::parse(&["--deadline".into(), "soon".into()]).unwrap_err();
        assert!(e.contains("whole seconds"), "{e}");
        let e = Options::parse(&["--gpu".into()]).unwrap_err();
        assert!(e.contains("unknown argument `--gpu`") && e.contains("usage"), "{e}");
    }

    #[test]
    fn the_full_plan_runs_the_issues_sizes_and_the_dry_run_tiny_ones() {
        let full = plan(false, Path::new("py"), "70GiB");
        let text: Vec<String> = full.iter().map(|s| s.args.join(" ")).collect();
        assert!(text
            .iter()
            .any(|a| a.contains("--config gpt2") && a.contains("--memory-budget 70GiB")));
        assert!(text
            .iter()
            .any(|a| a.starts_with("bench peers") && a.contains("--gpt2") && a.contains("--python py")));
        assert!(text.iter().any(|a| a.contains("--variants 2048")));
        assert!(text.iter().any(|a| a.contains("--preset seed --rng original")));
        assert_eq!(
            full.iter()
                .filter(|s| s.title.starts_with("compare, the largest"))
                .count(),
            LADDER.len()
        );
        let dry = plan(true, Path::new("py"), "4GiB");
        assert!(dry.iter().all(|s| !s.args.iter().any(|a| a == "gpt2" || a == "2048")));
        // The dry run leaves the calibration alone: it would replace this machine's cached one.
        assert_eq!(dry.len(), full.len() - 1 - LADDER.len() + DRY_LADDER.len());
    }

    /// The dry run on this machine's adapter (lavapipe) with JAX on the CPU: every step runs and
    /// the report reads each goal off its run. Named `under_jax` so that `cargo xtask test`
    /// runs it in its JAX step, with the venv; it needs the shardlab binary built.
    mod under_jax {
        use super::super::*;

        #[test]
        fn the_dry_run_runs_every_step_and_reads_every_goal_off_the_runs() {
            let shardlab = target_dir().join("debug/shardlab");
            if !shardlab.is_file() {
                run(
                    cargo().args(["build", "-p", "shardlab", "--bin", "shardlab"]),
                    "cargo build -p shardlab",
                )
                .unwrap();
            }
            let out = std::env::temp_dir().join(format!("device-bench-{}.md", std::process::id()));
            let o = Options {
                dry_run: true,
                shardlab: Some(shardlab),
                python: std::env::var_os("SHARDLAB_PYTHON").map(PathBuf::from),
                out: Some(out.clone()),
                ..Options::default()
            };
            let path = bench(&o).unwrap();
            let text = std::fs::read_to_string(&path).unwrap();
            let _ = std::fs::remove_file(&out);
            assert!(text.starts_with("# Device benchmark (dry run)"), "{text}");
            assert!(!text.contains("did not finish") && !text.contains("stderr:"), "{text}");
            for title in plan(true, Path::new("py"), "4GiB").iter().map(|s| &s.title) {
                assert!(text.contains(&format!("## {title}")), "{title} missing: {text}");
            }
            // Every goal is read off a run: none is left unmeasured.
            let goals = text.split("## Goals").nth(1).unwrap().split("\n## ").next().unwrap();
            assert_eq!(
                goals.matches("| yes |").count() + goals.matches("| no |").count(),
                5,
                "{goals}"
            );
            assert!(
                goals.contains("a dispatch's cost") && goals.contains("not measured"),
                "{goals}"
            );
            assert!(text.contains("matmul_variant") && text.contains("tiny gpt2"), "{text}");
        }
    }
}
