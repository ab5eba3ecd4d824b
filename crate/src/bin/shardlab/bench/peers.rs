//! `shardlab bench peers [--python PATH] [--steps N] [--json] [--tiny]`: shardlab against JAX
//! (train steps) and numpy (matmul) on the same CPU cores, alternating, in one run; prints each
//! configuration's medians, their ratio and the goal.
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use shardlab::bench::kernels::ceilings;
use shardlab::bench::peers::{
    configs, floor_ms, measure_matmul, measure_train, row, PeerConfig, PeerRow, Scale, Workload, DRIVER,
};
use shardlab::exec::Backend;
use shardlab::gpu::GpuContext;
use shardlab::plan::MemoryLimits;

use super::peer_process::{check, python, Peer};

#[derive(clap::Args)]
pub struct Args {
    /// The Python with jax and numpy (default: $SHARDLAB_PYTHON, else target/jax-venv from
    /// `cargo xtask test jax`, else python3).
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// Measured steps (matmuls) of each side per configuration, alternating, after 2 warm-up each.
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// One JSON object: {"adapter":..,"jax":..,"numpy":..,"rows":[{"config","shardlab_ms","peer_ms","ratio",..}]}.
    #[arg(long)]
    pub json: bool,
    /// Tiny configurations of the same kinds (a smoke test in seconds, not the goals' sizes).
    #[arg(long)]
    pub tiny: bool,
    /// Also GPT-2 124M on one device (seq 1024, batch 8; for GPUs: raise --memory-budget), held
    /// to 1.5x JAX.
    #[arg(long)]
    pub gpt2: bool,
    /// Run only the configuration of this name (repeat the flag for several), e.g. `--only small`.
    #[arg(long, value_name = "NAME")]
    pub only: Vec<String>,
    #[command(flatten)]
    pub budget: crate::args::MemoryBudgetArg,
    #[command(flatten)]
    pub retune: crate::tuning_cache::RetuneArg,
}

#[derive(serde::Serialize)]
struct Report {
    adapter: String,
    python: String,
    jax: String,
    numpy: String,
    steps: usize,
    rows: Vec<PeerRow>,
}

