//! The measured per-op profile: ops, categories and phases add up to the measured step, and
//! a sharded step's all-reduces show up as collectives time.
use std::sync::Arc;

use shardlab::exec::{Backend, Parallel, Trainer, TrainerOptions};
use shardlab::gpu::GpuContext;
use shardlab::ir::RngLayout;
use shardlab::model::{DataSource, GptConfig, Init, Optimizer};
use shardlab::plan::Strategy;
use shardlab::profile::{breakdown, Category};
use shardlab::sharding::Mesh;
use shardlab_tests::gpu_or_skip;

fn tiny(parallel: Parallel) -> TrainerOptions {
    TrainerOptions {
        config: GptConfig {
            layers: 1,
            d_model: 32,
            heads: 4,
            seq: 16,
            batch: 8,
            vocab: 16,
            tied: false,
            dropout: 0.0,
            attention: Default::default(),
            remat: Default::default(),
            precision: Default::default(),
            moe: None,
        },
        optimizer: Optimizer::AdamW { lr: 1e-2 },
        init: Init::Formula,
        data: DataSource::Copy,
        seed: 1,
        rng_layout: RngLayout::Partitionable,
        parallel,
        combine_all_reduces: false,
        microbatches: 1,
        cp_order: Default::default(),
        schedule: Default::default(),
        virtual_stages: 1,
        stage_layers: vec![],
    }
}

#[test]
fn categories_and_phases_add_up_to_the_step_and_collectives_are_measured() {
    let _ = gpu_or_skip!();
    let ctx = Arc::new(GpuContext::new_blocking().unwrap());
    let dp = Parallel::Auto {
        par: Strategy::Dp.compose(&Mesh::parse("dp=2").unwrap()).unwrap(),
        specs: vec![],
    };
    for (name, parallel) in [("one device", Parallel::None), ("dp=2", dp)] {
        pollster::block_on(async {
            let mut t = Trainer::new(Backend::Gpu(ctx.clone()), tiny(parallel)).await.unwrap();
            t.step().await.unwrap();
            // Wall times on a shared CPU drift: a profile counts if one of ten adds up within
            // 25%, which still catches a missing phase or category; the 10% goal is checked by
            // `shardlab bench train --ops` on a quiet machine (BENCHMARKS.md), not by a test.
            // Ten, not three: a test beside this one on the other core (the 16-lane child runs
            // seconds) put three profiles in a row of a 4.7 ms step off by 26-35%; alone they add
            // up within 2%.
            let mut tries = vec![];
            let b = loop {
                let (_, p) = t.profile_step().await.unwrap();
                let b = breakdown(t.program(), &p.expect("GPU steps are profiled"));
                let (cats, phases) = (b.off_by(b.categories_sum_ms), b.off_by(b.phases_sum_ms));
                // AdamW's one dispatch is timed and lands in its category (the page's profile may
                // not resolve it under a browser's coarse clock; this one does). Under load a
                // single profile has read it as 0 ms, so it is one more thing a counted profile
                // must show; a timer that never sees it still fails all ten.
                let optimizer = b.category_ms(Category::Optimizer);
                tries.push(format!(
                    "step {:.3} ms; categories + one submission {:.3} ms ({:+.1}%), phases + one submission {:.3} ms ({:+.1}%), optimizer {:.3} ms",
                    b.step_ms,
                    b.categories_sum_ms,
                    100.0 * cats,
                    b.phases_sum_ms,
                    100.0 * phases,
                    optimizer
                ));
                if cats.abs() <= 0.25 && phases.abs() <= 0.25 && optimizer > 0.0 {
                    break b;
                }
                assert!(
                    tries.len() < 10,
                    "{name}: no profile adds up within 25% with the optimizer timed:\n{}",
                    tries.join("\n")
                );
            };
            let all_reduces = t.program().instrs.iter().filter(|i| i.op.is_collective()).count();
            let collectives = b.category_ms(Category::Collectives);
            if all_reduces > 0 {
                assert!(collectives > 0.0, "{name}: {all_reduces} collectives measured as 0 ms");
            } else {
                assert_eq!(collectives, 0.0, "{name}: no collectives, yet {collectives} ms");
            }
            assert!(name == "one device" || all_reduces > 0, "dp=2 has all-reduces");
        });
    }
}

