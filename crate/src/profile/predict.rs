//! The cost model: a per-device program priced op by op on a device profile
//! ([`super::price`]), then placed on a timeline, a row per device ([`super::schedule`]): the
//! step is its end, and the breakdown its spans summed by category. Every device runs the same
//! program (SPMD), so one breakdown holds for each of them.
use std::collections::BTreeMap;

use super::collective::CollectiveKind;
use super::device::DeviceProfile;
use super::price::{price_ops, LAUNCH};
use super::schedule::schedule;
use super::summary::summarize;
use super::timeline::{spmd_work, Timeline, IDLE};
use super::work::Placement;
use crate::ir::{Precision, Program};
use crate::plan::TensorBytes;

/// What bounds a part of a step ([`Prediction::bounds_ms`]).
pub const COMPUTE: &str = "compute";
pub const MEMORY: &str = "memory";
pub const COMMUNICATION: &str = "communication";
pub const BUBBLE: &str = "bubble";

/// Bytes one device holds at the peak of a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct DeviceBytes {
    /// Parameters (the f32 masters under mixed precision).
    pub params: u64,
    pub optimizer_state: u64,
    pub gradients: u64,
    /// The bf16 copy of the parameters the step computes with under mixed precision (0 in f32).
    pub compute_params: u64,
    pub activations: u64,
    pub total: u64,
}

/// The priced collectives of one kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct CollectiveCost {
    pub count: usize,
    pub bytes: u64,
    /// Link hops of all of them together (alpha is paid once per hop).
    pub hops: f64,
    pub ms: f64,
}

/// The modelled step of a program on devices of one kind.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Prediction {
    pub device: String,
    pub device_label: String,
    pub devices: usize,
    pub placement: Placement,
    /// The dtype policy it is priced under (bf16: mixed precision; the sandbox itself trains f32).
    pub precision: Precision,
    /// Modelled milliseconds per step: the end of the step's timeline.
    pub step_ms: f64,
    /// Whether asynchronous collectives overlapped later compute (always false simulated: the
    /// adapter runs everything in one queue).
    pub overlap: bool,
    /// Every op of a device one after another, nothing overlapped: the step's upper bound
    /// (what the step is without overlap, on an SPMD program).
    pub serial_ms: f64,
    /// Milliseconds per category (matmul, attention, rng, collectives, optimizer, other,
    /// launch, idle), per device, from the timeline's compute spans; they add up to `step_ms`.
    /// With overlap, `collectives` is the communication the compute stream waited for (what
    /// overlap did not hide); `collectives` of [`Prediction::collectives`] is all of it.
    pub breakdown_ms: BTreeMap<&'static str, f64>,
    /// The step by what bounds each part of it (they add up to `step_ms`): `compute` (ops
    /// whose arithmetic outlasts their memory traffic), `memory` (the others), `communication`
    /// (waits on collectives overlap did not hide), `bubble` (waits on other devices) and
    /// `launch` (kernel launches and the step's fixed cost).
    pub bounds_ms: BTreeMap<&'static str, f64>,
    /// The largest of `bounds_ms`: what limits the step.
    pub limiting: &'static str,
    pub bytes_per_device: DeviceBytes,
    /// Memory of one device (simulated: of the one adapter, which holds every device).
    pub capacity_bytes: u64,
    pub fits: bool,
    /// The largest tensor on one device (what a memory plan names first when it does not fit).
    pub largest_tensor: TensorBytes,
    /// Each kind's collectives, their whole transfer time whether hidden or not.
    pub collectives: BTreeMap<&'static str, CollectiveCost>,
    /// The same collectives by the mesh axes they run over (`tp`, `dp,fsdp`): what each axis
    /// of the composition costs on the device kind's links.
    pub collectives_by_axes: BTreeMap<String, CollectiveCost>,
    /// Of each kind's time in flight on the timeline (per device), the fraction during which
    /// the compute stream ran ops: how much of ring attention's permutes the blocks' attention
    /// hides (0 without overlap).
    pub collectives_hidden: BTreeMap<&'static str, f64>,
    pub flops_per_device: f64,
    pub launches: usize,
    /// The device profile's figures that are estimates.
    pub estimated: Vec<String>,
}

