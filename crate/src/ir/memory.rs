//! What a program holds in memory at once, read off its shapes and liveness: the
//! parameters and optimizer state it keeps, and the peak of everything else.
use super::{numel, Op, Program, Role};

/// Bytes of all elements of a shape (every dtype is 4 bytes).
pub fn size_in_bytes(shape: &[usize]) -> u64 {
    4 * numel(shape) as u64
}

/// A program's memory, per device (its shapes are a device's local shapes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUse {
    pub params_bytes: u64,
    pub optimizer_state_bytes: u64,
    /// Peak bytes of everything else alive at once (activations, gradients, data), by
    /// liveness over the program order.
    pub activations_bytes: u64,
}

impl MemoryUse {
    pub fn total_bytes(&self) -> u64 {
        self.params_bytes + self.optimizer_state_bytes + self.activations_bytes
    }
}

/// Walks `prog` once in order: reshapes alias their operand, in-place updates reuse their
/// parameter's memory, and a value is freed after its last reader.
pub fn memory_use(prog: &Program) -> MemoryUse {
    let mut m = MemoryUse::default();
    let mut pinned = vec![false; prog.values.len()];
    for (v, role) in &prog.inputs {
        let b = size_in_bytes(prog.shape(*v));
        match role {
            Role::Param(_) => m.params_bytes += b,
            Role::OptState { .. } => m.optimizer_state_bytes += b,
            _ => {}
        }
        pinned[v.index()] = true;
    }
    let last = prog.last_uses();
    let data_bytes: u64 = prog
        .inputs
        .iter()
        .filter(|(_, r)| !matches!(r, Role::Param(_) | Role::OptState { .. }))
        .map(|(v, _)| size_in_bytes(prog.shape(*v)))
        .sum();
    let mut live = data_bytes;
    let mut peak = live;
    let mut owns = vec![true; prog.values.len()];
    for (i, ins) in prog.instrs.iter().enumerate() {
        let aliases = matches!(
            ins.op,
            Op::Reshape { .. } | Op::Pvary { .. } | Op::SgdUpdate { .. } | Op::AdamWUpdate { .. }
        );
        for o in &ins.outputs {
            if aliases {
                owns[o.index()] = false;
            } else {
                live += size_in_bytes(prog.shape(*o));
            }
        }
        peak = peak.max(live);
        for v in ins.inputs.iter().chain(&ins.outputs) {
            let dead = match last[v.index()] {
                Some(l) => l == i && ins.inputs.contains(v),
                None => ins.outputs.contains(v),
            };
            if dead && owns[v.index()] && !pinned[v.index()] {
                live -= size_in_bytes(prog.shape(*v));
                owns[v.index()] = false;
            }
        }
    }
    m.activations_bytes = peak;
    m
}
