//! `shardlab bench model [--json]`: the cost model's predicted step time (device `this`,
//! simulated placement) beside the measured one for three blocks of configurations (the
//! sweep, a held-out block the size of the seed preset and larger, and the search's
//! configurations of one model), then the errors per block and size class and the ranking's
//! Spearman correlation.
use shardlab::bench::model::{pick_configs, run_ops, run_sweep, Block, OpsCheck, OPS_DEFAULT};
use shardlab::exec::Backend;
use shardlab::profile::OpGroup;

#[derive(clap::Args)]
pub struct Args {
    /// Measured steps per configuration (after 2 warm-up steps), one per round over all
    /// configurations; the median is taken.
    #[arg(long, default_value_t = 7)]
    pub steps: usize,
    /// With --ops: calibrate `this` again first (the sweep calibrates in its own rounds).
    #[arg(long)]
    pub recalibrate: bool,
    #[command(flatten)]
    pub retune: crate::tuning_cache::RetuneArg,
    /// Print one JSON object at the end instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Instead of the sweep: profile a few of its configurations op by op and print each op
    /// kind's and category's predicted time beside its measured one.
    #[arg(long)]
    pub ops: bool,
    /// With --ops: the configurations to profile (a name as the sweep prints it, or part of
    /// one; repeatable). Default: one of each kind of program.
    #[arg(long = "config")]
    pub configs: Vec<String>,
}

fn print_groups(title: &str, groups: &[OpGroup]) {
    println!(
        "  {title:<20} {:>5} {:>9} {:>10} {:>12} {:>10} {:>12} {:>9}",
        "ops", "launches", "dispatches", "predicted ms", "(launch)", "measured ms", "pred/meas"
    );
    for g in groups {
        let ratio = g.ratio().map_or("-".to_string(), |r| format!("{r:.2}"));
        println!(
            "  {:<20} {:>5} {:>9} {:>10} {:>12.2} {:>10.2} {:>12.2} {:>9}",
            g.name,
            g.count,
            g.predicted_launches,
            g.measured_dispatches,
            g.predicted_ms,
            g.predicted_launch_ms,
            g.measured_ms,
            ratio
        );
    }
}

fn print_ops(c: &OpsCheck) {
    let k = &c.comparison;
    println!(
        "{}: predicted {:.2} ms, profiled step {:.2} ms (measured; ops: their share of the step, by split submissions)",
        c.name, k.predicted_ms, k.measured_ms
    );
    print_groups("category", &k.by_category);
    print_groups("op kind", &k.by_op);
}

fn run_ops_cli(args: &Args) -> Result<(), String> {
    let names: Vec<String> = if args.configs.is_empty() {
        OPS_DEFAULT.iter().map(|s| s.to_string()).collect()
    } else {
        args.configs.clone()
    };
    // Names first: a typo is said before the calibration and the GPU are opened.
    let configs = pick_configs(&names).map_err(|e| e.to_string())?;
    let (cal, _) = crate::device::this_calibration(args.recalibrate)?;
    // The matmul choices the calibration timed (cached per adapter), so both run one kernel
    // per shape class.
    let tuned = crate::tuning_cache::open(args.retune)?;
    let ctx = tuned.ctx.clone();
    let json = args.json;
    let checks = pollster::block_on(run_ops(Backend::Gpu(ctx), &cal.profile, configs, |c| {
        if !json {
            print_ops(c);
        }
    }))
    .map_err(|e| e.to_string())?;
    if json {
        println!("{}", serde_json::to_string(&checks).map_err(|e| e.to_string())?);
    }
    Ok(())
}

pub fn run(args: Args) -> Result<(), String> {
    if args.ops {
        return run_ops_cli(&args);
    }
    if args.steps == 0 {
        return Err("--steps must be at least 1: the sweep reports medians of measured steps".into());
    }
    if args.recalibrate {
        return Err(
            "--recalibrate goes with --ops: the sweep calibrates `this` in its own rounds, beside the configurations it checks"
                .into(),
        );
    }
    let tuned = crate::tuning_cache::open(args.retune)?;
    let ctx = tuned.ctx.clone();
    if !args.json {
        println!(
            "calibrating `this` in the same rounds as the configurations (their load is its load), then pricing them on it"
        );
        println!(
            "{:<44} {:>7} {:>12} {:>12} {:>7}",
            "configuration", "devices", "measured ms", "predicted ms", "error"
        );
    }
    let json = args.json;
    let mut block = None;
    let sweep = pollster::block_on(run_sweep(&ctx, args.steps, |c| {
        if !json {
            if block != Some(c.block) {
                block = Some(c.block);
                println!("-- {}", block_title(c.block));
            }
            println!(
                "{:<44} {:>7} {:>12.2} {:>12.2} {:>+6.1}%",
                c.name, c.devices, c.measured_ms, c.predicted_ms, c.signed_pct
            );
        }
    }))
    .map_err(|e| e.to_string())?;
    if json {
        println!("{}", serde_json::to_string(&sweep).map_err(|e| e.to_string())?);
        return Ok(());
    }
    let count = |b: Block| sweep.checks.iter().filter(|c| c.block == b).count();
    println!(
        "on {}: measured, the median of {} steps taken in interleaved rounds over all {} configurations; predicted, the cost model on `this`",
        sweep.device,
        sweep.steps,
        sweep.checks.len()
    );
    println!(
        "  the calibration, made in these rounds: its programs' rounds spread {:.1}%{}",
        100.0 * sweep.calibration.spread,
        if sweep.calibration.noisy() {
            " (a busy machine: the errors below are the load's as much as the model's)"
        } else {
            ""
        }
    );
    crate::calibrate::print_profile(&sweep.calibration.profile);
    println!(
        "  sweep ({}): mean absolute percentage error {:.1}%",
        count(Block::Sweep),
        sweep.mape_pct
    );
    println!(
        "  held out ({}): {:.1}% (goal <= 25%)",
        count(Block::HeldOut),
        sweep.held_out_mape_pct
    );
    println!("  per size class (bias: the mean signed error, + when over-predicted):");
    for g in &sweep.groups {
        println!(
            "    {:<9} {:<5} {:>3} configurations: {:>5.1}% error, bias {:>+6.1}%",
            block_title(g.block),
            g.size,
            g.count,
            g.mape_pct,
            g.bias_pct
        );
    }
    match sweep.spearman {
        Some(r) => println!(
            "  ranking ({}): the search's predicted order against the measured one, Spearman {r:.2} (goal >= 0.8)",
            count(Block::Ranking)
        ),
        None => println!("  ranking: too few configurations to rank"),
    }
    Ok(())
}

fn block_title(b: Block) -> &'static str {
    match b {
        Block::Sweep => "sweep",
        Block::HeldOut => "held out",
        Block::Ranking => "ranking",
    }
}
