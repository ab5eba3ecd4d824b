//! `shardlab train`: trains the model, with a live progress line on a terminal or one JSON
//! object per step with `--json`.
use std::io::{IsTerminal, Write};

use shardlab::exec::{Backend, Trainer};
use shardlab::plan::{MemoryLimits, TrainerOptions};

use crate::args::{trainer_options, MemoryBudgetArg, ModelArgs, ParallelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub parallel: ParallelArgs,
    /// Number of optimizer updates.
    #[arg(long, default_value_t = 200)]
    pub steps: u64,
    /// One JSON object per line: {"step":k,"loss":L,"step_ms":t}, then {"done":true,...} with
    /// the mode and the median step time after the warm-up steps, as exported JAX scripts print.
    #[arg(long)]
    pub json: bool,
    /// Run on the CPU reference executor instead of the GPU.
    #[arg(long)]
    pub cpu: bool,
    #[command(flatten)]
    pub budget: MemoryBudgetArg,
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
    let limits = args.budget.limits(&backend);
    pollster::block_on(train(backend, opts, &limits, args.steps, args.json)).map_err(|e| e.to_string())
}

async fn train(
    backend: Backend,
    opts: TrainerOptions,
    limits: &MemoryLimits,
    steps: u64,
    json: bool,
) -> Result<(), shardlab::exec::ExecError> {
    let mode = opts.parallel.mode_name();
    let mut trainer = Trainer::with_limits(backend, opts, limits).await?;
    let tty = !json && std::io::stderr().is_terminal();
    let mut err = std::io::stderr();
    let mut step_ms = Vec::new();
    for _ in 0..steps {
        let s = trainer.step().await?;
        step_ms.push(s.step_ms);
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
        let (median, timed) = median_after_warmup(&step_ms);
        let median = median.map_or("null".to_string(), |m| format!("{m:.3}"));
        println!(
            "{{\"done\":true,\"steps\":{steps},\"final_loss\":{final_loss},\"mode\":\"{mode}\",\
             \"median_step_ms\":{median},\"timed_steps\":{timed}}}"
        );
    } else {
        if tty {
            eprintln!();
        }
        let last_ms = step_ms.last().copied().unwrap_or(0.0);
        println!("done: {steps} steps, final loss {final_loss:.4} (last step {last_ms:.1} ms)");
    }
    Ok(())
}

/// Steps before the timed ones, as in the exported JAX scripts (`WARMUP` in export/main.py):
/// the first builds pipelines and tunes, the second settles caches.
const WARMUP: usize = 2;

/// The median step time after the warm-up steps (the upper median, as the JAX scripts take
/// it, so the two compare like for like) and how many steps it covers; None if none were timed.
fn median_after_warmup(step_ms: &[f64]) -> (Option<f64>, usize) {
    let mut timed: Vec<f64> = step_ms.iter().skip(WARMUP).copied().collect();
    timed.sort_by(f64::total_cmp);
    (timed.get(timed.len() / 2).copied(), timed.len())
}

#[cfg(test)]
mod tests {
    use super::median_after_warmup;

    #[test]
    fn median_skips_the_warmup_steps_and_takes_the_upper_middle() {
        assert_eq!(median_after_warmup(&[900.0, 50.0, 3.0, 1.0, 2.0, 4.0]), (Some(3.0), 4));
        assert_eq!(median_after_warmup(&[900.0, 50.0, 7.0]), (Some(7.0), 1));
        assert_eq!(median_after_warmup(&[900.0, 50.0]), (None, 0));
    }
}