pub fn run(args: Args) -> Result<(), String> {
    if args.steps == 0 {
        return Err("--steps must be at least 1: the benchmark compares medians of measured steps".into());
    }
    let python = python(args.python);
    let (jax, numpy) = check(&python)?;
    let tuned = crate::tuning_cache::open(args.retune)?;
    let ctx = &tuned.ctx;
    let scale = if args.tiny { Scale::Tiny } else { Scale::Full };
    let dir = std::env::temp_dir().join(format!("shardlab-peers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let limits = args.budget.limits(&Backend::Gpu(ctx.clone()));
    let result = chosen(scale, args.gpt2, &args.only)
        .and_then(|configs| measure_all(ctx, &python, &dir, configs, args.steps, &limits));
    let _ = std::fs::remove_dir_all(&dir);
    let report = Report {
        adapter: ctx.summary.identity(),
        python: python.display().to_string(),
        jax,
        numpy,
        steps: args.steps,
        rows: result?,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
    } else {
        print_table(&report);
    }
    Ok(())
}

/// The configurations of `scale` (with GPT-2 where asked), only those `only` names when it names
/// any; a name that is none of them is refused, naming them.
fn chosen(scale: Scale, gpt2: bool, only: &[String]) -> Result<Vec<PeerConfig>, String> {
    let all = configs(scale, gpt2).map_err(|e| e.to_string())?;
    let names: Vec<String> = all.iter().map(|c| c.name.clone()).collect();
    if let Some(unknown) = only.iter().find(|n| !names.contains(n)) {
        return Err(format!(
            "--only {unknown}: no such configuration here; the configurations are {}",
            names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(all
        .into_iter()
        .filter(|c| only.is_empty() || only.contains(&c.name))
        .collect())
}

fn measure_all(
    ctx: &Arc<GpuContext>,
    python: &std::path::Path,
    dir: &std::path::Path,
    configs: Vec<PeerConfig>,
    steps: usize,
    limits: &MemoryLimits,
) -> Result<Vec<PeerRow>, String> {
    let driver = dir.join("peers.py");
    std::fs::write(&driver, DRIVER).map_err(|e| format!("cannot write {}: {e}", driver.display()))?;
    eprintln!("measuring this adapter's ceilings ...");
    let roofline = pollster::block_on(ceilings(ctx)).map_err(|e| e.to_string())?.roofline();
    let mut rows = vec![];
    for (i, config) in configs.into_iter().enumerate() {
        eprintln!("measuring {} against {} ...", config.name, config.peer());
        let stderr_file = dir.join(format!("peer{i}.stderr"));
        let r = match &config.workload {
            Workload::Train(opts) => {
                let script = dir.join(format!("peer{i}.py"));
                // The script's own loop is not run (the driver steps it); STEPS only has to be valid.
                let text = shardlab::export::jax_script(opts, (steps + 2) as u64).map_err(|e| e.to_string())?;
                std::fs::write(&script, text).map_err(|e| format!("cannot write {}: {e}", script.display()))?;
                let mut peer = Peer::start(
                    python,
                    &driver,
                    &script.to_string_lossy(),
                    config.devices(),
                    stderr_file,
                )?;
                let mut step = || peer.measured_ms("step");
                let (ours, theirs) =
                    pollster::block_on(measure_train(Backend::Gpu(ctx.clone()), opts, limits, steps, &mut step))
                        .map_err(|e| format!("{}: {e}", config.name))?;
                row(&config, &ours, &theirs, None)
            }
            Workload::Matmul { n } => {
                let mut peer = Peer::start(python, &driver, "numpy", 1, stderr_file)?;
                let request = format!("matmul {n}");
                let mut step = || peer.measured_ms(&request);
                let (ours, theirs, variant) = pollster::block_on(measure_matmul(ctx, *n, steps, &mut step))
                    .map_err(|e| format!("{}: {e}", config.name))?;
                row(&config, &ours, &theirs, Some(variant))
            }
        };
        rows.push(r.with_floor(floor_ms(&config, roofline).map_err(|e| e.to_string())?));
    }
    Ok(rows)
}

/// Four significant digits: small and large times keep the same relative precision.
fn sig(x: f64) -> String {
    let digits = (3 - x.abs().max(1e-9).log10().floor() as i32).clamp(0, 6) as usize;
    format!("{x:.digits$}")
}

fn print_table(r: &Report) {
    println!(
        "shardlab on {} vs JAX {} and numpy {} ({}), on the same CPU cores",
        r.adapter, r.jax, r.numpy, r.python
    );
    println!(
        "{:<24} {:>12} {:>6} {:>12} {:>8} {:>6} {:>4} {:>7}  detail",
        "config", "shardlab ms", "peer", "peer ms", "ratio", "goal", "met", "floor"
    );
    for row in &r.rows {
        let detail = match (row.variant, row.shardlab_gflops, row.peer_gflops) {
            (Some(v), Some(ours), Some(theirs)) => format!(
                "{v}: {} vs {} GFLOP/s, {:.0}% of numpy (goal >= 25%)",
                sig(ours),
                sig(theirs),
                100.0 * ours / theirs
            ),
            _ => String::new(),
        };
        println!(
            "{:<24} {:>12} {:>6} {:>12} {:>7.2}x {:>6} {:>4} {:>7}  {detail}",
            row.config,
            sig(row.shardlab_ms),
            row.peer,
            sig(row.peer_ms),
            row.ratio,
            format!("<={}x", row.goal_max_ratio),
            if row.met { "yes" } else { "no" },
            row.floor_ratio.map_or(String::new(), |f| format!("{f:.2}x"))
        );
    }
    println!(
        "(ratio = shardlab ms / peer ms, medians of {} alternated measurements, each the second of two runs in a row, after 2 warm-up each; goal: at most that ratio)",
        r.steps
    );
    println!(
        "(floor = shardlab's floor on this adapter over the peer's ms: every op at the larger of its FLOPs over the FMA ceiling and its bytes over the storage-buffer copy ceiling, as `bench kernels` measures them, launches not counted; no kernel tuning gets the ratio below it here)"
    );
    let _ = std::io::stdout().flush();
}
