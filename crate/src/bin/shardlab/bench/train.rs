//! `shardlab bench train [--steps N] [--ops] [--json] [--config NAME...]`: steps/s, tokens/s and ms
//! per step split into forward, backward and update, for the tiny and a small configuration (or
//! those named, GPT-2 124M among them); with `--ops`,
//! the ops that take the most time and the categories against the step, each beside its floor on
//! this adapter's measured ceilings.

use std::path::PathBuf;

use shardlab::bench::kernels::ceilings;
use shardlab::bench::train::{self, TrainBench};
use shardlab::profile::{Category, OpSource, Trace};

#[derive(clap::Args)]
pub struct Args {
    /// Measured steps per configuration (after 2 warm-up steps).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// List the ops that take the most time, and the categories with their sum vs the step, each
    /// beside its floor on this adapter's measured ceilings (FMAs alone, storage-buffer copy).
    #[arg(long)]
    ops: bool,
    /// Ops listed with --ops.
    #[arg(long, default_value_t = 15)]
    top: usize,
    /// Write the profiled steps to FILE as Chrome trace-event JSON (one process per
    /// configuration, its ops on the adapter's queue in submission order), which
    /// ui.perfetto.dev and chrome://tracing open. Needs --ops.
    #[arg(long, value_name = "FILE", requires = "ops")]
    trace: Option<PathBuf>,
    /// One JSON object per configuration.
    #[arg(long)]
    json: bool,
    /// The configurations to run, in order (repeat the flag): tiny, small, or gpt2 (GPT-2 124M
    /// at seq 1024, batch 8: for GPUs; raise --memory-budget). Default: tiny and small.
    #[arg(long = "config", value_name = "NAME")]
    configs: Vec<String>,
    #[command(flatten)]
    budget: crate::args::MemoryBudgetArg,
    #[command(flatten)]
    retune: crate::tuning_cache::RetuneArg,
}

/// The configurations `names` ask for (tiny and small when none), or the error naming the choices.
fn chosen(names: &[String]) -> Result<Vec<(String, shardlab::model::GptConfig)>, String> {
    if names.is_empty() {
        return Ok(train::configs().into_iter().map(|(n, c)| (n.to_string(), c)).collect());
    }
    names
        .iter()
        .map(|n| {
            train::config_named(n).map(|c| (n.clone(), c)).ok_or_else(|| {
                format!(
                    "--config {n}: no such configuration; the choices are {}",
                    train::CONFIG_NAMES.join(", ")
                )
            })
        })
        .collect()
}

pub fn run(args: Args) -> Result<(), String> {
    if args.steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    let trace_file = args
        .trace
        .as_deref()
        .map(crate::trace_file::TraceFile::create)
        .transpose()?;
    let configs = chosen(&args.configs)?;
    let tuned = crate::tuning_cache::open(args.retune)?;
    let ctx = &tuned.ctx;
    let limits = args.budget.limits(&shardlab::exec::Backend::Gpu(ctx.clone()));
    let header = || {
        println!(
            "{:<6} {:>9} {:>9} {:>10} {:>11} {:>10} {:>11} {:>10} {:>10} {:>7}",
            "config",
            "params",
            "ms/step",
            "steps/s",
            "tokens/s",
            "fwd ms",
            "bwd ms",
            "update ms",
            "dispatches",
            "copies"
        )
    };
    let roofline = if args.ops {
        let c = pollster::block_on(ceilings(ctx)).map_err(|e| e.to_string())?;
        if !args.json {
            println!(
                "ceilings: {:.2} GFLOP/s of FMAs alone, {:.2} GB/s of storage-buffer copy (as `bench kernels`)",
                c.fma_gflops, c.copy_gbps
            );
        }
        Some(c.roofline())
    } else {
        None
    };
    if !args.json {
        println!("adapter: {}", ctx.summary.identity());
        header();
    }
    let mut trace = Trace::new();
    for (k, (name, cfg)) in configs.into_iter().enumerate() {
        if args.ops && !args.json && k > 0 {
            header();
        }
        let r = pollster::block_on(train::train(ctx.clone(), &name, cfg, args.steps, roofline, &limits))
            .map_err(|e| e.to_string())?;
        trace.add(&r.config, &r.timeline, &[OpSource::of_step(&r.step)]);
        if args.json {
            println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
            continue;
        }
        println!(
            "{:<6} {:>9} {:>9.2} {:>10.1} {:>11.0} {:>10.2} {:>11.2} {:>10.2} {:>10} {:>7}",
            r.config,
            r.params,
            r.ms_per_step,
            r.steps_per_s,
            r.tokens_per_s,
            r.forward_ms,
            r.backward_ms,
            r.update_ms,
            r.dispatches_per_step,
            r.copies_per_step
        );
        if args.ops {
            print_ops(&r, args.top);
        }
    }
    if !args.json {
        println!("ms/step: wall time, measured (median); fwd/bwd/update: wall time of each phase submitted alone, less one submission's overhead, measured");
        println!(
            "dispatches: a step's compute dispatches and buffer-to-texture copies; copies: how many of them are copies"
        );
    }
    if let Some(file) = trace_file {
        let path = file.path().display().to_string();
        file.write(&trace)?;
        if !args.json {
            println!(
                "wrote {path}: each configuration's profiled step on the adapter's queue; open it in https://ui.perfetto.dev or chrome://tracing"
            );
        }
    }
    Ok(())
}

