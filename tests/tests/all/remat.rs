//! Rematerialization (`--remat`, `jax.checkpoint` per block): the backward recomputes what the
//! policy does not save, so losses and parameters are bit-identical to remat off in every mode
//! and strategy; what is held between the forward and the backward pass is each block's input
//! (`nothing_saveable`), plus the weight matmuls' outputs it recomputes from
//! (`dots_with_no_batch_dims_saveable`),
//! in closed form and as JAX itself saves them; the recomputed ops are marked in the program.
use shardlab::exec::{Backend, Parallel, TrainerOptions};
use shardlab::ir::{Program, RngLayout};
use shardlab::model::{GptConfig, Init, Optimizer, Remat};
use shardlab::plan::{build, DropoutKey, MemoryPlan, Strategy};
use shardlab::sharding::Mesh;

fn config(remat: Remat, dropout: f32) -> GptConfig {
    GptConfig {
        layers: 2,
        d_model: 32,
        heads: 4,
        seq: 8,
        batch: 4,
        vocab: 32,
        tied: false,
        dropout,
        attention: Default::default(),
        remat,
        precision: Default::default(),
        moe: None,
    }
}

fn options(remat: Remat, parallel: Parallel, rng_layout: RngLayout) -> TrainerOptions {
    TrainerOptions {
        init: Init::Random { seed: 5 },
        rng_layout,
        ..TrainerOptions::new(config(remat, 0.1), parallel)
    }
}

fn remat_is_bit_identical(backend: Backend) {
    for (what, parallel) in shardlab_tests::every_mode(DropoutKey::FoldIn) {
        // The original layout where automatic mode makes (and, recomputing, remakes) the
        // global bits; partitionable elsewhere.
        let layout = match parallel {
            Parallel::Auto { .. } => RngLayout::Original,
            _ => RngLayout::Partitionable,
        };
        let run = |remat| shardlab_tests::train_steps(&backend, options(remat, parallel.clone(), layout), 3);
        let (losses, params) = run(Remat::None);
        for remat in [Remat::Full, Remat::Dots] {
            let (l, p) = run(remat);
            assert_eq!(l, losses, "{what}, remat {}: losses", remat.name());
            assert!(p == params, "{what}, remat {}: parameters differ", remat.name());
        }
    }
}

#[test]
fn remat_trains_bit_identically_to_none_in_every_mode_on_the_reference_executor() {
    remat_is_bit_identical(Backend::Reference);
}

#[test]
fn remat_trains_bit_identically_to_none_in_every_mode_on_the_gpu() {
    if shardlab_tests::gpu().is_none() {
        return;
    }
    remat_is_bit_identical(Backend::Gpu(std::sync::Arc::new(
        shardlab::gpu::GpuContext::new_blocking().unwrap(),
    )));
}

/// The shapes of the values instructions `made` make and the backward pass (from
/// `forward_end`) reads: what is held from the forward to the backward, in instruction order.
fn held(program: &Program, forward_end: usize, made: std::ops::Range<usize>) -> Vec<Vec<usize>> {
    let read_later: std::collections::HashSet<_> = program.instrs[forward_end..]
        .iter()
        .flat_map(|ins| ins.inputs.iter().copied())
        .collect();
    program.instrs[made]
        .iter()
        .flat_map(|ins| ins.outputs.iter().copied())
        .filter(|v| read_later.contains(v))
        .map(|v| program.shape(v).to_vec())
        .collect()
}

fn single_step(cfg: GptConfig) -> shardlab::model::TrainStep {
    let opts = shardlab_tests::formula_options(cfg, Optimizer::Sgd { lr: 0.1 }, Parallel::None);
    build(&opts).unwrap().step
}

#[test]
fn the_held_residuals_are_each_blocks_input_or_also_its_matmuls_in_closed_form() {
    for dropout in [0.0, 0.1] {
        let cfg = config(Remat::Full, dropout);
        let (l, b, t, d, v) = (cfg.layers, cfg.batch, cfg.seq, cfg.d_model, cfg.vocab);
        let bytes = |remat| {
            let step = single_step(GptConfig { remat, ..cfg.clone() });
            let held: usize = held(&step.program, step.forward_end, 0..step.forward_end)
                .iter()
                .map(|s| s.iter().product::<usize>())
                .sum();
            4 * held
        };
        // Outside the blocks: the final layer norm's input, row statistics and output, and the
        // logits. Each block's input (x0, then every block's output) is held under both
        // policies; dots adds the outputs of w_qkv, w_proj and w_fc. w_out's is saveable too,
        // but only the block's output is made from it, and that is never recomputed: JAX does
        // not hold it either.
        let tail = b * t * d + 2 * b * t + b * t * d + b * t * v;
        let full = (l * b * t * d) + tail;
        let dots = full + l * b * t * (3 * d + d + 4 * d);
        assert_eq!(bytes(Remat::Full), 4 * full, "full, dropout {dropout}");
        assert_eq!(bytes(Remat::Dots), 4 * dots, "dots, dropout {dropout}");
        assert!(bytes(Remat::None) > 4 * dots, "none holds more than dots");
    }
}

