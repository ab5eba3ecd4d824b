//! Long sequences: context parallelism (ring attention in shard_map mode, K and V gathered by
//! the partitioner in automatic mode; contiguous blocks or zig-zag's in both) and Megatron sequence parallelism, against the one-device
//! run: the losses of 3 steps and the parameters after them agree to 1e-5, without dropout and
//! with it (every mask the device's block of the one-device run's, bit for bit), in both RNG
//! layouts, on the CPU reference and on the GPU; and with gradient accumulation, where each
//! microbatch's masks are the device's blocks of the one-device run's for that microbatch.
use std::sync::Arc;

use shardlab::exec::{Backend, Parallel, TrainerOptions};
use shardlab::gpu::GpuContext;
use shardlab::ir::{CpOrder, RngLayout};
use shardlab::model::{DataSource, GptConfig, Init, Optimizer};
use shardlab::plan::{AxisKind, DropoutKey, Mode, Strategy};
use shardlab::sharding::Mesh;

fn config(dropout: f32) -> GptConfig {
    GptConfig {
        layers: 1,
        d_model: 32,
        heads: 4,
        seq: 16,
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

/// The run of `parallel` (`order` for cp), with dropout in `layout` or without.
fn options(parallel: Parallel, dropout: f32, layout: RngLayout, order: CpOrder) -> TrainerOptions {
    TrainerOptions {
        init: Init::Random { seed: 5 },
        data: DataSource::Copy,
        seed: 7,
        rng_layout: layout,
        cp_order: order,
        schedule: Default::default(),
        ..shardlab_tests::formula_options(config(dropout), Optimizer::Sgd { lr: 0.1 }, parallel)
    }
}

fn parallel(mode: Mode, strategy: Strategy, mesh: &str) -> Parallel {
    let mesh = Mesh::parse(mesh).unwrap();
    match mode {
        Mode::Auto => Parallel::Auto {
            par: strategy.compose(&mesh).unwrap(),
            specs: vec![],
        },
        Mode::Explicit => Parallel::Explicit {
            par: strategy.compose(&mesh).unwrap(),
            axis_types: vec![],
            specs: vec![],
        },
        _ => Parallel::ShardMap {
            par: strategy.compose(&mesh).unwrap(),
            dropout_key: DropoutKey::Same,
        },
    }
}

/// (mode, strategy, mesh, order) of every run the matrix holds to one device.
pub fn matrix() -> Vec<(Mode, Strategy, &'static str, CpOrder)> {
    let mut cases = vec![];
    for mode in [Mode::ShardMap, Mode::Auto] {
        for (strategy, mesh) in [
            (Strategy::Cp, "cp=2"),
            (Strategy::Cp, "cp=4"),
            (Strategy::DpCp, "dp=2,cp=2"),
            (Strategy::TpSp, "tp=2"),
            (Strategy::TpSp, "tp=4"),
        ] {
            cases.push((mode, strategy, mesh, CpOrder::Contiguous));
            // Zig-zag: the ring's order in shard_map, the tokens reordered inside jit's program.
            if strategy.axes().contains(&AxisKind::Cp) {
                cases.push((mode, strategy, mesh, CpOrder::Zigzag));
            }
        }
    }
    // Explicit mode reorders as jit does, its chunks typed as JAX types them.
    cases.push((Mode::Explicit, Strategy::DpCp, "dp=2,cp=2", CpOrder::Zigzag));
    cases
}

/// Each case against the one-device run with the same settings, `microbatches` included.
fn check(
    backend: &Backend,
    cases: &[(Mode, Strategy, &str, CpOrder)],
    dropouts: &[(f32, RngLayout)],
    microbatches: usize,
) {
    let options = |parallel, dropout, layout, order| TrainerOptions {
        microbatches,
        ..options(parallel, dropout, layout, order)
    };
    for &(dropout, layout) in dropouts {
        let want = shardlab_tests::train_steps(
            backend,
            options(Parallel::None, dropout, layout, CpOrder::Contiguous),
            3,
        );
        for &(mode, strategy, mesh, order) in cases {
            let opts = options(parallel(mode, strategy, mesh), dropout, layout, order);
            let got = shardlab_tests::train_steps(backend, opts, 3);
            let what = format!(
                "{} {} on {mesh} ({}), dropout {dropout} {layout:?}, {microbatches} microbatch(es)",
                mode.name(),
                strategy.name(),
                order.name()
            );
            for (k, (a, b)) in got.0.iter().zip(&want.0).enumerate() {
                assert!((a - b).abs() <= 1e-5, "{what}: loss {k}: {a} vs one device {b}");
            }
            for (i, (p, q)) in got.1.iter().zip(&want.1).enumerate() {
                let worst = p.iter().zip(q).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                assert!(worst <= 1e-5, "{what}: param {i} differs by {worst} from one device");
            }
        }
    }
}

#[test]
fn every_long_sequence_strategy_matches_one_device_on_the_reference_executor() {
    check(&Backend::Reference, &matrix(), &[(0.0, RngLayout::Partitionable)], 1);
}

#[test]
fn every_long_sequence_strategy_matches_one_device_with_dropout_in_both_layouts_on_the_reference_executor() {
    check(
        &Backend::Reference,
        &matrix(),
        &[(0.1, RngLayout::Original), (0.1, RngLayout::Partitionable)],
        1,
    );
}

/// Microbatch j draws its masks from fold_in(key, j) over the microbatch's (B / k, H, T, T):
/// ring attention's blocks included, whose global shape is the microbatch's, not the batch's.
#[test]
fn every_long_sequence_strategy_with_microbatches_matches_one_device_with_dropout_on_the_reference_executor() {
    check(
        &Backend::Reference,
        &matrix(),
        &[(0.1, RngLayout::Original), (0.1, RngLayout::Partitionable)],
        2,
    );
}

#[test]
fn every_long_sequence_strategy_matches_one_device_with_dropout_on_the_gpu() {
    if shardlab_tests::gpu().is_none() {
        eprintln!("skipped: no GPU adapter");
        return;
    }
    let gpu = Backend::Gpu(Arc::new(GpuContext::new_blocking().unwrap()));
    check(
        &gpu,
        &matrix(),
        &[(0.0, RngLayout::Partitionable), (0.1, RngLayout::Partitionable)],
        1,
    );
    // Gradient accumulation with the ring's drawn masks, in the layout whose bits depend on
    // the global shape.
    let rings = [
        (Mode::ShardMap, Strategy::Cp, "cp=4", CpOrder::Contiguous),
        (Mode::ShardMap, Strategy::DpCp, "dp=2,cp=2", CpOrder::Zigzag),
        (Mode::Auto, Strategy::DpCp, "dp=2,cp=2", CpOrder::Contiguous),
        (Mode::Auto, Strategy::Cp, "cp=4", CpOrder::Zigzag),
    ];
    check(&gpu, &rings, &[(0.1, RngLayout::Original)], 2);
}
