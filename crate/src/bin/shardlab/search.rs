//! `shardlab plan --search --device KIND --devices N <model flags> [--precision P] [--json]`:
//! which strategy? Every mesh of up to four axes, with ZeRO, sequence parallelism, the mode (auto, explicit, shard_map),
//! remat and a pipeline's schedule and microbatches, screened in closed form on N devices of
//! KIND, the fastest planned and priced exactly; the ten fastest of those that fit, each with
//! its memory, modelled step, what limits it and the command that plans it.
use std::time::Instant;

use shardlab::ir::CpOrder;
use shardlab::plan::Mode;
use shardlab::search::{search, SearchResult};

use crate::args::trainer_options;
use crate::plan::{f32_note, Args};

/// How many configurations the search lists.
const TOP: usize = 10;

pub fn run(mut args: Args) -> Result<(), String> {
    let p = &args.parallel;
    for (given, flag) in [
        (p.mesh.is_some(), "--mesh"),
        (p.strategy.is_some(), "--strategy"),
        (p.mode != Mode::Single, "--mode"),
        (!p.specs.is_empty() || p.spec_file.is_some(), "--spec"),
        (args.model.preset.is_some(), "--preset"),
        (args.trace.is_some(), "--trace"),
        (args.simulated, "--simulated"),
        (args.no_overlap, "--no-overlap"),
    ] {
        if given {
            return Err(format!(
                "{flag} does not go with --search, which tries every mesh, its options and every mode: drop {flag}"
            ));
        }
    }
    let Some(devices) = args.devices else {
        return Err("--search needs --devices N: how many devices of --device to plan for, e.g. --devices 8".into());
    };
    let device = crate::device::profile(&args.device)?;
    args.parallel.mode = Mode::Single;
    let mut base = trainer_options(&args.model, &args.parallel)?;
    base.config.precision = args.precision.precision;
    let t0 = Instant::now();
    let result = search(&base, &device, &args.device, devices).map_err(|e| e.to_string())?;
    let seconds = t0.elapsed().as_secs_f64();
    if args.json {
        let mut v = serde_json::to_value(&result).map_err(|e| e.to_string())?;
        if let Some(list) = v["ranked"].as_array_mut() {
            list.truncate(TOP);
        }
        v["fits"] = result.ranked.len().into();
        v["config"] = serde_json::to_value(&base.config).map_err(|e| e.to_string())?;
        v["seconds"] = seconds.into();
        v["kind"] = "modelled".into();
        if let Some(note) = f32_note(base.config.precision) {
            v["note"] = note.into();
        }
        println!("{v}");
        return Ok(());
    }
    print_text(&result, &base, seconds);
    Ok(())
}

fn print_text(r: &SearchResult, base: &shardlab::exec::TrainerOptions, seconds: f64) {
    let c = &base.config;
    println!(
        "which strategy for {} layers, d_model {}, batch {} x {}, on {} x {} (modelled, precision {}, attention {}, dropout {}):",
        c.layers, c.d_model, c.batch, c.seq, r.devices, r.device, c.precision.name(), c.attention.name(), c.dropout
    );
    if let Some(note) = f32_note(c.precision) {
        println!("  {note}");
    }
    println!(
        "  {} configurations ({}): {} do not split the model, {} do not fit, {} behind the {} fastest by the \
         closed-form estimate; those {} planned and priced exactly, {} fit:",
        r.considered,
        r.levers.join(" x "),
        r.invalid,
        r.too_large,
        r.screened,
        r.priced,
        r.priced,
        r.ranked.len(),
    );
    println!(
        "  {:>4}  {:<9} {:<22} {:<10} {:<5} {:>4} {:>12} {:>12} {:>12}  {}",
        "rank", "mode", "mesh", "options", "remat", "mb", "step ms", "estimate ms", "GiB/device", "limited by"
    );
    for x in r.ranked.iter().take(TOP) {
        let mut options = vec![];
        if x.zero != "0" {
            options.push(format!("zero{}", x.zero));
        }
        if x.sequence_parallel {
            options.push("sp".to_string());
        }
        if x.options.cp_order == CpOrder::Zigzag {
            options.push(CpOrder::Zigzag.name().to_string());
        }
        // A pipeline's schedule, and its virtual stages where it interleaves.
        options.extend(x.schedule.map(str::to_string));
        if x.virtual_stages > 1 {
            options.push(format!("v{}", x.virtual_stages));
        }
        let named = if x.strategy != x.mesh {
            format!("{} ({})", x.mesh, x.strategy)
        } else {
            x.mesh.clone()
        };
        println!(
            "  {:>4}  {:<9} {:<22} {:<10} {:<5} {:>4} {:>12.2} {:>12.2} {:>12.2}  {} ({:.0}%)",
            x.rank,
            x.mode,
            named,
            if options.is_empty() {
                "-".to_string()
            } else {
                options.join(" ")
            },
            x.remat,
            x.microbatches,
            x.step_ms,
            x.estimate_ms,
            x.bytes_per_device.total as f64 / (1u64 << 30) as f64,
            x.limiting,
            100.0 * x.limiting_share
        );
    }
    println!("  to plan one of them (add --trace FILE for its timeline):");
    for x in r.ranked.iter().take(TOP) {
        println!("  {:>4}  {}", x.rank, x.command);
    }
    if !r.invalid_reasons.is_empty() {
        println!("  not split, the first mesh each setting refuses:");
        for reason in &r.invalid_reasons {
            println!("        {reason}");
        }
    }
    println!("  searched in {seconds:.2} s");
}
