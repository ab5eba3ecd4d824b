//! `shardlab bench kernels [--json]`: prints each measurement of shardlab::bench::kernels as it completes.
use std::io::Write;

use shardlab::bench::kernels::{
    attention_designs, causal_softmax, ceilings, elementwise_add, matmul_sizes, matmul_square, matmul_variants,
    BandwidthBench,
};

#[derive(clap::Args)]
pub struct Args {
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// The square matmul sizes to measure (default 256, 512, 1024, and 2048 on GPUs).
    #[arg(long, value_name = "N", value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Also time every matmul variant this adapter supports at n x n x n (each checked against
    /// the CPU): what the autotuner chooses among.
    #[arg(long, value_name = "N")]
    variants: Option<usize>,
    #[command(flatten)]
    retune: crate::tuning_cache::RetuneArg,
}

/// Softmax problem: 4096 rows of 1024 scores (4 x 1024 queries of a 1024-token causal window).
const SOFTMAX_ROWS: usize = 4096;
const SOFTMAX_T: usize = 1024;

/// Attention problem: the `small` step's (B*H = 8 x 4 heads, T 64, Dh 32).
const ATTENTION: (usize, usize, usize) = (32, 64, 32);

pub fn run(args: Args) -> Result<(), String> {
    let tuned = crate::tuning_cache::open(args.retune)?;
    let ctx = &*tuned.ctx;
    let out = |line: String| {
        println!("{line}");
        let _ = std::io::stdout().flush();
    };
    if !args.json {
        let s = &ctx.summary;
        out(format!(
            "adapter: {} ({}, {}, {})",
            s.name, s.backend, s.device_type, s.driver
        ));
    }
    // The ceilings first: the rows below read as fractions of them.
    let ceil = pollster::block_on(ceilings(ctx)).map_err(|e| e.to_string())?;
    if args.json {
        out(json_line(&ceil));
    } else {
        out(format!(
            "ceilings: {:.2} GFLOP/s of FMAs alone (fma_peak), {:.2} GB/s of storage-buffer copy (copy4)",
            ceil.fma_gflops, ceil.copy_gbps
        ));
        out(format!(
            "{:<8} {:>5}  {:<8} {:>9} {:>9} {:>14} {:>12} {:>9}",
            "kernel", "n", "variant", "GFLOP/s", "% FMAs", "naive GFLOP/s", "CPU GFLOP/s", "x naive"
        ));
    }
    if args.sizes.contains(&0) {
        return Err("--sizes: each size must be at least 1".into());
    }
    let sizes = match args.sizes.is_empty() {
        true => matmul_sizes(ctx),
        false => args.sizes.clone(),
    };
    for n in sizes {
        let r = pollster::block_on(matmul_square(ctx, n)).map_err(|e| e.to_string())?;
        if args.json {
            out(json_line(&r));
        } else {
            out(format!(
                "{:<8} {:>5}  {:<8} {:>9.2} {:>8.1}% {:>14.2} {:>12.2} {:>8.1}x",
                r.kernel,
                r.n,
                r.variant,
                r.gflops,
                100.0 * r.gflops / ceil.fma_gflops,
                r.naive_gflops,
                r.cpu_gflops,
                r.gflops / r.naive_gflops
            ));
        }
    }
    if let Some(n) = args.variants {
        if n == 0 {
            return Err("--variants must be at least 1".into());
        }
        for r in pollster::block_on(matmul_variants(ctx, n)).map_err(|e| e.to_string())? {
            if args.json {
                out(json_line(&r));
            } else {
                let chosen = if r.chosen { "  <- the autotuner's choice" } else { "" };
                out(format!(
                    "{:<8} {:>5}  {:<8} {:>9.2} {:>8.1}%{chosen}",
                    "variant",
                    r.n,
                    r.variant,
                    r.gflops,
                    100.0 * r.gflops / ceil.fma_gflops
                ));
            }
        }
    }
    let print_bandwidth = |r: BandwidthBench| {
        if args.json {
            out(json_line(&r));
        } else {
            out(format!(
                "{:<12} {:<36} {:>8.2} GB/s {:>6.1}% of copy  ({:.2} ms)",
                r.kernel,
                r.shape,
                r.gbps,
                100.0 * r.gbps / ceil.copy_gbps,
                r.ms
            ));
        }
    };
    print_bandwidth(pollster::block_on(elementwise_add(ctx)).map_err(|e| e.to_string())?);
    print_bandwidth(pollster::block_on(causal_softmax(ctx, SOFTMAX_ROWS, SOFTMAX_T)).map_err(|e| e.to_string())?);
    let (heads, t, dh) = ATTENTION;
    let designs = pollster::block_on(attention_designs(ctx, heads, t, dh)).map_err(|e| e.to_string())?;
    for r in &designs {
        if args.json {
            out(json_line(r));
        } else {
            let chosen = if r.chosen {
                "  <- the executor's choice here"
            } else {
                ""
            };
            out(format!(
                "{:<12} {:<30} {:<12} forward {:>8.3} ms  backward {:>8.3} ms{chosen}",
                r.kernel, r.design, r.shape, r.forward_ms, r.backward_ms
            ));
        }
    }
    if !args.json && !designs.iter().any(|r| r.chosen) {
        out("attention: this adapter runs the op composed through the tuned matmuls".to_string());
    }
    Ok(())
}

fn json_line<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}
