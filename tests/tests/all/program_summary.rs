//! What `shardlab inspect` reports about per-device programs: dispatches that do not grow
//! with the device count, FSDP's 1/N memory, collectives per kind, the same-key dropout
//! caveat.
use std::sync::Arc;

use shardlab::exec::{Backend, Parallel, Trainer, TrainerOptions};
use shardlab::gpu::GpuContext;
use shardlab::ir::RngLayout;
use shardlab::model::{DataSource, GptConfig, Init, Optimizer};
use shardlab::plan::{shard_map_train_step, DropoutKey, Strategy};
use shardlab::profile::summarize;
use shardlab::sharding::Mesh;

fn cfg(dropout: f32) -> GptConfig {
    GptConfig {
        layers: 2,
        d_model: 32,
        heads: 4,
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

fn step(strategy: Strategy, mesh: &str, key: DropoutKey, dropout: f32) -> shardlab::model::TrainStep {
    let par = strategy.compose(&Mesh::parse(mesh).unwrap()).unwrap();
    shard_map_train_step(
        &cfg(dropout),
        Optimizer::AdamW { lr: 1e-3 },
        RngLayout::Partitionable,
        &par,
        key,
    )
    .unwrap()
}

#[test]
fn dp_dispatch_count_is_the_same_on_1_and_8_devices() {
    let Some(_) = shardlab_tests::gpu() else {
        return eprintln!("skipped: no GPU adapter");
    };
    let ctx = Arc::new(GpuContext::new_blocking().unwrap());
    // The autotuner may pick matmul variants with a packing pass for some shape classes and
    // not others; the device count must not change the count, so compare with one variant.
    shardlab::kernels::Tuning::with(&ctx, |t| {
        t.matmul_pin = Some(shardlab::kernels::matmul::Variant::Block8)
    })
    .unwrap();
    let count = |mesh: &str| {
        let opts = TrainerOptions {
            config: cfg(0.1),
            optimizer: Optimizer::AdamW { lr: 1e-3 },
            init: Init::Formula,
            data: DataSource::Formula,
            seed: 0,
            rng_layout: RngLayout::Partitionable,
            parallel: Parallel::ShardMap {
                par: Strategy::Dp.compose(&Mesh::parse(mesh).unwrap()).unwrap(),
                dropout_key: DropoutKey::FoldIn,
            },
            combine_all_reduces: false,
            microbatches: 1,
            cp_order: Default::default(),
            schedule: Default::default(),
            virtual_stages: 1,
            stage_layers: vec![],
        };
        pollster::block_on(Trainer::new(Backend::Gpu(ctx.clone()), opts))
            .unwrap()
            .dispatches_per_step()
    };
    let (one, eight) = (count("dp=1"), count("dp=8"));
    assert!(one > 50, "suspiciously few dispatches: {one}");
    assert_eq!(one, eight, "dispatches per step must not grow with the device count");
}

#[test]
fn fsdp_holds_one_nth_of_dp_params_and_optimizer_state_per_device() {
    for n in [2, 4, 8] {
        let mesh = format!("dp={n}");
        let dp = summarize(&step(Strategy::Dp, &mesh, DropoutKey::Same, 0.0).program);
        let fsdp = summarize(&step(Strategy::Fsdp, &mesh, DropoutKey::Same, 0.0).program);
        assert_eq!(fsdp.params_bytes * n as u64, dp.params_bytes, "params on {n} devices");
        assert_eq!(
            fsdp.optimizer_state_bytes * n as u64,
            dp.optimizer_state_bytes,
            "state on {n} devices"
        );
        assert!(
            fsdp.activations_bytes < dp.activations_bytes + dp.params_bytes,
            "gathered params are transient"
        );
    }
}

#[test]
fn collectives_are_counted_per_kind_for_each_strategy() {
    let totals = |s: Strategy, mesh: &str| summarize(&step(s, mesh, DropoutKey::Same, 0.0).program).collective_totals();
    let n_params = shardlab::model::param_specs(&cfg(0.0)).len();
    let dp = totals(Strategy::Dp, "dp=4");
    assert_eq!(
        dp["all-reduce"].count,
        n_params + 1,
        "one per gradient and one for the loss"
    );
    assert_eq!(dp["all-gather"].count, 0);
    let fsdp = totals(Strategy::Fsdp, "dp=4");
    assert_eq!(fsdp["all-gather"].count, n_params, "every parameter is gathered");
    assert_eq!(
        fsdp["reduce-scatter"].count, n_params,
        "every gradient is reduce-scattered"
    );
    assert_eq!(fsdp["all-gather"].bytes, fsdp["reduce-scatter"].bytes);
    let tp = totals(Strategy::Tp, "tp=2");
    // Per layer: a psum after each row-parallel projection (2) and one in the backward of
    // each pcast before the column-parallel ones (2).
    assert_eq!(tp["all-reduce"].count, 4 * cfg(0.0).layers);
}

#[test]
fn same_key_dropout_is_flagged_and_fold_in_clears_it() {
    let same = summarize(&step(Strategy::Dp, "dp=4", DropoutKey::Same, 0.1).program);
    assert!(
        same.warnings.iter().any(|w| w.contains("repeat across 'dp'")),
        "{:?}",
        same.warnings
    );
    let folded = summarize(&step(Strategy::Dp, "dp=4", DropoutKey::FoldIn, 0.1).program);
    assert!(folded.warnings.is_empty(), "{:?}", folded.warnings);
    assert_eq!(same.rng_bits, folded.rng_bits, "both draw local-shape masks");
}

#[test]
fn per_device_program_text_shows_shardings() {
    // The fsdp preset puts its devices on the axis named for what it splits.
    let text = step(Strategy::Fsdp, "dp=4", DropoutKey::Same, 0.0).program.to_text();
    assert!(text.contains("Mesh('fsdp': 4)"), "{}", &text[..200]);
    assert!(
        text.contains("sharding=PartitionSpec('fsdp',"),
        "inputs show their specs"
    );
    assert!(text.contains("all_gather(") && text.contains("psum_scatter("));
    assert!(text.contains("{varies along fsdp}") && text.contains("{replicated}"));
}
