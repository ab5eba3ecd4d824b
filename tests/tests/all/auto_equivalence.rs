//! Automatic partitioning (jit with shardings) against the one-device run, the RNG layouts'
//! bit counts, and single propagation and resharding rules.
use std::collections::BTreeMap;
use std::sync::Arc;

use shardlab::exec::{Backend, Parallel, ReferenceExecutor, Tensor, TrainerOptions};
use shardlab::gpu::GpuContext;
use shardlab::ir::{Builder, DType, Op, RngLayout, Role};
use shardlab::model::{GptConfig, Optimizer};
use shardlab::partition::auto::{op_rule, propagate, Assignment, Sharding};
use shardlab::partition::{jit, jit_with_constraints};
use shardlab::plan::{auto_train_step, Strategy};
use shardlab::profile::summarize;
use shardlab::sharding::{Mesh, NamedSharding, PartitionSpec};

fn config(dropout: f32) -> GptConfig {
    GptConfig {
        layers: 1,
        d_model: 32,
        heads: 8,
        seq: 8,
        batch: 8,
        vocab: 64,
        tied: false,
        dropout,
        attention: Default::default(),
        remat: Default::default(),
        precision: Default::default(),
        moe: None,
    }
}

fn options(parallel: Parallel, opt: Optimizer) -> TrainerOptions {
    shardlab_tests::formula_options(config(0.0), opt, parallel)
}

fn run(backend: &Backend, opts: TrainerOptions) -> (Vec<f32>, Vec<Vec<f32>>) {
    shardlab_tests::train_steps(backend, opts, 3)
}

fn check_cases(backend: Backend, opt: Optimizer, cases: &[(Strategy, &str)]) {
    let (want_losses, want_params) = run(&backend, options(Parallel::None, opt));
    for &(strategy, mesh) in cases {
        let parallel = Parallel::Auto {
            par: strategy.compose(&Mesh::parse(mesh).unwrap()).unwrap(),
            specs: vec![],
        };
        let (losses, params) = run(&backend, options(parallel, opt));
        let what = format!("auto {} on {mesh}", strategy.name());
        for (k, (a, b)) in losses.iter().zip(&want_losses).enumerate() {
            assert!((a - b).abs() <= 1e-5, "{what}: loss {k}: {a} vs one device {b}");
        }
        for (i, (p, q)) in params.iter().zip(&want_params).enumerate() {
            let worst = p.iter().zip(q).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-5, "{what}: param {i} differs by {worst} from one device");
        }
    }
}

const DP_FSDP: &[(Strategy, &str)] = &[
    (Strategy::Dp, "dp=1"),
    (Strategy::Dp, "dp=2"),
    (Strategy::Dp, "dp=4"),
    (Strategy::Dp, "dp=8"),
    (Strategy::Fsdp, "dp=1"),
    (Strategy::Fsdp, "dp=2"),
    (Strategy::Fsdp, "dp=4"),
    (Strategy::Fsdp, "dp=8"),
];

#[test]
fn auto_dp_and_fsdp_match_one_device_on_the_reference_executor() {
    check_cases(Backend::Reference, Optimizer::Sgd { lr: 0.1 }, DP_FSDP);
}

const TP: &[(Strategy, &str)] = &[
    (Strategy::Tp, "tp=2"),
    (Strategy::Tp, "tp=4"),
    (Strategy::Tp, "tp=8"),
    (Strategy::DpTp, "dp=2,tp=2"),
    (Strategy::DpTp, "dp=2,tp=4"),
];

#[test]
fn auto_tp_and_dp_tp_match_one_device_on_the_reference_executor() {
    check_cases(Backend::Reference, Optimizer::Sgd { lr: 0.1 }, TP);
}

fn gpu_backend() -> Option<Backend> {
    shardlab_tests::gpu()?;
    Some(Backend::Gpu(Arc::new(GpuContext::new_blocking().ok()?)))
}

