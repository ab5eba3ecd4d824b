//! Explicit mode against the one-device run: every strategy on a small mesh trains to the
//! one-device losses and parameters (to 1e-5), with dropout off and on in both RNG layouts
//! (its dropout bits typed like the values they mask, each device drawing its block of the
//! one-device run's masks), on mixed Explicit and Auto axes, and with microbatches; where the
//! dropout bits live in each layout; and a program JAX would refuse is refused at the op with
//! its fix, which, applied as the spec it names, plans. (The three- and four-axis meshes run in
//! explicit mode in `compositions`.)
use shardlab::exec::{Backend, Parallel, TrainerOptions};
use shardlab::ir::RngLayout;
use shardlab::model::{GptConfig, Optimizer};
use shardlab::partition::explicit::FixKind;
use shardlab::plan::{build, PlanError, Strategy};
use shardlab::setting::Setting;
use shardlab::sharding::{AxisType, Mesh, PartitionSpec};

/// Two blocks, 4 heads, a sequence of 8 and a batch of 4: every mesh below splits it.
fn config(dropout: f32) -> GptConfig {
    GptConfig {
        layers: 2,
        d_model: 16,
        heads: 4,
        seq: 8,
        batch: 4,
        vocab: 32,
        tied: false,
        dropout,
        attention: Default::default(),
        remat: Default::default(),
        precision: Default::default(),
        moe: None,
    }
}

const STRATEGIES: [(Strategy, &str); 9] = [
    (Strategy::Dp, "dp=2"),
    (Strategy::Zero1, "dp=2"),
    (Strategy::Zero2, "dp=2"),
    (Strategy::Fsdp, "fsdp=2"),
    (Strategy::Tp, "tp=2"),
    (Strategy::DpTp, "dp=2,tp=2"),
    (Strategy::Cp, "cp=2"),
    (Strategy::DpCp, "dp=2,cp=2"),
    (Strategy::TpSp, "tp=2"),
];

fn explicit(strategy: Strategy, mesh: &str, axis_types: &[(&str, AxisType)]) -> Parallel {
    Parallel::Explicit {
        par: strategy.compose(&Mesh::parse(mesh).unwrap()).unwrap(),
        axis_types: axis_types.iter().map(|(a, t)| (a.to_string(), *t)).collect(),
        specs: vec![],
    }
}

fn options(parallel: Parallel, dropout: f32, layout: RngLayout, microbatches: usize) -> TrainerOptions {
    let mut opts = shardlab_tests::formula_options(config(dropout), Optimizer::Sgd { lr: 0.1 }, parallel);
    opts.rng_layout = layout;
    opts.microbatches = microbatches;
    opts
}

/// Each run of `runs` against the one-device run of the same options: 3 steps' losses and the
/// parameters after them.
fn matches_one_device(runs: &[(String, Parallel)], dropout: f32, layout: RngLayout, microbatches: usize) {
    let backend = Backend::Reference;
    let (want_losses, want_params) =
        shardlab_tests::train_steps(&backend, options(Parallel::None, dropout, layout, microbatches), 3);
    for (what, parallel) in runs {
        let what = format!("{what} dropout {dropout} {} microbatches {microbatches}", layout.name());
        let opts = options(parallel.clone(), dropout, layout, microbatches);
        let (losses, params) = shardlab_tests::train_steps(&backend, opts, 3);
        for (s, (a, b)) in losses.iter().zip(&want_losses).enumerate() {
            assert!((a - b).abs() <= 1e-5, "{what}: loss {s}: {a} vs one device {b}");
        }
        for (i, (p, q)) in params.iter().zip(&want_params).enumerate() {
            let worst = p.iter().zip(q).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-5, "{what}: param {i} differs by {worst} from one device");
        }
    }
}

fn every_strategy() -> Vec<(String, Parallel)> {
    STRATEGIES
        .iter()
        .map(|(s, m)| (format!("explicit {} on {m}", s.name()), explicit(*s, m, &[])))
        .collect()
}

#[test]
fn every_strategy_in_explicit_mode_trains_to_the_one_device_losses() {
    matches_one_device(&every_strategy(), 0.0, RngLayout::Partitionable, 1);
}

#[test]
fn every_strategy_in_explicit_mode_draws_the_one_device_runs_masks_in_both_layouts() {
    for layout in RngLayout::ALL {
        matches_one_device(&every_strategy(), 0.1, layout, 1);
    }
}

