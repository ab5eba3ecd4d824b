//! `shardlab calibrate [--json] [--recalibrate]`: the `this` device profile of the local
//! adapter from microbenchmarks, cached per adapter.
use crate::device::this_calibration;

#[derive(clap::Args)]
pub struct Args {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Measure again even if this adapter's calibration is cached.
    #[arg(long)]
    pub recalibrate: bool,
}

pub fn run(args: Args) -> Result<(), String> {
    let (c, cached) = this_calibration(args.recalibrate)?;
    if args.json {
        let mut v = serde_json::to_value(&c).map_err(|e| e.to_string())?;
        v["cached"] = cached.into();
        println!("{v}");
        return Ok(());
    }
    let p = &c.profile;
    let from = if cached {
        format!(
            "cached, {}; --recalibrate to measure again",
            crate::device::made_text(&c)
        )
    } else {
        format!(
            "measured in {:.1} s, {:.1} s of it building and tuning the programs; {}{}",
            c.seconds,
            c.prepare_seconds,
            crate::device::made_text(&c),
            if c.noisy() { " (noisy: not cached)" } else { "" }
        )
    };
    println!("device `this`: {} ({from})", c.adapter);
    print_profile(p);
    println!("  measurements:");
    for m in &c.measurements {
        println!(
            "    {:<22} {:>9.3} ms  -> {:.4e}  (rounds spread {:.1}%)",
            m.name,
            m.ms,
            m.value,
            100.0 * m.spread
        );
    }
    Ok(())
}

/// The profile's figures, a line each, as `calibrate` and `bench model` print them.
pub fn print_profile(p: &shardlab::profile::DeviceProfile) {
    println!(
        "  matmul peak        {:>10.2} GFLOP/s (half of it at {:.1} MFLOP per matmul)",
        p.matmul_flops / 1e9,
        p.matmul_half_flops / 1e6
    );
    // The fits of many small products at once, as the autotuned kernels run them.
    for (name, product, fixed, fit) in [
        ("batched matmul", "product", "dispatch", p.matmul_batched),
        ("fused attention", "(batch, head)", "op", p.attention),
    ] {
        if let Some(b) = fit {
            println!(
                "  {name:<18} {:>10.2} GFLOP/s, +{:.1} us per {product}, +{:.1} us per {fixed}",
                b.flops / 1e9,
                b.per_product_s * 1e6,
                b.fixed_s * 1e6
            );
        }
    }
    println!("  vector arithmetic  {:>10.2} GFLOP/s", p.vector_flops / 1e9);
    if let Some(bw) = p.sim_collective_bandwidth {
        println!(
            "  simulated collectives {:>7.2} GB/s (copies between device blocks of this GPU)",
            bw / 1e9
        );
    }
    println!(
        "  integer ops        {:>10.2} Gop/s ({:.1} M random words/s)",
        p.int_ops / 1e9,
        p.int_ops / shardlab::profile::THREEFRY_INT_OPS / 1e6
    );
    println!("  memory bandwidth   {:>10.2} GB/s", p.mem_bandwidth / 1e9);
    println!("  launch overhead    {:>10.1} us per dispatch", p.launch_s * 1e6);
    println!("  step overhead      {:>10.1} us per submit and wait", p.step_s * 1e6);
}
