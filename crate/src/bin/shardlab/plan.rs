//! `shardlab plan <model and parallel flags> --device NAME [--no-overlap] [--trace FILE] [--json]`:
//! the modelled step on real devices of one kind, from the per-device program alone (nothing is
//! trained, so configurations far too large to run here plan in seconds), and its timeline.
use std::path::PathBuf;

use shardlab::ir::Precision;
use shardlab::profile::{attention_balance, model_step, pipeline_bubble, OpSource, Placement, Trace};

use crate::args::{trainer_options, ModelArgs, ParallelArgs, PrecisionArg};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub parallel: ParallelArgs,
    #[command(flatten)]
    pub precision: PrecisionArg,
    /// Device kind: `this` (the local adapter, calibrated) or a preset (tpu_v4, tpu_v5e,
    /// h100, a100, rtx4090, m2_max).
    #[arg(long)]
    pub device: String,
    /// Price the mesh as shards of one device, as shardlab runs it here (what `bench model`
    /// checks), instead of one real device per mesh position.
    #[arg(long)]
    pub simulated: bool,
    /// Collectives block compute until they are done, instead of overlapping the independent
    /// compute after them as XLA's latency-hiding scheduler lets them: the step is then every
    /// op's time added up.
    #[arg(long)]
    pub no_overlap: bool,
    /// Write the modelled timeline to FILE as Chrome trace-event JSON (a process per device, a
    /// thread per stream), which ui.perfetto.dev and chrome://tracing open.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Instead of one plan: every strategy, mesh, mode and remat policy on --devices devices,
    /// planned and priced; what does not fit dropped; the ten fastest listed.
    #[arg(long)]
    pub search: bool,
    /// With --search: how many devices of --device to plan for.
    #[arg(long)]
    pub devices: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

fn gib(b: u64) -> String {
    format!("{:.3} GiB", b as f64 / (1u64 << 30) as f64)
}