#[test]
fn auto_strategies_match_one_device_on_the_gpu() {
    let Some(gpu) = gpu_backend() else {
        eprintln!("skipped: no GPU adapter");
        return;
    };
    let cases = [
        (Strategy::Dp, "dp=2"),
        (Strategy::Dp, "dp=8"),
        (Strategy::Fsdp, "dp=4"),
        (Strategy::Tp, "tp=2"),
        (Strategy::DpTp, "dp=2,tp=2"),
    ];
    check_cases(gpu, Optimizer::Sgd { lr: 0.1 }, &cases);
}

/// The GPU's dynamic-slice of replicated bits and its per-device blocks of partitionable bits
/// give the reference executor's masks.
#[test]
fn auto_dropout_on_the_gpu_matches_the_reference_in_both_layouts() {
    let Some(gpu) = gpu_backend() else {
        eprintln!("skipped: no GPU adapter");
        return;
    };
    for layout in [RngLayout::Original, RngLayout::Partitionable] {
        let mut opts = options(
            Parallel::Auto {
                par: Strategy::Dp.compose(&Mesh::parse("dp=4").unwrap()).unwrap(),
                specs: vec![],
            },
            Optimizer::Sgd { lr: 0.1 },
        );
        opts.config = config(0.1);
        opts.rng_layout = layout;
        let (want_losses, want_params) = run(&Backend::Reference, opts.clone());
        let (losses, params) = run(&gpu, opts);
        for (a, b) in losses.iter().zip(&want_losses) {
            assert!((a - b).abs() <= 1e-5, "{layout:?}: GPU loss {a} vs reference {b}");
        }
        for (i, (p, q)) in params.iter().zip(&want_params).enumerate() {
            let worst = p.iter().zip(q).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-5, "{layout:?}: param {i} differs by {worst} on the GPU");
        }
    }
}

#[test]
fn auto_fsdp_with_adamw_matches_one_device_on_the_reference_executor() {
    check_cases(
        Backend::Reference,
        Optimizer::AdamW { lr: 1e-3 },
        &[(Strategy::Fsdp, "dp=4")],
    );
}

fn auto_program(strategy: Strategy, mesh: &str, dropout: f32, layout: RngLayout) -> shardlab::partition::AutoProgram {
    let par = strategy.compose(&Mesh::parse(mesh).unwrap()).unwrap();
    auto_train_step(&config(dropout), Optimizer::Sgd { lr: 0.1 }, layout, &par)
        .unwrap()
        .1
}

/// Random bits of the global program: 3 dropout sites per layer.
fn global_bits(cfg: &GptConfig) -> u64 {
    let (b, t, d, h) = (cfg.batch, cfg.seq, cfg.d_model, cfg.heads);
    32 * cfg.layers as u64 * (b * h * t * t + 2 * b * t * d) as u64
}

#[test]
fn original_layout_generates_the_global_bits_on_every_device_and_partitionable_only_its_block() {
    let cfg = config(0.1);
    for n in [2usize, 4, 8] {
        let mesh = format!("dp={n}");
        let original = summarize(&auto_program(Strategy::Dp, &mesh, 0.1, RngLayout::Original).program);
        assert_eq!(
            original.rng_bits,
            global_bits(&cfg),
            "original layout on {mesh}: bits per device"
        );
        let auto = auto_program(Strategy::Dp, &mesh, 0.1, RngLayout::Original);
        assert_eq!(
            auto.count("random_bits"),
            3,
            "every dropout site is generated replicated and sliced"
        );
        assert!(auto.count("dynamic_slice") >= 3);
        let part = summarize(&auto_program(Strategy::Dp, &mesh, 0.1, RngLayout::Partitionable).program);
        assert_eq!(
            part.rng_bits * n as u64,
            global_bits(&cfg),
            "partitionable layout on {mesh}: bits per device"
        );
    }
}

