//! A mixture of experts' load: how many routed rows the busiest device's experts take, the one
//! rule the closed-form estimate ([`super::estimate_step`]) and the timeline
//! ([`super::spmd_work`]) price a mixture's expert matmuls and all-to-alls by.
//!
//! On average a device's experts take the `k` choices of as many tokens as the device holds
//! (its sequences' choices spread over its expert-parallel group, and the group's over it).
//! Routing is never that even: the busiest device's routed rows over the mean (its imbalance)
//! set each block's time, since the combine's all-to-all waits for the busiest device's expert
//! matmuls, and the dispatch's delivers its extra rows. Without expert parallelism every device
//! holds every expert and routes its own tokens' choices: no device is busier. A capacity
//! factor caps each expert at its slots of a sequence's choices (the rest are dropped), so it
//! caps the imbalance too; dropless routing is capped only by every token choosing the expert.
//!
//! The work is priced at the rows routed, as a grouped GEMM and a ragged all-to-all move them
//! (Megatron-Core's and MegaBlocks' expert layers, `jax.lax.ragged_dot`), not at the slots the
//! sandbox's static buffers pad every expert to.
use crate::ir::{Op, Program};
use crate::model::{Moe, ASSUMED_IMBALANCE};

/// A mixture's routing, as the load rule reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Routing {
    pub experts: usize,
    pub top_k: usize,
    /// Tokens of a sequence (a routing group).
    pub seq: usize,
    /// Slots each expert holds of a sequence's choices (its capacity; the sequence, dropless).
    pub slots: usize,
    /// Devices of the expert-parallel group.
    pub ep: usize,
    /// The busiest device's routed rows over the mean, before the capacity caps it.
    pub imbalance: f64,
}

impl Routing {
    /// `moe`'s routing of sequences of `seq` tokens over an expert-parallel group of `ep`.
    pub fn of(moe: &Moe, seq: usize, ep: usize) -> Self {
        Routing {
            experts: moe.experts,
            top_k: moe.top_k,
            seq,
            slots: moe.slots(seq),
            ep,
            imbalance: moe.imbalance as f64,
        }
    }

    /// Choices an expert receives of a sequence on average.
    fn mean(&self) -> f64 {
        (self.seq * self.top_k) as f64 / self.experts.max(1) as f64
    }

    /// The most an expert takes over the mean: its slots.
    fn cap(&self) -> f64 {
        self.slots as f64 / self.mean().max(f64::MIN_POSITIVE)
    }

    /// The busiest device's routed rows over the mean: the imbalance over an expert-parallel
    /// group (1 without one), capped by the slots every expert holds.
    pub fn busiest(&self) -> f64 {
        let spread = if self.ep > 1 { self.imbalance.max(1.0) } else { 1.0 };
        spread.min(self.cap())
    }

    /// Every other device of the group's routed rows over the mean: what the busiest leaves of
    /// the group's choices (those the capacity keeps), shared evenly.
    pub fn others(&self) -> f64 {
        if self.ep <= 1 {
            return self.busiest();
        }
        let kept = self.cap().min(1.0) * self.ep as f64;
        ((kept - self.busiest()) / (self.ep - 1) as f64).max(0.0)
    }

    /// Rows the busiest device's experts compute for `tokens` tokens a device holds.
    pub fn rows(&self, tokens: f64) -> f64 {
        tokens * self.top_k as f64 * self.busiest()
    }

    /// Of the slots the program's buffers pad every expert to, the share `load` (rows over the
    /// mean) fills: what a device's expert work and all-to-alls cost of the program's shapes.
    pub fn slot_share(&self, load: f64) -> f64 {
        load * self.mean() / self.slots.max(1) as f64
    }
}

/// The imbalance of a measured run's routing: per layer, every expert's routed (kept) choices
/// over the step, the experts placed on `ep` devices in order (E / ep each, as "ep" splits
/// them). Each layer's busiest device over the mean sets that layer's wait, so the step's
/// imbalance is their mean over the layers; 1 without expert parallelism or without choices.
pub fn measured_imbalance(layers: &[Vec<f64>], ep: usize) -> f64 {
    let per_layer: Vec<f64> = layers
        .iter()
        .filter(|counts| ep > 1 && counts.len().is_multiple_of(ep) && counts.iter().sum::<f64>() > 0.0)
        .map(|counts| {
            let per_device: Vec<f64> = counts.chunks(counts.len() / ep).map(|c| c.iter().sum()).collect();
            let mean = per_device.iter().sum::<f64>() / ep as f64;
            per_device.iter().copied().fold(0.0, f64::max) / mean
        })
        .collect();
    if per_layer.is_empty() {
        return 1.0;
    }
    per_layer.iter().sum::<f64>() / per_layer.len() as f64
}

