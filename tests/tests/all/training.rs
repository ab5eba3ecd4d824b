//! Training behaviour on the GPU executor: a tiny model learns the copy task, the train step
//! reuses its dispatches instead of re-creating pipelines, and provisional matmuls switch to the
//! tuned ones between steps.
use std::sync::Arc;

use shardlab::exec::{Backend, MatmulChoice, Parallel, Trainer, TrainerOptions};
use shardlab::gpu::GpuContext;
use shardlab::ir::RngLayout;
use shardlab::kernels::matmul::Variant;
use shardlab::model::{DataSource, GptConfig, Init, Optimizer};
use shardlab_tests::gpu_or_skip;

fn copy_task(dropout: f32) -> TrainerOptions {
    TrainerOptions {
        config: GptConfig {
            layers: 1,
            d_model: 32,
            heads: 4,
            seq: 16,
            batch: 8,
            vocab: 16,
            tied: false,
            dropout,
            attention: Default::default(),
            remat: Default::default(),
            precision: Default::default(),
            moe: None,
        },
        optimizer: Optimizer::AdamW { lr: 1e-2 },
        init: Init::Random { seed: 1 },
        data: DataSource::Copy,
        seed: 1,
        rng_layout: RngLayout::Partitionable,
        parallel: Parallel::None,
        combine_all_reduces: false,
        microbatches: 1,
        cp_order: Default::default(),
        schedule: Default::default(),
        virtual_stages: 1,
        stage_layers: vec![],
    }
}

#[test]
fn tiny_model_learns_the_copy_task_on_the_gpu() {
    let _ = gpu_or_skip!();
    let ctx = Arc::new(GpuContext::new_blocking().unwrap());
    pollster::block_on(async {
        let mut t = Trainer::new(Backend::Gpu(ctx), copy_task(0.0)).await.unwrap();
        let first = t.step().await.unwrap().loss;
        for _ in 0..200 {
            t.step().await.unwrap();
        }
        let last = t.eval_loss().await.unwrap();
        let chance = (16f32).ln();
        assert!(
            (first - chance).abs() < 0.5,
            "initial loss {first} should be near log(V) = {chance}"
        );
        // Half of each row is a copy of the other half: the floor is about 0.5 * ln(8) = 1.04.
        assert!(
            last < 0.55 * chance,
            "after 200 steps the loss is {last}, not well below log(V) = {chance}"
        );
    });
}

#[test]
fn training_with_dropout_learns_and_keeps_pipelines_cached() {
    let _ = gpu_or_skip!();
    let ctx = Arc::new(GpuContext::new_blocking().unwrap());
    pollster::block_on(async {
        let mut t = Trainer::new(Backend::Gpu(ctx.clone()), copy_task(0.1)).await.unwrap();
        let first = t.step().await.unwrap().loss;
        let pipelines = ctx.pipelines.len();
        for _ in 0..60 {
            t.step().await.unwrap();
        }
        assert_eq!(ctx.pipelines.len(), pipelines, "steps must not create pipelines");
        let last = t.eval_loss().await.unwrap();
        assert!(
            last < first - 0.3,
            "with dropout 0.1 the loss went from {first} to {last}"
        );
    });
}

#[test]
fn dropout_training_matches_the_reference_executor_bit_for_bit_masks() {
    let _ = gpu_or_skip!();
    let ctx = Arc::new(GpuContext::new_blocking().unwrap());
    pollster::block_on(async {
        let mut gpu = Trainer::new(Backend::Gpu(ctx), copy_task(0.2)).await.unwrap();
        let mut cpu = Trainer::new(Backend::Reference, copy_task(0.2)).await.unwrap();
        for _ in 0..3 {
            let (g, c) = (gpu.step().await.unwrap().loss, cpu.step().await.unwrap().loss);
            assert!(
                (g - c).abs() < 1e-4,
                "GPU loss {g} vs reference {c}: dropout masks must agree"
            );
        }
    });
}

