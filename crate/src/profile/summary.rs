use std::collections::BTreeMap;

use super::collective::CollectiveKind;
use super::cost::instr_flops;
use crate::ir::{numel, varying_axes, Op, Program, ValueId};
use crate::plan::{MemoryPlan, TensorBytes};

/// One collective of a program, for counts, bytes and the modelled time.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CollectiveUse {
    pub instr: usize,
    pub kind: CollectiveKind,
    /// Size of the full arrays the collective reduces or assembles (per group); a combined
    /// all-reduce moves the sum of its operands' sizes.
    pub bytes: u64,
    /// Devices per group.
    pub group: usize,
    /// The mesh axes it runs over (its group: the devices that differ only along them).
    pub axes: Vec<String>,
    /// Arrays it moves: more than one for a combined all-reduce (HLO's tuple all-reduce).
    pub operands: usize,
}

/// Count and bytes of one collective kind.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct KindTotals {
    /// Collectives issued (a combined all-reduce counts once): what pays the latency.
    pub count: usize,
    /// Arrays moved: the count the collectives would have without combining.
    pub operands: usize,
    pub bytes: u64,
}

/// The modelled costs of one (per-device) program, as `shardlab inspect` reports them.
/// All numbers are per device: the program's shapes are a device's local shapes.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ProgramSummary {
    pub devices: usize,
    pub instructions: usize,
    pub flops: u64,
    /// In a pipelined program, the FLOPs each stage's devices run (its own passes, the
    /// embedding on the first stage, the head and loss on the last, and the work every stage
    /// does); `flops` is the busiest's. Empty otherwise.
    pub stage_flops: Vec<u64>,
    /// Random bits generated per step (elements of every random_bits op x 32).
    pub rng_bits: u64,
    pub params_bytes: u64,
    pub optimizer_state_bytes: u64,
    /// The gradient buffers one device holds for the update (ZeRO's accounting).
    pub gradients_bytes: u64,
    /// The bf16 compute copy of the parameters under mixed precision (0 in f32).
    pub compute_params_bytes: u64,
    /// Peak bytes of everything else alive at once (activations, data), by liveness over the
    /// program order. The memory fields come from the memory plan
    /// ([`crate::plan::MemoryPlan`]) that runs check before allocating.
    pub activations_bytes: u64,
    pub total_bytes: u64,
    /// The largest tensor on one device.
    pub largest_tensor: TensorBytes,
    pub collectives: Vec<CollectiveUse>,
    /// Things a reader should know, e.g. dropout masks repeating across data-parallel shards.
    pub warnings: Vec<String>,
}

impl ProgramSummary {
    /// Count and bytes per collective kind (every kind present, zero if unused).
    pub fn collective_totals(&self) -> BTreeMap<&'static str, KindTotals> {
        let mut out: BTreeMap<&'static str, KindTotals> = CollectiveKind::ALL
            .iter()
            .map(|k| (k.hlo_name(), KindTotals::default()))
            .collect();
        for c in &self.collectives {
            let t = out.get_mut(c.kind.hlo_name()).expect("every kind");
            t.count += 1;
            t.operands += c.operands;
            t.bytes += c.bytes;
        }
        out
    }
}

