//! Property test of jit: random valid PartitionSpecs for every parameter (and its optimizer
//! state), the tokens and the targets give the one-device losses and parameters, with and
//! without the all-reduce combiner.
use shardlab::exec::{ReferenceExecutor, Tensor};
use shardlab::ir::{Program, RngLayout, Role};
use shardlab::model::{init_params, train_step_program, DataSource, Dataset, GptConfig, Init, Optimizer};
use shardlab::partition::{combine_all_reduces, jit};
use shardlab::rng::Key;
use shardlab::sharding::{Mesh, NamedSharding, PartitionSpec};

fn config() -> GptConfig {
    GptConfig {
        layers: 1,
        d_model: 16,
        heads: 4,
        seq: 4,
        batch: 8,
        vocab: 16,
        tied: false,
        dropout: 0.0,
        attention: Default::default(),
        remat: Default::default(),
        precision: Default::default(),
        moe: None,
    }
}

/// A 64-bit LCG (Knuth's MMIX constants): reproducible draws without a dependency.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// A random valid spec for `shape`: each dim unsharded or split over one mesh axis not used
/// by another dim whose size divides it.
fn random_spec(rng: &mut Lcg, mesh: &Mesh, shape: &[usize]) -> PartitionSpec {
    let mut used: Vec<&str> = vec![];
    let mut dims: Vec<Option<&str>> = vec![];
    for &n in shape {
        let free: Vec<&str> = mesh
            .axes()
            .iter()
            .filter(|(a, size)| !used.contains(&a.as_str()) && n % size == 0)
            .map(|(a, _)| a.as_str())
            .collect();
        // Half the dims stay unsharded, the rest pick a free axis.
        let pick = rng.below(2 * free.len() + 1);
        let axis = (pick < free.len()).then(|| free[pick]);
        used.extend(axis);
        dims.push(axis);
    }
    PartitionSpec::from_axes(&dims)
}

fn sharding(mesh: &Mesh, spec: &PartitionSpec) -> NamedSharding {
    NamedSharding::new(mesh.clone(), spec.clone()).unwrap()
}

/// The global inputs of step `step`: params and optimizer state (from `state`), tokens,
/// targets and key, in `prog.inputs` order.
fn step_inputs(prog: &Program, state: &[Vec<f32>], data: &Dataset, step: u64) -> Vec<Tensor> {
    let batch = data.batch(step);
    let key = Key::from_seed(0).fold_in(step as u32);
    let mut k = 0;
    prog.inputs
        .iter()
        .map(|(_, role)| match role {
            Role::Param(_) | Role::OptState { .. } => {
                k += 1;
                Tensor::F32(state[k - 1].clone())
            }
            Role::Tokens => Tensor::U32(batch.inputs.clone()),
            Role::Targets => Tensor::U32(batch.targets.clone()),
            Role::RngKey => Tensor::U32(key.0.to_vec()),
            Role::Other | Role::ParamStack(_) | Role::OptStateStack { .. } => {
                unreachable!("the global train step has no other inputs")
            }
        })
        .collect()
}

/// Two steps of `prog`: the losses and the final state (params and optimizer state).
/// `run` executes one step on global inputs and returns global outputs.
fn two_steps(
    global: &Program,
    init: Vec<Vec<f32>>,
    data: &Dataset,
    mut run: impl FnMut(&[Tensor], u64) -> Vec<Tensor>,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let mut state = init;
    let mut losses = vec![];
    for step in 0..2 {
        let outs = run(&step_inputs(global, &state, data, step), step + 1);
        losses.push(outs[0].scalar());
        for &(o, i) in &global.donations {
            state[i] = outs[o].f32().to_vec();
        }
    }
    (losses, state)
}

