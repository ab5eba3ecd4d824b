//! What the lowering need not launch, read off the program alone: constants and unread values.
//! A `full` and the scales and broadcasts of one are worked out when the program is lowered (the
//! loss's cotangent, 1, times each mean's 1/n: `full`, `scale`, `scale`, `broadcast_in_dim` under
//! shard_map's pmean), and the chain runs as one fill of the value something reads; a scale or
//! broadcast whose value nothing reads launches nothing. XLA folds and drops them alike; the
//! program the page shows keeps them, as a jaxpr does.
use super::fuse::Fusion;
use crate::ir::{DType, Op, Program};

/// How the lowering runs one instruction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fold {
    /// As its op says.
    Run,
    /// Nothing: its value is a constant only other constants are made from, or nothing reads it.
    Skip,
    /// One fill of its output with this value (what its chain of constants computes).
    Fill(f32),
}

/// Every instruction's [`Fold`]. Only lone `full`, `scale` and `broadcast_in_dim` instructions of
/// f32 values fold: not the halves of a fused pair (`fusion`) nor a transpose folded into
/// attention (`quiet`).
pub fn plan(program: &Program, fusion: &[Option<Fusion>], quiet: &[bool]) -> Vec<Fold> {
    let n = program.instrs.len();
    let foldable = |i: usize| {
        let ins = &program.instrs[i];
        matches!(ins.op, Op::Full { .. } | Op::Scale { .. } | Op::BroadcastInDim { .. })
            && ins.outputs.len() == 1
            && program.info(ins.outputs[0]).dtype == DType::F32
            && fusion[i].is_none()
            && !(i > 0 && fusion[i - 1].is_some())
            && !quiet[i]
    };
    // The value of each constant, as the kernels would compute it (scale: alpha * x + 0).
    let mut constant: Vec<Option<f32>> = vec![None; program.values.len()];
    for (i, ins) in program.instrs.iter().enumerate() {
        if !foldable(i) {
            continue;
        }
        let of_input = || constant[ins.inputs[0].index()];
        constant[ins.outputs[0].index()] = match ins.op {
            Op::Full { value, .. } => Some(value),
            Op::Scale { alpha } => of_input().map(|c| alpha * c + 0.0),
            Op::BroadcastInDim { .. } => of_input(),
            _ => None,
        };
    }
    // Backwards: a value is read where an instruction that runs reads it, or it is an output.
    let mut read = vec![false; program.values.len()];
    for v in &program.outputs {
        read[v.index()] = true;
    }
    let mut folds = vec![Fold::Run; n];
    for i in (0..n).rev() {
        let ins = &program.instrs[i];
        if foldable(i) {
            let out = ins.outputs[0].index();
            folds[i] = match (read[out], constant[out]) {
                (false, _) => Fold::Skip,
                (true, Some(c)) => Fold::Fill(c),
                (true, None) => Fold::Run,
            };
        }
        if folds[i] == Fold::Run {
            for v in &ins.inputs {
                read[v.index()] = true;
            }
        }
    }
    folds
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Builder;

    #[test]
    fn a_chain_of_constants_runs_as_one_fill_and_unread_scales_launch_nothing() {
        let mut b = Builder::new();
        let x = b.input("x", &[2, 3], DType::F32, crate::ir::Role::Param(0));
        let one = b.emit1(
            Op::Full {
                shape: vec![],
                value: 1.0,
            },
            &[],
        );
        let quarter = b.scale(one, 0.25);
        let seed = b.scale(quarter, 1.0 / 3.0);
        let seeds = b.broadcast_in_dim(seed, &[2, 3], &[]);
        let y = b.mul(x, seeds);
        let _unread = b.scale(y, 2.0);
        b.output(y);
        let p = b.finish().expect("a valid program");
        let fusion = vec![None; p.instrs.len()];
        let quiet = vec![false; p.instrs.len()];
        let folds = plan(&p, &fusion, &quiet);
        let c = 1.0f32 * 0.25 * (1.0 / 3.0);
        assert_eq!(
            folds,
            [Fold::Skip, Fold::Skip, Fold::Skip, Fold::Fill(c), Fold::Run, Fold::Skip]
        );
    }
}
