//! The cost model: a per-device program priced op by op on a device profile
//! ([`super::price`]), then placed on a timeline, a row per device ([`super::schedule`]): the
//! step is its end, and the breakdown its spans summed by category. Every device runs the same
//! program (SPMD), so one breakdown holds for each of them.
use std::collections::BTreeMap;

use super::collective::CollectiveKind;
use super::device::DeviceProfile;
use super::price::price_ops;
use super::schedule::schedule;
use super::summary::summarize;
use super::timeline::{spmd_work, Timeline};
use super::work::Placement;
use crate::ir::Program;

/// Bytes one device holds at the peak of a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct DeviceBytes {
    pub params: u64,
    pub optimizer_state: u64,
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
    pub bytes_per_device: DeviceBytes,
    /// Memory of one device (simulated: of the one adapter, which holds every device).
    pub capacity_bytes: u64,
    pub fits: bool,
    /// Each kind's collectives, their whole transfer time whether hidden or not.
    pub collectives: BTreeMap<&'static str, CollectiveCost>,
    pub flops_per_device: f64,
    pub launches: usize,
    /// The device profile's figures that are estimates.
    pub estimated: Vec<String>,
}

/// Prices `prog` (a per-device program, or a global one for one device) on `device`, with
/// asynchronous collectives overlapping later compute as XLA schedules them.
pub fn predict(prog: &Program, device: &DeviceProfile, placement: Placement) -> Prediction {
    model_step(prog, device, placement, true).0
}

/// The modelled step of `prog` on `device` and its timeline, with overlap on or off.
pub fn model_step(
    prog: &Program,
    device: &DeviceProfile,
    placement: Placement,
    overlap: bool,
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
    let (mut flops, mut launches, mut serial) = (0.0, 0usize, device.step_s);
    for op in price_ops(prog, device, placement) {
        flops += op.flops;
        launches += op.launches;
        serial += op.launch_s + op.work_s;
        if let Some((kind, bytes, hops)) = op.collective {
            let e = collectives.get_mut(kind.hlo_name()).expect("every kind");
            e.count += 1;
            e.bytes += bytes;
            e.hops += hops;
            e.ms += op.work_s * 1e3;
        }
    }
    // Every device of an SPMD program runs the same tasks, whose collectives match by construction.
    let mut timeline = schedule(&spmd_work(prog, device, placement), overlap).expect("an SPMD program schedules");
    timeline.comm_stream = placement == Placement::Real;
    timeline.device = match placement {
        Placement::Real => format!("{devices} x {}", device.label),
        Placement::Simulated => format!("{devices} simulated devices on one {}", device.label),
    };
    let bytes_per_device = DeviceBytes {
        params: summary.params_bytes,
        optimizer_state: summary.optimizer_state_bytes,
        activations: summary.activations_bytes,
        total: summary.total_bytes,
    };
    let held = bytes_per_device.total * copies as u64;
    let prediction = Prediction {
        device: device.name.clone(),
        device_label: device.label.clone(),
        devices,
        placement,
        step_ms: timeline.step_ms,
        overlap,
        serial_ms: serial * 1e3,
        breakdown_ms: timeline.breakdown_ms(),
        bytes_per_device,
        capacity_bytes: device.memory_bytes,
        fits: held <= device.memory_bytes,
        collectives,
        flops_per_device: flops,
        launches,
        estimated: device.estimated.clone(),
    };
    (prediction, timeline)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{Parallel, TrainerOptions};
    use crate::ir::RngLayout;
    use crate::plan::{Preset, Strategy};
    use crate::profile::device::tpu_v4;
    use crate::sharding::Mesh;

    fn seed_options(parallel: Parallel, rng_layout: RngLayout) -> TrainerOptions {
        TrainerOptions {
            rng_layout,
            ..TrainerOptions::new(Preset::Seed.config(), parallel)
        }
    }

    fn auto_dp8() -> Parallel {
        Parallel::Auto {
            strategy: Strategy::Dp,
            mesh: Mesh::parse("dp=8").unwrap(),
            specs: vec![],
        }
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
}
