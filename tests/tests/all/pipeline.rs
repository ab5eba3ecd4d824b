//! Pipeline parallelism (`--strategy pp`, `dp_pp`): the stages' train step against the
//! one-device step with the same microbatches (the same keys and masks), on the reference
//! executor and on the GPU; the bubble the formula says; memory that grows with the
//! microbatches GPipe holds; and settings the engine cannot run refused, naming the fix.
use std::sync::Arc;

use shardlab::exec::{Backend, Parallel, TrainerOptions};
use shardlab::gpu::GpuContext;
use shardlab::ir::{Op, Role};
use shardlab::model::{GptConfig, Init, Optimizer};
use shardlab::plan::{build, DropoutKey, MemoryPlan, Schedule, Strategy, Table};
use shardlab::sharding::Mesh;

fn config(layers: usize, dropout: f32) -> GptConfig {
    GptConfig {
        layers,
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
        moe: None,
    }
}

fn pipeline(strategy: Strategy, mesh: &str) -> Parallel {
    Parallel::ShardMap {
        par: strategy.compose(&Mesh::parse(mesh).unwrap()).unwrap(),
        dropout_key: DropoutKey::Same,
    }
}

fn options(cfg: GptConfig, parallel: Parallel, microbatches: usize) -> TrainerOptions {
    TrainerOptions {
        microbatches,
        // Random init, so that the stages' blocks differ (formula init gives every block the
        // same weights, and a stage run out of order would go unseen).
        init: Init::Random { seed: 3 },
        ..shardlab_tests::formula_options(cfg, Optimizer::AdamW { lr: 3e-3 }, parallel)
    }
}

/// Holds each pipelined run, under every schedule, to the one-device run with the same
/// microbatches: 3 steps' losses and the parameters after them, within 1e-5.
fn check(backend: &Backend, cfg: &GptConfig, cases: &[(Strategy, &str, usize)]) {
    for (&(strategy, mesh, m), schedule) in cases.iter().flat_map(|c| Schedule::ALL.map(|s| (c, s))) {
        let opts = TrainerOptions {
            schedule,
            ..options(cfg.clone(), pipeline(strategy, mesh), m)
        };
        check_one(backend, opts, &format!("{} on {mesh}", strategy.name()));
    }
}

/// Holds the pipelined run `opts` to the one-device run with its microbatches.
fn check_one(backend: &Backend, opts: TrainerOptions, what: &str) {
    let (cfg, m) = (opts.config.clone(), opts.microbatches);
    let (want_losses, want_params) = shardlab_tests::train_steps(backend, options(cfg.clone(), Parallel::None, m), 3);
    let what = format!(
        "{what} {} (v={}, stage layers {:?}), {m} microbatches, dropout {}",
        opts.schedule.name(),
        opts.virtual_stages,
        opts.stage_layers,
        cfg.dropout
    );
    {
        let (losses, params) = shardlab_tests::train_steps(backend, opts, 3);
        for (s, (a, b)) in losses.iter().zip(&want_losses).enumerate() {
            assert!((a - b).abs() <= 1e-5, "{what}: loss {s}: {a} vs one device {b}");
        }
        for (i, (p, q)) in params.iter().zip(&want_params).enumerate() {
            let worst = p.iter().zip(q).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-5, "{what}: param {i} differs by {worst}");
        }
    }
}