#[test]
fn auto_axes_and_microbatches_in_explicit_mode_train_to_the_one_device_losses() {
    let auto = |axes: &[(&str, AxisType)]| explicit(Strategy::DpTp, "dp=2,tp=2", axes);
    let mixed = vec![
        ("explicit dp_tp, tp auto".to_string(), auto(&[("tp", AxisType::Auto)])),
        ("explicit dp_tp, dp auto".to_string(), auto(&[("dp", AxisType::Auto)])),
        ("explicit fsdp_tp".to_string(), {
            let mesh = Mesh::parse("fsdp=2,tp=2").unwrap();
            let par = shardlab::plan::Parallelism::new(mesh, Default::default(), false).unwrap();
            Parallel::Explicit {
                par,
                axis_types: vec![],
                specs: vec![],
            }
        }),
    ];
    matches_one_device(&mixed, 0.1, RngLayout::Partitionable, 1);
    let accumulating: Vec<(String, Parallel)> = [(Strategy::Dp, "dp=2"), (Strategy::Zero2, "dp=2")]
        .iter()
        .map(|(s, m)| (format!("explicit {} on {m}", s.name()), explicit(*s, m, &[])))
        .collect();
    matches_one_device(&accumulating, 0.1, RngLayout::Partitionable, 2);
}

#[test]
fn dropout_bits_are_typed_like_what_they_mask_and_each_device_draws_its_block_when_it_can() {
    for layout in RngLayout::ALL {
        let opts = options(explicit(Strategy::Dp, "dp=2", &[]), 0.1, layout, 1);
        let planned = build(&opts).unwrap();
        let view = planned.explicit.expect("explicit mode shows its typed program");
        assert_eq!(view.random_bits.len(), 6, "three dropout sites in each of two blocks");
        for b in &view.random_bits {
            assert!(b.ty.starts_with("u32[4@dp,"), "{}: {}", b.value, b.ty);
            assert_eq!(b.out_sharding.as_deref(), Some("P('dp')"), "{}", b.value);
            let per_device = match layout {
                RngLayout::Partitionable => b.global_elements / 2,
                RngLayout::Original => b.global_elements,
            };
            assert_eq!(
                b.generated_per_device,
                per_device,
                "{} in the {} layout",
                b.value,
                layout.name()
            );
        }
        // The program each device runs makes the same bits the view says.
        let made: u64 = view.random_bits.iter().map(|b| b.generated_per_device).sum();
        assert_eq!(shardlab::profile::summarize(&planned.step.program).rng_bits, 32 * made);
    }
}

#[test]
fn a_program_jax_would_refuse_is_refused_at_the_op_and_its_fix_plans() {
    // The last stream split over 'tp' and the head's weight split on its rows: the logits'
    // contraction is sharded on both sides, which JAX calls ambiguous.
    let spec = |n: &str, s: &str| (n.to_string(), PartitionSpec::parse(s).unwrap());
    let mut specs = vec![spec("h1.x_mlp", "P(None, None, 'tp')"), spec("w_head", "P('tp')")];
    let parallel = |specs: Vec<(String, PartitionSpec)>| Parallel::Explicit {
        par: Strategy::Tp.compose(&Mesh::parse("tp=2").unwrap()).unwrap(),
        axis_types: vec![],
        specs,
    };
    let e = build(&options(parallel(specs.clone()), 0.0, RngLayout::Partitionable, 1)).unwrap_err();
    let PlanError::Explicit(refused) = &e else {
        panic!("not JAX's refusal: {e}")
    };
    assert_eq!(refused.op, "dot_general");
    assert_eq!(refused.fix.kind, FixKind::OutSharding);
    assert_eq!(refused.fix.value, "logits");
    assert_eq!(e.setting(), Setting::Spec("logits".into()));
    let text = e.to_string();
    assert!(text.contains("Contracting dimensions are sharded"), "{text}");
    assert!(
        text.contains("--spec logits=P()"),
        "the fix as the flag that writes it: {text}"
    );
    // One press: the fix applied as the spec it names.
    specs.push(spec("logits", refused.fix.spec.as_deref().unwrap()));
    let planned = build(&options(parallel(specs), 0.0, RngLayout::Partitionable, 1)).unwrap();
    let view = planned.explicit.unwrap();
    assert!(view.choices.iter().any(|c| c.value == "logits" && c.spec == "P()"));
}