pub fn run(mut args: Args) -> Result<(), String> {
    if args.search {
        return crate::search::run(args);
    }
    if args.devices.is_some() {
        return Err("--devices N goes with --search; to plan one configuration give --mesh instead".into());
    }
    args.model.apply_preset(&mut args.parallel);
    let mut opts = trainer_options(&args.model, &args.parallel)?;
    opts.config.precision = args.precision.precision;
    let device = crate::device::profile(&args.device)?;
    let planned = shardlab::plan::build(&opts).map_err(|e| e.to_string())?;
    let trace_file = args
        .trace
        .as_deref()
        .map(crate::trace_file::TraceFile::create)
        .transpose()?;
    let placement = if args.simulated {
        Placement::Simulated
    } else {
        Placement::Real
    };
    let (p, timeline) = model_step(&planned.step.program, &device, placement, !args.no_overlap);
    let mode = opts.parallel.mode_name();
    let strategy = opts.parallel.parallelism().map(|_| opts.parallel.label());
    let mesh = opts.parallel.mesh().map(|m| m.to_string());
    if let Some(file) = trace_file {
        let mut trace = Trace::new();
        let title = strategy.as_ref().map_or(mode.to_string(), |s| format!("{mode} {s}"));
        trace.add(&title, &timeline, &[OpSource::of_planned(&planned)]);
        let path = file.path().display().to_string();
        file.write(&trace)?;
        if !args.json {
            println!(
                "wrote {path} ({} devices, {} spans): open it in https://ui.perfetto.dev or chrome://tracing",
                timeline.devices.len(),
                timeline.spans()
            );
        }
    }
    let rng = match opts.rng_layout {
        shardlab::ir::RngLayout::Original => "original",
        shardlab::ir::RngLayout::Partitionable => "partitionable",
    };
    if args.json {
        let mut v = serde_json::to_value(&p).map_err(|e| e.to_string())?;
        v["mode"] = mode.into();
        v["strategy"] = strategy.into();
        v["mesh"] = mesh.into();
        v["rng"] = rng.into();
        v["config"] = serde_json::to_value(&opts.config).map_err(|e| e.to_string())?;
        v["kind"] = "modelled".into();
        v["precision_policy"] = opts.config.precision.describe().into();
        if let Some(note) = f32_note(opts.config.precision) {
            v["note"] = note.into();
        }
        v["attention_balance"] =
            serde_json::to_value(attention_balance(&planned.step.program)).map_err(|e| e.to_string())?;
        if let Some(b) = pipeline_bubble(&planned.step.program, &timeline, &opts.pipeline()) {
            v["pipeline"] = serde_json::to_value(&b).map_err(|e| e.to_string())?;
            v["pipeline"]["schedule"] = opts.schedule.name().into();
        }
        println!("{v}");
        return Ok(());
    }
    let what = match (strategy, &mesh) {
        (Some(s), Some(m)) => format!("{mode} {s} on {m}"),
        _ => mode.to_string(),
    };
    let on = match placement {
        Placement::Real => format!("{} x {}", p.devices, p.device_label),
        Placement::Simulated => format!("{} simulated devices on one {}", p.devices, p.device_label),
    };
    println!(
        "modelled step ({what}, rng {rng}, precision {}) on {on}: {:.3} ms",
        opts.config.precision.name(),
        p.step_ms
    );
    if let Some(note) = f32_note(opts.config.precision) {
        println!("  {}; {note}", opts.config.precision.describe());
    }
    if placement == Placement::Real {
        let hidden = p.serial_ms - p.step_ms;
        if p.overlap {
            println!(
                "  collectives overlap later compute; every op one after another: {:.3} ms (overlap hides {:.3} ms, {:.1}%)",
                p.serial_ms,
                hidden,
                100.0 * hidden / p.serial_ms.max(f64::MIN_POSITIVE)
            );
        } else {
            println!("  no overlap (--no-overlap): every op one after another");
        }
    }
    println!("  per device, by category:");
    for (cat, ms) in &p.breakdown_ms {
        println!("    {cat:<12} {ms:>12.3} ms  {:>5.1}%", 100.0 * ms / p.step_ms);
    }
    for (kind, c) in &p.collectives {
        if c.count > 0 {
            let hidden = match p.collectives_hidden.get(kind) {
                Some(h) if p.overlap => format!(", {:.0}% of it hidden behind compute", 100.0 * h),
                _ => String::new(),
            };
            println!(
                "  {kind}: {} ops, {} bytes, {:.0} hops, {:.3} ms in flight{hidden}",
                c.count, c.bytes, c.hops, c.ms
            );
        }
    }
    if let Some(b) = attention_balance(&planned.step.program) {
        crate::balance::print(&b, "  ");
    }
    if let Some(b) = pipeline_bubble(&planned.step.program, &timeline, &opts.pipeline()) {
        crate::balance::print_bubble(&b, &opts.pipeline(), placement == Placement::Real, "  ");
    }
    let b = &p.bytes_per_device;
    let copy = if b.compute_params > 0 {
        format!(" (f32 masters) + their bf16 copy {}", gib(b.compute_params))
    } else {
        String::new()
    };
    println!(
        "  memory per device: params {}{copy}, optimizer state {}, gradients {}, activations (peak) {}, total {} of {} ({})",
        gib(b.params),
        gib(b.optimizer_state),
        gib(b.gradients),
        gib(b.activations),
        gib(b.total),
        gib(p.capacity_bytes),
        if p.fits { "fits" } else { "does not fit" }
    );
    if let Some(why) = p.overflow() {
        println!("  it {why}");
    }
    if !p.estimated.is_empty() {
        println!("  estimated figures of {}: {}", p.device, p.estimated.join(", "));
    }
    Ok(())
}

/// What a plan other than f32 says wherever it is shown: it is priced, not what runs here.
pub fn f32_note(precision: Precision) -> Option<&'static str> {
    (precision != Precision::F32)
        .then_some("priced only: the sandbox itself trains in f32 (`shardlab train` and the page run float32)")
}