/// Virtual stages (interleaved 1F1B, GPipe's circular form) and uneven stages, against one
/// device: pp=2 and pp=4, with dropout, and composed with dp.
fn check_layouts(backend: &Backend) {
    // (strategy, mesh, microbatches, schedule, virtual stages, blocks per stage)
    type Case<'a> = (Strategy, &'a str, usize, Schedule, usize, &'a [usize]);
    let cases: [Case; 7] = [
        (Strategy::Pp, "pp=2", 4, Schedule::OneFOneB, 2, &[]),
        (Strategy::Pp, "pp=2", 2, Schedule::Gpipe, 2, &[]),
        (Strategy::Pp, "pp=4", 4, Schedule::OneFOneB, 2, &[]),
        (Strategy::DpPp, "dp=2,pp=2", 2, Schedule::OneFOneB, 2, &[]),
        (Strategy::Pp, "pp=2", 2, Schedule::OneFOneB, 1, &[3, 1]),
        (Strategy::Pp, "pp=4", 2, Schedule::ZbH1, 1, &[1, 3, 2, 2]),
        // One count per virtual stage, an empty first chunk (Llama 3's layout in small).
        (Strategy::Pp, "pp=2", 2, Schedule::OneFOneB, 2, &[0, 2, 1, 1]),
    ];
    for (strategy, mesh, m, schedule, v, stage_layers) in cases {
        let layers = if mesh.contains("pp=4") { 8 } else { 4 };
        for dropout in [0.0, 0.1] {
            let opts = TrainerOptions {
                schedule,
                virtual_stages: v,
                stage_layers: stage_layers.to_vec(),
                ..options(config(layers, dropout), pipeline(strategy, mesh), m)
            };
            check_one(backend, opts, &format!("{} on {mesh}", strategy.name()));
        }
    }
}

const CASES: [(Strategy, &str, usize); 4] = [
    (Strategy::Pp, "pp=2", 4),
    (Strategy::Pp, "pp=4", 2),
    (Strategy::Pp, "pp=4", 1),
    (Strategy::DpPp, "dp=2,pp=2", 2),
];

#[test]
fn stages_match_one_device_on_the_reference_executor_with_and_without_dropout() {
    for dropout in [0.0, 0.1] {
        check(&Backend::Reference, &config(4, dropout), &CASES);
    }
}

#[test]
fn virtual_and_uneven_stages_match_one_device_on_the_reference_executor() {
    check_layouts(&Backend::Reference);
}

#[test]
fn stages_match_one_device_on_the_gpu_with_and_without_dropout() {
    let backend = Backend::Gpu(Arc::new(GpuContext::new_blocking().unwrap()));
    for dropout in [0.0, 0.1] {
        check(&backend, &config(4, dropout), &CASES);
    }
    check_layouts(&backend);
}

#[test]
fn each_stage_holds_only_its_own_blocks() {
    let cfg = config(4, 0.0);
    let planned = build(&options(cfg.clone(), pipeline(Strategy::Pp, "pp=4"), 2)).unwrap();
    let prog = &planned.step.program;
    let one = build(&options(cfg, Parallel::None, 2)).unwrap();
    let params = |p: &shardlab::ir::Program| -> usize {
        p.inputs
            .iter()
            .filter(|(_, r)| r.is_param())
            .map(|(v, _)| p.info(*v).numel())
            .sum()
    };
    let blocks_one = 4 * (2 * 16 + 16 * 48 + 48 + 16 * 16 + 16 + 2 * 16 + 16 * 64 + 64 + 64 * 16 + 16);
    // Every device holds one block of four, and the embeddings and head whole.
    assert_eq!(params(&one.step.program) - params(prog), blocks_one * 3 / 4);
    let stacks = prog
        .inputs
        .iter()
        .filter(|(_, r)| matches!(r, Role::ParamStack(_)))
        .count();
    assert_eq!(stacks, 12, "one stacked input per block parameter");
    let permutes = prog
        .instrs
        .iter()
        .filter(|i| matches!(i.op, Op::Ppermute { .. }))
        .count();
    // GPipe on pp=4 with M=2: a microbatch's activation crosses the 3 stage boundaries on the
    // way down, each in a step of its own but where both microbatches cross at once (4 steps),
    // and its cotangent the same on the way back.
    assert_eq!(permutes, 2 * 4, "{permutes} ppermutes");

    // The memory plan in closed form, per device: the embeddings (wte V x C, wpe T x C), the
    // final layer norm (2C) and head (C x V) whole, one block of the four, in float32; AdamW's
    // two moments of each; a gradient of each.
    let (c, v, t) = (16, 32, 8);
    let block = blocks_one / 4;
    let held = (v * c + t * c + 2 * c + c * v + block) as u64 * 4;
    let plan = MemoryPlan::of(prog).unwrap();
    assert_eq!(plan.params, held, "params");
    assert_eq!(plan.optimizer_state, 2 * held, "AdamW's moments");
    assert_eq!(plan.gradients, held, "gradients");
}

