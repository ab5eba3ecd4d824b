use super::cost::{bytes, instr_flops};
use crate::ir::{Op, Program, Role};

/// The modelled costs of one program, as `shardlab inspect` reports them.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ProgramSummary {
    pub instructions: usize,
    pub flops: u64,
    /// Random bits generated per run (elements of every random_bits op).
    pub rng_bits: u64,
    pub params_bytes: u64,
    pub optimizer_state_bytes: u64,
    /// Peak bytes of everything else alive at once (activations, gradients, data), by
    /// liveness over the program order.
    pub activations_bytes: u64,
    pub total_bytes: u64,
}

/// Walks `prog` once: FLOPs, random bits, and memory by liveness (reshapes alias their
/// operand; in-place updates reuse their parameter's memory).
pub fn summarize(prog: &Program) -> ProgramSummary {
    let mut s = ProgramSummary {
        instructions: prog.instrs.len(),
        ..Default::default()
    };
    let mut pinned = vec![false; prog.values.len()];
    for (v, role) in &prog.inputs {
        let b = bytes(prog.shape(*v));
        match role {
            Role::Param(_) => s.params_bytes += b,
            Role::OptState { .. } => s.optimizer_state_bytes += b,
            _ => {}
        }
        pinned[v.index()] = matches!(role, Role::Param(_) | Role::OptState { .. });
    }
    let last = prog.last_uses();
    let data_bytes: u64 = prog
        .inputs
        .iter()
        .filter(|(_, r)| !matches!(r, Role::Param(_) | Role::OptState { .. }))
        .map(|(v, _)| bytes(prog.shape(*v)))
        .sum();
    let mut live = data_bytes;
    let mut peak = live;
    let mut owns = vec![true; prog.values.len()];
    for (i, ins) in prog.instrs.iter().enumerate() {
        s.flops += instr_flops(prog, ins);
        if let Op::RandomBits { shape, .. } = &ins.op {
            s.rng_bits += 32 * shape.iter().product::<usize>() as u64;
        }
        let aliases = matches!(ins.op, Op::Reshape { .. } | Op::SgdUpdate { .. } | Op::AdamWUpdate { .. });
        for o in &ins.outputs {
            if aliases {
                owns[o.index()] = false;
            } else {
                live += bytes(prog.shape(*o));
            }
        }
        peak = peak.max(live);
        for v in ins.inputs.iter().chain(&ins.outputs) {
            let dead = match last[v.index()] {
                Some(l) => l == i && ins.inputs.contains(v),
                None => ins.outputs.contains(v),
            };
            if dead && owns[v.index()] && !pinned[v.index()] && !prog.inputs.iter().any(|(x, _)| x == v) {
                live -= bytes(prog.shape(*v));
                owns[v.index()] = false;
            }
        }
    }
    s.activations_bytes = peak;
    s.total_bytes = s.params_bytes + s.optimizer_state_bytes + s.activations_bytes;
    s
}