/// Prices `prog` (a per-device program, or a global one for one device) on `device`, with
/// asynchronous collectives overlapping later compute as XLA schedules them.
pub fn predict(prog: &Program, device: &DeviceProfile, placement: Placement) -> Prediction {
    priced_step(prog, device, placement, true, false).0
}

/// One pipeline stage's priced instructions, summed.
#[derive(Clone, Copy, Debug, Default)]
struct StageTotals {
    flops: f64,
    launches: usize,
    serial: f64,
    compute_s: f64,
    memory_s: f64,
}

/// The modelled step of `prog` on `device` and its timeline, a row per device, with overlap on
/// or off.
pub fn model_step(
    prog: &Program,
    device: &DeviceProfile,
    placement: Placement,
    overlap: bool,
) -> (Prediction, Timeline) {
    priced_step(prog, device, placement, overlap, true)
}

/// The step priced and scheduled on one row per distinct task list ([`StepWork::classes`]);
/// `rows`: the timeline with a row for every device, else the distinct rows alone (what a
/// prediction needs, at a mesh's size divided).
fn priced_step(
    prog: &Program,
    device: &DeviceProfile,
    placement: Placement,
    overlap: bool,
    rows: bool,
) -> (Prediction, Timeline) {
    let overlap = overlap && placement == Placement::Real;
    let devices = prog.devices();
    let copies = match placement {
        Placement::Real => 1,
        Placement::Simulated => devices,
    };
    let summary = summarize(prog);
    let mut collectives: BTreeMap<&'static str, CollectiveCost> = CollectiveKind::ALL
        .iter()
        .map(|k| (k.hlo_name(), CollectiveCost::default()))
        .collect();
    let mut collectives_by_axes: BTreeMap<String, CollectiveCost> = BTreeMap::new();
    let axes_of: std::collections::HashMap<usize, String> = summary
        .collectives
        .iter()
        .map(|c| (c.instr, c.axes.join(",")))
        .collect();
    // A device runs its pipeline stage's instructions only: its work is its stage's, and the
    // step's bounds are the busiest stage's (one stage without a pipeline).
    let stages = prog.stages.as_ref().map_or(1, |st| st.stages);
    let runs = |i: usize, stage: usize| prog.stages.is_none() || prog.instr_owner(i).active(stage);
    let mut work = vec![StageTotals::default(); stages];
    // A mixture's expert work at the busiest device's routed rows, as the timeline prices it.
    let busiest: std::collections::HashMap<usize, f64> = match placement {
        Placement::Real => super::expert_shares(prog)
            .and_then(|s| s.into_iter().next())
            .unwrap_or_default()
            .into_iter()
            .collect(),
        Placement::Simulated => Default::default(),
    };
    for mut op in price_ops(prog, device, placement) {
        if let Some(share) = busiest.get(&op.instr) {
            op.work_s *= share;
            op.flops *= share;
            if let Some((_, bytes, _)) = op.collective.as_mut() {
                *bytes = (*bytes as f64 * share) as u64;
            }
        }
        for (stage, w) in work.iter_mut().enumerate() {
            // A collective runs on every device of its groups, whatever its owner.
            if op.collective.is_none() && !runs(op.instr, stage) {
                continue;
            }
            w.flops += op.flops;
            w.launches += op.launches;
            w.serial += op.launch_s + op.work_s;
            if op.collective.is_none() {
                *(if op.memory_bound {
                    &mut w.memory_s
                } else {
                    &mut w.compute_s
                }) += op.work_s;
            }
        }
        if let Some((kind, bytes, hops)) = op.collective {
            let e = collectives.get_mut(kind.hlo_name()).expect("every kind");
            e.count += 1;
            e.bytes += bytes;
            e.hops += hops;
            e.ms += op.work_s * 1e3;
            let a = collectives_by_axes
                .entry(axes_of.get(&op.instr).cloned().unwrap_or_default())
                .or_default();
            a.count += 1;
            a.bytes += bytes;
            a.hops += hops;
            a.ms += op.work_s * 1e3;
        }
    }
    let busiest = work
        .iter()
        .copied()
        .max_by(|a, b| (a.compute_s + a.memory_s).total_cmp(&(b.compute_s + b.memory_s)))
        .unwrap_or_default();
    let StageTotals {
        flops,
        launches,
        compute_s,
        memory_s,
        ..
    } = busiest;
    let serial = device.step_s + busiest.serial;
    // Every device of an SPMD program runs the same tasks, whose collectives match by construction.
    let work = spmd_work(prog, device, placement);
    // Devices that run the same tasks run the same timeline, so one row per distinct task list
    // is scheduled: one for an SPMD program, one per pipeline stage, one per ring position of a
    // causal cp ring.
    let (classes, of) = work.classes();
    let scheduled = schedule(&classes, overlap).expect("an SPMD program schedules");
    // A prediction alone keeps the rows and weighs each by the devices it stands for: laying a
    // row out for each of thousands of devices is most of what pricing a ring or a pipeline
    // on a large mesh would cost.
    let (mut timeline, counts) = if rows {
        let labels: Vec<String> = work.devices.iter().map(|d| d.label.clone()).collect();
        (scheduled.by_class(&of, &labels), vec![1; of.len()])
    } else {
        let counts = (0..scheduled.devices.len())
            .map(|c| of.iter().filter(|&&o| o == c).count())
            .collect();
        (scheduled, counts)
    };
    timeline.comm_stream = placement == Placement::Real;
    timeline.device = match placement {
        Placement::Real => format!("{devices} x {}", device.label),
        Placement::Simulated => format!("{devices} simulated devices on one {}", device.label),
    };
    let bytes_per_device = DeviceBytes {
        params: summary.params_bytes,
        optimizer_state: summary.optimizer_state_bytes,
        gradients: summary.gradients_bytes,
        compute_params: summary.compute_params_bytes,
        activations: summary.activations_bytes,
        total: summary.total_bytes,
    };
    let held = bytes_per_device.total * copies as u64;
    let breakdown_ms = timeline.breakdown_ms_of(&counts);
    let bounds_ms: BTreeMap<&'static str, f64> = [
        (COMPUTE, compute_s * 1e3),
        (MEMORY, memory_s * 1e3),
        // Simulated, collectives are kernels of the one queue, moving memory.
        (COMMUNICATION, breakdown_ms.get("collectives").copied().unwrap_or(0.0)),
        (BUBBLE, breakdown_ms.get(IDLE).copied().unwrap_or(0.0)),
        (LAUNCH, breakdown_ms.get(LAUNCH).copied().unwrap_or(0.0)),
    ]
    .into_iter()
    .collect();
    let limiting = bounds_ms
        .iter()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(COMPUTE, |(k, _)| *k);
    let mut collectives_hidden = BTreeMap::new();
    for kind in CollectiveKind::ALL {
        let of_kind: std::collections::HashSet<usize> = summary
            .collectives
            .iter()
            .filter(|c| c.kind == kind)
            .map(|c| c.instr)
            .collect();
        if !of_kind.is_empty() {
            let (flight, hidden) = timeline.comm_hidden_ms_of(&counts, |i| of_kind.contains(&i));
            let share = if flight > 0.0 { hidden / flight } else { 0.0 };
            collectives_hidden.insert(kind.hlo_name(), share);
        }
    }
    let prediction = Prediction {
        device: device.name.clone(),
        device_label: device.label.clone(),
        devices,
        placement,
        precision: prog.precision,
        step_ms: timeline.step_ms,
        overlap,
        serial_ms: serial * 1e3,
        breakdown_ms,
        bounds_ms,
        limiting,
        bytes_per_device,
        capacity_bytes: device.memory_bytes,
        fits: held <= device.memory_bytes,
        largest_tensor: summary.largest_tensor.clone(),
        collectives,
        collectives_by_axes,
        collectives_hidden,
        flops_per_device: flops,
        launches,
        estimated: device.estimated.clone(),
    };
    (prediction, timeline)
}

