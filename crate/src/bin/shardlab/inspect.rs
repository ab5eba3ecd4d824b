//! `shardlab inspect`: the (per-device) train-step program, one line per op with each
//! value's sharding, and what it costs: FLOPs, collectives, random bits, memory per device,
//! dispatches, the measured step time on this machine, and the cost model's step on N real
//! devices of a chosen kind (`--device`), with its per-category breakdown. In explicit mode,
//! first the global program typed op by op, its choices and where its random bits live.

use shardlab::exec::{Backend, Trainer};
use shardlab::plan::TrainerOptions;
use shardlab::profile::{
    attention_balance, measured_bubble, model_step, pipeline_bubble, summarize, DeviceProfile, Placement,
};

use crate::args::{trainer_options, MemoryBudgetArg, ModelArgs, ParallelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub parallel: ParallelArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Measure on the CPU reference executor (also used when there is no GPU adapter).
    #[arg(long)]
    pub cpu: bool,
    /// Steps measured for the step time (after one warm-up step).
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Device kind the modelled step is priced on, as for `shardlab plan`: `this` (the local
    /// adapter, calibrated) or a preset (tpu_v4, tpu_v5e, h100, a100, rtx4090, m2_max).
    #[arg(long, default_value = "tpu_v4")]
    pub device: String,
    #[command(flatten)]
    pub budget: MemoryBudgetArg,
}

pub fn run(mut args: Args) -> Result<(), String> {
    args.model.apply_preset(&mut args.parallel);
    let opts = trainer_options(&args.model, &args.parallel)?;
    // Before the step runs, so an unknown device name fails fast.
    let profile = crate::device::profile(&args.device)?;
    // With the matmul choices cached for this adapter, as `train` and `bench` run them: tuned
    // afresh in each process, close choices (tex16 or sg1) moved the dispatch count between runs.
    let tuned = if args.cpu {
        None
    } else {
        match crate::tuning_cache::open(Default::default()) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("note: {e}; measuring on the CPU reference executor");
                None
            }
        }
    };
    let (backend, device) = match &tuned {
        None => (Backend::Reference, "CPU reference executor".to_string()),
        Some(t) => (Backend::Gpu(t.ctx.clone()), t.ctx.summary.identity()),
    };
    pollster::block_on(inspect(backend, device, &profile, opts, &args)).map_err(|e| e.to_string())
}

