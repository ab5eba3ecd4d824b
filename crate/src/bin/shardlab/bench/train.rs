//! `shardlab bench train [--steps N] [--json]`: steps/s, tokens/s and ms per step split
//! into forward, backward and update, for the tiny and a small configuration.
use std::sync::Arc;

use shardlab::bench::train;
use shardlab::gpu::GpuContext;

#[derive(clap::Args)]
pub struct Args {
    /// Measured steps per configuration (after 2 warm-up steps).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// One JSON object per configuration.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<(), String> {
    if args.steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    let ctx = Arc::new(GpuContext::new_blocking().map_err(|e| e.to_string())?);
    if !args.json {
        println!("adapter: {} ({})", ctx.summary.name, ctx.summary.backend);
        println!(
            "{:<6} {:>9} {:>9} {:>10} {:>11} {:>10} {:>11} {:>10} {:>10}",
            "config", "params", "ms/step", "steps/s", "tokens/s", "fwd ms", "bwd ms", "update ms", "dispatches"
        );
    }
    for (name, cfg) in train::configs() {
        let r = pollster::block_on(train::train(ctx.clone(), name, cfg, args.steps)).map_err(|e| e.to_string())?;
        if args.json {
            println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
        } else {
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
        }
    }
    if !args.json {
        println!("ms/step: wall time, measured (median); fwd/bwd/update: wall time of each phase run alone, measured");
    }
    Ok(())
}
