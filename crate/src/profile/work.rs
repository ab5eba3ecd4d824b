//! What one instruction of a per-device program asks of a device: matmul and vector FLOPs,
//! bytes moved through memory, integer operations (Threefry) and kernel launches. Read off
//! the program alone, so it works for programs far too large to run.
use super::cost::{attention_flops, instr_flops};
use crate::exec::{lowered, plan_instr_dot, Fusion, Lowered};
use crate::ir::{numel, Instr, Op, Precision, Program, RngLayout, ValueId};

/// 32-bit integer operations of one Threefry-2x32 hash: 20 rounds of add, rotate (shift,
/// shift, or) and xor, 5 key injections of 3 adds, 2 initial adds.
pub const THREEFRY_INT_OPS: f64 = 20.0 * 5.0 + 5.0 * 3.0 + 2.0;

/// How the instructions are executed, which changes what they cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// One real device per mesh position, each running the per-device program, as XLA
    /// would: the original Threefry layout hashes two words per call.
    Real,
    /// All mesh positions as shards of one adapter, as shardlab runs them: every dispatch
    /// covers all devices, collectives are copies in its memory, one hash per word but for the
    /// original layout's whole arrays (a hash per pair, as XLA).
    Simulated,
}

/// A matmul's shape after lowering: `batch` independent (m x k) @ (k x n) products.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DotShape {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// One instruction's demands on one device (per device: the program's local shapes).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Work {
    pub matmul_flops: f64,
    pub dot: Option<DotShape>,
    pub vector_flops: f64,
    pub int_ops: f64,
    /// Bytes read and written through device memory.
    pub bytes: f64,
    /// Kernel launches (GPU dispatches); 0 for ops that only rename memory and for the second
    /// instruction of a fused pair.
    pub launches: usize,
    /// A fused attention op: priced at the device's calibrated attention rate where it has one.
    pub fused_attention: bool,
}

/// Bytes of every value as a real device holds it, under the program's precision
/// ([`Program::element_bytes`]), and which values are master state.
struct Widths {
    bytes: Vec<u64>,
    master: Vec<bool>,
}

impl Widths {
    fn of(prog: &Program) -> Self {
        Widths {
            bytes: prog.element_bytes(),
            master: prog.master_values(),
        }
    }

    /// Bytes of value `v` as held.
    fn held(&self, prog: &Program, v: ValueId) -> f64 {
        (numel(prog.shape(v)) as u64 * self.bytes[v.index()]) as f64
    }

    /// Bytes `ins` reads of its operand `v`: master weights are read for compute through their
    /// compute copy (bf16 under mixed precision); only the optimizer update reads the masters.
    fn read(&self, prog: &Program, ins: &Instr, v: ValueId) -> f64 {
        if self.master[v.index()] && !is_update(&ins.op) {
            (numel(prog.shape(v)) as u64 * prog.precision.compute_bytes(prog.info(v).dtype)) as f64
        } else {
            self.held(prog, v)
        }
    }
}

fn is_update(op: &Op) -> bool {
    matches!(op, Op::SgdUpdate { .. } | Op::AdamWUpdate { .. })
}

/// The work of every instruction of `prog`, as the GPU lowering runs them
/// ([`crate::exec::lowered`]): its dispatches are the launches, and a fused pair is priced as
/// one kernel on its first instruction (their work together, less the intermediate's trip
/// through memory), its second instruction as nothing, and so is a transpose folded into fused
/// attention. Collectives report only their local
/// copies here; their traffic between devices is priced by the topology.
pub fn program_work(prog: &Program, placement: Placement) -> Vec<Work> {
    program_work_lowered(prog, placement, &lowered(prog))
}

