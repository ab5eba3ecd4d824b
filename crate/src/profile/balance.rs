//! How evenly causal attention's work falls on the devices under context parallelism. A
//! device's queries see every earlier key, so with contiguous blocks the last device of the
//! ring does the most (cp^2 more pairs than the first, at the extremes) and the others wait for
//! it at every ring step; zig-zag gives each device an early and a late chunk, and the same work.
use super::cost::{attention_flops_of, attention_pairs};
use crate::ir::{Op, Program, SeqBlock};

/// Attention FLOPs per device, in total and per ring step.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AttentionBalance {
    /// Each device's row label (its mesh coordinates).
    pub devices: Vec<String>,
    /// Per device: the step's attention FLOPs (forward and backward, every layer).
    pub flops: Vec<u64>,
    /// Per ring step (the key block `step` places back on the ring), per device.
    pub per_step: Vec<Vec<u64>>,
}

impl AttentionBalance {
    /// The busiest device's FLOPs over the mean: 1 when balanced; the step pays the busiest.
    pub fn imbalance(&self) -> f64 {
        let max = self.flops.iter().copied().max().unwrap_or(0) as f64;
        let mean = self.flops.iter().sum::<u64>() as f64 / self.flops.len().max(1) as f64;
        if mean > 0.0 {
            max / mean
        } else {
            1.0
        }
    }
}

/// The attention work of every device of `prog`, or None when every attention sees the whole
/// sequence (all devices alike).
pub fn attention_balance(prog: &Program) -> Option<AttentionBalance> {
    let mesh = prog.mesh.as_ref()?;
    let devices = mesh.devices();
    let mut flops = vec![0u64; devices];
    let mut per_step: Vec<Vec<u64>> = vec![];
    let mut blocks = false;
    for ins in &prog.instrs {
        let (Op::Attention { seq, .. } | Op::AttentionGrad { seq, .. }) = &ins.op else {
            continue;
        };
        blocks |= !seq.is_whole();
        let step = match &seq.kv {
            SeqBlock::Part { shift, .. } => *shift,
            SeqBlock::Whole | SeqBlock::Zigzag { .. } => 0,
        };
        if per_step.len() <= step {
            per_step.resize(step + 1, vec![0; devices]);
        }
        for (d, pairs) in attention_pairs(prog, ins).into_iter().enumerate() {
            let (dots, rest) = attention_flops_of(prog, ins, pairs);
            flops[d] += dots + rest;
            per_step[step][d] += dots + rest;
        }
    }
    blocks.then(|| AttentionBalance {
        devices: (0..devices).map(|d| super::timeline::mesh_label(mesh, d)).collect(),
        flops,
        per_step,
    })
}
