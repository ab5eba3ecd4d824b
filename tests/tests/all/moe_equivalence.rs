//! A mixture of experts over an "ep" axis against the one-device run on simulated devices (ep=4,
//! dp=2,ep=2, and dp=2,ep=2,tp=2 on 8, the experts' units split over tp too):
//! experts split over ep, tokens over dp x ep, the tokens' slots moved by all_to_all. The
//! losses of 3 steps and the updated parameters agree to 1e-5 in shard_map mode (its body
//! checked by check_vma), automatic mode and explicit mode, with dropout off and on (each
//! device drawing its block of the one-device run's masks), with routing that drops choices
//! (capacity factor 0.5) and dropless routing.
use shardlab::exec::{Backend, Parallel, TrainerOptions};
use shardlab::model::{Capacity, GptConfig, Moe, Optimizer};
use shardlab::plan::{DropoutKey, Parallelism, Zero};
use shardlab::sharding::Mesh;

/// One block of 4 experts, top-2, on sequences of 8: a capacity factor of 0.5 gives each expert
/// 2 slots, 8 in all for a sequence's 16 choices, so routing drops at least half of them.
fn config(dropout: f32, capacity: Capacity) -> GptConfig {
    GptConfig {
        layers: 1,
        d_model: 16,
        heads: 2,
        seq: 8,
        batch: 8,
        vocab: 32,
        tied: false,
        dropout,
        attention: Default::default(),
        remat: Default::default(),
        precision: Default::default(),
        moe: Some(Moe {
            top_k: 2,
            width: 24,
            capacity,
            aux: 0.01,
            ..Moe::new(4, 16)
        }),
    }
}

fn options(parallel: Parallel, dropout: f32, capacity: Capacity) -> TrainerOptions {
    shardlab_tests::formula_options(config(dropout, capacity), Optimizer::Sgd { lr: 0.1 }, parallel)
}

fn runs(mesh: &str) -> Vec<(String, Parallel)> {
    let par = Parallelism::new(Mesh::parse(mesh).unwrap(), Zero::Off, false).unwrap();
    vec![
        (
            format!("shard_map {mesh}"),
            Parallel::ShardMap {
                par: par.clone(),
                dropout_key: DropoutKey::Global,
            },
        ),
        (
            format!("explicit {mesh}"),
            Parallel::Explicit {
                par: par.clone(),
                axis_types: vec![],
                specs: vec![],
            },
        ),
        (format!("auto {mesh}"), Parallel::Auto { par, specs: vec![] }),
    ]
}

fn check(dropout: f32, capacity: Capacity) {
    let backend = Backend::Reference;
    let (want_losses, want_params) =
        shardlab_tests::train_steps(&backend, options(Parallel::None, dropout, capacity), 3);
    for mesh in ["ep=4", "dp=2,ep=2", "dp=2,ep=2,tp=2"] {
        for (name, parallel) in runs(mesh) {
            let what = format!("{name} dropout {dropout} capacity {}", capacity.text());
            let (losses, params) = shardlab_tests::train_steps(&backend, options(parallel, dropout, capacity), 3);
            assert_eq!(losses.len(), want_losses.len(), "{what}");
            for (s, (a, b)) in losses.iter().zip(&want_losses).enumerate() {
                assert!((a - b).abs() <= 1e-5, "{what}: loss {s}: {a} vs one device {b}");
            }
            assert_eq!(params.len(), want_params.len(), "{what}");
            for (i, (p, q)) in params.iter().zip(&want_params).enumerate() {
                let worst = p.iter().zip(q).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                assert!(worst <= 1e-5, "{what}: param {i} differs by {worst} from one device");
            }
        }
    }
}

#[test]
fn expert_parallel_meshes_match_one_device_in_every_mode_when_routing_drops() {
    check(0.0, Capacity::Factor(0.5));
}

#[test]
fn expert_parallel_meshes_match_one_device_in_every_mode_dropless_with_dropout() {
    check(0.1, Capacity::Dropless);
}

#[test]
fn expert_parallel_meshes_draw_the_one_device_masks_when_routing_drops() {
    check(0.1, Capacity::Factor(0.5));
}

/// The GPU executor trains the mixture over ep=4 in shard_map mode to the CPU reference's
/// one-device losses and parameters.
#[test]
fn gpu_trains_an_expert_parallel_mixture_to_the_one_device_reference() {
    if shardlab_tests::gpu().is_none() {
        return;
    }
    let capacity = Capacity::Factor(0.5);
    let (want_losses, want_params) =
        shardlab_tests::train_steps(&Backend::Reference, options(Parallel::None, 0.1, capacity), 3);
    let (_, shard_map) = runs("ep=4").remove(0);
    let gpu = Backend::Gpu(std::sync::Arc::new(shardlab::gpu::GpuContext::new_blocking().unwrap()));
    let (losses, params) = shardlab_tests::train_steps(&gpu, options(shard_map, 0.1, capacity), 3);
    for (s, (a, b)) in losses.iter().zip(&want_losses).enumerate() {
        assert!((a - b).abs() <= 1e-4, "GPU loss {s}: {a} vs one device {b}");
    }
    for (i, (p, q)) in params.iter().zip(&want_params).enumerate() {
        shardlab_tests::assert_close(&format!("GPU param {i}"), p, q, 1e-4, 1e-3);
    }
}

/// Automatic mode moves the slots by all-to-all four times a block (dispatch and combine, and
/// their transposes in the backward), each naming the composition's constraint that asked for
/// it, and gathers no expert weight.
#[test]
fn automatic_mode_says_which_rule_inserted_each_all_to_all() {
    let (_, auto) = runs("dp=2,ep=2").pop().unwrap();
    let planned = shardlab::plan::build(&options(auto, 0.0, Capacity::Dropless)).unwrap();
    let inserted = planned.inserted.as_ref().unwrap();
    let all_to_all: Vec<_> = inserted.iter().filter(|r| r.op == "all_to_all").collect();
    let values: Vec<&str> = all_to_all.iter().map(|r| r.value.as_str()).collect();
    assert_eq!(
        values,
        [
            "h0.moe.dispatched",
            "h0.moe.expert_out",
            "dh0.moe.expert_out",
            "dh0.moe.dispatched"
        ]
    );
    for r in &all_to_all {
        let rule = format!("the composition's with_sharding_constraint on {}", r.value);
        assert!(r.rule.contains(&rule), "{}: {}", r.value, r.rule);
    }
    let gathered: Vec<&str> = inserted
        .iter()
        .filter(|r| r.op == "all_gather" && r.value.contains("w_"))
        .map(|r| r.value.as_str())
        .collect();
    assert!(gathered.is_empty(), "jit gathered weights: {gathered:?}");
}