impl Prediction {
    /// Why the step does not fit one device's memory, in words: how far over, what takes the
    /// room (the largest tensor named), and which lever would fit it. None where it fits.
    pub fn overflow(&self) -> Option<String> {
        if self.fits {
            return None;
        }
        let gib = |b: u64| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64);
        let b = &self.bytes_per_device;
        // Simulated, every device is held by the one adapter.
        let copies = match self.placement {
            Placement::Real => 1,
            Placement::Simulated => self.devices as u64,
        };
        let need = b.total.saturating_mul(copies);
        let state = b.params + b.optimizer_state + b.gradients + b.compute_params;
        let t = &self.largest_tensor;
        let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
        let mut words = format!(
            "needs {} per device against the {} of a {}: {} over. Activations (their peak) take {} of it, the largest tensor `{}` [{}] alone {}; parameters, gradients and optimizer state {}.",
            gib(need),
            gib(self.capacity_bytes),
            self.device_label,
            gib(need - self.capacity_bytes.min(need)),
            gib(b.activations.saturating_mul(copies)),
            t.name,
            shape.join(","),
            gib(t.bytes),
            gib(state.saturating_mul(copies)),
        );
        words.push_str(if state.saturating_mul(copies) < self.capacity_bytes {
            " Keeping fewer activations would fit it: rematerialization (jax.checkpoint) recomputes them in the backward pass instead of holding them (remat full, `--remat full`); gradient accumulation holds one microbatch's at a time (`--microbatches`); a smaller batch or seq shrinks them too."
        } else {
            " The parameters and optimizer state alone exceed it: shard them over the devices (fsdp) or use more devices."
        });
        Some(words)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{Parallel, TrainerOptions};
    use crate::ir::RngLayout;
    use crate::plan::{Preset, Strategy};
    use crate::profile::device::tpu_v4;
    use crate::profile::schedule::schedule;
    use crate::sharding::Mesh;

