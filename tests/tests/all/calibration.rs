//! The calibration on a real adapter reads each rate off a program whose work outweighs its
//! launches: arrays sized for CPU adapters take less than a launch on a fast GPU.
use shardlab::profile::{calibrate_with, Budget};
use shardlab_tests::gpu_or_skip;

#[test]
fn arrays_smaller_than_a_launch_grow_until_their_work_outweighs_it() {
    let ctx = gpu_or_skip!();
    // Every array 64 elements (256 B): far below one launch's cost on any adapter, as the
    // CLI's arrays are on an H200.
    let budget = Budget {
        shrink: 30,
        fit_steps: false,
        sim_collectives: false,
        ..Budget::QUICK
    };
    let c = pollster::block_on(calibrate_with(ctx, budget)).expect("calibration");
    let array_bytes = |prefix: &str| -> f64 {
        let m = c
            .measurements
            .iter()
            .find(|m| m.name.starts_with(prefix))
            .unwrap_or_else(|| panic!("{prefix} measured: {:?}", c.measurements));
        // "mem_bandwidth (65.5 kB per array)": the size the rate was read off.
        let size = m
            .name
            .split('(')
            .nth(1)
            .and_then(|s| s.split(" per").next())
            .expect("a size");
        let (num, unit) = size.split_once(' ').expect("number and unit");
        let scale = match unit {
            "B" => 1.0,
            "kB" => 1e3,
            "MB" => 1e6,
            "GB" => 1e9,
            other => panic!("unit {other} in {}", m.name),
        };
        num.parse::<f64>().expect("a number") * scale
    };
    for rate in ["mem_bandwidth", "vector_flops", "int_ops"] {
        let bytes = array_bytes(rate);
        assert!(
            bytes >= 16e3,
            "{rate} read off {bytes} B arrays: they did not grow from 256 B"
        );
    }
    // The rates are then the adapter's, not the timer's: finite and positive.
    let p = &c.profile;
    for (name, v) in [
        ("mem_bandwidth", p.mem_bandwidth),
        ("vector_flops", p.vector_flops),
        ("int_ops", p.int_ops),
    ] {
        assert!(v.is_finite() && v > 0.0, "{name} {v}");
    }
}
