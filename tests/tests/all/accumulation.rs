//! Gradient accumulation (`--microbatches K`) against the one-device step on the whole batch:
//! with dropout 0, formula init and data, the losses of 3 steps and the parameters after them
//! agree to 1e-5 on one device, in shard_map mode and in automatic mode, for every strategy;
//! and in data parallelism the gradients are reduced once per step, not once per microbatch.
use std::sync::Arc;

use shardlab::exec::{Backend, Parallel, TrainerOptions};
use shardlab::gpu::GpuContext;
use shardlab::ir::{Op, Program};
use shardlab::model::{param_specs, GptConfig, Optimizer};
use shardlab::plan::{build, DropoutKey, Strategy};
use shardlab::sharding::Mesh;

pub fn config() -> GptConfig {
    GptConfig {
        layers: 1,
        d_model: 32,
        heads: 8,
        seq: 8,
        batch: 8,
        vocab: 64,
        tied: false,
        dropout: 0.0,
        attention: Default::default(),
        remat: Default::default(),
        precision: Default::default(),
        moe: None,
    }
}

pub fn options(parallel: Parallel, opt: Optimizer, microbatches: usize) -> TrainerOptions {
    TrainerOptions {
        microbatches,
        ..shardlab_tests::formula_options(config(), opt, parallel)
    }
}

pub fn shard_map(strategy: Strategy, mesh: &str) -> Parallel {
    Parallel::ShardMap {
        par: strategy.compose(&Mesh::parse(mesh).unwrap()).unwrap(),
        dropout_key: DropoutKey::Same,
    }
}

pub fn auto(strategy: Strategy, mesh: &str) -> Parallel {
    Parallel::Auto {
        par: strategy.compose(&Mesh::parse(mesh).unwrap()).unwrap(),
        specs: vec![],
    }
}

/// Runs every case and holds each to the one-device step on the whole batch (K = 1).
pub fn check_against_one_device(backend: &Backend, opt: Optimizer, cases: &[(Parallel, usize)]) {
    let (want_losses, want_params) = shardlab_tests::train_steps(backend, options(Parallel::None, opt, 1), 3);
    for (parallel, k) in cases {
        let what = match parallel.mesh() {
            None => format!("one device, {k} microbatches"),
            Some(mesh) => format!(
                "{} {} on {mesh:?}, {k} microbatches",
                parallel.mode_name(),
                parallel.label()
            ),
        };
        let (losses, params) = shardlab_tests::train_steps(backend, options(parallel.clone(), opt, *k), 3);
        for (s, (a, b)) in losses.iter().zip(&want_losses).enumerate() {
            assert!((a - b).abs() <= 1e-5, "{what}: loss {s}: {a} vs the whole batch {b}");
        }
        for (i, (p, q)) in params.iter().zip(&want_params).enumerate() {
            let worst = p.iter().zip(q).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(
                worst <= 1e-5,
                "{what}: param {i} differs by {worst} from the whole batch"
            );
        }
    }
}

/// Every strategy in both modes with 2 microbatches (batch 8: each 'dp' shard of 2 or 4 rows
/// splits in two), and one device with 2, 4 and 8.
fn every_strategy() -> Vec<(Parallel, usize)> {
    let mut cases = vec![(Parallel::None, 2), (Parallel::None, 4), (Parallel::None, 8)];
    let meshes: &[(Strategy, &str)] = &[
        (Strategy::Dp, "dp=2"),
        (Strategy::Dp, "dp=4"),
        (Strategy::Zero1, "dp=4"),
        (Strategy::Zero2, "dp=4"),
        (Strategy::Fsdp, "dp=2"),
        (Strategy::Fsdp, "dp=4"),
        (Strategy::Tp, "tp=2"),
        (Strategy::DpTp, "dp=2,tp=2"),
        (Strategy::Cp, "cp=2"),
        (Strategy::DpCp, "dp=2,cp=2"),
        (Strategy::TpSp, "tp=2"),
    ];
    for &(strategy, mesh) in meshes {
        cases.push((shard_map(strategy, mesh), 2));
        cases.push((auto(strategy, mesh), 2));
    }
    cases.push((shard_map(Strategy::Dp, "dp=2"), 4));
    cases.push((auto(Strategy::Dp, "dp=2"), 4));
    cases
}

#[test]
fn microbatches_match_the_whole_batch_in_every_mode_and_strategy_on_the_reference_executor() {
    check_against_one_device(&Backend::Reference, Optimizer::Sgd { lr: 0.1 }, &every_strategy());
}

