//! shard_map strategies against the one-device run: with dropout 0, formula init and data,
//! the losses of 3 steps and the updated parameters agree to 1e-5, for 1, 2, 4 and 8
//! devices (2x2 and 2x4 for dp_tp), on the CPU reference and on the GPU executor.
use std::sync::Arc;

use shardlab::exec::{Backend, Parallel, TrainerOptions};
use shardlab::gpu::GpuContext;
use shardlab::model::{GptConfig, Optimizer};
use shardlab::plan::{DropoutKey, Strategy};
use shardlab::sharding::Mesh;

fn options(parallel: Parallel, opt: Optimizer) -> TrainerOptions {
    let config = GptConfig {
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
    };
    shardlab_tests::formula_options(config, opt, parallel)
}

fn run(backend: &Backend, opts: TrainerOptions) -> (Vec<f32>, Vec<Vec<f32>>) {
    shardlab_tests::train_steps(backend, opts, 3)
}

fn check_all(backend: Backend, opt: Optimizer) {
    let (want_losses, want_params) = run(&backend, options(Parallel::None, opt));
    let cases: &[(Strategy, &str)] = &[
        (Strategy::Dp, "dp=1"),
        (Strategy::Dp, "dp=2"),
        (Strategy::Dp, "dp=4"),
        (Strategy::Dp, "dp=8"),
        (Strategy::Fsdp, "dp=2"),
        (Strategy::Fsdp, "dp=4"),
        (Strategy::Fsdp, "dp=8"),
        (Strategy::Tp, "tp=2"),
        (Strategy::Tp, "tp=4"),
        (Strategy::Tp, "tp=8"),
        (Strategy::DpTp, "dp=2,tp=2"),
        (Strategy::DpTp, "dp=2,tp=4"),
    ];
    for &(strategy, mesh) in cases {
        let parallel = Parallel::ShardMap {
            par: strategy.compose(&Mesh::parse(mesh).unwrap()).unwrap(),
            dropout_key: DropoutKey::Same,
        };
        let (losses, params) = run(&backend, options(parallel, opt));
        let what = format!("{} on {mesh}", strategy.name());
        for (k, (a, b)) in losses.iter().zip(&want_losses).enumerate() {
            assert!((a - b).abs() <= 1e-5, "{what}: loss {k}: {a} vs one device {b}");
        }
        for (i, (p, q)) in params.iter().zip(&want_params).enumerate() {
            let worst = p.iter().zip(q).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-5, "{what}: param {i} differs by {worst} from one device");
        }
    }
}

#[test]
fn every_strategy_matches_one_device_on_the_reference_executor() {
    check_all(Backend::Reference, Optimizer::Sgd { lr: 0.1 });
}

#[test]
fn every_strategy_matches_one_device_with_adamw_on_the_reference_executor() {
    check_all(Backend::Reference, Optimizer::AdamW { lr: 1e-3 });
}

#[test]
fn every_strategy_matches_one_device_on_the_gpu() {
    if shardlab_tests::gpu().is_none() {
        eprintln!("skipped: no GPU adapter");
        return;
    }
    check_all(
        Backend::Gpu(Arc::new(GpuContext::new_blocking().unwrap())),
        Optimizer::Sgd { lr: 0.1 },
    );
}

#[test]
fn out_spec_claiming_replication_of_a_varying_value_is_rejected_before_running() {
    use shardlab::ir::{DType, Role};
    use shardlab::partition::{shard_map, Arg, PartitionError};
    use shardlab::sharding::PartitionSpec;
    let mesh = Mesh::parse("dp=4").unwrap();
    let args = [Arg {
        name: "x".into(),
        global_shape: vec![8, 3],
        dtype: DType::F32,
        role: Role::Other,
        spec: PartitionSpec::from_axes(&[Some("dp"), None]),
    }];
    let err = shard_map(&mesh, &args, &[PartitionSpec::replicated()], |b, v| {
        let y = b.scale(v[0], 2.0);
        b.set_name(y, "doubled");
        Ok(vec![y])
    })
    .unwrap_err();
    assert!(matches!(err, PartitionError::Vma { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("doubled") && msg.contains("'dp'"), "{msg}");
    // Reducing over "dp" makes the same out_spec valid.
    shard_map(&mesh, &args, &[PartitionSpec::replicated()], |b, v| {
        Ok(vec![b.psum(v[0], &["dp"])])
    })
    .unwrap();
}