fn print_ops(r: &TrainBench, top: usize) {
    let p = &r.profile;
    let pct = |ms: f64| 100.0 * ms / p.step_ms.max(f64::MIN_POSITIVE);
    println!();
    println!(
        "  {}: profiled step {:.2} ms (all dispatches in one submission, awaited; median of split runs)",
        r.config, p.step_ms
    );
    let floor_ms = |i: usize| r.floor.as_ref().map_or(0.0, |f| f.instr_ms[i]);
    let category_floor = |c: Category| {
        r.floor
            .as_ref()
            .and_then(|f| f.categories_ms.iter().find(|(k, _)| *k == c))
            .map_or(0.0, |(_, ms)| *ms)
    };
    // "x floor": the measured time over the floor; blank where there is no floor to divide by.
    let times = |ms: f64, floor: f64| {
        if floor > 0.0 {
            format!("{:.1}x", ms / floor)
        } else {
            String::new()
        }
    };
    println!(
        "  {:>5} {:<22} {:<9} {:<11} {:>9} {:>7} {:>9} {:>8}  shape",
        "instr", "op", "phase", "category", "ms", "% step", "floor ms", "x floor"
    );
    for o in p.ops.iter().take(top) {
        let floor = floor_ms(o.instr);
        println!(
            "  {:>5} {:<22} {:<9} {:<11} {:>9.3} {:>6.1}% {:>9.3} {:>8}  {}",
            o.instr,
            o.op,
            o.phase,
            format!("{:?}", o.category).to_lowercase(),
            o.ms,
            o.percent,
            floor,
            times(o.ms, floor),
            o.shape
        );
    }
    println!(
        "  {:<26} {:>9} {:>7} {:>9} {:>8}",
        "category", "ms", "% step", "floor ms", "x floor"
    );
    for (c, ms) in &p.categories_ms {
        let floor = category_floor(*c);
        println!(
            "  {:<26} {:>9.3} {:>6.1}% {:>9.3} {:>8}",
            c.name(),
            ms,
            pct(*ms),
            floor,
            times(*ms, floor)
        );
    }
    println!(
        "  {:<26} {:>9.3} {:>6.1}%",
        "one submission",
        p.submit_overhead_ms,
        pct(p.submit_overhead_ms)
    );
    println!(
        "  categories + one submission = {:.2} ms vs step {:.2} ms ({:+.1}%)",
        p.categories_sum_ms,
        p.step_ms,
        100.0 * p.off_by(p.categories_sum_ms)
    );
    let phases: Vec<String> = p.phases_ms.iter().map(|(n, ms)| format!("{n} {ms:.2}")).collect();
    println!(
        "  phases {} + one submission = {:.2} ms vs step {:.2} ms ({:+.1}%)",
        phases.join(", "),
        p.phases_sum_ms,
        p.step_ms,
        100.0 * p.off_by(p.phases_sum_ms)
    );
    println!(
        "  one submission: {:.3} ms (an empty submission, awaited; median); the {} split submissions of the ops added {:.2} ms beyond their cost (each op: one copy alone minus the cost of a second copy), not counted above",
        p.submit_overhead_ms,
        p.split_submissions,
        p.split_overhead_ms
    );
    if let Some(f) = &r.floor {
        println!(
            "  floor {:.2} ms: each op at the larger of its FLOPs over {:.2} GFLOP/s and its bytes over {:.2} GB/s, launches not counted; the step takes {:.1}x its floor",
            f.total_ms,
            f.roofline.flops / 1e9,
            f.roofline.bytes_per_s / 1e9,
            p.step_ms / f.total_ms.max(f64::MIN_POSITIVE)
        );
    }
    println!(
        "  op ms: each phase's measured time shared out by its ops' split-measured cost (factors forward {:.2}, backward {:.2}, update {:.2})",
        p.phase_factor[0], p.phase_factor[1], p.phase_factor[2]
    );
    println!();
}
