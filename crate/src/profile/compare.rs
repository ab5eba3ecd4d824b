//! The cost model held against a measured step, op by op: each instruction's predicted time
//! (its launches plus its work, from [`price_ops`]) beside its measured share of the step
//! (from a [`StepProfile`]), summed per op kind and per category, so the mispriced ops show.
use std::collections::BTreeMap;

use super::cost::Category;
use super::device::DeviceProfile;
use super::price::price_ops;
use super::work::Placement;
use crate::exec::StepProfile;
use crate::ir::Program;

/// Predicted beside measured for one group of ops (an op kind or a category).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct OpGroup {
    pub name: String,
    /// Instructions in the group.
    pub count: usize,
    /// Kernel launches the model counts for them.
    pub predicted_launches: usize,
    /// Dispatches the executor ran for them.
    pub measured_dispatches: usize,
    pub predicted_ms: f64,
    /// The part of `predicted_ms` that is launch overhead.
    pub predicted_launch_ms: f64,
    pub measured_ms: f64,
}

impl OpGroup {
    /// predicted / measured; None where nothing was measured.
    pub fn ratio(&self) -> Option<f64> {
        (self.measured_ms > 0.0).then(|| self.predicted_ms / self.measured_ms)
    }
}

/// One step, predicted and measured per group. The step's fixed cost (the model's
/// `step_s`, the profile's one submission) is its own row, `submit`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OpComparison {
    pub predicted_ms: f64,
    /// The profiled step (all dispatches in one submission, awaited).
    pub measured_ms: f64,
    /// Per op kind (`dot_general`, `dynamic_slice`, `psum`, ...), most measured time first.
    pub by_op: Vec<OpGroup>,
    /// Per category, in [`Category::ALL`]'s order, then `submit`.
    pub by_category: Vec<OpGroup>,
}

/// Compares the cost model's pricing of `prog` on `device` with `measured`, a profile of the
/// same program.
pub fn compare_ops(
    prog: &Program,
    device: &DeviceProfile,
    placement: Placement,
    measured: &StepProfile,
) -> OpComparison {
    let priced = price_ops(prog, device, placement);
    let mut by_op: BTreeMap<&'static str, OpGroup> = BTreeMap::new();
    let mut by_cat: BTreeMap<Category, OpGroup> = Category::ALL
        .iter()
        .map(|c| {
            (
                *c,
                OpGroup {
                    name: c.name().into(),
                    ..Default::default()
                },
            )
        })
        .collect();
    let measured_of: BTreeMap<usize, (f64, usize)> =
        measured.ops.iter().map(|o| (o.instr, (o.ms, o.dispatches))).collect();
    for p in &priced {
        let name = prog.instrs[p.instr].op.name();
        let (ms, dispatches) = measured_of.get(&p.instr).copied().unwrap_or((0.0, 0));
        let pred = (p.launch_s + p.work_s) * 1e3;
        for g in [
            by_op.entry(name).or_insert_with(|| OpGroup {
                name: name.into(),
                ..Default::default()
            }),
            by_cat.get_mut(&p.category).expect("every category"),
        ] {
            g.count += 1;
            g.predicted_launches += p.launches;
            g.measured_dispatches += dispatches;
            g.predicted_ms += pred;
            g.predicted_launch_ms += p.launch_s * 1e3;
            g.measured_ms += ms;
        }
    }
    let submit = OpGroup {
        name: "submit".into(),
        count: 1,
        predicted_launches: 0,
        measured_dispatches: 0,
        predicted_ms: device.step_s * 1e3,
        predicted_launch_ms: device.step_s * 1e3,
        measured_ms: measured.submit_overhead_ms,
    };
    let mut by_op: Vec<OpGroup> = by_op
        .into_values()
        .filter(|g| g.predicted_launches + g.measured_dispatches > 0)
        .collect();
    by_op.sort_by(|a, b| b.measured_ms.total_cmp(&a.measured_ms));
    let mut by_category: Vec<OpGroup> = by_cat.into_values().collect();
    by_category.push(submit);
    OpComparison {
        predicted_ms: by_category.iter().map(|g| g.predicted_ms).sum(),
        measured_ms: measured.step_ms,
        by_op,
        by_category,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::OpTime;
    use crate::ir::{Builder, DType, Role};
    use crate::profile::device::m2_max;

    #[test]
    fn per_op_comparison_sums_each_kind_and_category_and_matches_predict() {
        let mut b = Builder::new();
        let x = b.input("x", &[64, 64], DType::F32, Role::Other);
        let y = b.matmul(x, x);
        let z = b.gelu(y);
        let w = b.scale(z, 2.0);
        b.output(w);
        let prog = b.finish().unwrap();
        let ops = |i: usize, ms: f64| OpTime {
            instr: i,
            phase: 0,
            dispatches: 1,
            ms,
            split_ms: ms,
            overhead_ms: 0.0,
        };
        let measured = StepProfile {
            step_ms: 7.5,
            submit_overhead_ms: 0.5,
            phases_ms: [7.0, 0.0, 0.0],
            ops: vec![ops(0, 4.0), ops(1, 2.0), ops(2, 1.0)],
            per_dispatch: None,
            split_overhead_ms: 0.0,
            phase_factor: [1.0; 3],
            reps: 1,
        };
        let d = m2_max();
        let c = compare_ops(&prog, &d, Placement::Real, &measured);
        let p = crate::profile::predict(&prog, &d, Placement::Real);
        assert!(
            (c.predicted_ms - p.step_ms).abs() < 1e-9,
            "{} vs {}",
            c.predicted_ms,
            p.step_ms
        );
        assert_eq!(c.measured_ms, 7.5);
        let matmul = c.by_category.iter().find(|g| g.name == "matmul").unwrap();
        assert_eq!((matmul.count, matmul.measured_ms), (1, 4.0));
        let other = c.by_category.iter().find(|g| g.name == "other").unwrap();
        assert_eq!((other.count, other.measured_ms, other.measured_dispatches), (2, 3.0, 2));
        // Most measured time first; the sums of the kinds and of the categories agree.
        assert_eq!(c.by_op[0].name, "dot_general");
        let kinds: f64 = c.by_op.iter().map(|g| g.predicted_ms).sum();
        let cats: f64 = c
            .by_category
            .iter()
            .filter(|g| g.name != "submit")
            .map(|g| g.predicted_ms)
            .sum();
        assert!((kinds - cats).abs() < 1e-9);
    }
}
