//! The all-reduce combiner: independent psums over the same axes become one (variadic) psum
//! that counts and pays its latency once, and training is unchanged by it.
use shardlab::autodiff::grad;
use shardlab::exec::{Backend, GpuExecutor, Parallel, ReferenceExecutor, Tensor, Trainer, TrainerOptions};
use shardlab::ir::{Builder, DType, Op, Program, RngLayout, Role, ValueId};
use shardlab::model::{DataSource, GptConfig, Init, Optimizer};
use shardlab::partition::{check_out_specs, combine_all_reduces, combine_all_reduces_mapped, combine_auto_program};
use shardlab::plan::{auto_train_step, combine_train_step, shard_map_train_step, DropoutKey, Strategy};
use shardlab::profile::{predict, summarize, tpu_v4, Placement};
use shardlab::sharding::Mesh;
use shardlab_tests::rand_vec;

fn config() -> GptConfig {
    GptConfig {
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
    }
}

const SGD: Optimizer = Optimizer::Sgd { lr: 0.1 };

fn all_reduces(prog: &Program) -> (usize, usize, u64) {
    let t = summarize(prog).collective_totals()["all-reduce"];
    (t.count, t.operands, t.bytes)
}

fn psums(prog: &Program) -> usize {
    prog.instrs.iter().filter(|i| matches!(i.op, Op::Psum { .. })).count()
}

/// Feeds every input of a per-device program deterministic values (`[device, local...]`).
fn feed(prog: &Program) -> Vec<Tensor> {
    let devices = prog.devices();
    prog.inputs
        .iter()
        .enumerate()
        .map(|(k, (v, _))| Tensor::F32(rand_vec(devices * prog.info(*v).numel(), 7 + k as u32)))
        .collect()
}

fn assert_same_outputs(what: &str, a: &[Tensor], b: &[Tensor]) {
    assert_eq!(a.len(), b.len(), "{what}: output count");
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.f32(), y.f32(), "{what}: output {k} differs");
    }
}

#[test]
fn shard_map_dp_gradients_and_loss_become_one_all_reduce() {
    let mesh = Mesh::parse("dp=4").unwrap();
    let step = shard_map_train_step(
        &config(),
        SGD,
        RngLayout::Partitionable,
        &Strategy::Dp.compose(&mesh).unwrap(),
        DropoutKey::Same,
    )
    .unwrap();
    let combined = combine_train_step(&step);
    let (count, operands, bytes) = all_reduces(&step.program);
    let (ccount, coperands, cbytes) = all_reduces(&combined.program);
    let params = shardlab::model::param_specs(&config()).len();
    // One all-reduce per gradient and one for the loss.
    assert_eq!((count, operands), (params + 1, params + 1));
    assert_eq!(
        ccount, 1,
        "every psum over 'dp' is independent until the update:\n{}",
        combined.program
    );
    assert_eq!(coperands, operands, "combining keeps every array");
    assert_eq!(cbytes, bytes, "the combined all-reduce moves the sum of its operands");
    assert_eq!(combined.program.instrs.len(), step.program.instrs.len() - params);
    // The combined psum ends the backward pass; the loss's pmean and the updates follow it.
    let at = combined
        .program
        .instrs
        .iter()
        .position(|i| matches!(i.op, Op::Psum { .. }))
        .unwrap();
    assert!(combined.forward_end <= at && at < combined.backward_end);
    assert!(combined.program.instrs[combined.backward_end..]
        .iter()
        .all(|i| matches!(i.op, Op::SgdUpdate { .. })));
    check_out_specs(&combined.program).unwrap();
}

