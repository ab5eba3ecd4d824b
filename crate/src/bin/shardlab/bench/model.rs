//! `shardlab bench model [--json]`: the cost model's predicted step time (device `this`,
//! simulated placement) beside the measured one for a sweep of small configurations, then
//! the mean absolute percentage error.
use shardlab::bench::model::{pick_configs, run_ops, run_sweep, OpsCheck, OPS_DEFAULT};
use shardlab::exec::Backend;
use shardlab::profile::OpGroup;

#[derive(clap::Args)]
pub struct Args {
    /// Measured steps per configuration (after 2 warm-up steps), one per round over all
    /// configurations; the median is taken.
    #[arg(long, default_value_t = 7)]
    pub steps: usize,
    /// Calibrate `this` again first.
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
    let (cal, _) = crate::device::this_calibration(args.recalibrate)?;
    let tuned = crate::tuning_cache::open(args.retune)?;
    let ctx = tuned.ctx.clone();
    if !args.json {
        println!(
            "{:<36} {:>7} {:>12} {:>12} {:>7}",
            "configuration", "devices", "measured ms", "predicted ms", "error"
        );
    }
    let json = args.json;
    let sweep = pollster::block_on(run_sweep(Backend::Gpu(ctx), &cal.profile, args.steps, |c| {
        if !json {
            println!(
                "{:<36} {:>7} {:>12.2} {:>12.2} {:>6.1}%",
                c.name, c.devices, c.measured_ms, c.predicted_ms, c.error_pct
            );
        }
    }))
    .map_err(|e| e.to_string())?;
    if json {
        println!("{}", serde_json::to_string(&sweep).map_err(|e| e.to_string())?);
    } else {
        println!(
            "{} configurations on {}: mean absolute percentage error {:.1}% (measured: median of {} steps, taken in interleaved rounds over all configurations; predicted: the cost model on `this`)",
            sweep.checks.len(),
            sweep.device,
            sweep.mape_pct,
            sweep.steps
        );
    }
    Ok(())
}
