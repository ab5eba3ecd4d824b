//! One instruction priced on a device profile: its launches plus the larger of its arithmetic
//! time (matmul FLOPs at a shape-dependent throughput, vector FLOPs, integer ops) and its
//! memory time (a roofline); a collective crosses the mesh topology, or, simulated, is a
//! copy between device blocks of one adapter. `predict` places the priced ops on a
//! timeline.
use super::collective::CollectiveKind;
use super::device::{DeviceProfile, MatmulFit};
use super::summary::summarize;
use super::topology::{collective_time_on, MeshLayout};
use super::work::{program_work_lowered, DotShape, Placement, Work};
use super::{category, Category};
use crate::ir::Program;

/// The breakdown's bucket for kernel-launch overhead (and the fixed per-step cost).
pub const LAUNCH: &str = "launch";

/// The kernel figures a matmul of `dot` (times `copies` devices' worth of batch, as one
/// dispatch) runs at on `d`: batched products (more than one in the dispatch) at the batched
/// class's where the profile has them, as the executor's autotuner picks kernels per class.
pub fn matmul_fit(d: &DeviceProfile, dot: DotShape, copies: usize) -> MatmulFit {
    let single = MatmulFit {
        flops: d.matmul_flops,
        half_flops: d.matmul_half_flops,
        per_product_s: 0.0,
        fixed_s: 0.0,
    };
    match d.matmul_batched {
        Some(b) if copies * dot.batch > 1 => b,
        _ => single,
    }
}

/// Throughput fraction a matmul of `dot` (times `copies` independent devices' worth of
/// batch) reaches on `d` against its class's peak: the share of the peak large matmuls sustain
/// on the part (`matmul_sustained`), padding waste per tile dimension, the idle units of a
/// partial last wave, and the start-up cost of small products (half the peak at the class's
/// `half_flops`).
pub fn matmul_efficiency(d: &DeviceProfile, dot: DotShape, copies: usize) -> f64 {
    let pad = |x: usize, t: usize| {
        let t = t.max(1);
        x as f64 / (x.div_ceil(t) * t) as f64
    };
    let [tm, tn, tk] = d.matmul_tile;
    let tiles = copies * dot.batch * dot.m.div_ceil(tm.max(1)) * dot.n.div_ceil(tn.max(1));
    let units = d.matmul_units.max(1);
    let wave = tiles as f64 / (tiles.div_ceil(units) * units) as f64;
    // In f64: the product overflows a 32-bit usize (wasm32) for the report's model.
    let flops = 2.0
        * [copies, dot.batch, dot.m, dot.n, dot.k]
            .iter()
            .map(|&x| x as f64)
            .product::<f64>();
    let half = matmul_fit(d, dot, copies).half_flops;
    let size = if half > 0.0 { flops / (flops + half) } else { 1.0 };
    (d.matmul_sustained * pad(dot.m, tm) * pad(dot.n, tn) * pad(dot.k, tk) * wave * size).max(1e-6)
}

/// Seconds of one instruction's work (launches excluded), `copies` devices' worth at once: the
/// larger of its arithmetic and its memory time (a roofline).
pub fn work_seconds(d: &DeviceProfile, w: &Work, copies: usize) -> f64 {
    let (compute, memory) = work_split(d, w, copies);
    compute.max(memory)
}

/// Seconds of one instruction's arithmetic (matmul, vector, integer) and of its bytes through
/// memory, `copies` devices' worth at once: the roofline's two sides.
pub fn work_split(d: &DeviceProfile, w: &Work, copies: usize) -> (f64, f64) {
    let c = copies as f64;
    if let (true, Some(fit)) = (w.fused_attention, d.attention) {
        // The sandbox's own attention kernels, as calibrated: per op, per (batch, head) product
        // and per FLOP, on every copy.
        let products = w.dot.map_or(1, |dot| dot.batch) as f64;
        let flops = w.matmul_flops + w.vector_flops;
        let op = fit.fixed_s + products * fit.per_product_s + flops / fit.flops.max(1e-30);
        return (c * op + c * w.int_ops / d.int_ops, c * w.bytes / d.mem_bandwidth);
    }
    let matmul = match w.dot {
        Some(dot) => {
            let fit = matmul_fit(d, dot, copies);
            let products = (copies * dot.batch) as f64;
            fit.fixed_s
                + products * fit.per_product_s
                + c * w.matmul_flops / (fit.flops * matmul_efficiency(d, dot, copies))
        }
        None => 0.0,
    };
    let compute = matmul + c * w.vector_flops / d.vector_flops + c * w.int_ops / d.int_ops;
    (compute, c * w.bytes / d.mem_bandwidth)
}