#[test]
fn microbatches_match_the_whole_batch_with_adamw_on_the_reference_executor() {
    check_against_one_device(&Backend::Reference, Optimizer::AdamW { lr: 1e-3 }, &every_strategy());
}

#[test]
fn microbatches_match_the_whole_batch_on_the_gpu() {
    if shardlab_tests::gpu().is_none() {
        eprintln!("skipped: no GPU adapter");
        return;
    }
    let cases = [
        (Parallel::None, 4),
        (shard_map(Strategy::Dp, "dp=2"), 2),
        (auto(Strategy::Dp, "dp=2"), 2),
        (shard_map(Strategy::Fsdp, "dp=2"), 2),
        (auto(Strategy::Tp, "tp=2"), 2),
    ];
    let gpu = Backend::Gpu(Arc::new(GpuContext::new_blocking().unwrap()));
    check_against_one_device(&gpu, Optimizer::Sgd { lr: 0.1 }, &cases);
}

pub fn count(prog: &Program, op: &str) -> usize {
    prog.instrs.iter().filter(|i| i.op.name() == op).count()
}

/// Arrays a kind of collective carries (a combined psum carries several).
pub fn operands(prog: &Program, op: &str) -> usize {
    prog.instrs
        .iter()
        .filter(|i| i.op.name() == op)
        .map(|i| i.inputs.len())
        .sum()
}

#[test]
fn data_parallelism_all_reduces_each_gradient_once_per_step_in_both_modes() {
    let n = param_specs(&config()).len();
    for k in [1, 2, 4] {
        for parallel in [shard_map(Strategy::Dp, "dp=2"), auto(Strategy::Dp, "dp=2")] {
            let planned = build(&options(parallel.clone(), Optimizer::Sgd { lr: 0.1 }, k)).unwrap();
            let prog = &planned.step.program;
            // One all-reduce per parameter's gradient and one for the loss, whatever K is.
            assert_eq!(operands(prog, "psum"), n + 1, "{parallel:?} with {k} microbatches");
            assert_eq!(
                count(prog, "psum_scatter") + count(prog, "all_gather"),
                0,
                "{parallel:?}"
            );
        }
    }
}

#[test]
fn the_automatic_partitioner_adds_the_microbatches_partial_sums_before_the_one_all_reduce() {
    let planned = build(&options(auto(Strategy::Dp, "dp=2"), Optimizer::Sgd { lr: 0.1 }, 4)).unwrap();
    let prog = &planned.step.program;
    // Every psum follows the last microbatch's backward pass: none sits between two forwards.
    let last_forward = prog
        .instrs
        .iter()
        .rposition(|i| matches!(i.op, Op::CrossEntropy))
        .unwrap();
    let first_psum = prog.instrs.iter().position(|i| i.op.name() == "psum").unwrap();
    assert!(
        first_psum > last_forward,
        "a psum at {first_psum} before the last forward at {last_forward}"
    );
    let inserted = planned.inserted.unwrap();
    assert!(
        inserted.iter().filter(|r| r.op == "psum").all(|r| r.source_op != "add"),
        "{inserted:?}"
    );
}

#[test]
fn sharded_gradients_are_reduce_scattered_once_per_microbatch() {
    // FSDP and ZeRO-2 hold only their block of each gradient, so each microbatch's is
    // reduce-scattered as it is made: K reduce-scatters per split parameter, in both modes.
    let cfg = config();
    let split = param_specs(&cfg).iter().filter(|p| p.shape[0] % 2 == 0).count();
    for strategy in [Strategy::Zero2, Strategy::Fsdp] {
        for k in [1, 2] {
            for parallel in [shard_map(strategy, "dp=2"), auto(strategy, "dp=2")] {
                let planned = build(&options(parallel.clone(), Optimizer::Sgd { lr: 0.1 }, k)).unwrap();
                let scatters = count(&planned.step.program, "psum_scatter");
                assert_eq!(scatters, k * split, "{parallel:?} with {k} microbatches");
            }
        }
    }
}

#[test]
fn memory_for_activations_drops_with_more_microbatches_and_the_rest_does_not_move() {
    let plan = |k| {
        let planned = build(&options(
            shard_map(Strategy::Dp, "dp=2"),
            Optimizer::AdamW { lr: 1e-3 },
            k,
        ))
        .unwrap();
        shardlab::plan::MemoryPlan::of(&planned.step.program).unwrap()
    };
    let (one, two, four) = (plan(1), plan(2), plan(4));
    assert!(two.activations < one.activations && four.activations < two.activations);
    for p in [&two, &four] {
        assert_eq!(
            (p.params, p.optimizer_state, p.gradients),
            (one.params, one.optimizer_state, one.gradients)
        );
    }
}