    fn seed_options(parallel: Parallel, rng_layout: RngLayout) -> TrainerOptions {
        TrainerOptions {
            rng_layout,
            ..TrainerOptions::new(Preset::Seed.config(), parallel)
        }
    }

    fn auto_dp8() -> Parallel {
        Parallel::Auto {
            par: Strategy::Dp.compose(&Mesh::parse("dp=8").unwrap()).unwrap(),
            specs: vec![],
        }
    }

    #[test]
    fn one_row_per_task_list_schedules_an_spmd_step_as_every_row_does() {
        let mut dp_tp = seed_options(auto_dp8(), RngLayout::Original);
        dp_tp.parallel = Parallel::Auto {
            par: Strategy::DpTp.compose(&Mesh::parse("dp=4,tp=2").unwrap()).unwrap(),
            specs: vec![],
        };
        for opts in [seed_options(auto_dp8(), RngLayout::Original), dp_tp] {
            let prog = crate::plan::build(&opts).unwrap().step.program;
            for overlap in [true, false] {
                let work = spmd_work(&prog, &tpu_v4(), Placement::Real);
                let all = schedule(&work, overlap).unwrap();
                let (p, one) = model_step(&prog, &tpu_v4(), Placement::Real, overlap);
                assert_eq!(one.devices.len(), all.devices.len());
                assert!(
                    (p.step_ms - all.step_ms).abs() < 1e-9,
                    "{} vs {}",
                    p.step_ms,
                    all.step_ms
                );
                assert_eq!(one.devices[3].compute, all.devices[3].compute);
                assert_eq!(one.devices[3].label, all.devices[3].label);
                if overlap {
                    let (fast, slow) = (
                        predict(&prog, &tpu_v4(), Placement::Real).breakdown_ms,
                        all.breakdown_ms(),
                    );
                    for (k, v) in &slow {
                        assert!((fast[k] - v).abs() < 1e-9, "{k}: {} vs {v}", fast[k]);
                    }
                }
            }
        }
    }

