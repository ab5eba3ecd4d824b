//! `shardlab export jax`: the exported script runs under JAX (8 simulated CPU devices) and its
//! losses match shardlab's reference executor; the script text has the partitioning written
//! out (NamedSharding / shard_map with explicit collectives).
use std::process::Command;

use serde_json::Value;
use shardlab::exec::{Backend, Parallel, Trainer, TrainerOptions};
use shardlab::export::jax_script;
use shardlab::ir::{Precision, RngLayout};
use shardlab::model::{Capacity, DataSource, GptConfig, Init, Moe, Optimizer, Remat};
use shardlab::plan::{AxisKind, DropoutKey, Parallelism, Strategy, Zero};
use shardlab::sharding::{Mesh, PartitionSpec};

const STEPS: u64 = 5;

fn golden() -> Value {
    let path = format!("{}/fixtures/golden_tiny.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// tests/fixtures/golden_tiny.json's experiment: formula init and data, SGD lr 0.1.
fn golden_options(parallel: Parallel) -> TrainerOptions {
    let g = golden();
    let c = &g["config"];
    let u = |k: &str| c[k].as_u64().unwrap() as usize;
    assert_eq!(g["optimizer"]["name"], "sgd");
    TrainerOptions {
        config: GptConfig {
            layers: u("layers"),
            d_model: u("d_model"),
            heads: u("heads"),
            seq: u("seq"),
            batch: u("batch"),
            vocab: u("vocab"),
            tied: c["tied"].as_bool().unwrap(),
            dropout: 0.0,
            attention: Default::default(),
            remat: Default::default(),
            precision: Default::default(),
            moe: None,
        },
        optimizer: Optimizer::Sgd {
            lr: g["optimizer"]["lr"].as_f64().unwrap() as f32,
        },
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

/// The golden experiment with the batch raised to 8, so that it splits over 8 devices.
fn golden_batch8(parallel: Parallel) -> TrainerOptions {
    let mut o = golden_options(parallel);
    o.config.batch = 8;
    o
}

fn mesh(text: &str) -> Mesh {
    Mesh::parse(text).unwrap()
}

fn shard_map(strategy: Strategy, m: &str) -> Parallel {
    Parallel::ShardMap {
        par: strategy.compose(&mesh(m)).unwrap(),
        dropout_key: DropoutKey::Same,
    }
}

fn auto(strategy: Strategy, m: &str) -> Parallel {
    Parallel::Auto {
        par: strategy.compose(&mesh(m)).unwrap(),
        specs: vec![],
    }
}

fn explicit(strategy: Strategy, m: &str) -> Parallel {
    Parallel::Explicit {
        par: strategy.compose(&mesh(m)).unwrap(),
        axis_types: vec![],
        specs: vec![],
    }
}

/// shardlab's losses on the reference executor: before each update, then the final eval.
fn shardlab_losses(opts: &TrainerOptions, steps: u64) -> Vec<f64> {
    pollster::block_on(async {
        let mut t = Trainer::new(Backend::Reference, opts.clone()).await.unwrap();
        let mut losses = vec![];
        for _ in 0..steps {
            losses.push(t.step().await.unwrap().loss as f64);
        }
        losses.push(t.eval_loss().await.unwrap() as f64);
        losses
    })
}

/// Returns from the test when JAX is missing and `SHARDLAB_ALLOW_NO_JAX=1`; fails it when missing otherwise.
macro_rules! jax_or_skip {
    () => {
        if shardlab_tests::jax_python().is_none() {
            return;
        }
    };
}

fn write_script(name: &str, script: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("shardlab-export-jax-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.py"));
    std::fs::write(&path, script).unwrap();
    path
}

/// Runs the script on 8 simulated CPU devices; returns its step losses then its final loss,
/// after checking the JSON lines' shape.
fn run_script(name: &str, script: &str, steps: u64) -> Vec<f64> {
    run_script_done(name, script, steps).0
}

/// [`run_script`]'s losses, and the done line.
fn run_script_done(name: &str, script: &str, steps: u64) -> (Vec<f64>, Value) {
    let stdout = shardlab_tests::run_jax_script("export-jax", name, script, 8);
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: `{l}` is not JSON: {e}")))
        .collect();
    assert_eq!(
        lines.len() as u64,
        steps + 1,
        "{name}: one line per step and a done line:\n{stdout}"
    );
    let mut losses = vec![];
    for (k, line) in lines[..steps as usize].iter().enumerate() {
        assert_eq!(line["step"].as_u64(), Some(k as u64), "{name}: {line}");
        losses.push(
            line["loss"]
                .as_f64()
                .unwrap_or_else(|| panic!("{name}: no loss in {line}")),
        );
    }
    let done = lines[steps as usize].clone();
    assert_eq!(done["done"], true, "{name}: {done}");
    assert_eq!(done["steps"].as_u64(), Some(steps), "{name}: {done}");
    losses.push(done["final_loss"].as_f64().unwrap());
    (losses, done)
}

#[track_caller]
fn assert_losses_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "{what}: loss {k} is {g} under JAX but {w} in shardlab (|diff| {:.2e} > {tol:e})\nJAX:      {got:?}\nshardlab: {want:?}",
            (g - w).abs()
        );
    }
}

fn script_matches_shardlab(name: &str, opts: &TrainerOptions) -> Vec<f64> {
    let script = jax_script(opts, STEPS).unwrap();
    let jax = run_script(name, &script, STEPS);
    assert_losses_close(name, &jax, &shardlab_losses(opts, STEPS), 1e-4);
    jax
}