/// Runs the train step once on one device and partitioned, with dropout: the masks must
/// be the global program's (jax.random.bits of the global shape) in both layouts.
#[test]
fn auto_dropout_matches_one_device_in_both_layouts() {
    for layout in [RngLayout::Original, RngLayout::Partitionable] {
        let mut base = options(Parallel::None, Optimizer::Sgd { lr: 0.1 });
        base.config = config(0.1);
        base.rng_layout = layout;
        let (want_losses, want_params) = run(&Backend::Reference, base.clone());
        let mut auto = base.clone();
        auto.parallel = Parallel::Auto {
            par: Strategy::Dp.compose(&Mesh::parse("dp=4").unwrap()).unwrap(),
            specs: vec![],
        };
        let (losses, params) = run(&Backend::Reference, auto);
        for (a, b) in losses.iter().zip(&want_losses) {
            assert!((a - b).abs() <= 1e-5, "{layout:?}: loss {a} vs one device {b}");
        }
        for (i, (p, q)) in params.iter().zip(&want_params).enumerate() {
            let worst = p.iter().zip(q).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-5, "{layout:?}: param {i} differs by {worst}");
        }
    }
}

#[test]
fn dp_all_reduces_gradients_and_fsdp_gathers_params_and_reduce_scatters_grads() {
    let n_params = 2 + 12 + 3;
    let dp = auto_program(Strategy::Dp, "dp=4", 0.0, RngLayout::Partitionable);
    assert_eq!(dp.count("all_gather"), 0, "{}", dp.report());
    assert_eq!(dp.count("psum_scatter"), 0, "{}", dp.report());
    // One all-reduce per parameter gradient and one for the loss.
    assert_eq!(dp.count("psum"), n_params + 1, "{}", dp.report());

    let fsdp = auto_program(Strategy::Fsdp, "dp=4", 0.0, RngLayout::Partitionable);
    assert!(fsdp.count("all_gather") >= n_params, "{}", fsdp.report());
    assert!(fsdp.count("psum_scatter") >= n_params - 1, "{}", fsdp.report());
    let s_dp = summarize(&dp.program);
    let s_fsdp = summarize(&fsdp.program);
    assert_eq!(
        s_fsdp.params_bytes * 4,
        s_dp.params_bytes,
        "fsdp holds 1/N of the params"
    );
}

#[test]
fn dot_general_over_a_sharded_contracting_dim_leaves_a_partial_sum() {
    let op = Op::DotGeneral {
        lhs_contract: vec![1],
        rhs_contract: vec![0],
        lhs_batch: vec![],
        rhs_batch: vec![],
        alpha: 1.0,
    };
    let rule = op_rule(&op, &[&[8, 16], &[16, 4]], &[&[8, 4]]).unwrap();
    let mesh = Mesh::parse("dp=2,tp=2").unwrap();
    let mut a = Assignment::empty(&rule);
    a.absorb(&rule, &mesh, &rule.operands[0], &[vec!["dp".into()], vec!["tp".into()]]);
    a.legalize(&rule);
    let out = a.result(&rule, 0);
    assert_eq!(out.dims, vec![vec!["dp".to_string()], vec![]]);
    assert_eq!(out.partial, vec!["tp".to_string()]);
    // The rhs is asked for its contracting dim split like the lhs's.
    assert_eq!(
        a.project(&rule, &rule.operands[1]),
        vec![vec!["tp".to_string()], vec![]]
    );
}

