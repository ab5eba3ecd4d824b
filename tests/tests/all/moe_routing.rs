//! The routing a trainer reads back after a step (`Trainer::routing`, the page's chart): the
//! routers' own counts, kept alive to the step's end. Split over dp=2,ep=2 in shard_map,
//! explicit and automatic mode, every expert's choices and kept choices add up to the one-device run's; the
//! choices are every token's k; a capacity factor of 0.5 keeps at most the slots there are; a
//! rematerialised backward's second routing is not counted again.
use shardlab::exec::{Backend, Parallel, Routing, Trainer};
use shardlab::model::{Capacity, GptConfig, Moe, Optimizer, Remat};
use shardlab::plan::{DropoutKey, Parallelism, Zero};
use shardlab::sharding::Mesh;

/// Two blocks of 4 experts, top-2, on 8 sequences of 8: at capacity factor 0.5 each expert has
/// 2 slots a sequence.
fn config(remat: Remat) -> GptConfig {
    GptConfig {
        layers: 2,
        d_model: 16,
        heads: 2,
        seq: 8,
        batch: 8,
        vocab: 32,
        tied: false,
        dropout: 0.0,
        attention: Default::default(),
        remat,
        precision: Default::default(),
        moe: Some(Moe {
            width: 24,
            capacity: Capacity::Factor(0.5),
            ..Moe::new(4, 16)
        }),
    }
}

/// Per router and expert, the choices routed and kept over every device.
fn totals(r: &Routing) -> Vec<(Vec<u32>, Vec<u32>)> {
    let add = |router: &Vec<Vec<u32>>| (0..r.experts).map(|e| router.iter().map(|d| d[e]).sum()).collect();
    r.routed.iter().zip(&r.kept).map(|(a, b)| (add(a), add(b))).collect()
}

fn routing_after_a_step(gpu: &Backend, parallel: Parallel, remat: Remat) -> Routing {
    let opts = shardlab_tests::formula_options(config(remat), Optimizer::Sgd { lr: 0.1 }, parallel);
    pollster::block_on(async {
        let mut t = Trainer::new(gpu.clone(), opts).await.unwrap();
        t.step().await.unwrap();
        t.routing().await.unwrap().expect("a mixture's routing")
    })
}

#[test]
fn the_routing_read_back_after_a_step_adds_up_to_the_one_device_runs_in_every_mode() {
    if shardlab_tests::gpu().is_none() {
        return;
    }
    // One context for every run, so that they share its compiled pipelines.
    let gpu = Backend::Gpu(std::sync::Arc::new(shardlab::gpu::GpuContext::new_blocking().unwrap()));
    let one = routing_after_a_step(&gpu, Parallel::None, Remat::None);
    let want = totals(&one);
    assert_eq!(want.len(), 2, "a router per block");
    for (routed, kept) in &want {
        assert_eq!(routed.iter().sum::<u32>(), 8 * 8 * 2, "every token's 2 choices");
        assert!(kept.iter().all(|&k| k <= 8 * 2), "at most 2 slots a sequence: {kept:?}");
        assert!(routed.iter().zip(kept).all(|(r, k)| k <= r));
    }
    assert_eq!(totals(&routing_after_a_step(&gpu, Parallel::None, Remat::Full)), want);
    let par = Parallelism::new(Mesh::parse("dp=2,ep=2").unwrap(), Zero::Off, false).unwrap();
    let shard_map = Parallel::ShardMap {
        par: par.clone(),
        dropout_key: DropoutKey::Same,
    };
    let explicit = Parallel::Explicit {
        par: par.clone(),
        axis_types: vec![],
        specs: vec![],
    };
    for parallel in [shard_map, explicit, Parallel::Auto { par, specs: vec![] }] {
        let r = routing_after_a_step(&gpu, parallel.clone(), Remat::None);
        assert_eq!(r.routed[0].len(), 4, "a row per device");
        assert_eq!(totals(&r), want, "{}", parallel.label());
    }
}