/// [`program_work`] with the program's lowering at hand (its `lowered`).
pub(crate) fn program_work_lowered(prog: &Program, placement: Placement, lowered: &[Lowered]) -> Vec<Work> {
    let widths = Widths::of(prog);
    let mut out: Vec<Work> = prog
        .instrs
        .iter()
        .map(|ins| instr_work(prog, &widths, ins, placement))
        .collect();
    for (i, l) in lowered.iter().enumerate() {
        out[i].launches = l.dispatches;
        // A transpose the fused attention kernels read or write in place moves nothing, nor
        // does a constant worked out when lowering or a value nobody reads.
        if l.fused_into_previous || l.folded || l.skipped {
            out[i] = Work::default();
            continue;
        }
        let Some(fusion) = l.fuses else { continue };
        let next = out[i + 1];
        let first = &mut out[i];
        // The intermediate is not read back (and not written, unless the pair keeps it).
        let trips = if fusion.keeps_intermediate() { 1.0 } else { 2.0 };
        let intermediate = widths.held(prog, prog.instrs[i].outputs[0]);
        first.bytes = (first.bytes + next.bytes - trips * intermediate).max(0.0);
        first.vector_flops += next.vector_flops;
        first.int_ops += next.int_ops;
        first.matmul_flops += next.matmul_flops;
        if fusion == Fusion::DotTransposed {
            // The same product with its operands swapped: m and n trade places.
            first.dot = first.dot.map(|d| DotShape { m: d.n, n: d.m, ..d });
        }
    }
    // Bits fused attention draws in place move no bytes. Each (T, T) mask is hashed over its
    // causal half in the forward and again in the backward: once per gradient kernel in
    // shardlab's (dq, dk, dv: twice the array's hashes), once in FlashAttention-2's single
    // backward kernel on a real device (the array's hashes).
    let drawn = prog.bits_drawn_in_attention();
    let rehash = match placement {
        Placement::Simulated => 2.0,
        Placement::Real => 1.0,
    };
    for (i, ins) in prog.instrs.iter().enumerate() {
        if ins.outputs.first().is_some_and(|o| drawn[o.index()].is_some()) {
            out[i].bytes = 0.0;
            out[i].int_ops *= rehash;
        }
        for v in ins.inputs.iter().filter(|v| drawn[v.index()].is_some()) {
            out[i].bytes = (out[i].bytes - widths.read(prog, ins, *v)).max(0.0);
        }
    }
    out
}