#[test]
fn reshape_moves_a_split_to_the_major_factor_and_layer_norm_keeps_its_axis_whole() {
    let mesh = Mesh::parse("tp=4").unwrap();
    // [8, 12] -> [8, 3, 4]: dim 1's factors are (3, 4); 'tp' (4) cannot split 3.
    let rule = op_rule(&Op::Reshape { shape: vec![8, 3, 4] }, &[&[8, 12]], &[&[8, 3, 4]]).unwrap();
    let mut a = Assignment::empty(&rule);
    a.absorb(&rule, &mesh, &rule.operands[0], &[vec![], vec!["tp".into()]]);
    a.legalize(&rule);
    assert_eq!(a.project(&rule, &rule.results[0]), vec![Vec::<String>::new(); 3]);
    // [8, 12] -> [2, 4, 12]: 'tp' on dim 0 (8) goes to the major factor 2? No: 2 % 4 != 0.
    // [16, 12] -> [4, 4, 12]: it goes to the major factor (4).
    let rule = op_rule(&Op::Reshape { shape: vec![4, 4, 12] }, &[&[16, 12]], &[&[4, 4, 12]]).unwrap();
    let mut a = Assignment::empty(&rule);
    a.absorb(&rule, &mesh, &rule.operands[0], &[vec!["tp".into()], vec![]]);
    a.legalize(&rule);
    assert_eq!(
        a.project(&rule, &rule.results[0]),
        vec![vec!["tp".to_string()], vec![], vec![]]
    );

    let rule = op_rule(&Op::LayerNorm, &[&[8, 16], &[16], &[16]], &[&[8, 16], &[8], &[8]]).unwrap();
    let mut a = Assignment::empty(&rule);
    a.absorb(&rule, &mesh, &rule.operands[0], &[vec![], vec!["tp".into()]]);
    a.legalize(&rule);
    assert_eq!(a.project(&rule, &rule.operands[1]), vec![Vec::<String>::new()]);
}

/// x (8, 16) @ w (16, 4), then a sum: a tiny program for propagation and lowering.
fn matmul_program() -> shardlab::ir::Program {
    let mut b = Builder::new();
    let x = b.input("x", &[8, 16], DType::F32, Role::Other);
    let w = b.input("w", &[16, 4], DType::F32, Role::Other);
    let y = b.matmul(x, w);
    b.set_name(y, "y");
    let s = b.sum(y, &[0, 1]);
    b.output(y);
    b.output(s);
    b.finish().unwrap()
}

fn inputs(prog: &shardlab::ir::Program) -> Vec<Vec<f32>> {
    prog.inputs
        .iter()
        .enumerate()
        .map(|(k, (v, _))| {
            let n = prog.info(*v).numel();
            (0..n).map(|i| ((i * 7 + k * 3) % 11) as f32 * 0.25 - 1.0).collect()
        })
        .collect()
}

fn run_jit(
    prog: &shardlab::ir::Program,
    mesh: &Mesh,
    in_specs: &[PartitionSpec],
    auto: &shardlab::partition::AutoProgram,
) -> Vec<Vec<f32>> {
    let globals = inputs(prog);
    let feed: Vec<Tensor> = globals
        .iter()
        .zip(in_specs)
        .zip(&prog.inputs)
        .map(|((g, spec), (v, _))| {
            let s = NamedSharding::new(mesh.clone(), spec.clone()).unwrap();
            Tensor::F32(s.shard(g, prog.shape(*v)).unwrap())
        })
        .collect();
    let outs = ReferenceExecutor::run(&auto.program, &feed, 1).unwrap();
    outs.iter()
        .zip(&auto.program.out_specs)
        .zip(&prog.outputs)
        .map(|((t, spec), v)| {
            let s = NamedSharding::new(mesh.clone(), spec.clone()).unwrap();
            s.unshard(t.f32(), prog.shape(*v)).unwrap()
        })
        .collect()
}

fn assert_matches_global(prog: &shardlab::ir::Program, got: &[Vec<f32>]) {
    let feed: Vec<Tensor> = inputs(prog).into_iter().map(Tensor::F32).collect();
    let want = ReferenceExecutor::run(prog, &feed, 1).unwrap();
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        for (a, b) in g.iter().zip(w.f32()) {
            assert!((a - b).abs() <= 1e-4, "output {k}: {a} vs {b}");
        }
    }
}

#[test]
fn contracting_over_a_sharded_dim_inserts_a_reduce_scatter_when_the_output_is_sharded() {
    let prog = matmul_program();
    let mesh = Mesh::parse("dp=2").unwrap();
    let specs = [
        PartitionSpec::from_axes(&[None, Some("dp")]),
        PartitionSpec::from_axes(&[Some("dp"), None]),
    ];
    let outs = [
        Some(PartitionSpec::from_axes(&[Some("dp"), None])),
        Some(PartitionSpec::replicated()),
    ];
    let auto = jit(&prog, &mesh, &specs, &outs).unwrap();
    assert_eq!(auto.count("psum_scatter"), 1, "{}", auto.report());
    assert_eq!(auto.count("psum"), 1, "{}", auto.report());
    assert_matches_global(&prog, &run_jit(&prog, &mesh, &specs, &auto));
}