#[test]
fn the_floor_of_a_profiled_step_is_charged_to_the_ops_that_ran_it() {
    let _ = gpu_or_skip!();
    let ctx = Arc::new(GpuContext::new_blocking().unwrap());
    let roofline = shardlab::profile::Roofline {
        flops: 50e9,
        bytes_per_s: 2e9,
    };
    let cfg = tiny(Parallel::None).config;
    let limits = shardlab::exec::Backend::Gpu(ctx.clone()).memory_limits();
    let r = pollster::block_on(shardlab::bench::train::train(
        ctx,
        "tiny",
        cfg,
        1,
        Some(roofline),
        &limits,
    ))
    .unwrap();
    let floor = r.floor.expect("a floor for the given ceilings");
    assert_eq!(floor.roofline, roofline);
    // Every op row carries its own floor and those of the instructions it ran (the optimizer's
    // packed updates, fused pairs): the rows' floors add up to the step's.
    let rows: f64 = r.profile.ops.iter().map(|o| floor.instr_ms[o.instr]).sum();
    assert!(
        (rows - floor.total_ms).abs() <= 1e-9 * floor.total_ms,
        "rows {rows} vs step {}",
        floor.total_ms
    );
    let optimizer = r
        .profile
        .ops
        .iter()
        .find(|o| o.category == Category::Optimizer)
        .expect("an update op");
    let want = floor
        .categories_ms
        .iter()
        .find(|(c, _)| *c == Category::Optimizer)
        .unwrap()
        .1;
    assert!(want > 0.0 && (floor.instr_ms[optimizer.instr] - want).abs() <= 1e-9 * want);
}

#[test]
fn the_measured_timeline_is_the_profile_on_one_queue_in_submission_order() {
    let _ = gpu_or_skip!();
    let ctx = Arc::new(GpuContext::new_blocking().unwrap());
    let cfg = tiny(Parallel::None).config;
    let limits = shardlab::exec::Backend::Gpu(ctx.clone()).memory_limits();
    let r = pollster::block_on(shardlab::bench::train::train(ctx, "tiny", cfg, 1, None, &limits)).unwrap();
    let t = &r.timeline;
    assert_eq!((t.kind, t.devices.len(), t.comm_stream), ("measured", 1, false));
    let spans = &t.devices[0].compute;
    // The one submission, then every profiled op in the order it was submitted, back to back.
    assert_eq!(spans[0].category, shardlab::profile::SUBMIT);
    let instrs: Vec<usize> = spans[1..].iter().map(|s| s.instr.unwrap()).collect();
    let mut sorted = instrs.clone();
    sorted.sort_unstable();
    assert_eq!(instrs, sorted, "program order is submission order");
    assert_eq!(instrs.len(), r.profile.ops.len());
    for w in spans.windows(2) {
        assert!((w[1].start_ms - w[0].end_ms()).abs() < 1e-9);
    }
    assert!((t.step_ms - r.profile.categories_sum_ms).abs() < 1e-9 * t.step_ms);
    let b = t.device_breakdown_ms(0);
    for (c, ms) in &r.profile.categories_ms {
        assert!(
            (b[c.name()] - ms).abs() < 1e-9 * t.step_ms.max(1.0),
            "{c:?}: {} vs {ms}",
            b[c.name()]
        );
    }
    // As a trace: one process, one thread, the ops named as the program names them.
    let mut trace = shardlab::profile::Trace::new();
    trace.add("tiny", t, &[shardlab::profile::OpSource::of_step(&r.step)]);
    let v: serde_json::Value = serde_json::from_str(&trace.to_json().to_string()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let count = |name: &str| events.iter().filter(|e| e["name"] == name && e["ph"] == "M").count();
    assert_eq!((count("process_name"), count("thread_name")), (1, 1));
    for e in events.iter().filter(|e| e["ph"] == "X" && e["args"]["instr"].is_u64()) {
        let i = e["args"]["instr"].as_u64().unwrap() as usize;
        assert_eq!(e["name"], r.step.program.instrs[i].op.name());
    }
}

#[test]
fn a_one_run_profile_times_every_op_and_leaves_training_as_a_plain_step_does() {
    let _ = gpu_or_skip!();
    let ctx = Arc::new(GpuContext::new_blocking().unwrap());
    pollster::block_on(async {
        let mut quick = Trainer::new(Backend::Gpu(ctx.clone()), tiny(Parallel::None))
            .await
            .unwrap();
        let mut plain = Trainer::new(Backend::Gpu(ctx.clone()), tiny(Parallel::None))
            .await
            .unwrap();
        quick.step().await.unwrap();
        plain.step().await.unwrap();
        let (profiled, p) = quick.profile_step_with(1).await.unwrap();
        let p = p.expect("GPU steps are profiled");
        assert_eq!(p.reps, 1);
        assert_eq!(profiled.loss, plain.step().await.unwrap().loss);
        // The state it restores is the step's: the next losses agree to the bit.
        assert_eq!(quick.step().await.unwrap().loss, plain.step().await.unwrap().loss);
        let (_, full) = plain.profile_step().await.unwrap();
        let full = full.expect("GPU steps are profiled");
        assert_eq!(full.reps, shardlab::exec::PROFILE_REPS);
        assert_eq!(p.ops.len(), full.ops.len(), "every op is timed");
    });
}