#[test]
fn a_count_that_does_not_split_the_batch_is_refused_naming_the_flag() {
    let cases = [
        (Parallel::None, 0, "--microbatches 0"),
        (Parallel::None, 3, "does not divide --batch 8"),
        (Parallel::None, 16, "more than --batch 8"),
        (shard_map(Strategy::Dp, "dp=4"), 4, "each data-parallel shard"),
        (auto(Strategy::Zero1, "dp=4"), 4, "each data-parallel shard"),
        (shard_map(Strategy::DpCp, "dp=2,cp=2"), 8, "each data-parallel shard"),
        (auto(Strategy::Cp, "cp=2"), 3, "does not divide --batch 8"),
    ];
    for (parallel, k, want) in cases {
        let e = build(&options(parallel.clone(), Optimizer::Sgd { lr: 0.1 }, k))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want) && e.contains("use "), "{parallel:?} {k}: {e}");
    }
}

#[test]
fn the_cost_model_prices_k_microbatches_with_one_update_and_the_reductions_where_they_run() {
    use shardlab::profile::{device_preset, predict, Placement};
    let device = device_preset("tpu_v4").unwrap();
    // With dropout, so that ring attention's drawn masks are priced too.
    let priced = |parallel: Parallel, k| {
        let mut opts = options(parallel, Optimizer::AdamW { lr: 1e-3 }, k);
        opts.config.dropout = 0.1;
        let planned = build(&opts).unwrap();
        predict(&planned.step.program, &device, Placement::Real)
    };
    for parallel in [
        shard_map(Strategy::Dp, "dp=2"),
        auto(Strategy::Zero2, "dp=2"),
        shard_map(Strategy::Cp, "cp=2"),
    ] {
        let (one, four) = (priced(parallel.clone(), 1), priced(parallel.clone(), 4));
        // The same examples' FLOPs and the accumulation's adds ((K-1) per parameter, a few
        // percent of this tiny model's work), in four passes' launches.
        let extra = four.flops_per_device / one.flops_per_device - 1.0;
        assert!((0.0..0.05).contains(&extra), "{parallel:?}: {extra}");
        assert!(
            four.launches > 3 * one.launches,
            "{parallel:?}: {} vs {}",
            four.launches,
            one.launches
        );
        // One optimizer step, whatever K.
        let optimizer = |p: &shardlab::profile::Prediction| p.breakdown_ms.get("optimizer").copied().unwrap_or(0.0);
        assert!((optimizer(&four) - optimizer(&one)).abs() <= 1e-12, "{parallel:?}");
        let count = |p: &shardlab::profile::Prediction, kind: &str| p.collectives[kind].count;
        match parallel {
            // dp and cp reduce once per step; ZeRO-2 once per microbatch; the ring sends K and V
            // round once per microbatch.
            Parallel::ShardMap { .. } => {
                assert_eq!(count(&four, "all-reduce"), count(&one, "all-reduce"));
                if parallel.strategy() == Some(Strategy::Cp) {
                    assert!(count(&one, "collective-permute") > 0);
                    assert_eq!(
                        count(&four, "collective-permute"),
                        4 * count(&one, "collective-permute")
                    );
                }
            }
            _ => assert_eq!(count(&four, "reduce-scatter"), 4 * count(&one, "reduce-scatter")),
        }
        assert!(four.bytes_per_device.activations < one.bytes_per_device.activations);
    }
}

#[test]
fn microbatches_with_remat_match_the_whole_batch() {
    // The levers together: each microbatch's blocks recompute in its own backward pass.
    use shardlab::model::Remat;
    let sgd = Optimizer::Sgd { lr: 0.1 };
    let (want_losses, want_params) =
        shardlab_tests::train_steps(&Backend::Reference, options(Parallel::None, sgd, 1), 3);
    for (parallel, remat) in [
        (Parallel::None, Remat::Full),
        (shard_map(Strategy::Zero2, "dp=2"), Remat::Dots),
        (auto(Strategy::Dp, "dp=2"), Remat::Full),
    ] {
        let mut opts = options(parallel.clone(), sgd, 2);
        opts.config.remat = remat;
        let (losses, params) = shardlab_tests::train_steps(&Backend::Reference, opts, 3);
        for (a, b) in losses.iter().zip(&want_losses) {
            assert!((a - b).abs() <= 1e-5, "{parallel:?} {remat:?}: {a} vs {b}");
        }
        for (p, q) in params.iter().zip(&want_params) {
            let worst = p.iter().zip(q).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-5, "{parallel:?} {remat:?}: a parameter differs by {worst}");
        }
    }
}