#[test]
fn combined_all_reduce_counts_once_with_the_summed_bytes_and_pays_latency_once() {
    let mesh = Mesh::parse("dp=4").unwrap();
    let step = shard_map_train_step(
        &config(),
        SGD,
        RngLayout::Partitionable,
        &Strategy::Dp.compose(&mesh).unwrap(),
        DropoutKey::Same,
    )
    .unwrap();
    let combined = combine_all_reduces(&step.program);
    let one = summarize(&combined);
    let uses: Vec<_> = one
        .collectives
        .iter()
        .filter(|c| c.kind.hlo_name() == "all-reduce")
        .collect();
    assert_eq!(uses.len(), 1);
    let ins = &combined.instrs[uses[0].instr];
    let want: u64 = ins.inputs.iter().map(|v| 4 * combined.info(*v).numel() as u64).sum();
    assert_eq!(uses[0].bytes, want);
    assert_eq!(uses[0].operands, ins.inputs.len());
    assert_eq!(uses[0].group, 4);

    // Priced on real devices, the combined all-reduce moves the same bytes over the same
    // links but pays its per-hop latency once instead of once per psum.
    let device = tpu_v4();
    let all_reduce = |p: &Program| predict(p, &device, Placement::Real).collectives["all-reduce"];
    let (before, after) = (all_reduce(&step.program), all_reduce(&combined));
    let n = psums(&step.program) as f64;
    assert_eq!((before.count, after.count), (psums(&step.program), 1));
    assert_eq!(before.bytes, after.bytes, "the same bytes move");
    assert!((before.hops - n * after.hops).abs() < 1e-9, "{before:?} vs {after:?}");
    assert!(after.ms < before.ms, "combined {} ms vs {} ms", after.ms, before.ms);
}

#[test]
fn combined_psum_prints_as_one_all_reduce_with_several_operands() {
    let mesh = Mesh::parse("dp=4").unwrap();
    let step = shard_map_train_step(
        &config(),
        SGD,
        RngLayout::Partitionable,
        &Strategy::Dp.compose(&mesh).unwrap(),
        DropoutKey::Same,
    )
    .unwrap();
    let text = combine_all_reduces(&step.program).to_text();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("= psum(")).collect();
    assert_eq!(lines.len(), 1, "{text}");
    let args = lines[0].split("psum(").nth(1).unwrap().split(')').next().unwrap();
    assert_eq!(
        args.split(", ").count(),
        shardlab::model::param_specs(&config()).len() + 1,
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains("axes='dp'") && lines[0].contains("dwte"),
        "{}",
        lines[0]
    );
}

/// a, b, c, x -> psums over 'dp' and 'tp' with readers in between.
fn mixed_program() -> Program {
    let mut b = Builder::with_mesh(Mesh::parse("dp=2,tp=2").unwrap());
    let a = b.input("a", &[3], DType::F32, Role::Other);
    let bb = b.input("b", &[5], DType::F32, Role::Other);
    let c = b.input("c", &[3], DType::F32, Role::Other);
    let x = b.input("x", &[5], DType::F32, Role::Other);
    let pa = b.psum(a, &["dp"]); // 0: a 'dp' group
    let pb = b.psum(bb, &["dp"]); // 1: joins it
    let s = b.add(x, x); // 2: reads nothing pending: stays first
    let pc = b.psum(c, &["tp"]); // 3: a 'tp' group beside the 'dp' one
    let pd = b.psum(pa, &["tp"]); // 4: reads the 'dp' group: emits it, then joins the 'tp' one
    let pe = b.psum(pd, &["tp"]); // 5: reads the 'tp' group: emits it, starts another
    let y = b.add(pc, pe); // 6: reads pending pe: held back until the end
    let z = b.add(pb, s); // 7: computable: goes ahead of the held one
    b.output(y);
    b.output(z);
    b.finish().unwrap()
}

