//! The lines `inspect` and `plan` print for context parallelism: causal attention's work per
//! device (contiguous blocks leave the last device the most; zig-zag evens it), per ring step.
use shardlab::profile::AttentionBalance;

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
