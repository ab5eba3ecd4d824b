//! ZeRO-1 and ZeRO-2 (`--strategy zero1 | zero2`) in both modes: the same losses and
//! parameters as one device (1e-5), the collectives each body says, and memory per device in
//! the closed form of the ZeRO paper's accounting (Rajbhandari et al. 2020, section 3), in
//! float32: Ψ parameters take 4Ψ bytes, their gradients 4Ψ, AdamW's m and v 8Ψ (the paper's
//! mixed-precision 2Ψ + 2Ψ + KΨ, K = 12, becomes 4Ψ + 4Ψ + 8Ψ: no fp32 master copy, since
//! the parameters already are fp32), and N devices split what each stage splits:
//! dp 16Ψ, ZeRO-1 8Ψ + 8Ψ/N, ZeRO-2 4Ψ + 12Ψ/N, ZeRO-3 (FSDP) 16Ψ/N.
use std::sync::Arc;

use shardlab::exec::{Backend, Parallel};
use shardlab::gpu::GpuContext;
use shardlab::model::{param_specs, Optimizer};
use shardlab::plan::{build, MemoryPlan, Strategy};
use shardlab::sharding::Mesh;

use crate::accumulation::{auto, check_against_one_device, config, count, operands, options, shard_map};

fn every_mesh(k: usize) -> Vec<(Parallel, usize)> {
    let mut cases = vec![];
    for strategy in [Strategy::Zero1, Strategy::Zero2] {
        for mesh in ["dp=1", "dp=2", "dp=4", "dp=8"] {
            cases.push((shard_map(strategy, mesh), k));
            cases.push((auto(strategy, mesh), k));
        }
    }
    cases
}

#[test]
fn zero1_and_zero2_match_one_device_in_both_modes_on_the_reference_executor() {
    check_against_one_device(&Backend::Reference, Optimizer::Sgd { lr: 0.1 }, &every_mesh(1));
}

#[test]
fn zero1_and_zero2_match_one_device_with_adamw_on_the_reference_executor() {
    check_against_one_device(&Backend::Reference, Optimizer::AdamW { lr: 1e-3 }, &every_mesh(1));
}

#[test]
fn zero1_and_zero2_with_microbatches_match_the_whole_batch_on_the_reference_executor() {
    let cases: Vec<(Parallel, usize)> = every_mesh(2).into_iter().filter(|(p, _)| p.devices() <= 4).collect();
    check_against_one_device(&Backend::Reference, Optimizer::AdamW { lr: 1e-3 }, &cases);
}

#[test]
fn zero1_and_zero2_match_one_device_on_the_gpu() {
    if shardlab_tests::gpu().is_none() {
        eprintln!("skipped: no GPU adapter");
        return;
    }
    let cases = [
        (shard_map(Strategy::Zero1, "dp=2"), 1),
        (auto(Strategy::Zero1, "dp=2"), 1),
        (shard_map(Strategy::Zero2, "dp=4"), 2),
        (auto(Strategy::Zero2, "dp=4"), 2),
    ];
    let gpu = Backend::Gpu(Arc::new(GpuContext::new_blocking().unwrap()));
    check_against_one_device(&gpu, Optimizer::AdamW { lr: 1e-3 }, &cases);
}

