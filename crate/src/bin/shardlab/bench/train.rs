//! `shardlab bench train [--steps N] [--ops] [--json]`: steps/s, tokens/s and ms per step split
//! into forward, backward and update, for the tiny and a small configuration; with `--ops`,
//! the ops that take the most time and the categories against the step.

use shardlab::bench::train::{self, TrainBench};

#[derive(clap::Args)]
pub struct Args {
    /// Measured steps per configuration (after 2 warm-up steps).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// List the ops that take the most time, and the categories with their sum vs the step.
    #[arg(long)]
    ops: bool,
    /// Ops listed with --ops.
    #[arg(long, default_value_t = 15)]
    top: usize,
    /// One JSON object per configuration.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    retune: crate::tuning_cache::RetuneArg,
}

pub fn run(args: Args) -> Result<(), String> {
    if args.steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    let tuned = crate::tuning_cache::open(args.retune)?;
    let ctx = &tuned.ctx;
    let header = || {
        println!(
            "{:<6} {:>9} {:>9} {:>10} {:>11} {:>10} {:>11} {:>10} {:>10}",
            "config", "params", "ms/step", "steps/s", "tokens/s", "fwd ms", "bwd ms", "update ms", "dispatches"
        )
    };
    if !args.json {
        println!("adapter: {} ({})", ctx.summary.name, ctx.summary.backend);
        header();
    }
    for (k, (name, cfg)) in train::configs().into_iter().enumerate() {
        if args.ops && !args.json && k > 0 {
            header();
        }
        let r = pollster::block_on(train::train(ctx.clone(), name, cfg, args.steps)).map_err(|e| e.to_string())?;
        if args.json {
            println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
            continue;
        }
        println!(
            "{:<6} {:>9} {:>9.2} {:>10.1} {:>11.0} {:>10.2} {:>11.2} {:>10.2} {:>10}",
            r.config,
            r.params,
            r.ms_per_step,
            r.steps_per_s,
            r.tokens_per_s,
            r.forward_ms,
            r.backward_ms,
            r.update_ms,
            r.dispatches_per_step
        );
        if args.ops {
            print_ops(&r, args.top);
        }
    }
    if !args.json {
        println!("ms/step: wall time, measured (median); fwd/bwd/update: wall time of each phase submitted alone, less one submission's overhead, measured");
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
    println!(
        "  {:>5} {:<22} {:<9} {:<11} {:>9} {:>7}  shape",
        "instr", "op", "phase", "category", "ms", "% step"
    );
    for o in p.ops.iter().take(top) {
        println!(
            "  {:>5} {:<22} {:<9} {:<11} {:>9.3} {:>6.1}%  {}",
            o.instr,
            o.op,
            o.phase,
            format!("{:?}", o.category).to_lowercase(),
            o.ms,
            o.percent,
            o.shape
        );
    }
    println!("  {:<26} {:>9} {:>7}", "category", "ms", "% step");
    for (c, ms) in &p.categories_ms {
        println!("  {:<26} {:>9.3} {:>6.1}%", c.name(), ms, pct(*ms));
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
    println!(
        "  op ms: each phase's measured time shared out by its ops' split-measured cost (factors forward {:.2}, backward {:.2}, update {:.2})",
        p.phase_factor[0], p.phase_factor[1], p.phase_factor[2]
    );
    println!();
}