async fn inspect(
    backend: Backend,
    device: String,
    profile: &DeviceProfile,
    opts: TrainerOptions,
    args: &Args,
) -> Result<(), shardlab::exec::ExecError> {
    let limits = args.budget.limits(&backend);
    let mut t = Trainer::with_limits(backend, opts, &limits).await?;
    // In automatic mode, also what the partitioner inserted and why (at the instructions of
    // the program that runs, after any combining).
    let inserted = t.planned().inserted.clone();
    // In explicit mode, the typed global program: its types, choices and random bits.
    let explicit = t.planned().explicit.clone();
    let s = summarize(t.program());
    t.step().await?;
    let mut times = vec![];
    for _ in 0..args.steps.max(1) {
        times.push(t.step().await?.step_ms);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let step_ms = times[times.len() / 2];
    let collectives_ms = t.collectives_ms().await?.unwrap_or(0.0);
    // Modelled from the program alone: one real device of `profile` per mesh position.
    let (modelled, timeline) = model_step(t.program(), profile, Placement::Real, true);
    let bubble = pipeline_bubble(t.program(), &timeline, &t.options().pipeline());
    // A pipeline's bubble measured too: each pass at its instructions' profiled time.
    let measured = match &bubble {
        Some(_) => t
            .profile_step()
            .await?
            .1
            .and_then(|p| measured_bubble(t.program(), &p, &t.options().pipeline())),
        None => None,
    };
    let dispatches = (t.dispatches_per_step() > 0).then(|| t.dispatches_per_step());

    if args.json {
        let totals = s.collective_totals();
        let v = serde_json::json!({
            "devices": s.devices,
            "collectives": totals,
            "rng_bits_per_device": s.rng_bits,
            "flops_per_device": s.flops,
            "peak_bytes_per_device": {
                "params": s.params_bytes,
                "optimizer_state": s.optimizer_state_bytes,
                "gradients": s.gradients_bytes,
                "activations": s.activations_bytes,
                "total": s.total_bytes,
            },
            "largest_tensor_per_device": s.largest_tensor,
            "dispatches": dispatches,
            "texture_copies": dispatches.map(|_| t.copies_per_step()),
            "measured_step_ms": step_ms,
            "measured_on": device,
            "measured_collectives_ms": collectives_ms,
            "modelled": modelled,
            "warnings": s.warnings,
            "inserted": inserted,
            "explicit": explicit,
            "attention_balance": attention_balance(t.program()),
            "pipeline": bubble.as_ref().map(|b| serde_json::json!({
                "stages": b.stages,
                "microbatches": b.microbatches,
                "schedule": t.options().schedule.name(),
                "virtual_stages": t.options().virtual_stages,
                "stage_layers": t.options().stage_layers,
                "stage_flops": s.stage_flops,
                "formula": b.formula,
                "modelled": b.modelled,
                "measured": measured,
            })),
            "program": t.program().to_text(),
        });
        println!("{v}");
        return Ok(());
    }
    let ts = t.train_step();
    if let Some(x) = &explicit {
        print_explicit(x);
    }
    print!("{}", t.program());
    println!();
    println!(
        "# {} devices, {} instructions ({} forward, {} backward, {} update)",
        s.devices,
        s.instructions,
        ts.forward_end,
        ts.backward_end - ts.forward_end,
        s.instructions - ts.backward_end
    );
    println!("# FLOPs per device per step: {:.3e}", s.flops as f64);
    if !s.stage_flops.is_empty() {
        let per: Vec<String> = s.stage_flops.iter().map(|f| format!("{:.3e}", *f as f64)).collect();
        println!("# FLOPs per stage per step: {}", per.join(", "));
    }
    println!("# random bits per device per step: {}", s.rng_bits);
    for (kind, k) in s.collective_totals() {
        if k.count > 0 {
            let arrays = if k.operands != k.count {
                format!(" carrying {} arrays (combined)", k.operands)
            } else {
                String::new()
            };
            println!("# {kind}: {} ops{arrays}, {} bytes", k.count, k.bytes);
        }
    }
    println!(
        "# memory per device: params {} B, optimizer state {} B, gradients {} B, activations (peak) {} B, total {} B; largest tensor {} {} ({} B)",
        s.params_bytes,
        s.optimizer_state_bytes,
        s.gradients_bytes,
        s.activations_bytes,
        s.total_bytes,
        s.largest_tensor.name,
        shardlab::ir::fmt_shape(&s.largest_tensor.shape),
        s.largest_tensor.bytes
    );
    if let Some(d) = dispatches {
        println!(
            "# GPU dispatches per step: {d} ({} compute, {} buffer-to-texture copies of matmul operands)",
            d - t.copies_per_step(),
            t.copies_per_step()
        );
    }
    println!("# measured on {device}: {step_ms:.2} ms per step (all simulated devices), of which collectives {collectives_ms:.2} ms");
    println!(
        "# modelled on {} x {} (cost model, --device {}): {:.3} ms per step; per device, by category:",
        modelled.devices, modelled.device_label, modelled.device, modelled.step_ms
    );
    for (cat, ms) in &modelled.breakdown_ms {
        println!("#   {cat:<12} {ms:>12.3} ms  {:>5.1}%", 100.0 * ms / modelled.step_ms);
    }
    for (kind, c) in &modelled.collectives {
        if let (true, Some(h)) = (c.count > 0, modelled.collectives_hidden.get(kind)) {
            println!(
                "# modelled {kind}: {:.3} ms in flight per device, {:.0}% of it hidden behind compute",
                c.ms,
                100.0 * h
            );
        }
    }
    if let Some(b) = attention_balance(t.program()) {
        crate::balance::print(&b, "# ");
    }
    if let Some(b) = &bubble {
        crate::balance::print_bubble(b, &t.options().pipeline(), true, "# ");
        if let Some(m) = &measured {
            crate::balance::print_measured_bubble(m, &device, "# ");
        }
    }
    println!(
        "# modelled memory per device: {} of {} B ({})",
        modelled.bytes_per_device.total,
        modelled.capacity_bytes,
        if modelled.fits { "fits" } else { "does not fit" }
    );
    if let Some(x) = &explicit {
        for b in &x.random_bits {
            println!(
                "# random bits of {}: {} ({} layout): {}; {} of {} elements per device",
                b.value, b.ty, b.layout, b.generation, b.generated_per_device, b.global_elements
            );
        }
    }
    if let Some(inserted) = &inserted {
        println!(
            "# inserted by the partitioner ({}): [instruction] op of value for consumer: rule",
            inserted.len()
        );
        for r in inserted {
            let at = r.source_instr.map(|i| format!(" (#{i})")).unwrap_or_default();
            println!(
                "#   [{}] {} of {} for {}{at}: {}",
                r.instr, r.op, r.value, r.source_op, r.rule
            );
        }
    }
    for w in &s.warnings {
        println!("# warning: {w}");
    }
    Ok(())
}

/// The typed global program of explicit mode, then its choices: each line that writes
/// `out_sharding=` or `reshard`, the value it types and why.
fn print_explicit(x: &shardlab::plan::ExplicitView) {
    println!(
        "# explicit sharding: the global program typed on mesh axes {} (jax.make_mesh(..., axis_types={}))",
        x.axis_types, x.jax_axis_types
    );
    for line in &x.lines {
        println!("{}", line.text);
    }
    println!(
        "# the program's choices ({}): [instruction] out_sharding= or reshard of value: why",
        x.choices.len()
    );
    for c in &x.choices {
        let how = match c.kind {
            shardlab::partition::explicit::ChoiceKind::OutSharding => "out_sharding=",
            shardlab::partition::explicit::ChoiceKind::Reshard => "reshard to ",
        };
        println!("#   [{}] {how}{} of {}: {}", c.instr, c.spec, c.value, c.why);
    }
    println!();
}