/// A collective run as shardlab simulates it: a kernel copying between device blocks of one
/// adapter's memory. Each output element reads its group's `g` blocks (all-reduce) or one.
pub(crate) fn sim_collective_bytes(kind: CollectiveKind, bytes: u64, group: usize, devices: usize) -> f64 {
    let full = bytes as f64;
    let local_out = match kind {
        CollectiveKind::AllReduce => full,
        CollectiveKind::AllGather => full,
        CollectiveKind::ReduceScatter => full / group as f64,
        CollectiveKind::AllToAll | CollectiveKind::CollectivePermute => full,
    };
    let reads = match kind {
        CollectiveKind::AllReduce => full * group as f64,
        _ => full,
    };
    devices as f64 * (reads + local_out)
}

/// Seconds of a simulated collective on `device`: its bytes at the rate simulated collectives
/// run at there (calibrated on `this`), else at the memory bandwidth. `in_place` of its bytes
/// (a psum's operands the executor sums in place over a gradient arena) move each device's
/// element once in and once out, where a psum alone reads every group member's for each
/// device's result.
fn simulated_collective_seconds(
    device: &DeviceProfile,
    kind: CollectiveKind,
    bytes: u64,
    group: usize,
    devices: usize,
    in_place: f64,
) -> f64 {
    let alone = sim_collective_bytes(kind, bytes, group, devices);
    let packed = 2.0 * devices as f64 * bytes as f64;
    let moved = (1.0 - in_place) * alone + in_place * packed;
    moved / device.sim_collective_bandwidth.unwrap_or(device.mem_bandwidth)
}

/// One instruction priced: its launches and its work (or, for a collective, its transfer).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct OpPrice {
    pub instr: usize,
    pub category: Category,
    pub launches: usize,
    /// Seconds of its launches (`launches` x the profile's launch overhead).
    pub launch_s: f64,
    /// Seconds of its work beyond the launches (a collective: its transfer).
    pub work_s: f64,
    /// Its matmul and vector FLOPs per device.
    pub flops: f64,
    /// The collective it is, with its bytes and link hops (0 hops when simulated).
    pub collective: Option<(CollectiveKind, u64, f64)>,
    /// Whether its bytes through memory take longer than its arithmetic (the roofline's
    /// memory side bounds it); false for collectives.
    pub memory_bound: bool,
}