#[test]
fn the_embedding_runs_on_the_first_stage_and_the_head_on_the_last() {
    use shardlab::ir::Owner;
    let opts = TrainerOptions {
        schedule: Schedule::OneFOneB,
        ..options(config(4, 0.0), pipeline(Strategy::Pp, "pp=4"), 4)
    };
    let prog = build(&opts).unwrap().step.program;
    let owners_of = |pick: &dyn Fn(&Op) -> bool| -> Vec<Owner> {
        let mut out: Vec<Owner> = (0..prog.instrs.len())
            .filter(|&i| pick(&prog.instrs[i].op))
            .map(|i| prog.instr_owner(i))
            .collect();
        out.dedup();
        out
    };
    // The token lookup (a gather of wte's rows) on the first stage; the loss on the last.
    let lookups = owners_of(&|op| matches!(op, Op::Gather));
    assert_eq!(lookups, vec![Owner::stage(0)], "{lookups:?}");
    let losses = owners_of(&|op| matches!(op, Op::CrossEntropy));
    assert_eq!(losses, vec![Owner::stage(3)], "{losses:?}");
    // Each stage's FLOPs: the middle stages run their blocks alone; the last adds the head,
    // the first the embedding (a lookup: few FLOPs).
    let s = shardlab::profile::summarize(&prog);
    let f = &s.stage_flops;
    assert_eq!(f.len(), 4);
    // (The middle stages differ by the sums of the cotangents sent on in a step, a few
    // thousand FLOPs.)
    assert!(f[1].abs_diff(f[2]) * 100 < f[1], "{f:?}");
    assert!(f[3] as f64 > 1.1 * f[1] as f64 && f[0] < f[3], "{f:?}");
    assert_eq!(s.flops, f[3], "the busiest stage's");
}

#[test]
fn the_bubble_is_the_fill_and_drain_of_the_formula() {
    for (p, m, want) in [(1, 4, 0.0), (2, 2, 1.0 / 3.0), (4, 4, 3.0 / 7.0), (4, 16, 3.0 / 19.0)] {
        for s in [Schedule::Gpipe, Schedule::OneFOneB] {
            assert!((s.bubble_fraction(p, m) - want).abs() < 1e-12, "{s:?} pp={p} M={m}");
        }
    }
    // ZB-H1's drain runs the weight passes (F, B and W alike): (pp-1)/(3M+pp-1).
    for (p, m, want) in [(1, 4, 0.0), (2, 2, 1.0 / 7.0), (4, 4, 3.0 / 15.0)] {
        assert!(
            (Schedule::ZbH1.bubble_fraction(p, m) - want).abs() < 1e-12,
            "ZB-H1 pp={p} M={m}"
        );
    }
    // Virtual stages divide the fill and drain by v: (pp-1)/(vM+pp-1).
    let v2 = Schedule::OneFOneB.bubble(4, 4, 2, shardlab::plan::PassTimes::EVEN);
    assert!((v2 - 3.0 / 11.0).abs() < 1e-12, "{v2}");
}

/// The memory plan of a pipeline on pp=2 with `m` microbatches of 2 rows each.
fn activation_plan(schedule: Schedule, m: usize) -> MemoryPlan {
    let cfg = GptConfig {
        batch: 2 * m,
        d_model: 64,
        seq: 32,
        ..config(4, 0.0)
    };
    let opts = TrainerOptions {
        schedule,
        ..options(cfg, pipeline(Strategy::Pp, "pp=2"), m)
    };
    MemoryPlan::of(&build(&opts).unwrap().step.program).unwrap()
}

/// Stage 0's activation peak: the stage that holds the most microbatches.
fn activation_peak(schedule: Schedule, m: usize) -> u64 {
    activation_plan(schedule, m).stage_activations[0]
}

