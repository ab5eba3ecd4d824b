//! The lines `inspect` and `plan` print for context parallelism: causal attention's work per
//! device (contiguous blocks leave the last device the most; zig-zag evens it), per ring step.
use shardlab::plan::PipelinePlan;
use shardlab::profile::{AttentionBalance, MeasuredBubble, PipelineBubble};

/// `prefix` starts each line (`# ` for inspect, `  ` for plan).
pub fn print(b: &AttentionBalance, prefix: &str) {
    let gflop = |f: u64| format!("{:.3}", f as f64 / 1e9);
    println!(
        "{prefix}attention per device (causal, GFLOP per step), busiest / mean = {:.2}:",
        b.imbalance()
    );
    for (d, (label, f)) in b.devices.iter().zip(&b.flops).enumerate() {
        let steps: Vec<String> = b.per_step.iter().map(|s| gflop(s[d])).collect();
        println!(
            "{prefix}  {label:<12} {:>10}   by ring step: {}",
            gflop(*f),
            steps.join(" ")
        );
    }
}

/// The lines for a pipeline: the bubble the formula says, and each stage's idle share of the
/// modelled step where the timeline has a row per device (`modelled`).
pub fn print_bubble(b: &PipelineBubble, pipeline: &PipelinePlan, modelled: bool, prefix: &str) {
    let chunks = match pipeline.chunks {
        1 => String::new(),
        v => format!(", {v} virtual stages"),
    };
    println!(
        "{prefix}pipeline: {} stages, {} microbatches, {}{chunks}: bubble {} = {:.1}% of the step",
        b.stages,
        b.microbatches,
        pipeline.schedule.name(),
        pipeline.schedule.bubble_text(pipeline.chunks),
        100.0 * b.formula
    );
    if modelled {
        let per: Vec<String> = b
            .modelled
            .iter()
            .enumerate()
            .map(|(s, f)| format!("stage {s} {:.1}%", 100.0 * f))
            .collect();
        println!("{prefix}  idle on the modelled timeline: {}", per.join(", "));
    }
}

/// The measured bubble's lines: each stage's idle share, fill and drain, its passes at the
/// times a profiled step on `adapter` measured.
pub fn print_measured_bubble(m: &MeasuredBubble, adapter: &str, prefix: &str) {
    let per: Vec<String> = (0..m.idle.len())
        .map(|s| {
            format!(
                "stage {s} {:.1}% (fill {:.2} ms, drain {:.2} ms)",
                100.0 * m.idle[s],
                m.fill_ms[s],
                m.drain_ms[s]
            )
        })
        .collect();
    println!(
        "{prefix}  idle measured, each pass at its profiled time on {adapter} ({:.2} ms a step so placed): {}",
        m.step_ms,
        per.join(", ")
    );
}
