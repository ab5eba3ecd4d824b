//! The optimizer updates of a step packed into a few dispatches (crate/src/exec/gpu/packing.rs):
//! the same numbers as the CPU reference over a model's whole parameter set, and a dispatch
//! count that does not grow with the number of parameters.
use std::sync::Arc;

use shardlab::exec::{Backend, GpuExecutor, Parallel, ReferenceExecutor, Tensor, Trainer, TrainerOptions};
use shardlab::gpu::GpuContext;
use shardlab::ir::{Builder, DType, RngLayout, Role};
use shardlab::model::{param_specs, state_input, update, DataSource, GptConfig, Init, Optimizer};
use shardlab::plan::{DropoutKey, Strategy};
use shardlab::sharding::Mesh;
use shardlab_tests::{assert_close, gpu_or_skip, rand_vec};

fn cfg(tied: bool) -> GptConfig {
    GptConfig {
        layers: 2,
        d_model: 32,
        heads: 4,
        seq: 8,
        batch: 4,
        vocab: 48,
        tied,
        dropout: 0.0,
        attention: Default::default(),
        remat: Default::default(),
        precision: Default::default(),
        moe: None,
    }
}

/// A program of one update per parameter of `cfg`'s model (MODEL.md's weight decay: 2-D
/// weights only), each gradient computed from a fed one (a scale by 1, exact), as a step's are.
fn update_program(cfg: &GptConfig, opt: Optimizer) -> shardlab::ir::Program {
    let mut b = Builder::new();
    let specs = param_specs(cfg);
    let n = specs.len();
    let params: Vec<_> = specs
        .iter()
        .map(|p| b.input(&p.name, &p.shape, DType::F32, Role::Param(p.index)))
        .collect();
    let state: Vec<[_; 2]> = specs
        .iter()
        .map(|p| {
            [0, 1].map(|slot| {
                b.input(
                    &format!("{}.{slot}", p.name),
                    &p.shape,
                    DType::F32,
                    Role::OptState { param: p.index, slot },
                )
            })
        })
        .collect();
    let fed: Vec<_> = specs
        .iter()
        .map(|p| b.input(&format!("d{}", p.name), &p.shape, DType::F32, Role::Other))
        .collect();
    for (i, p) in specs.iter().enumerate() {
        let g = b.scale(fed[i], 1.0);
        let outs = update(&mut b, opt, p.decays(), params[i], g, &state[i][..opt.slots()]);
        for (k, v) in outs.into_iter().enumerate() {
            let o = b.output(v);
            b.donate(o, state_input(n, opt, i, k));
        }
    }
    b.finish().unwrap()
}

fn optimizer_dispatches(exec: &GpuExecutor) -> usize {
    exec.dispatches()
        .iter()
        .filter(|d| d.label.starts_with("adamw") || d.label.starts_with("sgd"))
        .count()
}

#[test]
fn packed_updates_of_a_models_parameters_match_the_reference_in_one_dispatch() {
    let ctx = gpu_or_skip!();
    for (tied, opt) in [
        (false, Optimizer::AdamW { lr: 1e-2 }),
        (true, Optimizer::AdamW { lr: 3e-3 }),
        (false, Optimizer::Sgd { lr: 0.1 }),
    ] {
        let program = update_program(&cfg(tied), opt);
        let updates = program
            .instrs
            .iter()
            .filter(|i| i.op.name().ends_with("update"))
            .count();
        let exec = pollster::block_on(GpuExecutor::new(ctx, program.clone())).unwrap();
        assert_eq!(optimizer_dispatches(&exec), 1, "{opt:?} tied={tied}: {updates} updates");
        // Parameters random, moments zero, then three steps of fed gradients.
        let mut inputs: Vec<Tensor> = program
            .inputs
            .iter()
            .enumerate()
            .map(|(k, (v, role))| {
                let n = program.info(*v).numel();
                Tensor::F32(match role {
                    Role::Param(_) => rand_vec(n, k as u32),
                    _ => vec![0.0; n],
                })
            })
            .collect();
        for (pos, t) in inputs.iter().enumerate() {
            exec.write_input(ctx, pos, t).unwrap();
        }
        for step in 1..=3u64 {
            for (k, (v, role)) in program.inputs.iter().enumerate() {
                if *role == Role::Other {
                    inputs[k] = Tensor::F32(rand_vec(program.info(*v).numel(), 100 * step as u32 + k as u32));
                    exec.write_input(ctx, k, &inputs[k]).unwrap();
                }
            }
            exec.set_step(ctx, step).unwrap();
            exec.submit(ctx);
            let want = ReferenceExecutor::run(&program, &inputs, step).unwrap();
            for &(out, input) in &program.donations {
                inputs[input] = want[out].clone();
            }
            for (out, w) in want.iter().enumerate() {
                let Tensor::F32(got) = pollster::block_on(exec.read_output(ctx, out)).unwrap() else {
                    panic!("f32 output")
                };
                let Tensor::F32(w) = w else { panic!("f32 output") };
                let name = program.info(program.outputs[out]).name.clone().unwrap_or_default();
                assert_close(
                    &format!("{opt:?} tied={tied} step {step} output {out} {name}"),
                    &got,
                    w,
                    1e-6,
                    1e-6,
                );
            }
        }
    }
}

fn options(parallel: Parallel) -> TrainerOptions {
    TrainerOptions {
        config: cfg(false),
        optimizer: Optimizer::AdamW { lr: 1e-3 },
        init: Init::Formula,
        data: DataSource::Formula,
        seed: 0,
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
fn a_train_steps_adamw_takes_one_dispatch_for_all_parameters_and_trains_as_the_reference() {
    let _ = gpu_or_skip!();
    let ctx = Arc::new(GpuContext::new_blocking().unwrap());
    let mesh = |m: &str| Mesh::parse(m).unwrap();
    for parallel in [
        Parallel::None,
        Parallel::ShardMap {
            par: Strategy::Fsdp.compose(&mesh("dp=2")).unwrap(),
            dropout_key: DropoutKey::FoldIn,
        },
        Parallel::Auto {
            par: Strategy::Dp.compose(&mesh("dp=2")).unwrap(),
            specs: vec![],
        },
        Parallel::Auto {
            par: Strategy::Tp.compose(&mesh("tp=2")).unwrap(),
            specs: vec![],
        },
    ] {
        let what = format!("{parallel:?}");
        let t = pollster::block_on(Trainer::new(Backend::Gpu(ctx.clone()), options(parallel))).unwrap();
        let program = t.program().clone();
        let updates = program.instrs.iter().filter(|i| i.op.name() == "adamw_update").count();
        assert_eq!(updates, param_specs(&cfg(false)).len(), "{what}");
        let exec = pollster::block_on(GpuExecutor::new(&ctx, program)).unwrap();
        // One per parameter would be 27.
        assert!(
            optimizer_dispatches(&exec) <= 2,
            "{what}: {} AdamW dispatches",
            optimizer_dispatches(&exec)
        );
        // And the packed updates train as the reference does (MODEL.md's 1e-5).
        let mut gpu = t;
        let opts = gpu.options().clone();
        let mut cpu = pollster::block_on(Trainer::new(Backend::Reference, opts)).unwrap();
        for step in 0..4 {
            let a = pollster::block_on(gpu.step()).unwrap().loss;
            let b = pollster::block_on(cpu.step()).unwrap().loss;
            assert!(
                (a - b).abs() <= 1e-5,
                "{what}: step {step} loss {a} on the GPU, {b} on the reference"
            );
        }
    }
}