    #[test]
    fn the_bounds_add_up_to_the_step_and_name_what_limits_it() {
        let prog = crate::plan::build(&seed_options(auto_dp8(), RngLayout::Original))
            .unwrap()
            .step
            .program;
        let p = predict(&prog, &tpu_v4(), Placement::Real);
        let sum: f64 = p.bounds_ms.values().sum();
        assert!(
            (sum - p.step_ms).abs() < 1e-9 * p.step_ms.max(1.0),
            "{sum} vs {}",
            p.step_ms
        );
        let max = p.bounds_ms.values().cloned().fold(0.0, f64::max);
        assert_eq!(p.bounds_ms[p.limiting], max);
        // The seed's tiny matmuls on a TPU: launches and memory, not the MXUs.
        assert_ne!(p.limiting, COMPUTE, "{:?}", p.bounds_ms);
    }

    #[test]
    fn breakdown_adds_up_to_the_step() {
        let step = crate::plan::build(&seed_options(auto_dp8(), RngLayout::Original))
            .unwrap()
            .step;
        for placement in [Placement::Real, Placement::Simulated] {
            let p = predict(&step.program, &tpu_v4(), placement);
            let sum: f64 = p.breakdown_ms.values().sum();
            assert!(
                (sum - p.step_ms).abs() < 1e-9 * p.step_ms.max(1.0),
                "{sum} vs {}",
                p.step_ms
            );
            assert!(p.step_ms > 0.0);
        }
    }

    /// Fused attention draws its dropout bits in its kernels, except where automatic mode in
    /// the original layout generates the global bits replicated and slices them: that array is
    /// held and priced, as JAX holds it, and the story points at it.
    #[test]
    fn fused_attention_draws_its_bits_in_place_except_the_replicated_original_generation() {
        use crate::ir::Op;
        let drawn_and_held = |parallel: Parallel, layout| {
            let step = crate::plan::build(&seed_options(parallel, layout)).unwrap().step;
            let prog = &step.program;
            let drawn = prog.bits_drawn_in_attention();
            let bits: Vec<_> = prog
                .instrs
                .iter()
                // The attention probabilities' bits, (B, H, T, T); the residual dropouts' are rank 3.
                .filter(|ins| matches!(ins.op, Op::RandomBits { .. } | Op::RandomBitsBlock { .. }))
                .filter(|ins| prog.shape(ins.outputs[0]).len() == 4)
                .map(|ins| drawn[ins.outputs[0].index()].is_some())
                .collect();
            (
                bits.iter().filter(|&&d| d).count(),
                bits.iter().filter(|&&d| !d).count(),
            )
        };
        let layers = Preset::Seed.config().layers;
        let shard_map = || Parallel::ShardMap {
            par: Strategy::Dp.compose(&Mesh::parse("dp=8").unwrap()).unwrap(),
            dropout_key: crate::plan::DropoutKey::FoldIn,
        };
        assert_eq!(drawn_and_held(auto_dp8(), RngLayout::Partitionable).1, 0);
        assert_eq!(drawn_and_held(shard_map(), RngLayout::Original).1, 0);
        let (drawn, held) = drawn_and_held(auto_dp8(), RngLayout::Original);
        assert!(held >= layers, "{held} held bits arrays for {layers} attention layers");
        assert!(drawn == 0, "{drawn}");
        assert!(drawn_and_held(auto_dp8(), RngLayout::Partitionable).0 >= layers);
    }