#[test]
fn jit_with_random_specs_matches_one_device() {
    let cfg = config();
    let data = Dataset::new(DataSource::Formula, &cfg, 0).unwrap();
    let meshes = ["dp=2", "dp=4", "dp=2,tp=2"];
    let mut rng = Lcg(20241130);
    for case in 0..21 {
        let mesh = Mesh::parse(meshes[case % meshes.len()]).unwrap();
        // SGD: AdamW normalizes each gradient by its own size, so the key bias's gradient (zero
        // up to rounding: softmax ignores a per-query constant) would turn rounding into updates.
        let opt = Optimizer::Sgd { lr: 0.1 };
        let global = train_step_program(&cfg, opt, RngLayout::Partitionable).unwrap().program;
        let params = init_params(&cfg, Init::Formula);
        let init: Vec<Vec<f32>> = params
            .iter()
            .cloned()
            .chain(
                params
                    .iter()
                    .flat_map(|p| std::iter::repeat_n(vec![0.0; p.len()], opt.slots())),
            )
            .collect();
        let (want_losses, want_state) = two_steps(&global, init.clone(), &data, |ins, step| {
            ReferenceExecutor::run(&global, ins, step).unwrap()
        });

        // One spec per parameter, shared by its optimizer state; tokens and targets their own.
        let mut param_spec = vec![];
        for (v, role) in &global.inputs {
            if let Role::Param(_) = role {
                param_spec.push(random_spec(&mut rng, &mesh, global.shape(*v)));
            }
        }
        let in_specs: Vec<PartitionSpec> = global
            .inputs
            .iter()
            .map(|(v, role)| match role {
                Role::Param(i) | Role::OptState { param: i, .. } => param_spec[*i].clone(),
                Role::Tokens | Role::Targets => random_spec(&mut rng, &mesh, global.shape(*v)),
                _ => PartitionSpec::replicated(),
            })
            .collect();
        // Outputs: the loss replicated; each updated array laid out like its input or, at
        // random, wherever propagation puts it.
        let mut out_specs = vec![Some(PartitionSpec::replicated())];
        for k in 1..global.outputs.len() {
            let input = global
                .donations
                .iter()
                .find(|&&(o, _)| o == k)
                .map(|&(_, i)| i)
                .unwrap();
            out_specs.push((rng.below(3) > 0).then(|| in_specs[input].clone()));
        }
        let what = || {
            let specs: Vec<String> = global
                .inputs
                .iter()
                .zip(&in_specs)
                .map(|((v, _), s)| format!("{}={s}", global.info(*v).name.clone().unwrap_or_default()))
                .collect();
            format!("case {case} on {mesh}, in_specs {}", specs.join(" "))
        };
        let auto = jit(&global, &mesh, &in_specs, &out_specs).unwrap_or_else(|e| panic!("{}: jit failed: {e}", what()));
        // The all-reduce combiner must not change the results either.
        let combined = combine_all_reduces(&auto.program);
        for (spmd, how) in [(&auto.program, ""), (&combined, " (all-reduces combined)")] {
            let (losses, state) = two_steps(&global, init.clone(), &data, |ins, step| {
                let local: Vec<Tensor> = ins
                    .iter()
                    .zip(&global.inputs)
                    .zip(&in_specs)
                    .map(|((t, (v, _)), spec)| {
                        let (s, shape) = (sharding(&mesh, spec), global.shape(*v));
                        match t {
                            Tensor::F32(x) => Tensor::F32(s.shard(x, shape).unwrap()),
                            Tensor::U32(x) => Tensor::U32(s.shard(x, shape).unwrap()),
                        }
                    })
                    .collect();
                let outs = ReferenceExecutor::run(spmd, &local, step).unwrap_or_else(|e| panic!("{}: {e}", what()));
                outs.iter()
                    .zip(&global.outputs)
                    .zip(&spmd.out_specs)
                    .map(|((t, v), spec)| {
                        Tensor::F32(sharding(&mesh, spec).unshard(t.f32(), global.shape(*v)).unwrap())
                    })
                    .collect()
            });
            for (k, (a, b)) in losses.iter().zip(&want_losses).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5,
                    "{}{how}: loss {k}: {a} vs one device {b}",
                    what()
                );
            }
            for (i, (p, q)) in state.iter().zip(&want_state).enumerate() {
                let worst = p.iter().zip(q).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                let name = global.info(global.inputs[i].0).name.clone().unwrap_or_default();
                assert!(
                    worst <= 1e-5,
                    "{}{how}: `{name}` differs by {worst} from one device",
                    what()
                );
            }
        }
    }
}

/// Token ids resharded between dims (an all-to-all of a u32 array) on the GPU as on the CPU.
#[test]
fn resharded_token_ids_on_the_gpu_match_the_reference() {
    let ctx = shardlab_tests::gpu_or_skip!();
    let cfg = config();
    let data = Dataset::new(DataSource::Formula, &cfg, 0).unwrap();
    let mesh = Mesh::parse("dp=2,tp=2").unwrap();
    let global = train_step_program(&cfg, Optimizer::Sgd { lr: 0.1 }, RngLayout::Partitionable)
        .unwrap()
        .program;
    let in_specs: Vec<PartitionSpec> = global
        .inputs
        .iter()
        .map(|(_, role)| match role {
            Role::Tokens => PartitionSpec::from_axes(&[Some("tp"), None]),
            Role::Targets => PartitionSpec::from_axes(&[None, Some("tp")]),
            _ => PartitionSpec::replicated(),
        })
        .collect();
    let out_specs = vec![Some(PartitionSpec::replicated()); global.outputs.len()];
    let auto = jit(&global, &mesh, &in_specs, &out_specs).unwrap();
    assert!(auto.count("all_to_all") > 0, "{}", auto.report());
    let prog = auto.program;
    let state = init_params(&cfg, Init::Formula);
    let local: Vec<Tensor> = step_inputs(&global, &state, &data, 0)
        .iter()
        .zip(&global.inputs)
        .zip(&in_specs)
        .map(|((t, (v, _)), spec)| {
            let (s, shape) = (sharding(&mesh, spec), global.shape(*v));
            match t {
                Tensor::F32(x) => Tensor::F32(s.shard(x, shape).unwrap()),
                Tensor::U32(x) => Tensor::U32(s.shard(x, shape).unwrap()),
            }
        })
        .collect();
    let want = ReferenceExecutor::run(&prog, &local, 1).unwrap();
    let got = pollster::block_on(async {
        let exec = shardlab::exec::GpuExecutor::new(ctx, prog.clone()).await.unwrap();
        for (i, t) in local.iter().enumerate() {
            exec.write_input(ctx, i, t).unwrap();
        }
        exec.set_step(ctx, 1).unwrap();
        exec.submit(ctx);
        let mut outs = vec![];
        for k in 0..prog.outputs.len() {
            outs.push(exec.read_output(ctx, k).await.unwrap());
        }
        outs
    });
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        shardlab_tests::assert_close(&format!("output {k}"), g.f32(), w.f32(), 1e-5, 1e-4);
    }
}