#[test]
fn the_memory_plan_holds_less_activation_memory_as_remat_recomputes_more() {
    let cfg = GptConfig {
        layers: 4,
        seq: 32,
        batch: 8,
        ..config(Remat::None, 0.1)
    };
    let activations = |remat| {
        let step = single_step(GptConfig { remat, ..cfg.clone() });
        MemoryPlan::of(&step.program).unwrap().activations
    };
    let (none, dots, full) = (
        activations(Remat::None),
        activations(Remat::Dots),
        activations(Remat::Full),
    );
    assert!(none > dots && dots > full, "none {none}, dots {dots}, full {full}");
}

#[test]
fn recomputed_ops_are_marked_in_the_program_text_and_cost_flops() {
    let plain = single_step(config(Remat::None, 0.1));
    let full = single_step(config(Remat::Full, 0.1));
    assert!(plain.program.recomputed.is_empty());
    assert!(!plain.program.to_text().contains("recomputed"));
    // A recomputed value keeps its name: `# h0.ln1, recomputed (jax.checkpoint)`.
    let marked = full.program.to_text().matches("recomputed (jax.checkpoint)").count();
    assert_eq!(marked, full.program.recomputed.len());
    assert!(marked > 0);
    // Every recomputation is in the backward pass, and re-traces a forward op.
    assert!(full
        .program
        .recomputed
        .iter()
        .all(|&i| (full.forward_end..full.backward_end).contains(&i)));
    let flops = |s: &shardlab::model::TrainStep| shardlab::profile::summarize(&s.program).flops;
    assert!(flops(&full) > flops(&plain), "the recompute costs FLOPs");
    // In automatic mode the partitioned recomputations are marked too.
    let auto = build(&options(
        Remat::Full,
        Parallel::Auto {
            par: Strategy::Dp.compose(&Mesh::parse("dp=2").unwrap()).unwrap(),
            specs: vec![],
        },
        RngLayout::Original,
    ))
    .unwrap();
    assert!(auto.step.program.to_text().contains("random_bits") && !auto.step.program.recomputed.is_empty());
}

/// Named `under_jax::` so that `cargo xtask test` runs it in its JAX step, with the venv.
mod under_jax {
    use super::*;

    /// Runs the exported script's own `block` under `jax.checkpoint` with each policy and asks
    /// JAX which residuals it saves beyond the block's arguments.
    const PROBE: &str = r#"
if __name__ == "__main__":
    from jax._src.ad_checkpoint import saved_residuals
    params = init_params()
    lp = {name: jnp.asarray(params[name][0]) for name in BLOCK}  # layer 0 of the stacks
    x = jnp.asarray(np.linspace(-1.0, 1.0, BATCH * SEQ * D_MODEL, dtype=np.float32).reshape(BATCH, SEQ, D_MODEL))
    out = {}
    for policy in ("nothing_saveable", "dots_with_no_batch_dims_saveable"):
        f = jax.checkpoint(block, policy=getattr(jax.checkpoint_policies, policy), static_argnums=(3, 4))
        loss = lambda x, lp, key: jnp.sum(f(x, lp, key, 0, None)[0])  # (x, the load-balancing loss)
        saved = saved_residuals(loss, x, lp, step_key(0))
        out[policy] = [list(a.shape) for a, why in saved if not why.startswith("from the argument")]
    say(out)
"#;

    #[test]
    fn the_policies_hold_what_jax_checkpoint_holds_for_the_exported_block_under_jax() {
        if shardlab_tests::jax_python().is_none() {
            return;
        }
        let cfg = GptConfig {
            layers: 1,
            ..config(Remat::Full, 0.1)
        };
        let opts = shardlab_tests::formula_options(cfg.clone(), Optimizer::Sgd { lr: 0.1 }, Parallel::None);
        let script = shardlab::export::jax_script(&opts, 1).unwrap();
        let guard = "if __name__ == \"__main__\":\n    main()\n";
        assert!(script.contains(guard) && script.contains("jax.checkpoint(one, policy="));
        let stdout = shardlab_tests::run_jax_script("remat-jax", "residuals", &script.replace(guard, PROBE), 1);
        let jax: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        for remat in [Remat::Full, Remat::Dots] {
            let step = single_step(GptConfig { remat, ..cfg.clone() });
            // The block's residuals: what the backward reads of the values made after its
            // input x0 and before its output h0.x_mlp.
            let made_by = |name: &str| {
                step.program
                    .instrs
                    .iter()
                    .position(|ins| step.program.info(ins.outputs[0]).name.as_deref() == Some(name))
                    .unwrap()
            };
            let mut ours = held(&step.program, step.forward_end, made_by("x0") + 1..made_by("h0.x_mlp"));
            let policy = remat.policy().unwrap().jax_name();
            let mut theirs: Vec<Vec<usize>> = serde_json::from_value(jax[policy].clone()).unwrap();
            ours.sort();
            theirs.sort();
            assert_eq!(
                ours,
                theirs,
                "remat {}: shardlab holds {ours:?}, JAX {theirs:?}",
                remat.name()
            );
        }
    }
}