#[test]
fn gpipe_holds_every_microbatch_and_1f1b_a_bounded_few() {
    let gpipe: Vec<u64> = [2, 4, 8].map(|m| activation_peak(Schedule::Gpipe, m)).to_vec();
    let one: Vec<u64> = [2, 4, 8].map(|m| activation_peak(Schedule::OneFOneB, m)).to_vec();
    // GPipe keeps every tick's activations for the backward: twice the microbatches, nearly
    // twice the bytes.
    assert!(
        gpipe[2] as f64 > 1.6 * gpipe[1] as f64 && gpipe[1] as f64 > 1.4 * gpipe[0] as f64,
        "GPipe's peaks for M = 2, 4, 8: {gpipe:?}"
    );
    // 1F1B as Megatron runs it holds at most pp microbatches' activations (stage 0: the
    // warm-up's pp - 1 and the one it forwards before its first backward), nothing recomputed:
    // on pp=2, two, for any M; what GPipe holds with M = 2.
    assert_eq!(Table::new(Schedule::OneFOneB, 2, 8, 1).in_flight(), vec![2, 1]);
    assert!(
        one[2] as f64 <= 1.01 * one[1] as f64,
        "1F1B's peaks for M = 2, 4, 8: {one:?}"
    );
    // With M = 2 both schedules run stage 0's forwards before its backwards: the same peak.
    // With more, 1F1B's stage 0 holds its two microbatches beside the running sums of its
    // gradients (made by the first backward): no more than those sums above GPipe's M = 2.
    assert_eq!(one[0], gpipe[0]);
    let sums = activation_plan(Schedule::OneFOneB, 8).gradients;
    assert!(
        one[2] > gpipe[0] && one[2] <= gpipe[0] + sums,
        "M = 8: 1F1B {} B against GPipe's with M = 2, {} B, and gradients of {sums} B",
        one[2],
        gpipe[0]
    );
    assert!(one[2] * 2 < gpipe[2], "M = 8: 1F1B {} B, GPipe {} B", one[2], gpipe[2]);
}