#[test]
fn combiner_holds_readers_back_and_splits_groups_only_at_dependent_psums() {
    let prog = mixed_program();
    let (combined, position) = combine_all_reduces_mapped(&prog);
    let ops: Vec<(String, usize)> = combined
        .instrs
        .iter()
        .map(|i| (format!("{} {}", i.op.name(), i.op.attrs()), i.inputs.len()))
        .collect();
    let want = [
        ("add ".to_string(), 2),
        ("psum axes='dp'".to_string(), 2),
        ("psum axes='tp'".to_string(), 2),
        ("add ".to_string(), 2),
        ("psum axes='tp'".to_string(), 1),
        ("add ".to_string(), 2),
    ];
    assert_eq!(ops, want, "\n{combined}");
    assert_eq!(position, vec![1, 1, 0, 2, 2, 4, 5, 3]);
    assert_eq!(
        (combined.values.len(), combined.outputs.clone()),
        (prog.values.len(), prog.outputs.clone())
    );
    let inputs = feed(&prog);
    let want = ReferenceExecutor::run(&prog, &inputs, 1).unwrap();
    let got = ReferenceExecutor::run(&combined, &inputs, 1).unwrap();
    assert_same_outputs("mixed program", &got, &want);
}

/// The same loss with its psums separate or combined, and its gradients.
fn psum_grad_program(combined: bool) -> Program {
    let mut b = Builder::with_mesh(Mesh::parse("dp=2").unwrap());
    let a = b.input("a", &[3], DType::F32, Role::Other);
    let c = b.input("c", &[4], DType::F32, Role::Other);
    let (pa, pc) = if combined {
        let p = b.psum_many(&[a, c], &["dp"]);
        (p[0], p[1])
    } else {
        (b.psum(a, &["dp"]), b.psum(c, &["dp"]))
    };
    let sq = b.mul(pa, pa);
    let la = b.sum(sq, &[0]);
    let lc = b.sum(pc, &[0]);
    let loss = b.add(la, lc);
    let g: Vec<ValueId> = grad(&mut b, loss, &[a, c]).unwrap();
    b.output(loss);
    b.output(g[0]);
    b.output(g[1]);
    b.finish().unwrap()
}

#[test]
fn variadic_psum_differentiates_per_operand_like_separate_psums() {
    let (sep, comb) = (psum_grad_program(false), psum_grad_program(true));
    assert_eq!(psums(&comb), 1);
    let inputs = feed(&sep);
    let want = ReferenceExecutor::run(&sep, &inputs, 1).unwrap();
    let got = ReferenceExecutor::run(&comb, &inputs, 1).unwrap();
    assert_same_outputs("psum gradients", &got, &want);
    // d(sum pc)/dc = 1 on every device: psum's transpose is the identity per operand.
    assert!(got[2].f32().iter().all(|&g| g == 1.0));
}

#[test]
fn variadic_psum_keeps_each_operands_varying_axes() {
    // On dp=2,tp=2, a dp_tp step psums over 'dp' gradients that vary along 'tp' and ones that
    // do not; combined, each output must still be replicated where its out_spec says.
    let mesh = Mesh::parse("dp=2,tp=2").unwrap();
    let step = shard_map_train_step(
        &config(),
        SGD,
        RngLayout::Partitionable,
        &Strategy::DpTp.compose(&mesh).unwrap(),
        DropoutKey::Same,
    )
    .unwrap();
    let combined = combine_train_step(&step);
    assert!(psums(&combined.program) < psums(&step.program));
    check_out_specs(&combined.program).unwrap();
}

fn options(parallel: Parallel, combine: bool) -> TrainerOptions {
    TrainerOptions {
        config: config(),
        optimizer: SGD,
        init: Init::Formula,
        data: DataSource::Formula,
        seed: 0,
        rng_layout: RngLayout::Partitionable,
        parallel,
        combine_all_reduces: combine,
        microbatches: 1,
        cp_order: Default::default(),
        schedule: Default::default(),
        virtual_stages: 1,
        stage_layers: vec![],
    }
}

fn run(opts: TrainerOptions) -> (Vec<f32>, Vec<Vec<f32>>, Program) {
    pollster::block_on(async {
        let mut t = Trainer::new(Backend::Reference, opts).await.unwrap();
        let mut losses = vec![];
        for _ in 0..3 {
            losses.push(t.step().await.unwrap().loss);
        }
        (losses, t.params().await.unwrap(), t.program().clone())
    })
}

