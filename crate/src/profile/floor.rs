//! The least time a program's ops could take on one adapter, from two measured ceilings (a
//! roofline): every op at the larger of its arithmetic over the FMA ceiling and its bytes over
//! the copy ceiling. Launches and waits are not counted, so what an op takes beyond its floor is
//! time spent on neither arithmetic nor memory traffic at the adapter's best, and a step's floor
//! says what no kernel tuning of this op decomposition can beat there.
use super::price::sim_collective_bytes;
use super::{category, program_work, summarize, Category, Placement, Work};
use crate::exec::StepProfile;
use crate::ir::Program;

/// One adapter's ceilings, measured (`shardlab bench`'s `fma_peak` and `copy4`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Roofline {
    /// FLOP/s of f32 FMAs alone.
    pub flops: f64,
    /// Bytes/s, read plus written, of the best storage-buffer copy.
    pub bytes_per_s: f64,
}

impl Roofline {
    /// Seconds one instruction's work needs at the ceilings: its FLOPs (integer operations
    /// counted as FLOPs) over the FMA rate, or its bytes over the copy rate, whichever is more.
    pub fn seconds(&self, w: &Work) -> f64 {
        let ops = w.matmul_flops + w.vector_flops + w.int_ops;
        (ops / self.flops).max(w.bytes / self.bytes_per_s)
    }
}

/// A program's floor on one adapter.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StepFloor {
    pub roofline: Roofline,
    /// Per instruction, ms; 0 for the second instruction of a fused pair (priced on the first).
    pub instr_ms: Vec<f64>,
    pub categories_ms: Vec<(Category, f64)>,
    pub total_ms: f64,
}

impl StepFloor {
    /// The floor with each instruction's share charged to the first instruction at or after it
    /// that has dispatches (`dispatches[i]`), as a measured profile charges time: an optimizer
    /// update packed into its group's last dispatch is priced there. Shares past the last
    /// instruction with dispatches stay where they are.
    pub fn charged_to_dispatches(mut self, dispatches: &[bool]) -> Self {
        let last = self.instr_ms.len().min(dispatches.len());
        let Some(last) = dispatches[..last].iter().rposition(|&d| d) else {
            return self;
        };
        let mut carried = 0.0;
        for (ms, &d) in self.instr_ms[..=last].iter_mut().zip(dispatches) {
            carried += *ms;
            *ms = if d { std::mem::take(&mut carried) } else { 0.0 };
        }
        self
    }
}

/// The floor of a profiled step of `prog`, charged as its profile `p` charges time: each op's
/// floor on the op whose dispatches ran it ([`StepFloor::charged_to_dispatches`]).
pub fn profiled_floor(prog: &Program, p: &StepProfile, roofline: Roofline) -> StepFloor {
    let mut dispatches = vec![false; prog.instrs.len()];
    for o in &p.ops {
        if let Some(d) = dispatches.get_mut(o.instr) {
            *d = true;
        }
    }
    step_floor(prog, roofline).charged_to_dispatches(&dispatches)
}

/// The floor of `prog` as shardlab runs it: every dispatch covers all simulated devices' shards
/// of one adapter, and a collective is a copy between their blocks (its bytes as the cost model
/// counts them).
pub fn step_floor(prog: &Program, roofline: Roofline) -> StepFloor {
    let devices = prog.devices();
    let summary = summarize(prog);
    let mut collectives = summary.collectives.iter().peekable();
    let work = program_work(prog, Placement::Simulated);
    let instr_ms: Vec<f64> = work
        .iter()
        .enumerate()
        .map(|(i, w)| match collectives.next_if(|c| c.instr == i) {
            Some(c) => 1e3 * sim_collective_bytes(c.kind, c.bytes, c.group, devices) / roofline.bytes_per_s,
            None => 1e3 * devices as f64 * roofline.seconds(w),
        })
        .collect();
    let categories_ms = Category::ALL
        .iter()
        .map(|&c| {
            let of_c = prog.instrs.iter().zip(&instr_ms).filter(|(ins, _)| category(ins) == c);
            (c, of_c.fold(0.0, |sum, (_, ms)| sum + ms))
        })
        .collect();
    StepFloor {
        roofline,
        total_ms: instr_ms.iter().sum(),
        instr_ms,
        categories_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instruction_without_dispatches_is_charged_to_the_next_one_with_them() {
        let floor = StepFloor {
            roofline: Roofline {
                flops: 1.0,
                bytes_per_s: 1.0,
            },
            instr_ms: vec![1.0, 2.0, 4.0, 8.0, 16.0],
            categories_ms: vec![],
            total_ms: 31.0,
        };
        let charged = floor.charged_to_dispatches(&[true, false, false, true, false]);
        assert_eq!(charged.instr_ms, vec![1.0, 0.0, 0.0, 14.0, 16.0]);
        assert_eq!(charged.total_ms, 31.0);
    }

    fn work(matmul_flops: f64, vector_flops: f64, bytes: f64) -> Work {
        Work {
            matmul_flops,
            vector_flops,
            bytes,
            ..Work::default()
        }
    }

    #[test]
    fn an_op_is_bound_by_the_slower_of_its_arithmetic_and_its_traffic() {
        let roof = Roofline {
            flops: 1e9,
            bytes_per_s: 1e9,
        };
        assert_eq!(roof.seconds(&work(2e9, 0.0, 1e9)), 2.0);
        assert_eq!(roof.seconds(&work(1e9, 1e9, 3e9)), 3.0);
        assert_eq!(roof.seconds(&Work::default()), 0.0);
    }

    #[test]
    fn a_steps_floor_is_the_sum_of_its_ops_and_of_its_categories() {
        use crate::model::{train_step_program, GptConfig, Optimizer};
        let opt = Optimizer::AdamW { lr: 1e-3 };
        let step = train_step_program(&GptConfig::tiny(), opt, crate::ir::RngLayout::Partitionable);
        let prog = step.expect("the tiny step builds").program;
        let roof = Roofline {
            flops: 50e9,
            bytes_per_s: 2e9,
        };
        let floor = step_floor(&prog, roof);
        assert_eq!(floor.instr_ms.len(), prog.instrs.len());
        let by_category: f64 = floor.categories_ms.iter().map(|(_, ms)| ms).sum();
        assert!((by_category - floor.total_ms).abs() <= 1e-9 * floor.total_ms);
        assert!(floor.total_ms > 0.0);
        // Twice the ceilings, half the floor: a roofline is linear in its rates.
        let fast = step_floor(
            &prog,
            Roofline {
                flops: 100e9,
                bytes_per_s: 4e9,
            },
        );
        assert!((2.0 * fast.total_ms - floor.total_ms).abs() <= 1e-9 * floor.total_ms);
        let matmul = floor
            .categories_ms
            .iter()
            .find(|(c, _)| *c == Category::Matmul)
            .map(|(_, ms)| *ms);
        assert!(
            matmul.is_some_and(|ms| ms > 0.0),
            "the step's dots have a floor: {floor:?}"
        );
    }
}
