//! `shardlab train`: trains the model, with a live progress line on a terminal or one JSON
//! object per step with `--json`.
use std::io::{IsTerminal, Write};

use shardlab::exec::{Backend, Trainer};
use shardlab::plan::TrainerOptions;

use crate::args::{trainer_options, ModelArgs, ParallelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub parallel: ParallelArgs,
    /// Number of optimizer updates.
    #[arg(long, default_value_t = 200)]
    pub steps: u64,
    /// One JSON object per line: {"step":k,"loss":L,"step_ms":t}, then {"done":true,...}.
    #[arg(long)]
    pub json: bool,
    /// Run on the CPU reference executor instead of the GPU.
    #[arg(long)]
    pub cpu: bool,
    #[command(flatten)]
    pub retune: crate::tuning_cache::RetuneArg,
}

pub fn run(mut args: Args) -> Result<(), String> {
    args.model.apply_preset(&mut args.parallel);
    let opts = trainer_options(&args.model, &args.parallel)?;
    if args.steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    let tuned = if args.cpu {
        None
    } else {
        Some(crate::tuning_cache::open(args.retune)?)
    };
    let backend = match &tuned {
        None => Backend::Reference,
        Some(t) => Backend::Gpu(t.ctx.clone()),
    };
    pollster::block_on(train(backend, opts, args.steps, args.json)).map_err(|e| e.to_string())
}

async fn train(
    backend: Backend,
    opts: TrainerOptions,
    steps: u64,
    json: bool,
) -> Result<(), shardlab::exec::ExecError> {
    let mut trainer = Trainer::new(backend, opts).await?;
    let tty = !json && std::io::stderr().is_terminal();
    let mut err = std::io::stderr();
    let mut last_ms = 0.0;
    for _ in 0..steps {
        let s = trainer.step().await?;
        last_ms = s.step_ms;
        if json {
            println!(
                "{{\"step\":{},\"loss\":{},\"step_ms\":{:.3}}}",
                s.step, s.loss, s.step_ms
            );
        } else if tty {
            let done = s.step + 1;
            let width = 30;
            let filled = (done as usize * width) / steps as usize;
            let _ = write!(
                err,
                "\r[{}{}] step {done}/{steps}  loss {:.4}  {:.1} ms/step ",
                "#".repeat(filled),
                ".".repeat(width - filled),
                s.loss,
                s.step_ms
            );
            let _ = err.flush();
        } else if s.step % 10 == 0 || s.step + 1 == steps {
            eprintln!("step {:>5}  loss {:.4}  {:.1} ms", s.step, s.loss, s.step_ms);
        }
    }
    let final_loss = trainer.eval_loss().await?;
    if json {
        println!("{{\"done\":true,\"steps\":{steps},\"final_loss\":{final_loss}}}");
    } else {
        if tty {
            eprintln!();
        }
        println!("done: {steps} steps, final loss {final_loss:.4} (last step {last_ms:.1} ms)");
    }
    Ok(())
}