fn collective_use(prog: &Program, i: usize) -> Option<CollectiveUse> {
    let ins = &prog.instrs[i];
    if !ins.op.is_collective() {
        return None;
    }
    // Collectives move what is computed with: bf16 under mixed precision (gradients, gathered
    // weights), integers at 4 bytes.
    let bytes = |v: ValueId| numel(prog.shape(v)) as u64 * prog.precision.compute_bytes(prog.info(v).dtype);
    let in_bytes = bytes(ins.inputs[0]);
    let out_bytes = bytes(ins.outputs[0]);
    let axes: Vec<String> = match &ins.op {
        Op::Psum { axes, .. }
        | Op::AllGather { axes, .. }
        | Op::PsumScatter { axes, .. }
        | Op::AllToAll { axes, .. } => axes.clone(),
        Op::Ppermute { axis, .. } => vec![axis.clone()],
        _ => vec![],
    };
    let (kind, bytes, group) = match &ins.op {
        Op::Psum { group, .. } => {
            let all: u64 = ins.inputs.iter().map(|v| bytes(*v)).sum();
            (CollectiveKind::AllReduce, all, *group)
        }
        Op::AllGather { group, .. } => (CollectiveKind::AllGather, out_bytes, *group),
        Op::PsumScatter { group, .. } => (CollectiveKind::ReduceScatter, in_bytes, *group),
        Op::AllToAll { group, .. } => (CollectiveKind::AllToAll, in_bytes, *group),
        Op::Ppermute { axis, .. } => {
            let g = prog.mesh.as_ref().and_then(|m| m.axis_size(axis).ok()).unwrap_or(1);
            (CollectiveKind::CollectivePermute, in_bytes, g)
        }
        _ => return None,
    };
    Some(CollectiveUse {
        instr: i,
        kind,
        bytes,
        group,
        axes,
        operands: ins.inputs.len(),
    })
}

/// Walks `prog` once: FLOPs, random bits, collectives and warnings; memory from the memory
/// plan (by liveness: reshapes alias their operand; in-place updates reuse their parameter's
/// memory).
pub fn summarize(prog: &Program) -> ProgramSummary {
    let mut s = ProgramSummary {
        devices: prog.devices(),
        instructions: prog.instrs.len(),
        ..Default::default()
    };
    s.stage_flops = vec![0; prog.stages.as_ref().map_or(0, |st| st.stages)];
    for (i, ins) in prog.instrs.iter().enumerate() {
        let flops = instr_flops(prog, ins);
        let owner = prog.instr_owner(i);
        for (stage, f) in s.stage_flops.iter_mut().enumerate() {
            if owner.active(stage) {
                *f += flops;
            }
        }
        s.flops += flops;
        // Bits each device generates: the whole shape of a random_bits, only its own block
        // of a partitioned one.
        if let Op::RandomBits { shape, .. } | Op::RandomBitsBlock { shape, .. } = &ins.op {
            s.rng_bits += 32 * shape.iter().product::<usize>() as u64;
        }
        s.collectives.extend(collective_use(prog, i));
    }
    if let Some(&busiest) = s.stage_flops.iter().max() {
        s.flops = busiest;
    }
    s.warnings = rng_warnings(prog);
    match MemoryPlan::of(prog) {
        Ok(m) => {
            s.params_bytes = m.params;
            s.optimizer_state_bytes = m.optimizer_state;
            s.gradients_bytes = m.gradients;
            s.compute_params_bytes = m.compute_params;
            s.activations_bytes = m.activations;
            s.total_bytes = m.total;
            s.largest_tensor = m.largest;
        }
        Err(e) => s.warnings.push(e.to_string()),
    }
    s
}

/// Dropout masks drawn from a key that is the same on every device along an axis, applied
/// to data that differs along it: the masks repeat across those shards.
fn rng_warnings(prog: &Program) -> Vec<String> {
    let Some(mesh) = &prog.mesh else { return vec![] };
    let vma = varying_axes(prog);
    let mut out = vec![];
    for ins in &prog.instrs {
        let Op::Dropout { .. } = ins.op else { continue };
        let (x, bits) = (ins.inputs[0], ins.inputs[1]);
        for (axis, size) in mesh.axes() {
            if *size > 1 && vma[x.index()].contains(axis) && !vma[bits.index()].contains(axis) {
                let msg = format!(
                    "dropout masks repeat across '{axis}' shards: every device draws with the same key; use fold_in(key, axis_index('{axis}')) (--dropout-key fold_in)"
                );
                if !out.contains(&msg) {
                    out.push(msg);
                }
            }
        }
    }
    out
}