#[test]
fn zero1_all_reduces_and_zero2_reduce_scatters_then_both_gather_the_updated_blocks() {
    // dp=2 splits every parameter's dimension 0 of the tiny model except none: all are even.
    let cfg = config();
    let n = param_specs(&cfg).len();
    let split = param_specs(&cfg).iter().filter(|p| p.shape[0] % 2 == 0).count();
    assert_eq!(split, n);
    for parallel in [shard_map(Strategy::Zero1, "dp=2"), auto(Strategy::Zero1, "dp=2")] {
        let prog = build(&options(parallel.clone(), Optimizer::AdamW { lr: 1e-3 }, 1))
            .unwrap()
            .step
            .program;
        assert_eq!(
            operands(&prog, "psum"),
            n + 1,
            "{parallel:?}: the gradients and the loss"
        );
        assert_eq!(count(&prog, "psum_scatter"), 0, "{parallel:?}");
        // Each device slices its block of the parameter and of the gradient for the update.
        assert_eq!(count(&prog, "dynamic_slice"), 2 * n, "{parallel:?}");
        assert_eq!(count(&prog, "all_gather"), n, "{parallel:?}");
    }
    for parallel in [shard_map(Strategy::Zero2, "dp=2"), auto(Strategy::Zero2, "dp=2")] {
        let prog = build(&options(parallel.clone(), Optimizer::AdamW { lr: 1e-3 }, 1))
            .unwrap()
            .step
            .program;
        assert_eq!(operands(&prog, "psum"), 1, "{parallel:?}: only the loss");
        assert_eq!(count(&prog, "psum_scatter"), n, "{parallel:?}");
        assert_eq!(
            count(&prog, "dynamic_slice"),
            n,
            "{parallel:?}: the parameter's block only"
        );
        assert_eq!(count(&prog, "all_gather"), n, "{parallel:?}");
    }
}

#[test]
fn zero1_reduces_the_microbatches_gradients_once_and_zero2_once_per_microbatch() {
    let n = param_specs(&config()).len();
    for k in [1, 2, 4] {
        for mode in [shard_map(Strategy::Zero1, "dp=2"), auto(Strategy::Zero1, "dp=2")] {
            let prog = build(&options(mode.clone(), Optimizer::Sgd { lr: 0.1 }, k))
                .unwrap()
                .step
                .program;
            assert_eq!(operands(&prog, "psum"), n + 1, "{mode:?} with {k} microbatches");
        }
        for mode in [shard_map(Strategy::Zero2, "dp=2"), auto(Strategy::Zero2, "dp=2")] {
            let prog = build(&options(mode.clone(), Optimizer::Sgd { lr: 0.1 }, k))
                .unwrap()
                .step
                .program;
            assert_eq!(count(&prog, "psum_scatter"), k * n, "{mode:?} with {k} microbatches");
        }
    }
}

/// (params, optimizer state, gradients) per device in units of Ψ bytes / 4 (f32), times N.
fn closed_form(strategy: Strategy, n: u64) -> (u64, u64, u64) {
    match strategy {
        Strategy::Dp => (4 * n, 8 * n, 4 * n),
        Strategy::Zero1 => (4 * n, 8, 4 * n),
        Strategy::Zero2 => (4 * n, 8, 4),
        Strategy::Fsdp => (4, 8, 4),
        _ => unreachable!("not a ZeRO stage"),
    }
}

#[test]
fn memory_per_device_is_the_zero_papers_accounting_in_float32() {
    // Every parameter of the tiny model splits evenly over 4 devices, so N divides Ψ exactly.
    let cfg = config();
    let psi = cfg.param_count().unwrap();
    let n = 4u64;
    for strategy in [Strategy::Dp, Strategy::Zero1, Strategy::Zero2, Strategy::Fsdp] {
        for parallel in [shard_map(strategy, "dp=4"), auto(strategy, "dp=4")] {
            for k in [1, 2] {
                let prog = build(&options(parallel.clone(), Optimizer::AdamW { lr: 1e-3 }, k))
                    .unwrap()
                    .step
                    .program;
                let m = MemoryPlan::of(&prog).unwrap();
                let (p, s, g) = closed_form(strategy, n);
                let got = (m.params * n, m.optimizer_state * n, m.gradients * n);
                assert_eq!(
                    got,
                    (p * psi, s * psi, g * psi),
                    "{parallel:?} with {k} microbatches (x N, in Ψ)"
                );
                // What must fit at once is at most the parts, each at its largest.
                assert!(m.total <= m.params + m.optimizer_state + m.gradients + m.activations);
            }
        }
    }
}

#[test]
fn zero_needs_a_dp_axis_and_says_which_mesh_to_use() {
    for strategy in [Strategy::Zero1, Strategy::Zero2] {
        let e = strategy.compose(&Mesh::parse("tp=2").unwrap()).unwrap_err().to_string();
        assert!(e.contains(&format!("--strategy {}", strategy.name())), "{e}");
        assert!(e.contains("axis 'dp'") && e.contains("--mesh dp=4"), "{e}");
    }
}