#[test]
fn a_profiled_step_reports_the_same_loss_as_a_plain_step() {
    let _ = gpu_or_skip!();
    use shardlab::plan::Strategy;
    use shardlab::sharding::Mesh;
    let ctx = Arc::new(GpuContext::new_blocking().unwrap());
    for parallel in [
        Parallel::None,
        Parallel::Auto {
            par: Strategy::Dp.compose(&Mesh::parse("dp=2").unwrap()).unwrap(),
            specs: vec![],
        },
    ] {
        let mut opts = copy_task(0.0);
        opts.parallel = parallel;
        opts.init = Init::Formula;
        pollster::block_on(async {
            let mut plain = Trainer::new(Backend::Gpu(ctx.clone()), opts.clone()).await.unwrap();
            let mut profiled = Trainer::new(Backend::Gpu(ctx.clone()), opts).await.unwrap();
            for _ in 0..3 {
                let a = plain.step().await.unwrap().loss;
                let (b, profile) = profiled.profile_step().await.unwrap();
                assert!((a - b.loss).abs() < 1e-6, "profiled loss {} vs plain {a}", b.loss);
                assert!(profile.unwrap().phases_ms.iter().all(|&ms| ms > 0.0));
            }
        });
    }
}

#[test]
fn both_executors_report_the_peak_bytes_a_step_needs() {
    let _ = gpu_or_skip!();
    let ctx = Arc::new(GpuContext::new_blocking().unwrap());
    pollster::block_on(async {
        let gpu = Trainer::new(Backend::Gpu(ctx), copy_task(0.0)).await.unwrap();
        let cpu = Trainer::new(Backend::Reference, copy_task(0.0)).await.unwrap();
        let params = 4 * shardlab::model::GptConfig::num_params(&copy_task(0.0).config) as u64;
        for (what, bytes) in [("GPU", gpu.peak_bytes()), ("reference", cpu.peak_bytes())] {
            // Params, AdamW's two moments, and activations on top.
            assert!(bytes > 3 * params, "{what}: {bytes} B for {params} B of params");
            assert!(bytes < 100 * params, "{what}: {bytes} B is implausibly large");
        }
    });
}

#[test]
fn a_trained_model_predicts_the_copied_half_of_an_example() {
    pollster::block_on(async {
        let mut t = Trainer::new(Backend::Reference, copy_task(0.0)).await.unwrap();
        let untrained = t.predict(0).await.unwrap();
        assert_eq!(untrained.len(), 16, "one prediction per position of the example");
        assert!(
            untrained.iter().all(|&p| p < 16),
            "predictions are tokens of the vocabulary"
        );
        for _ in 0..200 {
            t.step().await.unwrap();
        }
        let predicted = t.predict(0).await.unwrap();
        let batch = shardlab::model::Dataset::new(DataSource::Copy, &copy_task(0.0).config, 1)
            .unwrap()
            .batch(0);
        let targets = &batch.targets[..16];
        // The second half repeats the first: after training the model copies it.
        let right = (9..16).filter(|&i| predicted[i] == targets[i]).count();
        assert!(
            right >= 6,
            "after 200 steps it predicts {predicted:?} for targets {targets:?}: {right} of the copied 7 right"
        );
    });
}

#[test]
fn provisional_matmuls_skip_the_tuner_and_retune_keeps_the_losses() {
    let _ = gpu_or_skip!();
    // A context of its own: its autotuner has tuned nothing yet.
    let ctx = Arc::new(GpuContext::new_blocking().unwrap());
    let opts = copy_task(0.1);
    pollster::block_on(async {
        let planned = shardlab::plan::build(&opts).unwrap();
        let choice = MatmulChoice::Provisional(Variant::Naive);
        let mut first = Trainer::from_plan_with(Backend::Gpu(ctx.clone()), planned.clone(), choice)
            .await
            .unwrap();
        assert!(!first.provisional_matmuls().is_empty());
        assert_eq!(
            shardlab::kernels::Tuning::with(&ctx, |t| t.tuned).unwrap(),
            0,
            "building tuned nothing"
        );
        let mut losses = vec![first.step().await.unwrap().loss];
        assert!(first.retune().await.unwrap(), "the provisional matmuls switched");
        assert!(first.provisional_matmuls().is_empty());
        assert!(
            shardlab::kernels::Tuning::with(&ctx, |t| t.tuned).unwrap() > 0,
            "retune tuned their classes"
        );
        assert!(!first.retune().await.unwrap(), "nothing left to switch");
        for _ in 0..2 {
            losses.push(first.step().await.unwrap().loss);
        }

        // The same run on the tuned variants throughout: the classes are tuned now, so nothing is
        // provisional, and the losses agree to the tolerance the matmul variants share.
        let mut tuned = Trainer::from_plan_with(Backend::Gpu(ctx.clone()), planned, choice)
            .await
            .unwrap();
        assert!(tuned.provisional_matmuls().is_empty());
        for (i, want) in losses.iter().enumerate() {
            let got = tuned.step().await.unwrap().loss;
            assert!((got - want).abs() <= 1e-4 * want.abs(), "step {i}: {got} vs {want}");
        }
    });
}
