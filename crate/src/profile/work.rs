//! What one instruction of a per-device program asks of a device: matmul and vector FLOPs,
//! bytes moved through memory, integer operations (Threefry) and kernel launches. Read off
//! the program alone, so it works for programs far too large to run.
use super::cost::instr_flops;
use crate::exec::plan_dot;
use crate::ir::{size_in_bytes as bytes, Instr, Op, Program, RngLayout};

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
    /// covers all devices, collectives are copies in its memory, one hash per word.
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
    /// Kernel launches (GPU dispatches); 0 for ops that only rename memory.
    pub launches: usize,
}

fn prog_bytes(prog: &Program, v: crate::ir::ValueId) -> f64 {
    bytes(prog.shape(v)) as f64
}

/// The work of instruction `ins` of `prog`. Collectives report only their local copies here;
/// their traffic between devices is priced by the topology.
pub fn instr_work(prog: &Program, ins: &Instr, placement: Placement) -> Work {
    let ins_bytes: f64 = ins.inputs.iter().map(|v| prog_bytes(prog, *v)).sum();
    let out_bytes: f64 = ins.outputs.iter().map(|v| prog_bytes(prog, *v)).sum();
    let mut w = Work {
        bytes: ins_bytes + out_bytes,
        launches: 1,
        ..Default::default()
    };
    match &ins.op {
        Op::Reshape { .. } | Op::Pvary { .. } => return Work::default(),
        // One strided copy per piece.
        Op::Split { .. } => w.launches = ins.outputs.len(),
        Op::Concat { .. } => w.launches = ins.inputs.len(),
        Op::DotGeneral {
            lhs_contract,
            rhs_contract,
            lhs_batch,
            rhs_batch,
            alpha,
        } => {
            let (lhs, rhs) = (prog.shape(ins.inputs[0]), prog.shape(ins.inputs[1]));
            let p = plan_dot(lhs, rhs, lhs_contract, rhs_contract, lhs_batch, rhs_batch, *alpha);
            // Operands in neither (free, contract) nor (contract, free) order are copied
            // transposed first: one more launch and a read and a write each.
            for (perm, v) in [(&p.lhs_perm, ins.inputs[0]), (&p.rhs_perm, ins.inputs[1])] {
                if perm.is_some() {
                    w.launches += 1;
                    w.bytes += 2.0 * prog_bytes(prog, v);
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
                w.launches += 1;
                w.bytes += 2.0 * ins_bytes;
            }
            w.vector_flops = instr_flops(prog, ins) as f64;
        }
        Op::RandomBits { shape, layout } | Op::RandomBitsBlock { shape, layout, .. } => {
            let words: f64 = shape.iter().product::<usize>() as f64;
            // JAX's original layout hashes a pair of counters into two words; shardlab's
            // kernel (and the partitionable layout everywhere) hashes once per word.
            let hashes = match (layout, placement) {
                (RngLayout::Original, Placement::Real) => words / 2.0,
                _ => words,
            };
            w.int_ops = hashes * THREEFRY_INT_OPS;
            w.bytes = out_bytes;
        }
        Op::FoldIn { .. } | Op::FoldInAxisIndex { .. } => w.int_ops = THREEFRY_INT_OPS,
        Op::Psum { .. } => w.launches = ins.inputs.len(),
        _ => w.vector_flops = instr_flops(prog, ins) as f64,
    }
    w
}