#[test]
fn exported_single_device_script_reproduces_the_golden_losses_under_jax() {
    jax_or_skip!();
    let jax = script_matches_shardlab("single", &golden_options(Parallel::None));
    // losses[k] of the fixture is the loss after k updates: the steps' losses, then the final one.
    let want: Vec<f64> = golden()["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_losses_close("single vs golden_tiny.json", &jax, &want, 1e-4);
}

/// Pipeline parallelism's shard_map body (stacked stage weights, shardlab's pass table in
/// lockstep steps of ppermutes) over 4 stages under 1F1B, a pullback per backward slot, with
/// dropout (the masks of the one-device run with the same microbatches) and AdamW. (GPipe and
/// pipelines composed with other axes run in `cluster::`.)
#[test]
fn exported_pipeline_script_with_dropout_matches_shardlab_under_1f1b_over_four_stages() {
    jax_or_skip!();
    let mut opts = golden_batch8(shard_map(Strategy::Pp, "pp=4"));
    opts.config.layers = 4;
    opts.config.dropout = 0.1;
    opts.microbatches = 2;
    opts.schedule = shardlab::plan::Schedule::OneFOneB;
    opts.optimizer = Optimizer::AdamW { lr: 1e-2 };
    opts.init = Init::Random { seed: 5 };
    opts.rng_layout = RngLayout::Original;
    opts.seed = 3;
    script_matches_shardlab("shard_map_pp4_1f1b", &opts);
}

/// The pipelines `shardlab train` runs beyond one equal run of blocks per stage, each exported
/// with shardlab's own pass table: interleaved 1F1B over two chunks a stage (layers 0 and 2 on
/// stage 0), GPipe's circular form, and ZB-H1 over uneven stages (1 block and 3, the lighter
/// stage's rows padded); with dropout (each block's masks its own layer's) and without. Under
/// SGD, whose update is the gradient itself (AdamW's first updates are nearly its sign, which a
/// misscaled gradient keeps).
#[test]
fn exported_pipeline_scripts_match_shardlab_with_virtual_and_uneven_stages_and_zb_h1() {
    jax_or_skip!();
    use shardlab::plan::Schedule;
    // (name, schedule, virtual stages, blocks per stage, microbatches, dropout)
    type Case<'a> = (&'a str, Schedule, usize, &'a [usize], usize, f32);
    let cases: [Case; 3] = [
        // One count per virtual stage, the first chunk empty.
        ("pp2_1f1b_v2_chunks", Schedule::OneFOneB, 2, &[0, 2, 1, 1], 2, 0.1),
        ("pp2_gpipe_v2", Schedule::Gpipe, 2, &[], 2, 0.0),
        ("pp2_zb_h1_1_3", Schedule::ZbH1, 1, &[1, 3], 4, 0.1),
    ];
    for (name, schedule, v, stage_layers, m, dropout) in cases {
        let mut opts = golden_batch8(shard_map(Strategy::Pp, "pp=2"));
        opts.config.layers = 4;
        opts.config.dropout = dropout;
        opts.microbatches = m;
        opts.schedule = schedule;
        opts.virtual_stages = v;
        opts.stage_layers = stage_layers.to_vec();
        opts.init = Init::Random { seed: 5 };
        opts.seed = 3;
        script_matches_shardlab(name, &opts);
    }
}

/// The long-sequence strategies: ring attention under a custom VJP in shard_map mode
/// (contiguous and zig-zag), K and V gathered by XLA in automatic mode, sequence parallelism in
/// both, with dropout (every mask the one-device run's block) in both RNG layouts; and with
/// gradient accumulation, each microbatch's masks (its key folded in) the one-device run's
/// blocks, ring attention's among them.
#[test]
fn exported_long_sequence_scripts_with_dropout_match_shardlab_in_both_modes_and_with_microbatches() {
    jax_or_skip!();
    use shardlab::ir::CpOrder;
    for (name, parallel, order, layout, k) in [
        (
            "auto_tp_sp",
            auto(Strategy::TpSp, "tp=4"),
            CpOrder::Contiguous,
            RngLayout::Original,
            1,
        ),
        (
            "shard_map_tp_sp",
            shard_map(Strategy::TpSp, "tp=2"),
            CpOrder::Contiguous,
            RngLayout::Original,
            1,
        ),
        (
            "shard_map_dp_cp_zigzag_mb2",
            shard_map(Strategy::DpCp, "dp=2,cp=2"),
            CpOrder::Zigzag,
            RngLayout::Original,
            2,
        ),
        (
            "shard_map_cp2_mb2",
            shard_map(Strategy::Cp, "cp=2"),
            CpOrder::Contiguous,
            RngLayout::Partitionable,
            2,
        ),
        (
            "auto_tp_sp_mb2",
            auto(Strategy::TpSp, "tp=2"),
            CpOrder::Contiguous,
            RngLayout::Original,
            2,
        ),
    ] {
        let mut opts = golden_batch8(parallel);
        opts.config.dropout = 0.1;
        opts.microbatches = k;
        opts.cp_order = order;
        opts.rng_layout = layout;
        opts.seed = 3;
        script_matches_shardlab(name, &opts);
    }
}

/// Zig-zag under jit, as MaxText runs it: the script reorders the tokens, targets and wpe's
/// rows inside the step (jit's contiguous blocks over "cp" are then zig-zag's chunks), puts
/// K and V back in order, and masks jax.nn.dot_product_attention by the queries' positions;
/// its losses are shardlab's (and so the one-device run's).
#[test]
fn exported_zigzag_scripts_reorder_the_sequence_inside_jit_and_match_shardlab_in_both_modes() {
    jax_or_skip!();
    // Automatic mode pins the reordered tokens; explicit mode's types carry their split, the
    // concatenation of the chunks typed as JAX types it.
    for (name, parallel, pin) in [
        (
            "auto_dp_cp_zigzag",
            auto(Strategy::DpCp, "dp=2,cp=2"),
            "\"tokens.zigzag\": P(\"dp\", \"cp\")",
        ),
        (
            "explicit_dp_cp_zigzag",
            explicit(Strategy::DpCp, "dp=2,cp=2"),
            "MODE = \"explicit\"",
        ),
    ] {
        let mut opts = golden_options(parallel);
        opts.cp_order = shardlab::ir::CpOrder::Zigzag;
        let script = jax_script(&opts, STEPS).unwrap();
        for needle in [
            "ZIGZAG = 2",
            "tokens, targets = (constrain(reorder(x, 1), f\"{n}.zigzag\")",
            "k, v = reorder(k, 2, back=True), reorder(v, 2, back=True)",
            "mask=seen[None, None]",
            pin,
        ] {
            assert!(script.contains(needle), "{name}: the script lacks {needle}");
        }
        let jax = run_script(name, &script, STEPS);
        assert_losses_close(name, &jax, &shardlab_losses(&opts, STEPS), 1e-5);
    }
}

/// With dropout, which jax.nn.dot_product_attention lacks, the script's fused attention is
/// FlashAttention's tiles, each tile pair drawing its block of the mask: over several tiles
/// of queries and keys it matches shardlab in both modes, and the compiled step holds no
/// (T, T) array. Its temporaries stay within 2.5x the plan's activations and gradients,
/// where the whole sequence's scores, probabilities and bits take 14x (--attention unfused).
#[test]
fn exported_fused_attention_with_dropout_runs_in_tiles_and_holds_no_score_matrix() {
    jax_or_skip!();
    for (name, parallel) in [
        ("auto_dp_tiles", auto(Strategy::Dp, "dp=2")),
        ("shard_map_tp_tiles", shard_map(Strategy::Tp, "tp=2")),
    ] {
        let mut opts = golden_options(parallel);
        opts.config.seq = 512; // four tiles of 128 rows
        opts.config.dropout = 0.1;
        opts.seed = 3;
        let script = jax_script(&opts, STEPS).unwrap();
        assert!(
            script.contains("return tiled_attention(q, k, v, key, layer, split)"),
            "{name}"
        );
        let (jax, done) = run_script_done(name, &script, STEPS);
        assert_losses_close(name, &jax, &shardlab_losses(&opts, STEPS), 1e-4);
        let temp = done["memory_per_device"]["temp_bytes"].as_f64().unwrap();
        let program = shardlab::plan::build(&opts).unwrap().step.program;
        let plan = shardlab::plan::MemoryPlan::of(&program).unwrap();
        let planned = (plan.activations + plan.gradients) as f64;
        assert!(
            temp <= 2.5 * planned,
            "{name}: the compiled step's temporaries are {temp} bytes, {:.1}x the plan's {planned}",
            temp / planned
        );
    }
}

#[test]
fn long_sequence_scripts_write_ring_attention_and_sequence_parallelism() {
    use shardlab::ir::CpOrder;
    let mut cp = golden_options(shard_map(Strategy::Cp, "cp=2"));
    cp.cp_order = CpOrder::Zigzag;
    let s = jax_script(&cp, STEPS).unwrap();
    for needle in [
        "CP_AXIS = \"cp\"",
        "CP_ORDER = \"zigzag\"",
        "BATCH_SPEC = TARGETS_SPEC = P()",
        "@jax.custom_vjp",
        "jax.lax.ppermute(x, axis, perm)",
        "jax.lax.cond(kp[0] <= qp[-1], merge, lambda o, lse: (o, lse), *carry)",
        "jax.lax.optimization_barrier((query_tiles_positions(), positions(shift), site))",
        "jax.lax.scan(step, (k, v, o, lse), jnp.arange(1, n))",
        "bits_at(site, (rows, heads, qp, kp), shape)",
        "TOKEN_AXES = BATCH_AXES + SEQ_AXES",
        "SEQ_AXES = (\"cp\",)",
        "MASK_BLOCKS = True",
    ] {
        assert!(s.contains(needle), "the cp script lacks `{needle}`:\n{s}");
    }
    let sp = jax_script(&golden_options(shard_map(Strategy::TpSp, "tp=2")), STEPS).unwrap();
    for needle in [
        "SP = True",
        "BATCH_SPEC = TARGETS_SPEC = P(None, \"tp\")",
        "jax.lax.all_gather(x, split.tp, axis=1, tiled=True)",
        "jax.lax.psum_scatter(y, split.tp, scatter_dimension=1, tiled=True)",
        "linear = jax.checkpoint(linear, policy=jax.checkpoint_policies.nothing_saveable)",
    ] {
        assert!(sp.contains(needle), "the tp_sp script lacks `{needle}`:\n{sp}");
    }
    let auto_sp = jax_script(&golden_options(auto(Strategy::TpSp, "tp=2")), STEPS).unwrap();
    for needle in [
        "\"ln1\": P(),",
        "\"proj\": P(None, \"tp\", None),",
        "\"x0\": P(None, \"tp\", None),",
    ] {
        assert!(
            auto_sp.contains(needle),
            "the auto tp_sp script lacks `{needle}`:\n{auto_sp}"
        );
    }
}

#[test]
fn exported_remat_scripts_write_jax_checkpoint_and_match_shardlab_in_both_modes() {
    jax_or_skip!();
    for (name, parallel, remat) in [
        ("single_remat_full", Parallel::None, Remat::Full),
        ("shard_map_tp_remat_dots", shard_map(Strategy::Tp, "tp=2"), Remat::Dots),
        ("auto_dp_remat_full", auto(Strategy::Dp, "dp=4"), Remat::Full),
    ] {
        let mut opts = golden_batch8(parallel);
        opts.config.dropout = 0.1;
        opts.config.remat = remat;
        opts.seed = 3;
        let script = jax_script(&opts, STEPS).unwrap();
        let policy = remat.policy().unwrap().jax_name();
        assert!(script.contains(&format!("REMAT = \"{policy}\"")), "{name}");
        script_matches_shardlab(name, &opts);
    }
}

#[test]
fn exported_microbatch_scripts_match_shardlab_in_every_mode() {
    jax_or_skip!();
    // golden_batch8 on dp=4: each device's 2 rows split in 2 microbatches of one.
    for (name, parallel, k) in [
        ("single_mb4", Parallel::None, 4),
        ("shard_map_dp4_mb2", shard_map(Strategy::Dp, "dp=4"), 2),
        ("auto_dp4_mb2", auto(Strategy::Dp, "dp=4"), 2),
        ("shard_map_fsdp2_mb2", shard_map(Strategy::Fsdp, "dp=2"), 2),
        ("auto_tp2_mb2", auto(Strategy::Tp, "tp=2"), 2),
    ] {
        let mut opts = golden_batch8(parallel);
        opts.microbatches = k;
        opts.optimizer = Optimizer::AdamW { lr: 1e-2 };
        script_matches_shardlab(name, &opts);
    }
}

#[test]
fn exported_zero_scripts_match_shardlab_in_both_modes() {
    jax_or_skip!();
    for (name, parallel, k) in [
        ("shard_map_zero1_dp4", shard_map(Strategy::Zero1, "dp=4"), 1),
        ("auto_zero1_dp4_mb2", auto(Strategy::Zero1, "dp=4"), 2),
        ("shard_map_zero2_dp4_mb2", shard_map(Strategy::Zero2, "dp=4"), 2),
        ("auto_zero2_dp4", auto(Strategy::Zero2, "dp=4"), 1),
    ] {
        let mut opts = golden_batch8(parallel);
        opts.microbatches = k;
        opts.optimizer = Optimizer::AdamW { lr: 1e-2 };
        script_matches_shardlab(name, &opts);
    }
}

#[test]
fn exported_scripts_with_the_three_memory_levers_together_match_shardlab() {
    jax_or_skip!();
    for (name, parallel, remat) in [
        (
            "shard_map_zero1_mb2_remat_full",
            shard_map(Strategy::Zero1, "dp=4"),
            Remat::Full,
        ),
        ("auto_zero2_mb2_remat_dots", auto(Strategy::Zero2, "dp=4"), Remat::Dots),
    ] {
        let mut opts = golden_batch8(parallel);
        opts.microbatches = 2;
        opts.config.remat = remat;
        opts.optimizer = Optimizer::AdamW { lr: 1e-2 };
        script_matches_shardlab(name, &opts);
    }
}

#[test]
fn zero_and_microbatch_scripts_write_the_loop_the_state_layout_and_the_gather() {
    let mut opts = golden_batch8(shard_map(Strategy::Zero2, "dp=4"));
    opts.microbatches = 2;
    opts.optimizer = Optimizer::AdamW { lr: 1e-2 };
    let s = jax_script(&opts, STEPS).unwrap();
    for needle in [
        "MICROBATCHES = 2",
        "grouped = x.reshape(x.shape[0] // MICROBATCHES, MICROBATCHES, *x.shape[1:])",
        "jax.value_and_grad(loss_of, has_aux=True)",
        "jax.random.fold_in(key, j)",
        "ZERO = 2",
        "\"wte\": ((64, 32), P()),",
        "STATE_LAYOUT = {\n    \"wte\": ((64, 32), P(\"dp\", None)),",
        "jax.lax.all_gather(p, \"dp\", axis=block_dim(n), tiled=True, to=\"invarying\")",
        "jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(\"dp\") * n, n, dim)",
        "jax.lax.psum_scatter(g, \"dp\", scatter_dimension=block_dim(name), tiled=True)",
    ] {
        assert!(s.contains(needle), "the zero2 script lacks `{needle}`:\n{s}");
    }
    let mut opts = golden_batch8(auto(Strategy::Zero1, "dp=4"));
    opts.optimizer = Optimizer::AdamW { lr: 1e-2 };
    let s = jax_script(&opts, STEPS).unwrap();
    for needle in [
        "\"wte\": P(\"dp\", None),",
        "UPDATE_GRAD_SPECS = {\n    \"wte\": P(),",
        "CONSTRAINTS = {}",
        "MICROBATCHES = 1",
    ] {
        assert!(s.contains(needle), "the auto zero1 script lacks `{needle}`:\n{s}");
    }
    opts.parallel = auto(Strategy::Zero2, "dp=4");
    let s = jax_script(&opts, STEPS).unwrap();
    assert!(s.contains("CONSTRAINTS = {\n    \"dwte\": P(\"dp\", None),"), "{s}");
}

/// bf16's relative spacing is 2^-8 (0.39%): a mixed-precision run's losses are held to five
/// spacings of the f32 run's over the first updates (measured: at most 0.52% after 5 SGD
/// updates of the golden experiment, in all three modes).
const BF16_LOSS_TOLERANCE: f64 = 5.0 / 256.0;

/// The f32 losses are shardlab's (which every f32 script matches to 1e-4 above), so each case
/// costs one JAX run. The last case is fused attention with dropout: FlashAttention's tiles,
/// whose skipped tile pairs (jax.lax.cond) must give the dtypes of the computed ones.
#[test]
fn exported_bf16_scripts_compute_in_bfloat16_and_track_the_f32_losses_within_bf16_precision() {
    jax_or_skip!();
    let mut fused_dropout = golden_batch8(explicit(Strategy::Dp, "dp=8"));
    fused_dropout.config.dropout = 0.1;
    fused_dropout.config.attention = shardlab::model::Attention::Fused;
    for (name, f32) in [
        ("single_bf16", golden_batch8(Parallel::None)),
        ("shard_map_dp8_bf16", golden_batch8(shard_map(Strategy::Dp, "dp=8"))),
        ("auto_fsdp4_bf16", golden_batch8(auto(Strategy::Fsdp, "dp=4"))),
        ("explicit_dp8_bf16_fused_dropout", fused_dropout),
    ] {
        let mut bf16 = f32.clone();
        bf16.config.precision = Precision::Bf16;
        let script = jax_script(&bf16, STEPS).unwrap();
        assert!(script.contains("COMPUTE_DTYPE = \"bfloat16\""), "{name}");
        let low = run_script(name, &script, STEPS);
        let full = shardlab_losses(&f32, STEPS);
        for (k, (l, f)) in low.iter().zip(&full).enumerate() {
            assert!(
                (l - f).abs() <= BF16_LOSS_TOLERANCE * f,
                "{name}: loss {k} is {l} in bf16 against {f} in f32\nbf16: {low:?}\nf32:  {full:?}"
            );
        }
        // It does compute in bf16: the losses move off the f32 ones.
        assert!(
            low.iter().zip(&full).any(|(l, f)| (l - f).abs() > 1e-5),
            "{name}: {low:?}"
        );
    }
}

/// `--spec`s on named values: constraints on activations, a gradient and an updated parameter,
/// and targets laid out apart from tokens.
fn auto_with_constraints() -> TrainerOptions {
    let p = PartitionSpec::from_axes;
    golden_batch8(Parallel::Auto {
        par: Strategy::Dp.compose(&mesh("dp=4")).unwrap(),
        specs: vec![
            ("h0.x_att".into(), PartitionSpec::replicated()),
            ("h0.att".into(), p(&[Some("dp"), None, None, None])),
            ("logits".into(), p(&[None, None, None])),
            ("dh0.w_fc".into(), PartitionSpec::replicated()),
            ("h0.w_out'".into(), PartitionSpec::replicated()),
            ("targets".into(), PartitionSpec::replicated()),
        ],
    })
}

#[test]
fn auto_script_writes_sharding_constraints_where_the_model_names_the_values() {
    let s = jax_script(&auto_with_constraints(), STEPS).unwrap();
    for needle in [
        "CONSTRAINTS = {\n    \"x_att\": P(),\n    \"att\": P(\"dp\", None, None, None),",
        "\"logits\": P(),",
        "\"dw_fc\": P(),",
        "\"w_out'\": P(),",
        "BATCH_SPEC = P(\"dp\", None)",
        "TARGETS_SPEC = P()",
        "constrain(x + dropout(y, key, 3 * layer + 1, split), \"x_att\")",
        "jax.lax.with_sharding_constraint(x, sharding(spec))",
    ] {
        assert!(s.contains(needle), "the auto script lacks `{needle}`:\n{s}");
    }
    let plain = jax_script(&golden_batch8(auto(Strategy::Dp, "dp=4")), STEPS).unwrap();
    assert!(plain.contains("CONSTRAINTS = {}"), "no --spec, no constraint");
}

#[test]
fn exported_auto_script_with_sharding_constraints_matches_shardlab() {
    jax_or_skip!();
    script_matches_shardlab("auto_dp4_constraints", &auto_with_constraints());
}

#[test]
fn exported_scripts_are_valid_python() {
    let Some(python) = shardlab_tests::python() else {
        return;
    };
    let mut cases: Vec<(String, TrainerOptions)> = vec![("single".into(), golden_options(Parallel::None))];
    for s in Strategy::ALL {
        if s.axes().contains(&AxisKind::Pp) {
            // Two stages of one block each; jit has no pipeline (refused, naming why).
            let mut opts = golden_options(shard_map(s, s.example_mesh()));
            opts.config.layers = 2;
            opts.config.batch = 4;
            opts.microbatches = 2;
            cases.push((format!("shard_map_{}", s.name()), opts));
            continue;
        }
        let m = match s {
            Strategy::DpTp => "dp=2,tp=2",
            Strategy::Tp | Strategy::TpSp => "tp=2",
            Strategy::Cp => "cp=2",
            Strategy::DpCp => "dp=2,cp=2",
            _ => "dp=2",
        };
        cases.push((format!("shard_map_{}", s.name()), golden_options(shard_map(s, m))));
        cases.push((format!("auto_{}", s.name()), golden_options(auto(s, m))));
        cases.push((format!("explicit_{}", s.name()), golden_options(explicit(s, m))));
    }
    let mut text = golden_options(Parallel::None);
    text.config.vocab = 80;
    text.data = DataSource::Text("A \"quoted\" line\\ with ünïcode ✓,\nand a tab\there.\u{1}".into());
    text.init = Init::Random { seed: 7 };
    text.optimizer = Optimizer::AdamW { lr: 3e-3 };
    cases.push(("text_random_adamw".into(), text));
    for (name, opts) in cases {
        let path = write_script(&format!("syntax_{name}"), &jax_script(&opts, 3).unwrap());
        let out = Command::new(python)
            .args([
                "-c",
                "import ast, sys; ast.parse(open(sys.argv[1], encoding='utf-8').read())",
            ])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: not valid Python (kept at {}): {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        shardlab_tests::remove_script(&path);
    }
}

#[test]
fn shard_map_script_writes_the_body_with_explicit_collectives() {
    let fsdp = jax_script(&golden_options(shard_map(Strategy::Fsdp, "dp=2")), STEPS).unwrap();
    for needle in [
        "jax.shard_map(",
        "in_specs=(param_specs, state_specs, BATCH_SPEC, BATCH_SPEC, P(), P())",
        "out_specs=(P(), param_specs, state_specs)",
        "jax.lax.all_gather(p, \"fsdp\", axis=fsdp_dim(name), tiled=True)",
        "jax.lax.psum_scatter(g, \"fsdp\", scatter_dimension=fsdp_dim(name), tiled=True)",
        "jax.lax.psum(g, axes) if axes else g",
        "jax.lax.pmean(loss, TOKEN_AXES)",
        "\"wte\": ((64, 32), P(\"fsdp\", None)),",
        "\"ln1_g\": ((1, 32), P(None, \"fsdp\")),",
        "BATCH_AXES = (\"fsdp\",)",
        "TP_AXIS = None",
        "MESH_AXES = ((\"fsdp\", 2),)",
        "jax.config.update(\"jax_num_cpu_devices\", simulated_cpu_devices(FLAGS))",
        "jax.distributed.initialize(flags.coordinator, flags.num_processes, flags.process_id)",
        "jax.make_mesh(shape, names, axis_types=types, devices=mesh_devices())",
        "jax.make_array_from_process_local_data(sharding(spec), local, (BATCH, SEQ))",
    ] {
        assert!(fsdp.contains(needle), "the fsdp script lacks `{needle}`:\n{fsdp}");
    }
    let dp = jax_script(&golden_batch8(shard_map(Strategy::Dp, "dp=8")), STEPS).unwrap();
    assert!(dp.contains("\"wte\": ((64, 32), P()),"), "dp replicates the parameters");
    // Megatron: w_qkv viewed per head and split over "tp"; psum after the row-parallel matmuls.
    let tp = jax_script(&golden_options(shard_map(Strategy::Tp, "tp=2")), STEPS).unwrap();
    for needle in [
        "\"w_qkv\": ((1, 32, 3, 4, 8), P(None, None, None, \"tp\", None)),",
        "\"w_fc\": ((1, 32, 128), P(None, None, \"tp\")),",
        "\"w_out\": ((1, 128, 32), P(None, \"tp\", None)),",
        "TP_AXIS = \"tp\"",
        "BATCH_AXES = ()",
        "jax.lax.psum(y, split.tp)",
        "jax.lax.pcast(x, split.tp, to=\"varying\")",
    ] {
        assert!(tp.contains(needle), "the tp script lacks `{needle}`:\n{tp}");
    }
    assert!(!tp.contains("in_shardings="), "shard_map mode writes no jit shardings");
}

/// A pipeline's block stacks laid out (chunks, pp, rows, ...) with "pp" on the stage axis, as
/// `shardlab train` lays the blocks out: with virtual stages, stage 0 holds layers 0 and 2;
/// with uneven stages the lighter stage's rows are padded (its chunk lists fewer layers).
#[test]
fn pipeline_script_lays_out_each_stage_s_chunks_on_its_own_devices() {
    let mut opts = golden_batch8(shard_map(Strategy::Pp, "pp=2"));
    opts.config.layers = 4;
    opts.microbatches = 2;
    opts.virtual_stages = 2;
    let interleaved = jax_script(&opts, STEPS).unwrap();
    for needle in [
        "\"w_qkv\": ((2, 2, 1, 32, 96), P(None, \"pp\", None, None, None)),",
        "PIPELINE_LAYERS = (((0,), (1,)), ((2,), (3,)))",
        "((\"F\", 0, 0), None),",
    ] {
        assert!(
            interleaved.contains(needle),
            "the script lacks `{needle}`:\n{interleaved}"
        );
    }
    opts.virtual_stages = 1;
    opts.stage_layers = vec![3, 1];
    let uneven = jax_script(&opts, STEPS).unwrap();
    for needle in [
        "\"w_fc\": ((1, 2, 3, 32, 128), P(None, \"pp\", None, None, None)),",
        "PIPELINE_LAYERS = (((0, 1, 2), (3,)),)",
    ] {
        assert!(uneven.contains(needle), "the script lacks `{needle}`:\n{uneven}");
    }
}

#[test]
fn auto_script_writes_the_jit_shardings_of_the_strategy_and_overrides() {
    let mut opts = golden_options(Parallel::Auto {
        par: Strategy::DpTp.compose(&mesh("dp=2,tp=2")).unwrap(),
        specs: vec![("w_head".into(), PartitionSpec::from_axes(&[None, Some("tp")]))],
    });
    opts.rng_layout = RngLayout::Original;
    let s = jax_script(&opts, STEPS).unwrap();
    for needle in [
        "params = {name: sharding(spec) for name, (_, spec) in PARAM_LAYOUT.items()}",
        "in_shardings=(params, state, sharding(BATCH_SPEC), sharding(TARGETS_SPEC), replicated, replicated)",
        "out_shardings=(replicated, params, state)",
        // auto mode keeps w_qkv's stored shape: its columns split over "tp"
        "\"w_qkv\": P(None, None, \"tp\"),",
        "\"w_proj\": P(None, \"tp\", None),",
        "\"w_head\": P(None, \"tp\"),",
        "\"wte\": P(),",
        "BATCH_SPEC = P(\"dp\", None)",
        "MESH_AXES = ((\"dp\", 2), (\"tp\", 2))",
        "RNG_PARTITIONABLE = False",
        "jax.config.update(\"jax_threefry_partitionable\", RNG_PARTITIONABLE)",
    ] {
        assert!(s.contains(needle), "the auto script lacks `{needle}`:\n{s}");
    }
    assert!(!s.contains("jax.shard_map("), "auto mode writes no shard_map body");
}

#[test]
fn single_device_script_uses_plain_jit_and_the_options() {
    let mut opts = golden_options(Parallel::None);
    opts.init = Init::Random { seed: 42 };
    opts.data = DataSource::ModAdd;
    opts.optimizer = Optimizer::AdamW { lr: 3e-3 };
    opts.config.dropout = 0.25;
    opts.seed = 9;
    let s = jax_script(&opts, 17).unwrap();
    for needle in [
        "jax.jit(global_train_step, donate_argnums=(0, 1))",
        "MESH_AXES = ()",
        "INIT = \"random\"",
        "INIT_SEED = 42",
        "DATA = \"modadd\"",
        "OPTIMIZER = \"adamw\"",
        "LR = 0.003",
        "DROPOUT = 0.25",
        "SEED = 9",
        "STEPS = 17",
        "RNG_PARTITIONABLE = True",
    ] {
        assert!(s.contains(needle), "the script lacks `{needle}`");
    }
    assert!(!s.contains("in_shardings=") && !s.contains("jax.shard_map("));
}

#[test]
fn export_rejects_what_train_rejects_with_a_fix() {
    let err = jax_script(&golden_options(Parallel::None), 0).unwrap_err().to_string();
    assert!(err.contains("--steps"), "{err}");
    // golden_tiny's 4 heads do not split over tp=3
    let err = jax_script(&golden_options(shard_map(Strategy::Tp, "tp=3")), 3)
        .unwrap_err()
        .to_string();
    assert!(err.contains("tp=3 does not divide --heads 4"), "{err}");
    // golden_tiny's batch of 2 does not split over 8 devices
    let err = jax_script(&golden_options(auto(Strategy::Dp, "dp=8")), 3)
        .unwrap_err()
        .to_string();
    assert!(err.contains("--batch 2"), "{err}");
    let mut opts = golden_options(Parallel::None);
    opts.data = DataSource::Text("tiny".into());
    let err = jax_script(&opts, 3).unwrap_err().to_string();
    assert!(err.contains("too short"), "{err}");
    // a named value the JAX model code has no place for: refused, not silently dropped
    let dloss = golden_batch8(Parallel::Auto {
        par: Strategy::Dp.compose(&mesh("dp=2")).unwrap(),
        specs: vec![("dloss".into(), PartitionSpec::replicated())],
    });
    let err = jax_script(&dloss, 3).unwrap_err().to_string();
    assert!(err.contains("`dloss`") && err.contains("drop this --spec"), "{err}");
    let mut pp = golden_batch8(shard_map(Strategy::Pp, "pp=2"));
    pp.config.layers = 4;
    pp.microbatches = 2;
    // Explicit mode runs no pipeline (as `train` refuses it): the fix is shard_map's body.
    let explicit_pp = shardlab::exec::TrainerOptions {
        parallel: explicit(Strategy::Pp, "pp=2"),
        ..pp
    };
    let err = jax_script(&explicit_pp, 3).unwrap_err().to_string();
    assert!(
        err.contains("--mode explicit") && err.contains("Use --mode shard_map"),
        "{err}"
    );
}

/// Explicit mode under JAX, to shardlab's losses: compositions whose choices together are
/// every non-pipeline strategy's (dp and ZeRO-1's update on blocks, ZeRO-2's gradients, FSDP's
/// gathers, tp's out_sharding= on a mesh with an Auto axis, cp's keys whole along the sequence
/// beside dp, sequence parallelism's layer norms), with dropout (the bits typed like what they
/// mask; fused attention's tiles, under auto_axes where the sequence is split; unfused
/// attention's probabilities) in both RNG layouts and without (jax.nn.dot_product_attention),
/// with microbatches and AdamW.
#[test]
fn exported_explicit_scripts_match_shardlab_for_every_strategy_with_and_without_dropout() {
    jax_or_skip!();
    use shardlab::model::Attention::{Fused, Unfused};
    use shardlab::sharding::AxisType;
    let tp_auto = Parallel::Explicit {
        par: Strategy::DpTp.compose(&mesh("dp=2,tp=2")).unwrap(),
        axis_types: vec![("tp".into(), AxisType::Auto)],
        specs: vec![],
    };
    let (p, o) = (RngLayout::Partitionable, RngLayout::Original);
    for (name, parallel, dropout, layout, attention, k) in [
        (
            "explicit_zero1_dp4_mb2",
            explicit(Strategy::Zero1, "dp=4"),
            0.1,
            p,
            Fused,
            2,
        ),
        (
            "explicit_zero2_dp4",
            explicit(Strategy::Zero2, "dp=4"),
            0.0,
            p,
            Fused,
            1,
        ),
        (
            "explicit_fsdp2_unfused",
            explicit(Strategy::Fsdp, "dp=2"),
            0.1,
            o,
            Unfused,
            1,
        ),
        ("explicit_dp2_tp2_tp_auto", tp_auto, 0.1, p, Fused, 1),
        (
            "explicit_dp2_cp2",
            explicit(Strategy::DpCp, "dp=2,cp=2"),
            0.1,
            o,
            Fused,
            1,
        ),
        ("explicit_tp_sp2", explicit(Strategy::TpSp, "tp=2"), 0.0, p, Fused, 1),
    ] {
        let mut opts = golden_batch8(parallel);
        opts.config.dropout = dropout;
        opts.config.attention = attention;
        opts.rng_layout = layout;
        opts.microbatches = k;
        opts.optimizer = Optimizer::AdamW { lr: 1e-2 };
        opts.seed = 3;
        script_matches_shardlab(name, &opts);
    }
}

/// The explicit script sets the mesh's axis types and jax.set_mesh, and writes each choice of
/// shardlab's typed program (`out_sharding=` on the op making a value, `reshard` after it, the
/// update's own reshards) by the model code's name of the value; what JAX writes itself
/// (autodiff's cotangents, jit's out_shardings, the bits typed like what they mask) is not listed.
#[test]
fn explicit_script_writes_the_typed_programs_choices_where_the_model_makes_the_values() {
    use shardlab::partition::explicit::{ChoiceBy, ChoiceKind};
    let mut tp = golden_options(explicit(Strategy::Tp, "tp=2"));
    tp.config.dropout = 0.1;
    let s = jax_script(&tp, STEPS).unwrap();
    for needle in [
        "MODE = \"explicit\"",
        "AXIS_TYPES = {\"tp\": jax.sharding.AxisType.Explicit}",
        "OUT_SHARDINGS = {\n    \"heads\": P(None, None, None, \"tp\"),\n    \"proj\": P(),\n    \"mlp\": P(),\n}",
        "RESHARDS = {}",
        "UPDATE_RESHARDS = {}",
        "CONSTRAINTS = {}",
        "jax.set_mesh(mesh)",
        "y = row_parallel_output(matmul(y, p[\"w_proj\"], \"proj\"), split) + p[\"b_proj\"]",
        "constrain(jnp.matmul(x, w, out_sharding=out_sharding(name)), name)",
        "constrain(jnp.reshape(x, shape, out_sharding=out_sharding(name)), name)",
        "jax.random.bernoulli(site_key, keep_prob, x.shape, out_sharding=bits_sharding(x))",
        "return jax.typeof(x).sharding if MODE == \"explicit\" else None",
        "in_shardings=(params, state, sharding(BATCH_SPEC), sharding(TARGETS_SPEC), replicated, replicated)",
    ] {
        assert!(s.contains(needle), "the explicit tp script lacks `{needle}`:\n{s}");
    }
    let fsdp = jax_script(&golden_options(explicit(Strategy::Fsdp, "dp=2")), STEPS).unwrap();
    for needle in [
        "RESHARDS = {\n    \"wte\": P(),",
        "\"w_fc\": P(),",
        "p = {name: constrain(w, name) for name, w in p.items()}",
        "\"w_fc\": P(None, \"fsdp\", None),",
    ] {
        assert!(
            fsdp.contains(needle),
            "the explicit fsdp script lacks `{needle}`:\n{fsdp}"
        );
    }
    let mut zero1 = golden_batch8(explicit(Strategy::Zero1, "dp=4"));
    zero1.optimizer = Optimizer::AdamW { lr: 1e-2 };
    let z = jax_script(&zero1, STEPS).unwrap();
    for needle in [
        "UPDATE_RESHARDS = {\n    \"wte\": P(\"dp\"),\n    \"dwte\": P(\"dp\"),",
        "\"w_fc\": P(None, \"dp\"),",
        "\"dw_fc\": P(None, \"dp\"),",
        "p, g = update_operand(p, name), update_operand(grads[name], f\"d{name}\")",
    ] {
        assert!(z.contains(needle), "the explicit zero1 script lacks `{needle}`:\n{z}");
    }
    let mixed = Parallel::Explicit {
        par: Strategy::DpTp.compose(&mesh("dp=2,tp=2")).unwrap(),
        axis_types: vec![("tp".into(), shardlab::sharding::AxisType::Auto)],
        specs: vec![],
    };
    let m = jax_script(&golden_options(mixed), STEPS).unwrap();
    let want = "AXIS_TYPES = {\"dp\": jax.sharding.AxisType.Explicit, \"tp\": jax.sharding.AxisType.Auto}";
    assert!(m.contains(want), "{m}");
    // A --spec on fused attention's output is its reshard there.
    let spec = Parallel::Explicit {
        par: Strategy::Dp.compose(&mesh("dp=2")).unwrap(),
        axis_types: vec![],
        specs: vec![("h0.att".into(), PartitionSpec::replicated())],
    };
    let a = jax_script(&golden_options(spec), STEPS).unwrap();
    for needle in ["RESHARDS = {\n    \"att\": P(),\n}", "return constrain(y, \"att\")"] {
        assert!(
            a.contains(needle),
            "the explicit script with --spec h0.att lacks `{needle}`:\n{a}"
        );
    }
    // Every choice the program's author makes on a named value is in the script, by its name in
    // the model code, for every strategy the script runs in explicit mode.
    for strategy in Strategy::ALL.into_iter().filter(|s| !s.axes().contains(&AxisKind::Pp)) {
        let mut opts = golden_batch8(explicit(strategy, strategy.example_mesh()));
        opts.config.dropout = 0.1;
        let script = jax_script(&opts, STEPS).unwrap();
        let view = shardlab::plan::build(&opts).unwrap().explicit.unwrap();
        let bits: Vec<usize> = view.random_bits.iter().map(|b| b.instr).collect();
        for c in view
            .choices
            .iter()
            .filter(|c| c.by != ChoiceBy::Autodiff && c.by != ChoiceBy::Outputs)
        {
            if bits.contains(&c.instr) {
                continue;
            }
            let dict = match (c.by, c.kind) {
                (ChoiceBy::Update, _) => "UPDATE_RESHARDS",
                (_, ChoiceKind::OutSharding) => "OUT_SHARDINGS",
                (_, ChoiceKind::Reshard) => "RESHARDS",
            };
            // A block's value by its name in the block, its gradient by the stack's (dh0.w_fc: dw_fc).
            let leaf = c.value.rsplit('.').next().unwrap();
            let leaf = match c.value.strip_prefix("dh") {
                Some(_) => format!("d{leaf}"),
                None => leaf.to_string(),
            };
            // The mode section's dict, after model.py's empty one.
            let section = script
                .rsplit(&format!("\n{dict} = {{"))
                .next()
                .unwrap()
                .split("\n}")
                .next()
                .unwrap();
            assert!(
                section.contains(&format!("\"{leaf}\": ")),
                "{}: {dict} lacks {leaf} ({:?}):\n{section}",
                strategy.name(),
                c
            );
        }
    }
}

/// A mixture of experts' options over `mesh`: two blocks of 4 experts (top-2, 24 hidden units)
/// on sequences of 8, so that a capacity factor of 0.5 gives each expert 2 slots of a
/// sequence's 16 choices and routing drops at least half of them.
fn mixture(
    parallel: impl FnOnce(shardlab::plan::Parallelism) -> Parallel,
    mesh_text: &str,
    capacity: Capacity,
) -> TrainerOptions {
    let par = Parallelism::new(mesh(mesh_text), Zero::Off, false).unwrap();
    let mut opts = golden_batch8(parallel(par));
    let c = &mut opts.config;
    (c.layers, c.d_model, c.heads, c.seq, c.vocab) = (2, 16, 2, 8, 32);
    c.moe = Some(Moe {
        top_k: 2,
        width: 24,
        capacity,
        aux: 0.01,
        ..Moe::new(4, 16)
    });
    opts
}

/// The exported mixture of experts matches shardlab's losses under JAX: in shard_map mode
/// over ep=4 (two jax.lax.all_to_all a block, check_vma on) with routing that drops choices,
/// dropout and AdamW; in automatic mode over dp=2,ep=2, dropless, with microbatches (the
/// expert buffers' with_sharding_constraints); in explicit mode over dp=2,ep=2 with dropping
/// routing and dropout (their reshards).
#[test]
fn exported_mixture_of_experts_matches_shardlab_in_every_mode() {
    jax_or_skip!();
    let shard_map_ep = |par| Parallel::ShardMap {
        par,
        dropout_key: DropoutKey::Same,
    };
    let auto_ep = |par| Parallel::Auto { par, specs: vec![] };
    let explicit_ep = |par| Parallel::Explicit {
        par,
        axis_types: vec![],
        specs: vec![],
    };
    let half = Capacity::Factor(0.5);
    let mut ep4 = mixture(shard_map_ep, "ep=4", half);
    ep4.config.dropout = 0.1;
    ep4.optimizer = Optimizer::AdamW { lr: 1e-2 };
    ep4.seed = 3;
    let mut auto_dropless = mixture(auto_ep, "dp=2,ep=2", Capacity::Dropless);
    auto_dropless.microbatches = 2;
    let mut explicit_dropping = mixture(explicit_ep, "dp=2,ep=2", half);
    explicit_dropping.config.dropout = 0.1;
    explicit_dropping.seed = 3;
    for (name, opts) in [
        ("shard_map_ep4_dropping_dropout", ep4),
        ("auto_dp2_ep2_dropless_mb2", auto_dropless),
        ("explicit_dp2_ep2_dropping_dropout", explicit_dropping),
    ] {
        script_matches_shardlab(name, &opts);
    }
}

/// The mixture's script writes the all_to_alls under shard_map, the expert buffers' shardings
/// under jit, and the routing's settings.
#[test]
fn mixture_scripts_write_the_all_to_alls_and_the_expert_buffers_shardings() {
    let shard_map_ep = |par| Parallel::ShardMap {
        par,
        dropout_key: DropoutKey::Same,
    };
    let s = jax_script(&mixture(shard_map_ep, "ep=4", Capacity::Factor(0.5)), STEPS).unwrap();
    for want in [
        "EP_AXIS = \"ep\"",
        "jax.lax.all_to_all(slots, ep, 0, 1, tiled=True)",
        "jax.lax.all_to_all(out, ep, 1, 0, tiled=True)",
        "EXPERTS = 4",
        "TOP_K = 2",
        "CAPACITY = 2",
        "\"w_fc\": ((2, 4, 16, 24), P(None, \"ep\", None, None)),",
    ] {
        assert!(s.contains(want), "no `{want}` in the shard_map script");
    }
    let auto_ep = |par| Parallel::Auto { par, specs: vec![] };
    let s = jax_script(&mixture(auto_ep, "dp=2,ep=2", Capacity::Dropless), STEPS).unwrap();
    for want in [
        "\"moe.dispatched\": P(\"ep\", \"dp\", None, None),",
        "\"moe.expert_out\": P(None, (\"dp\", \"ep\"), None, None),",
        "\"moe.slots\": P(None, (\"dp\", \"ep\"), None, None),",
        "\"dmoe.expert_out\": P(\"ep\", \"dp\", None, None),",
        "CAPACITY = 8",
    ] {
        assert!(s.contains(want), "no `{want}` in the automatic script");
    }
}

mod cluster;