#[test]
fn pipeline_settings_it_cannot_run_are_refused_naming_the_fix() {
    let refuse = |cfg: GptConfig, parallel: Parallel, m: usize, schedule: Schedule| {
        let opts = TrainerOptions {
            schedule,
            ..options(cfg, parallel, m)
        };
        build(&opts).unwrap_err().to_string()
    };
    let gpipe = Schedule::Gpipe;
    let e = refuse(config(3, 0.0), pipeline(Strategy::Pp, "pp=2"), 2, gpipe);
    assert!(e.contains("--layers 3") && e.contains("multiple of 2"), "{e}");
    let e = refuse(config(2, 0.0), pipeline(Strategy::Pp, "pp=4"), 2, gpipe);
    assert!(e.contains("pp=4") && e.contains("one of 1, 2"), "{e}");
    let e = refuse(config(4, 0.0), pipeline(Strategy::Pp, "pp=2"), 0, gpipe);
    assert!(e.contains("--microbatches 0"), "{e}");
    // The preset names its axis: a mesh without it is refused where the preset is composed.
    let e = Strategy::Pp
        .compose(&Mesh::parse("dp=2").unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("'pp'") && e.contains("--mesh pp=2"), "{e}");
    let auto = Parallel::Auto {
        par: Strategy::Pp.compose(&Mesh::parse("pp=2").unwrap()).unwrap(),
        specs: vec![],
    };
    let e = refuse(config(4, 0.0), auto, 2, gpipe);
    assert!(
        e.contains("collective-permute") && e.contains("--mode shard_map"),
        "{e}"
    );
    let e = refuse(config(4, 0.0), pipeline(Strategy::Dp, "dp=2"), 2, Schedule::OneFOneB);
    assert!(
        e.contains("--schedule 1f1b") && e.contains("has no 'pp' axis: add one"),
        "{e}"
    );
    let e = refuse(config(4, 0.0), Parallel::None, 2, Schedule::OneFOneB);
    assert!(e.contains("--schedule 1f1b") && e.contains("'pp'"), "{e}");

    // Layouts: stage layer counts must add up to the layers, one per stage; virtual stages
    // must divide each stage's blocks; interleaved 1F1B takes microbatches in groups of pp.
    let laid = |m: usize, schedule: Schedule, v: usize, stage_layers: &[usize]| {
        let opts = TrainerOptions {
            schedule,
            virtual_stages: v,
            stage_layers: stage_layers.to_vec(),
            ..options(config(8, 0.0), pipeline(Strategy::Pp, "pp=4"), m)
        };
        build(&opts).unwrap_err().to_string()
    };
    let e = laid(4, gpipe, 1, &[2, 2, 2, 1]);
    assert!(
        e.contains("--stage-layers 2,2,2,1") && e.contains("adds up to 7") && e.contains("--layers 8"),
        "{e}"
    );
    let e = laid(4, gpipe, 1, &[4, 4]);
    assert!(
        e.contains("--stage-layers 4,4") && e.contains("one block count per stage"),
        "{e}"
    );
    let e = laid(4, gpipe, 1, &[3, 3, 2, 0]);
    assert!(e.contains("gives a stage no blocks"), "{e}");
    let e = laid(4, Schedule::OneFOneB, 4, &[]);
    assert!(
        e.contains("--virtual-stages 4")
            && e.contains("does not divide stage 0's 2 blocks")
            && e.contains("one of 1, 2"),
        "{e}"
    );
    let e = laid(4, Schedule::OneFOneB, 2, &[3, 1, 2, 2]);
    assert!(
        e.contains("--virtual-stages 2") && e.contains("stage 0's 3 blocks"),
        "{e}"
    );
    let e = laid(6, Schedule::OneFOneB, 2, &[]);
    assert!(e.contains("--microbatches 6") && e.contains("multiple of"), "{e}");
    let e = laid(4, Schedule::ZbH1, 2, &[]);
    assert!(
        e.contains("--virtual-stages 2") && e.contains("--schedule zb_h1"),
        "{e}"
    );
    let off = TrainerOptions {
        virtual_stages: 2,
        ..options(config(4, 0.0), pipeline(Strategy::Dp, "dp=2"), 2)
    };
    let e = build(&off).unwrap_err().to_string();
    assert!(e.contains("--virtual-stages 2") && e.contains("no 'pp' axis"), "{e}");
}

/// Each stage's idle milliseconds on the modelled step on real devices, and the step's.
fn modelled_idle(schedule: Schedule, pp: usize, m: usize) -> (Vec<f64>, f64) {
    use shardlab::profile::{h100, model_step, Placement, IDLE};
    // Blocks dominate (8 wide ones, a small vocabulary), as in a model worth pipelining: their
    // work, not launches, sets each tick's length.
    let cfg = GptConfig {
        layers: 8,
        d_model: 1024,
        heads: 8,
        seq: 512,
        batch: 4 * m,
        vocab: 64,
        ..config(8, 0.0)
    };
    let opts = TrainerOptions {
        schedule,
        ..options(cfg, pipeline(Strategy::Pp, &format!("pp={pp}")), m)
    };
    let planned = build(&opts).unwrap();
    let (_, timeline) = model_step(&planned.step.program, &h100(), Placement::Real, true);
    let idle = (0..pp).map(|d| timeline.device_breakdown_ms(d)[IDLE]).collect();
    (idle, timeline.step_ms)
}