/// The work of instruction `ins` of `prog` run alone; its launches are set by
/// [`program_work`] from the lowering.
fn instr_work(prog: &Program, widths: &Widths, ins: &Instr, placement: Placement) -> Work {
    let ins_bytes: f64 = ins.inputs.iter().map(|v| widths.read(prog, ins, *v)).sum();
    let out_bytes: f64 = ins.outputs.iter().map(|v| widths.held(prog, *v)).sum();
    let mut w = Work {
        bytes: ins_bytes + out_bytes,
        ..Default::default()
    };
    if is_update(&ins.op) && prog.precision != Precision::F32 {
        // The update also writes the bf16 copy of the new weights that the next step computes
        // with (as llm.c's AdamW kernel writes both).
        let p = ins.inputs[0];
        w.bytes += (numel(prog.shape(p)) as u64 * prog.precision.compute_bytes(prog.info(p).dtype)) as f64;
    }
    match &ins.op {
        Op::Reshape { .. } | Op::Pcast { .. } | Op::Reshard { .. } => return Work::default(),
        Op::DotGeneral { .. } => {
            let p = plan_instr_dot(prog, ins).expect("a dot_general");
            // Operands in neither (free, contract) nor (contract, free) order are copied
            // transposed first: a read and a write each.
            for (perm, v) in [(&p.lhs_perm, ins.inputs[0]), (&p.rhs_perm, ins.inputs[1])] {
                if perm.is_some() {
                    w.bytes += 2.0 * widths.read(prog, ins, v);
                }
            }
            w.matmul_flops = instr_flops(prog, ins) as f64;
            w.dot = Some(DotShape {
                batch: p.shape.batch,
                m: p.shape.m,
                n: p.shape.n,
                k: p.shape.k,
            });
        }
        Op::ReduceSum { axes } => {
            if crate::exec::plan_reduce(prog.shape(ins.inputs[0]), axes).perm.is_some() {
                w.bytes += 2.0 * ins_bytes;
            }
            w.vector_flops = instr_flops(prog, ins) as f64;
        }
        Op::RandomBits { shape, layout, .. } | Op::RandomBitsBlock { shape, layout, .. } => {
            let words: f64 = shape.iter().product::<usize>() as f64;
            // JAX's original layout hashes a pair of counters into two words, and so does
            // shardlab's kernel for a whole array (`random_bits_pairs`); a block of it and the
            // partitionable layout everywhere hash once per word.
            let whole = match &ins.op {
                Op::RandomBitsBlock { global, .. } => global == shape,
                _ => true,
            };
            let hashes = match (layout, placement) {
                (RngLayout::Original, Placement::Real) => words / 2.0,
                (RngLayout::Original, Placement::Simulated) if whole => words / 2.0,
                _ => words,
            };
            w.int_ops = hashes * THREEFRY_INT_OPS;
            w.bytes = out_bytes;
        }
        Op::Attention { .. } | Op::AttentionGrad { .. } => {
            // Its dot products run as (T, Dh) x (Dh, T) products per head, as FlashAttention's
            // tiles do on tensor cores; no (T, T) array moves through memory.
            let (dots, rest) = attention_flops(prog, ins);
            let (shape, keys) = (prog.shape(ins.inputs[0]), prog.shape(ins.inputs[1]));
            let n = shape.len();
            w.matmul_flops = dots as f64;
            w.vector_flops = rest as f64;
            w.fused_attention = true;
            w.dot = Some(DotShape {
                batch: shape[..n - 2].iter().product(),
                m: shape[n - 2],
                n: keys[n - 2],
                k: shape[n - 1],
            });
        }
        Op::FoldIn { .. } | Op::FoldInAxisIndex { .. } => w.int_ops = THREEFRY_INT_OPS,
        _ => w.vector_flops = instr_flops(prog, ins) as f64,
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::DType;
    use crate::model::{train_step_program, GptConfig, Optimizer};

    #[test]
    fn bf16_moves_half_the_float_bytes_and_its_update_reads_and_writes_f32_masters_and_a_bf16_copy() {
        let step = |precision| {
            let cfg = GptConfig {
                precision,
                ..GptConfig::tiny()
            };
            train_step_program(&cfg, Optimizer::AdamW { lr: 1e-3 }, RngLayout::Partitionable)
                .unwrap()
                .program
        };
        let (f32, bf16) = (step(Precision::F32), step(Precision::Bf16));
        let (a, b) = (
            program_work(&f32, Placement::Real),
            program_work(&bf16, Placement::Real),
        );
        let mut updates = 0;
        for (i, ins) in f32.instrs.iter().enumerate() {
            if is_update(&ins.op) {
                // AdamW reads the bf16 gradient (2) and the f32 parameter and moments (4 each),
                // writes the f32 parameter and moments and the parameter's bf16 copy: 28 bytes an
                // element, as f32's four 4-byte reads and three 4-byte writes are.
                let n = numel(f32.shape(ins.inputs[0])) as f64;
                assert_eq!(a[i].bytes, 28.0 * n);
                assert_eq!(b[i].bytes, (2.0 + 3.0 * 4.0 + 3.0 * 4.0 + 2.0) * n);
                updates += 1;
            } else if ins
                .inputs
                .iter()
                .chain(&ins.outputs)
                .all(|v| f32.info(*v).dtype == DType::F32)
            {
                // Every float operand, weights read through their bf16 copy, at half the width.
                assert_eq!(b[i].bytes, a[i].bytes / 2.0, "{} {:?}", i, ins.op);
            }
            assert_eq!(a[i].matmul_flops, b[i].matmul_flops);
        }
        assert!(updates > 0);
    }

    #[test]
    fn a_fused_pair_costs_the_lowerings_launches_and_no_trip_of_its_intermediate() {
        let cfg = GptConfig {
            dropout: 0.1,
            ..GptConfig::tiny()
        };
        let prog = train_step_program(&cfg, Optimizer::AdamW { lr: 1e-3 }, RngLayout::Partitionable)
            .unwrap()
            .program;
        let works = program_work(&prog, Placement::Simulated);
        let lowered = lowered(&prog);
        let widths = Widths::of(&prog);
        let mut seen = vec![];
        for (i, l) in lowered.iter().enumerate() {
            assert_eq!(works[i].launches, l.dispatches, "instruction {i}");
            // A transpose fused attention reads or writes in place moves nothing.
            if l.folded {
                assert_eq!(works[i], Work::default(), "instruction {i}");
                continue;
            }
            let Some(f) = l.fuses else { continue };
            seen.push(f);
            let (a, b) = (
                instr_work(&prog, &widths, &prog.instrs[i], Placement::Simulated),
                instr_work(&prog, &widths, &prog.instrs[i + 1], Placement::Simulated),
            );
            // The pair is priced on its first instruction; the second costs nothing.
            assert_eq!(works[i + 1], Work::default());
            let mid = widths.held(&prog, prog.instrs[i].outputs[0]);
            let trips = if f.keeps_intermediate() { 1.0 } else { 2.0 };
            assert_eq!(works[i].bytes, a.bytes + b.bytes - trips * mid, "{f:?}");
            assert_eq!(works[i].vector_flops, a.vector_flops + b.vector_flops);
            if f == Fusion::DotTransposed {
                let (d, fused) = (a.dot.unwrap(), works[i].dot.unwrap());
                assert_eq!((fused.m, fused.n, fused.k), (d.n, d.m, d.k));
            }
        }
        assert!(lowered.iter().any(|l| l.folded), "no transpose folded into attention");
        for kind in ["DotTransposed", "BiasGelu", "DropoutResidual"] {
            assert!(
                seen.iter().any(|f| format!("{f:?}").starts_with(kind)),
                "{kind}: {seen:?}"
            );
        }
    }
}
