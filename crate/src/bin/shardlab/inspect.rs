//! `shardlab inspect`: prints the train-step program, one line per op, and what it costs.
use shardlab::model::train_step_program;
use shardlab::profile::summarize;

use crate::args::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print one JSON object (the summary and the program text) instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<(), String> {
    let cfg = args.model.config();
    let step = train_step_program(&cfg, args.model.optimizer()?, args.model.rng_layout()).map_err(|e| e.to_string())?;
    let s = summarize(&step.program);
    if args.json {
        let v = serde_json::json!({
            "instructions": s.instructions,
            "flops_per_device": s.flops,
            "rng_bits_per_device": s.rng_bits,
            "peak_bytes_per_device": {
                "params": s.params_bytes,
                "optimizer_state": s.optimizer_state_bytes,
                "activations": s.activations_bytes,
                "total": s.total_bytes,
            },
            "program": step.program.to_text(),
        });
        println!("{v}");
        return Ok(());
    }
    print!("{}", step.program);
    println!();
    println!("# {} instructions ({} forward, {} backward, {} update)", s.instructions, step.forward_end, step.backward_end - step.forward_end, s.instructions - step.backward_end);
    println!("# FLOPs per step: {:.3e} (modelled)", s.flops as f64);
    println!("# random bits per step: {}", s.rng_bits);
    println!(
        "# memory: params {} B, optimizer state {} B, activations peak {} B, total {} B (modelled, by liveness)",
        s.params_bytes, s.optimizer_state_bytes, s.activations_bytes, s.total_bytes
    );
    Ok(())
}