/// The share of its expert work each device of `prog` does, as (instruction, share) per
/// device, or None without a mixture. The expert work is what the rows routed flow through:
/// every dispatch (the forward's, and the backward's transpose of the combine) and everything
/// downstream of it, the all-to-alls over "ep", the experts' matmuls and their activation, up
/// to the combine (or the backward's transpose of the dispatch) that sums them back per token. A
/// matmul that contracts the rows away (a weight's gradient, shaped as the weight) ends it. The
/// first device of each expert-parallel group is its busiest; an all-to-all runs as long as its
/// slowest member's, so every member waits for it.
pub fn expert_shares(prog: &Program) -> Option<Vec<Vec<(usize, f64)>>> {
    let mesh = prog.mesh.as_ref();
    let ep = mesh.and_then(|m| m.size_of("ep")).unwrap_or(1);
    let weights: Vec<&[usize]> = prog.inputs.iter().map(|(v, _)| prog.shape(*v)).collect();
    let mut routed = vec![false; prog.values.len()];
    let mut routing = None;
    let mut instrs = vec![];
    for (i, ins) in prog.instrs.iter().enumerate() {
        let reads_routed = ins.inputs.iter().any(|v| routed[v.index()]);
        match &ins.op {
            Op::MoeRoute { k, capacity } => {
                if let Some(&[_, seq, experts]) = ins.inputs.first().map(|l| prog.shape(*l)) {
                    routing = Some(Routing {
                        experts,
                        top_k: *k,
                        seq,
                        slots: *capacity,
                        ep,
                        imbalance: prog.expert_imbalance.unwrap_or(ASSUMED_IMBALANCE) as f64,
                    });
                }
            }
            // The dispatch writes the rows routed, the combine and the gates' gradient read
            // them: priced at those rows too, and where the rows flow ends at them.
            Op::MoeDispatch => {
                instrs.push(i);
                ins.outputs.iter().for_each(|o| routed[o.index()] = true);
            }
            Op::MoeCombine | Op::MoeGateGrad => instrs.push(i),
            _ if reads_routed => {
                instrs.push(i);
                let contracts_rows = matches!(ins.op, Op::DotGeneral { .. });
                for o in &ins.outputs {
                    routed[o.index()] = !(contracts_rows && weights.contains(&prog.shape(*o)));
                }
            }
            _ => {}
        }
    }
    let routing = routing?;
    let (busiest, others) = (
        routing.slot_share(routing.busiest()),
        routing.slot_share(routing.others()),
    );
    let first_of_group = |d: usize| mesh.is_none_or(|m| m.axes_index(d, &["ep"]).map_or(true, |e| e == 0));
    Some(
        (0..prog.devices())
            .map(|d| {
                let share = if first_of_group(d) { busiest } else { others };
                instrs.iter().map(|&i| (i, share)).collect()
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Capacity;

    fn routing(capacity: Capacity, ep: usize, imbalance: f32) -> Routing {
        let moe = Moe {
            capacity,
            imbalance,
            top_k: 2,
            ..Moe::new(8, 64)
        };
        Routing::of(&moe, 64, ep)
    }

    #[test]
    fn the_busiest_device_takes_the_imbalance_up_to_the_capacity() {
        // 64 tokens choosing 2 of 8 experts: 16 choices an expert on average.
        let even = routing(Capacity::Dropless, 4, 1.0);
        assert_eq!((even.busiest(), even.others()), (1.0, 1.0));
        let skewed = routing(Capacity::Dropless, 4, 1.6);
        assert!((skewed.busiest() - 1.6).abs() < 1e-6);
        // The other three share what is left: (4 - 1.6) / 3.
        assert!((skewed.others() - 0.8).abs() < 1e-6);
        assert!((skewed.rows(100.0) - 320.0).abs() < 1e-4);
        // Capacity 1.25: 20 slots an expert; the busiest is capped there.
        let capped = routing(Capacity::Factor(1.25), 4, 1.6);
        assert_eq!(capped.busiest(), 1.25);
        assert_eq!(capped.slot_share(capped.busiest()), 1.0);
        // Dropless buffers pad every expert to the sequence: the routed rows fill a quarter.
        assert!((even.slot_share(1.0) - 0.25).abs() < 1e-12);
        // Without expert parallelism every device routes its own tokens to all its experts.
        assert_eq!(routing(Capacity::Dropless, 1, 1.6).busiest(), 1.0);
    }

    #[test]
    fn measured_counts_give_the_busiest_device_over_the_mean_per_layer() {
        // 4 experts on 2 devices: loads 30 + 10 against 20 + 20, then even.
        let layers = vec![vec![30.0, 10.0, 20.0, 20.0], vec![10.0; 4]];
        assert!((measured_imbalance(&layers, 2) - 1.0).abs() < 1e-12);
        let layers = vec![vec![30.0, 20.0, 5.0, 5.0], vec![10.0; 4]];
        // Layer 1: 50 against a mean of 30 (5/3); layer 2: 1.
        assert!((measured_imbalance(&layers, 2) - (5.0 / 3.0 + 1.0) / 2.0).abs() < 1e-12);
        assert_eq!(measured_imbalance(&layers, 1), 1.0);
    }
}