    #[test]
    fn replicated_original_rng_costs_more_than_partitionable_on_tpu() {
        let d = tpu_v4();
        let original = crate::plan::build(&seed_options(auto_dp8(), RngLayout::Original))
            .unwrap()
            .step;
        let partitionable = crate::plan::build(&seed_options(auto_dp8(), RngLayout::Partitionable))
            .unwrap()
            .step;
        let (o, p) = (
            predict(&original.program, &d, Placement::Real),
            predict(&partitionable.program, &d, Placement::Real),
        );
        assert!(o.breakdown_ms["rng"] > 3.0 * p.breakdown_ms["rng"], "{o:?} {p:?}");
        assert!(o.step_ms > p.step_ms);
    }

    #[test]
    fn data_parallel_steps_price_their_all_reduces() {
        let step = crate::plan::build(&seed_options(auto_dp8(), RngLayout::Partitionable))
            .unwrap()
            .step;
        let p = predict(&step.program, &tpu_v4(), Placement::Real);
        let ar = p.collectives["all-reduce"];
        assert!(ar.count > 0 && ar.ms > 0.0 && ar.hops > 0.0, "{ar:?}");
        assert!(p.fits);
        assert!(p.bytes_per_device.total >= p.bytes_per_device.params + p.bytes_per_device.optimizer_state);
    }

    #[test]
    fn a_step_that_does_not_fit_says_how_far_over_what_takes_the_room_and_the_lever() {
        // The report's ~400M model, data parallel over a v4-8's four chips, no remat, with
        // unfused attention (its (T, T) arrays held): it does not fit; fused, it does.
        let cfg = crate::model::GptConfig {
            layers: 24,
            d_model: 1024,
            heads: 16,
            seq: 1024,
            batch: 32,
            vocab: 50304,
            tied: false,
            dropout: 0.1,
            attention: crate::model::Attention::Unfused,
            remat: crate::model::Remat::None,
            precision: Default::default(),
            moe: None,
        };
        let parallel = Parallel::ShardMap {
            par: Strategy::Dp.compose(&Mesh::parse("dp=4").unwrap()).unwrap(),
            dropout_key: crate::plan::DropoutKey::Same,
        };
        let plan = |cfg: &crate::model::GptConfig| {
            let step = crate::plan::build(&TrainerOptions::new(cfg.clone(), parallel.clone()))
                .unwrap()
                .step;
            predict(&step.program, &tpu_v4(), Placement::Real)
        };
        let fused = crate::model::GptConfig {
            attention: crate::model::Attention::Fused,
            ..cfg.clone()
        };
        assert!(plan(&fused).fits);
        let p = plan(&cfg);
        assert!(!p.fits);
        let why = p.overflow().expect("it does not fit");
        let b = &p.bytes_per_device;
        let over = (b.total - p.capacity_bytes) as f64 / (1u64 << 30) as f64;
        assert!(why.contains(&format!("{over:.1} GiB over")), "{why}");
        assert!(why.contains(&format!("`{}`", p.largest_tensor.name)), "{why}");
        // Parameters and optimizer state fit: activations are the lever.
        assert!(b.params + b.optimizer_state < p.capacity_bytes);
        assert!(why.contains("rematerialization (jax.checkpoint)"), "{why}");
        // And the lever works: the same run with every block rematerialized fits.
        let remat = crate::model::GptConfig {
            remat: crate::model::Remat::Full,
            precision: Default::default(),
            ..cfg.clone()
        };
        assert!(plan(&remat).fits);
        // A step that fits has nothing to explain.
        let small = crate::plan::build(&seed_options(auto_dp8(), RngLayout::Original))
            .unwrap()
            .step;
        assert_eq!(predict(&small.program, &tpu_v4(), Placement::Real).overflow(), None);
    }
}