#[test]
fn training_with_combined_all_reduces_matches_training_without() {
    let mesh = |m: &str| Mesh::parse(m).unwrap();
    let cases = [
        (
            "shard_map dp",
            Parallel::ShardMap {
                par: Strategy::Dp.compose(&mesh("dp=4")).unwrap(),
                dropout_key: DropoutKey::Same,
            },
        ),
        (
            "shard_map dp_tp",
            Parallel::ShardMap {
                par: Strategy::DpTp.compose(&mesh("dp=2,tp=2")).unwrap(),
                dropout_key: DropoutKey::Same,
            },
        ),
        (
            "auto dp",
            Parallel::Auto {
                par: Strategy::Dp.compose(&mesh("dp=4")).unwrap(),
                specs: vec![],
            },
        ),
        (
            "auto fsdp",
            Parallel::Auto {
                par: Strategy::Fsdp.compose(&mesh("dp=4")).unwrap(),
                specs: vec![],
            },
        ),
    ];
    for (what, parallel) in cases {
        let (want_losses, want_params, plain) = run(options(parallel.clone(), false));
        let (losses, params, combined) = run(options(parallel, true));
        assert!(psums(&combined) <= psums(&plain), "{what}");
        assert_eq!(
            all_reduces(&combined).1,
            all_reduces(&plain).1,
            "{what}: the same arrays are all-reduced"
        );
        for (k, (a, b)) in losses.iter().zip(&want_losses).enumerate() {
            assert!((a - b).abs() <= 1e-6, "{what}: loss {k}: {a} combined vs {b}");
        }
        for (i, (p, q)) in params.iter().zip(&want_params).enumerate() {
            let worst = p.iter().zip(q).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-6, "{what}: param {i} differs by {worst} with combining");
        }
    }
}

#[test]
fn combining_an_auto_program_remaps_its_inserted_ops() {
    let mesh = Mesh::parse("dp=4").unwrap();
    let (_, auto) = auto_train_step(
        &config(),
        SGD,
        RngLayout::Partitionable,
        &Strategy::Dp.compose(&mesh).unwrap(),
    )
    .unwrap();
    let combined = combine_auto_program(&auto);
    // jit puts each gradient's all-reduce right before its update; the combiner holds the
    // updates back, so all of them (and the loss's) become one.
    let params = shardlab::model::param_specs(&config()).len();
    assert_eq!(all_reduces(&auto.program).0, params + 1);
    assert_eq!(all_reduces(&combined.program).0, 1, "\n{}", combined.program);
    assert_eq!(all_reduces(&combined.program).1, all_reduces(&auto.program).1);
    for r in combined.inserted.iter().filter(|r| r.op == "psum") {
        let ins = &combined.program.instrs[r.instr];
        assert!(
            matches!(ins.op, Op::Psum { .. }),
            "record {r:?} points at {}",
            ins.op.name()
        );
    }
    assert_eq!(combined.instr_starts.len(), auto.instr_starts.len());
    assert!(combined.instr_starts.windows(2).all(|w| w[0] <= w[1]));
}

#[test]
fn combined_psum_on_the_gpu_matches_the_reference() {
    let ctx = shardlab_tests::gpu_or_skip!();
    let prog = combine_all_reduces(&mixed_program());
    let inputs = feed(&prog);
    let want = ReferenceExecutor::run(&prog, &inputs, 1).unwrap();
    let got = pollster::block_on(async {
        let exec = GpuExecutor::new(ctx, prog.clone()).await.unwrap();
        for (i, t) in inputs.iter().enumerate() {
            exec.write_input(ctx, i, t).unwrap();
        }
        exec.submit(ctx);
        let mut outs = vec![];
        for k in 0..prog.outputs.len() {
            outs.push(exec.read_output(ctx, k).await.unwrap());
        }
        outs
    });
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        shardlab_tests::assert_close(&format!("output {k}"), g.f32(), w.f32(), 1e-6, 1e-6);
    }
}
