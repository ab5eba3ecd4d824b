//! The cost model on the long-sequence strategies: causal attention's work per device under
//! context parallelism (contiguous blocks leave the last device cp^2-ish more pairs than the
//! first; zig-zag gives every device the same), the modelled timeline where the other devices
//! wait for the busiest at every ring step, and ring attention's permutes hidden behind the
//! blocks' attention when collectives overlap compute.
use shardlab::ir::CpOrder;
use shardlab::model::GptConfig;
use shardlab::plan::{build, DropoutKey, Parallel, Strategy, TrainerOptions};
use shardlab::profile::{attention_balance, h100, model_step, Placement};
use shardlab::sharding::Mesh;

fn program(order: CpOrder, cp: usize) -> shardlab::ir::Program {
    let cfg = GptConfig {
        layers: 2,
        d_model: 128,
        heads: 4,
        seq: 1024,
        batch: 1,
        vocab: 64,
        tied: false,
        dropout: 0.0,
        attention: Default::default(),
        remat: Default::default(),
        precision: Default::default(),
        moe: None,
    };
    let opts = TrainerOptions {
        cp_order: order,
        schedule: Default::default(),
        ..TrainerOptions::new(
            cfg,
            Parallel::ShardMap {
                par: Strategy::Cp
                    .compose(&Mesh::parse(&format!("cp={cp}")).unwrap())
                    .unwrap(),
                dropout_key: DropoutKey::Same,
            },
        )
    };
    build(&opts).unwrap().step.program
}

#[test]
fn contiguous_blocks_give_the_last_device_the_most_attention_and_zigzag_the_same_to_all() {
    let cp = 4;
    let l = 1024 / cp;
    let b = attention_balance(&program(CpOrder::Contiguous, cp)).unwrap();
    // Device r's queries see r whole blocks and half of its own: r L^2 + L(L+1)/2 pairs.
    let pairs = |r: usize| (r * l * l + l * (l + 1) / 2) as f64;
    for r in 0..cp {
        let ratio = b.flops[r] as f64 / b.flops[0] as f64;
        assert!((ratio - pairs(r) / pairs(0)).abs() < 1e-9, "device {r}: {ratio}");
    }
    // At ring step s only the devices at s or later see the block it brings.
    for (s, step) in b.per_step.iter().enumerate() {
        for (r, f) in step.iter().enumerate() {
            assert_eq!(*f == 0, r < s, "step {s} device {r}");
        }
    }
    assert!(b.imbalance() > 1.7, "{}", b.imbalance());
    let z = attention_balance(&program(CpOrder::Zigzag, cp)).unwrap();
    assert!(z.flops.iter().all(|f| *f == z.flops[0]), "{:?}", z.flops);
    assert!((z.imbalance() - 1.0).abs() < 1e-12);
    // The same pairs in all: zig-zag only moves them.
    assert_eq!(z.flops.iter().sum::<u64>(), b.flops.iter().sum::<u64>());
    // One device's whole attention has no blocks to balance.
    assert!(attention_balance(
        &build(&TrainerOptions::new(GptConfig::tiny(), Parallel::None))
            .unwrap()
            .step
            .program
    )
    .is_none());
}

#[test]
fn the_modelled_timeline_waits_for_the_busiest_device_and_zigzag_waits_less() {
    let device = h100();
    let (contiguous, ct) = model_step(&program(CpOrder::Contiguous, 4), &device, Placement::Real, true);
    let (zigzag, _) = model_step(&program(CpOrder::Zigzag, 4), &device, Placement::Real, true);
    assert!(
        zigzag.step_ms < contiguous.step_ms,
        "{} vs {}",
        zigzag.step_ms,
        contiguous.step_ms
    );
    assert!(contiguous.breakdown_ms["idle"] > zigzag.breakdown_ms["idle"]);
    // The first device, with the least attention, waits most for the others.
    let idle = |d: usize| ct.device_breakdown_ms(d)["idle"];
    assert!(idle(0) > idle(3), "{} vs {}", idle(0), idle(3));
}

#[test]
fn ring_permutes_hide_behind_the_blocks_attention_when_collectives_overlap() {
    let device = h100();
    let prog = program(CpOrder::Zigzag, 4);
    let (overlap, _) = model_step(&prog, &device, Placement::Real, true);
    let (blocking, _) = model_step(&prog, &device, Placement::Real, false);
    let hidden = overlap.collectives_hidden["collective-permute"];
    assert!(hidden > 0.0 && hidden <= 1.0, "{hidden}");
    assert_eq!(blocking.collectives_hidden["collective-permute"], 0.0);
    // Each permute is one hop on the ring: 2(cp-1) per attention forward, 4(cp-1)+2 backward.
    let c = overlap.collectives["collective-permute"];
    assert_eq!(c.count, 2 * (6 * 4 - 4));
    assert_eq!(c.hops, c.count as f64);
}