#[test]
fn the_modelled_timeline_idles_each_stage_for_the_bubble_and_more_microbatches_shrink_it() {
    let mut last_gpipe = 1.0;
    for m in [2, 4, 8] {
        let want = Schedule::Gpipe.bubble_fraction(4, m);
        let (gpipe, step) = modelled_idle(Schedule::Gpipe, 4, m);
        for (s, idle) in gpipe.iter().enumerate() {
            // The stages' own work is the same but for the embedding (first) and head (last),
            // and the gradients' reductions and the update, which no stage idles through.
            let got = idle / step;
            assert!(
                (got - want).abs() <= 0.1 * want + 0.02,
                "GPipe, M={m}: stage {s} idles {got:.3} of the step, the formula says {want:.3}"
            );
        }
        // 1F1B idles GPipe's fill and drain, and more on this timeline: the program runs
        // the stages' passes in lockstep steps, each step's sends one ppermute over the stage
        // axis that waits for the step's slowest pass, and 1F1B's steady state pairs one
        // stage's forward with another's backward in a step. (6.81 ms against GPipe's 5.67 at
        // M=4, 9.85 against 6.05 at M=8: the cost model's timeline of the schedule's table,
        // `estimate_step`, has no such steps.)
        let (one, _) = modelled_idle(Schedule::OneFOneB, 4, m);
        for (s, (a, b)) in one.iter().zip(&gpipe).enumerate() {
            assert!(
                *a >= 0.95 * b,
                "M={m}: stage {s} idles {a:.3} ms under 1F1B, {b:.3} ms under GPipe"
            );
        }
        let g = mean(&gpipe) / step;
        assert!(g < last_gpipe, "M={m}: GPipe's idle share {g:.3} did not shrink");
        last_gpipe = g;
    }
}

#[test]
fn one_row_per_stage_schedules_a_pipeline_as_every_devices_row_does() {
    use shardlab::profile::{h100, model_step, schedule, spmd_work, Placement};
    let cfg = GptConfig {
        batch: 8,
        ..config(4, 0.0)
    };
    for schedule_kind in Schedule::ALL {
        let opts = TrainerOptions {
            schedule: schedule_kind,
            ..options(cfg.clone(), pipeline(Strategy::DpPp, "dp=2,pp=2"), 2)
        };
        let prog = build(&opts).unwrap().step.program;
        let all = schedule(&spmd_work(&prog, &h100(), Placement::Real), true).unwrap();
        let (p, rows) = model_step(&prog, &h100(), Placement::Real, true);
        assert!(
            (p.step_ms - all.step_ms).abs() < 1e-9,
            "{} vs {}",
            p.step_ms,
            all.step_ms
        );
        assert_eq!(rows.devices.len(), 4);
        for (a, b) in rows.devices.iter().zip(&all.devices) {
            assert_eq!((&a.label, &a.compute), (&b.label, &b.compute));
        }
    }
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Named `under_jax::` so that `cargo xtask test` runs it in its JAX step, with the venv.
mod under_jax {
    use super::*;
    use crate::levers_jax::{shardlab_counts, xla_counts};

    /// XLA compiles the exported pipeline body (GPipe: autodiff through the ticks; 1F1B: a
    /// pullback per slot) into the collectives shardlab's program has: a collective-permute per
    /// tick boundary each way, an all-reduce of each replicated parameter's gradient over the
    /// stages and "dp", and of each stage weight's over "dp" (the script stacks a stage's
    /// layers per parameter kind: one all-reduce a kind, where shardlab's program has one a
    /// layer).
    #[test]
    fn the_pipeline_bodies_have_xlas_collectives_under_both_schedules() {
        if shardlab_tests::jax_python().is_none() {
            return;
        }
        // The script writes GPipe and 1F1B (zb_h1 it refuses: shardlab runs it alone).
        for schedule in [Schedule::Gpipe, Schedule::OneFOneB] {
            let opts = TrainerOptions {
                schedule,
                ..options(config(4, 0.1), pipeline(Strategy::DpPp, "dp=2,pp=2"), 2)
            };
            let name = format!("dp_pp_{}", schedule.name());
            let ours = shardlab_counts(&opts);
            // Three ticks (M + pp - 1) each way: 2 permutes forward, 2 back.
            assert_eq!(ours["collective-permute"], 4, "{name}: {ours:?}");
            let mut stacked = ours.clone();
            let stage_layers = opts.config.layers / 2;
            *stacked.get_mut("all-reduce").unwrap() -= (stage_layers - 1) * BLOCK_PARAMS;
            assert_eq!(xla_counts(&name, &opts, None), stacked, "{name}: shardlab's {ours:?}");
        }
    }

    /// The parameters of one block (docs/MODEL.md).
    const BLOCK_PARAMS: usize = 12;
}