/// Prices every instruction of `prog` on `device`, in program order: what `predict` sums.
pub fn price_ops(prog: &Program, device: &DeviceProfile, placement: Placement) -> Vec<OpPrice> {
    // Dots at the rate of the program's precision (bf16's under mixed precision).
    let device = &*device.at_precision(prog.precision);
    let devices = prog.devices();
    let copies = match placement {
        Placement::Real => 1,
        Placement::Simulated => devices,
    };
    let summary = summarize(prog);
    // How the executor lowers it: its launches, fused pairs and the psums it sums in place.
    let lowered = crate::exec::lowered(prog);
    let layout = prog.mesh.as_ref().map(|m| MeshLayout::of(m, device));
    let mut uses = summary.collectives.iter().peekable();
    let mut out = Vec::with_capacity(prog.instrs.len());
    for ((i, ins), w) in prog
        .instrs
        .iter()
        .enumerate()
        .zip(program_work_lowered(prog, placement, &lowered))
    {
        let mut memory_bound = false;
        let (work_s, collective) = match uses.peek() {
            Some(c) if c.instr == i => {
                let c = uses.next().expect("peeked");
                match placement {
                    Placement::Real => {
                        let axes: Vec<&str> = c.axes.iter().map(String::as_str).collect();
                        let t = match &layout {
                            Some(layout) => collective_time_on(device, layout, c.kind, c.bytes, &axes),
                            None => super::topology::collective_time(device, c.kind, c.bytes, c.group),
                        };
                        (t.seconds, Some((c.kind, c.bytes, t.hops)))
                    }
                    Placement::Simulated => {
                        let operands: usize = ins.inputs.iter().map(|v| crate::ir::numel(prog.shape(*v))).sum();
                        let in_place = match lowered.get(i) {
                            Some(l) if operands > 0 => l.summed_in_place as f64 / operands as f64,
                            _ => 0.0,
                        };
                        (
                            simulated_collective_seconds(device, c.kind, c.bytes, c.group, devices, in_place),
                            Some((c.kind, c.bytes, 0.0)),
                        )
                    }
                }
            }
            _ => {
                let (compute, memory) = work_split(device, &w, copies);
                memory_bound = memory > compute;
                (compute.max(memory), None)
            }
        };
        out.push(OpPrice {
            instr: i,
            category: category(ins),
            launches: w.launches,
            launch_s: w.launches as f64 * device.launch_s,
            work_s,
            flops: w.matmul_flops + w.vector_flops,
            collective,
            memory_bound,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::device::{h100, tpu_v4};

    #[test]
    fn gradient_psums_summed_in_place_move_each_element_once_in_and_once_out() {
        use crate::model::GptConfig;
        use crate::plan::{DropoutKey, Parallel, Strategy, TrainerOptions};
        let parallel = Parallel::ShardMap {
            par: Strategy::Dp
                .compose(&crate::sharding::Mesh::parse("dp=8").unwrap())
                .unwrap(),
            dropout_key: DropoutKey::Same,
        };
        let cfg = GptConfig {
            batch: 8,
            ..GptConfig::tiny()
        };
        let prog = crate::plan::build(&TrainerOptions::new(cfg, parallel))
            .unwrap()
            .step
            .program;
        let device = DeviceProfile {
            sim_collective_bandwidth: Some(1e9),
            ..tpu_v4()
        };
        let lowered = crate::exec::lowered(&prog);
        let prices = price_ops(&prog, &device, Placement::Simulated);
        let mut in_place = 0;
        for (i, ins) in prog.instrs.iter().enumerate() {
            let Some((CollectiveKind::AllReduce, bytes, _)) = prices[i].collective else {
                continue;
            };
            let operands: usize = ins.inputs.iter().map(|v| crate::ir::numel(prog.shape(*v))).sum();
            // In place: 8 devices' elements read and written once; alone, each device's result
            // reads all 8 members' (and is written).
            let want = if lowered[i].summed_in_place == operands {
                in_place += 1;
                2.0 * 8.0 * bytes as f64
            } else {
                9.0 * 8.0 * bytes as f64
            };
            assert!(
                (prices[i].work_s - want / 1e9).abs() < 1e-12,
                "psum {i}: {} s",
                prices[i].work_s
            );
        }
        // The gradients' psums run in place over their arena; the loss's pmean alone.
        assert!(in_place > 0, "no psum summed in place");
    }

    #[test]
    fn h100_matmul_of_4096_cubed_takes_about_a_third_of_a_millisecond() {
        // 2 * 4096^3 FLOPs at 494.7 TFLOP/s TF32 is 0.278 ms at the peak; the part sustains
        // 80.3% of it, and 1024 output tiles over 132 SMs leave the last wave partly idle (97%).
        let dot = DotShape {
            batch: 1,
            m: 4096,
            n: 4096,
            k: 4096,
        };
        let w = Work {
            matmul_flops: 2.0 * 4096f64.powi(3),
            dot: Some(dot),
            bytes: 3.0 * 4.0 * 4096.0 * 4096.0,
            launches: 1,
            ..Default::default()
        };
        let ms = work_seconds(&h100(), &w, 1) * 1e3;
        assert!((0.34..0.37).contains(&ms), "{ms}");
    }

    #[test]
    fn matmuls_off_the_tile_grid_run_below_the_peak() {
        let d = tpu_v4();
        let aligned = DotShape {
            batch: 1,
            m: 1024,
            n: 1024,
            k: 1024,
        };
        let ragged = DotShape { m: 1025, ..aligned };
        assert!(matmul_efficiency(&d, ragged, 1) < 0.9 * matmul_efficiency(&d, aligned, 1));
    }

    #[test]
    fn batched_matmuls_run_at_the_batched_class_figures() {
        let slow = MatmulFit {
            flops: 1e9,
            half_flops: 0.0,
            per_product_s: 0.0,
            fixed_s: 0.0,
        };
        // No tiles or waves, as calibrated on `this`: only the class's figures decide.
        let d = DeviceProfile {
            matmul_batched: Some(slow),
            attention: None,
            matmul_tile: [1, 1, 1],
            matmul_units: 1,
            ..crate::profile::device::m2_max()
        };
        let dot = DotShape {
            batch: 1,
            m: 256,
            n: 256,
            k: 256,
        };
        let w = Work {
            matmul_flops: 2.0 * 256f64.powi(3),
            dot: Some(dot),
            launches: 1,
            ..Default::default()
        };
        // One product is a single matmul; the same product on 4 simulated devices is one
        // batched dispatch over them, priced at the batched class's 1 GFLOP/s.
        assert_eq!(matmul_fit(&d, dot, 1).flops, d.matmul_flops);
        let batched = work_seconds(&d, &w, 4);
        assert!((batched - 4.0 * w.matmul_flops / 1e9).abs() < 1e-9, "{batched}");
    }

    #[test]
    fn fused_attention_runs_at_its_calibrated_figures_where_the_device_has_them() {
        let dot = DotShape {
            batch: 32,
            m: 64,
            n: 64,
            k: 32,
        };
        let w = Work {
            matmul_flops: 4e6,
            vector_flops: 1e6,
            dot: Some(dot),
            launches: 1,
            fused_attention: true,
            ..Default::default()
        };
        let preset = crate::profile::device::h100();
        // Calibrated on `this`: per op, per (batch, head) product and per FLOP, on every copy.
        let d = DeviceProfile {
            attention: Some(MatmulFit {
                flops: 1e9,
                half_flops: 0.0,
                per_product_s: 1e-5,
                fixed_s: 1e-4,
            }),
            ..preset.clone()
        };
        let want = 1e-4 + 32.0 * 1e-5 + 5e6 / 1e9;
        let (compute, _) = work_split(&d, &w, 2);
        assert!((compute - 2.0 * want).abs() < 1e-12, "{compute}");
        // A preset prices it as its dot products on the matrix units, as before.
        let as_dots = Work {
            fused_attention: false,
            ..w
        };
        assert_eq!(work_split(&preset, &w, 1), work_split(&preset, &as_dots, 1));
    }

    #[test]
    fn many_small_batched_products_cost_their_per_product_time() {
        let fit = MatmulFit {
            flops: 1e9,
            half_flops: 0.0,
            per_product_s: 1e-4,
            fixed_s: 1e-3,
        };
        let d = DeviceProfile {
            matmul_batched: Some(fit),
            attention: None,
            matmul_tile: [1, 1, 1],
            matmul_units: 1,
            ..crate::profile::device::m2_max()
        };
        let dot = DotShape {
            batch: 64,
            m: 32,
            n: 32,
            k: 16,
        };
        let flops = 2.0 * 64.0 * 32.0 * 32.0 * 16.0;
        let w = Work {
            matmul_flops: flops,
            dot: Some(dot),
            launches: 1,
            ..Default::default()
        };
        // On 2 simulated devices: one dispatch of 128 products.
        let s = work_seconds(&d, &w, 2);
        let want = 1e-3 + 128.0 * 1e-4 + 2.0 * flops / 1e9;
        assert!((s - want).abs() < 1e-12, "{s} vs {want}");
    }
}
