//! `shardlab bench model [--json]`: the cost model's predicted step time (device `this`,
//! simulated placement) beside the measured one for a sweep of small configurations, then
//! the mean absolute percentage error.
use std::sync::Arc;

use shardlab::bench::model::run_sweep;
use shardlab::exec::Backend;
use shardlab::gpu::GpuContext;

#[derive(clap::Args)]
pub struct Args {
    /// Measured steps per configuration (after 2 warm-up steps).
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// Calibrate `this` again first.
    #[arg(long)]
    pub recalibrate: bool,
    /// Print one JSON object at the end instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<(), String> {
    let (cal, _) = crate::device::this_calibration(args.recalibrate)?;
    let ctx = Arc::new(GpuContext::new_blocking().map_err(|e| e.to_string())?);
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
            "{} configurations on {}: mean absolute percentage error {:.1}% (measured: median of {} steps; predicted: the cost model on `this`)",
            sweep.checks.len(),
            sweep.device,
            sweep.mape_pct,
            sweep.steps
        );
    }
    Ok(())
}