#[test]
fn replicated_to_sharded_is_a_dynamic_slice_and_moving_an_axis_is_an_all_to_all() {
    let prog = matmul_program();
    let mesh = Mesh::parse("dp=4").unwrap();
    let specs = [PartitionSpec::replicated(), PartitionSpec::replicated()];
    let outs = [Some(PartitionSpec::from_axes(&[None, Some("dp")])), None];
    let auto = jit(&prog, &mesh, &specs, &outs).unwrap();
    assert_eq!(auto.count("dynamic_slice"), 1, "{}", auto.report());
    assert_matches_global(&prog, &run_jit(&prog, &mesh, &specs, &auto));

    // y is made split by rows (x's rows), the output wants it split by columns.
    let specs = [
        PartitionSpec::from_axes(&[Some("dp"), None]),
        PartitionSpec::replicated(),
    ];
    let auto = jit(&prog, &mesh, &specs, &outs).unwrap();
    assert_eq!(auto.count("all_to_all"), 1, "{}", auto.report());
    assert_matches_global(&prog, &run_jit(&prog, &mesh, &specs, &auto));
}

#[test]
fn with_sharding_constraint_pins_a_value_and_propagation_follows_it() {
    let prog = matmul_program();
    let mesh = Mesh::parse("dp=2").unwrap();
    let y = prog.outputs[0];
    let specs = [PartitionSpec::replicated(), PartitionSpec::replicated()];
    let mut pins = BTreeMap::new();
    pins.insert(y, PartitionSpec::from_axes(&[Some("dp"), None]));
    let prop = propagate(&prog, &mesh, &pins).unwrap();
    assert_eq!(prop.shardings[y.index()], vec![vec!["dp".to_string()], vec![]]);
    // Backward: x takes y's row split.
    assert_eq!(
        prop.shardings[prog.inputs[0].0.index()],
        vec![vec!["dp".to_string()], vec![]]
    );
    let auto = jit_with_constraints(&prog, &mesh, &specs, &[None, None], &pins).unwrap();
    assert_eq!(auto.program.out_specs[0], PartitionSpec::from_axes(&[Some("dp")]));
    assert_matches_global(&prog, &run_jit(&prog, &mesh, &specs, &auto));
}

#[test]
fn shardings_the_partitioner_cannot_honour_are_errors_naming_the_value() {
    let prog = matmul_program();
    let mesh = Mesh::parse("dp=3").unwrap();
    let bad = [
        PartitionSpec::from_axes(&[Some("dp"), None]),
        PartitionSpec::replicated(),
    ];
    let e = jit(&prog, &mesh, &bad, &[None, None]).unwrap_err().to_string();
    assert!(e.contains("`x`") && e.contains("not divisible"), "{e}");
    let bad = [
        PartitionSpec::from_axes(&[Some("tp"), None]),
        PartitionSpec::replicated(),
    ];
    let e = jit(&prog, &mesh, &bad, &[None, None]).unwrap_err().to_string();
    assert!(e.contains("`x`") && e.contains("unknown mesh axis 'tp'"), "{e}");
    let bad = [
        PartitionSpec::from_axes(&[Some("dp"), Some("dp")]),
        PartitionSpec::replicated(),
    ];
    let e = jit(&prog, &mesh, &bad, &[None, None]).unwrap_err().to_string();
    assert!(e.contains("`x`") && e.contains("used twice"), "{e}");
}

#[test]
fn partial_sum_sharding_prints_its_axes() {
    let s = Sharding {
        dims: vec![vec!["dp".into()], vec![]],
        partial: vec!["tp".into()],
    };
    assert_eq!(s.text(), "PartitionSpec('dp',) partial-sum over (tp)");
}
