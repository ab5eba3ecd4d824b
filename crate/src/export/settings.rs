//! The script's top: its settings as Python constants, and the docstring's summary.
use crate::ir::{CpOrder, Precision, RngLayout};
use crate::model::{DataSource, Init, Optimizer};
use crate::plan::{DropoutKey, Parallel, Parallelism, TrainerOptions};
use crate::profile::{device_preset, DeviceProfile};

use super::layouts::{pipeline_layout, py_tuple};

/// One setting: its Python name, value (a literal) and comment.
struct Setting(&'static str, String, String);

/// The top-of-file constants, plain Python literals (numpy is not imported yet), then
/// `SETTINGS`, their names (a checkpoint records them all but STEPS, and a resumed run must
/// have the same), a pipeline's layout of the blocks, and the peaks MFU is read against.
pub fn settings(opts: &TrainerOptions, mesh_axes: &[(String, usize)], steps: u64) -> String {
    let list = setting_list(opts, mesh_axes, steps);
    let mut s = String::new();
    for Setting(name, value, comment) in &list {
        s.push_str(&format!("{name} = {value}"));
        if !comment.is_empty() {
            s.push_str(&format!("  # {comment}"));
        }
        s.push('\n');
    }
    let names: Vec<String> = list.iter().map(|Setting(n, _, _)| format!("\"{n}\"")).collect();
    s.push_str(&format!("SETTINGS = {}\n", py_tuple(names)));
    s.push_str(&pipeline_layers(opts));
    s.push_str(&peak_flops());
    s
}

fn setting_list(opts: &TrainerOptions, mesh_axes: &[(String, usize)], steps: u64) -> Vec<Setting> {
    let cfg = &opts.config;
    let py_bool = |b: bool| if b { "True" } else { "False" }.to_string();
    let quoted = |s: &str| format!("\"{s}\"");
    let set = |n, v: String, c: &str| Setting(n, v, c.to_string());
    let (init, init_seed) = match opts.init {
        Init::Formula => ("formula", 0),
        Init::Random { seed } => ("random", seed),
    };
    let (optimizer, lr) = match opts.optimizer {
        Optimizer::Sgd { lr } => ("sgd", lr),
        Optimizer::AdamW { lr } => ("adamw", lr),
    };
    let text = match &opts.data {
        // A JSON string is a valid Python string literal (serde_json leaves non-ASCII as is).
        DataSource::Text(t) => serde_json::to_string(t).expect("a string serializes"),
        _ => "None".into(),
    };
    let compute = match cfg.precision {
        Precision::F32 => "float32",
        Precision::Bf16 => "bfloat16",
    };
    let remat = cfg.remat.policy().map_or("None".into(), |p| quoted(p.jax_name()));
    let mesh = py_tuple(mesh_axes.iter().map(|(n, s)| format!("(\"{n}\", {s})")).collect());
    let mut list = vec![
        set("LAYERS", cfg.layers.to_string(), ""),
        set("D_MODEL", cfg.d_model.to_string(), ""),
        set("HEADS", cfg.heads.to_string(), ""),
        set("SEQ", cfg.seq.to_string(), "T"),
        set("BATCH", cfg.batch.to_string(), "B, the global batch"),
        set("VOCAB", cfg.vocab.to_string(), ""),
        set("TIED", py_bool(cfg.tied), "the LM head shares wte"),
        set("DROPOUT", format!("{:?}", cfg.dropout), "rate, a float32"),
        set(
            "EXPERTS",
            cfg.moe.map_or(0, |m| m.experts).to_string(),
            "a mixture of experts in every block's MLP (0: the dense MLP)",
        ),
        set(
            "COMPUTE_DTYPE",
            quoted(compute),
            &format!("--precision {}: {}", cfg.precision.name(), cfg.precision.describe()),
        ),
        set(
            "REMAT",
            remat,
            &format!(
                "each block under jax.checkpoint with this jax.checkpoint_policies policy (--remat {})",
                cfg.remat.name()
            ),
        ),
        set(
            "ATTENTION",
            quoted(cfg.attention.name()),
            "fused: jax.nn.dot_product_attention (with dropout: FlashAttention's tiles); unfused: the composition",
        ),
        set("INIT", quoted(init), "formula (MODEL.md) or random (seeded N(0, 0.02))"),
        set("INIT_SEED", init_seed.to_string(), ""),
        set(
            "DATA",
            quoted(opts.data.name()),
            "formula, copy, reverse, modadd or text",
        ),
        set("TEXT", text, "the corpus of DATA = \"text\""),
        set("OPTIMIZER", quoted(optimizer), "sgd or adamw"),
        set("LR", format!("{lr:?}"), "a float32"),
        set("SEED", opts.seed.to_string(), "of the data and of the dropout keys"),
        set(
            "RNG_PARTITIONABLE",
            py_bool(opts.rng_layout == RngLayout::Partitionable),
            "jax_threefry_partitionable",
        ),
        set("STEPS", steps.to_string(), "the default of --steps"),
        set(
            "MICROBATCHES",
            opts.microbatches.to_string(),
            "gradient accumulation: slices of the batch per update",
        ),
        set(
            "MODE",
            quoted(opts.parallel.mode_name()),
            "single, auto (jit with shardings), explicit (typed shardings) or shard_map",
        ),
        set("MESH_AXES", mesh, "(name, size) per mesh axis; () for one device"),
        set(
            "ZIGZAG",
            match &opts.parallel {
                Parallel::Auto { par, .. } | Parallel::Explicit { par, .. } => par.zigzag_parts(opts.cp_order),
                Parallel::None | Parallel::ShardMap { .. } => None,
            }
            .map_or("None".into(), |n| n.to_string()),
            "--cp-order zigzag under jit (automatic and explicit mode): the program holds the sequence in zig-zag \
             order of this many blocks",
        ),
    ];
    if let Some(moe) = &cfg.moe {
        list.extend([
            set("TOP_K", moe.top_k.to_string(), "experts each token chooses"),
            set("EXPERT_WIDTH", moe.width.to_string(), "each expert's hidden units"),
            set(
                "CAPACITY",
                moe.slots(cfg.seq).to_string(),
                &format!(
                    "slots per expert and sequence (--capacity {}: min(T, ceil(factor T k / E)), T when dropless)",
                    moe.capacity.text()
                ),
            ),
            set(
                "AUX_LOSS",
                format!("{:?}", moe.aux),
                "Switch's load-balancing loss coefficient",
            ),
        ]);
    }
    if let Parallel::ShardMap { dropout_key, .. } = &opts.parallel {
        list.push(set(
            "DROPOUT_KEY",
            quoted(dropout_key.name()),
            "\"same\": one key on every device; \"fold_in\": fold_in(key, axis_index of the batch axes); \
             \"global\": each device's block of the one-device run's masks",
        ));
    }
    list
}

/// `PIPELINE_LAYERS`: per chunk, per stage, the layers whose blocks it holds, as `shardlab
/// train` lays them out (`--virtual-stages`, `--stage-layers`); None without a pipeline.
fn pipeline_layers(opts: &TrainerOptions) -> String {
    let value = pipeline_layout(opts).map_or("None".to_string(), |l| {
        py_tuple(
            (0..l.chunks)
                .map(|c| {
                    py_tuple(
                        (0..l.stages)
                            .map(|s| {
                                let (first, blocks) = l.run(s, c);
                                py_tuple((first..first + blocks).map(|b| b.to_string()).collect())
                            })
                            .collect(),
                    )
                })
                .collect(),
        )
    });
    format!(
        "# A pipeline's blocks: per chunk (virtual stages), per stage, the layers it holds; its block stacks are\n\
         # laid out by it (a checkpoint holds them in model order whatever it is). None: no pipeline.\n\
         PIPELINE_LAYERS = {value}\n"
    )
}

/// The device kinds (as JAX's `device_kind` names them) whose bf16 matmul peak MFU is read
/// against, from shardlab's device presets.
const DEVICE_KINDS: [(&str, &str); 6] = [
    ("tpu_v4", "TPU v4"),
    ("tpu_v5e", "TPU v5 lite"),
    ("h100", "H100"),
    ("a100", "A100"),
    ("rtx4090", "RTX 4090"),
    ("m2_max", "M2 Max"),
];

fn peak_flops() -> String {
    let peak = |p: DeviceProfile| p.matmul_flops_bf16.unwrap_or(p.matmul_flops);
    let entries: Vec<String> = DEVICE_KINDS
        .iter()
        .filter_map(|(preset, kind)| device_preset(preset).map(|p| format!("(\"{kind}\", {:e})", peak(p))))
        .collect();
    format!(
        "# A device kind's dense bf16 matmul peak, FLOP/s (shardlab's device presets): MFU's \
         denominator.\nPEAK_FLOPS = {}",
        py_tuple(entries)
    )
}

/// One paragraph for the docstring: what this script runs.
pub fn summary(opts: &TrainerOptions, steps: u64) -> String {
    let cfg = &opts.config;
    let opt = match opts.optimizer {
        Optimizer::Sgd { lr } => format!("SGD lr {lr}"),
        Optimizer::AdamW { lr } => format!("AdamW lr {lr}"),
    };
    let init = match opts.init {
        Init::Formula => "formula".to_string(),
        Init::Random { seed } => format!("random (seed {seed})"),
    };
    let accumulation = match opts.microbatches {
        1 => String::new(),
        k => format!(" Gradient accumulation over {k} microbatches, one update per step."),
    };
    let experts = cfg.moe.map_or(String::new(), |m| {
        format!(
            ", a mixture of {} experts (top-{}, width {}, capacity {}, aux loss {})",
            m.experts,
            m.top_k,
            m.width,
            m.capacity.text(),
            m.aux
        )
    });
    let mut s = format!(
        "{}\nModel: layers {}, d_model {}, heads {}, seq {}, batch {}, vocab {}{}{experts}, dropout {}, \
         attention {}.\nInit {init}; data {}; {opt}; seed {}; RNG layout {}; {steps} steps.{accumulation}",
        mode_summary(opts),
        cfg.layers,
        cfg.d_model,
        cfg.heads,
        cfg.seq,
        cfg.batch,
        cfg.vocab,
        if cfg.tied { ", tied head" } else { "" },
        cfg.dropout,
        cfg.attention.name(),
        opts.data.name(),
        opts.seed,
        opts.rng_layout.name(),
    );
    if opts.combine_all_reduces {
        s.push_str("\n(--combine-all-reduces has no line here: XLA runs its own all-reduce combiner.)");
    }
    s
}

fn mode_summary(opts: &TrainerOptions) -> String {
    match &opts.parallel {
        Parallel::None => "One device (plain jit).".to_string(),
        Parallel::ShardMap { par, dropout_key } => format!(
            "shard_map: {}{} on the mesh {}, dropout keys {}.",
            opts.parallel.label(),
            cp_text(par, opts.cp_order),
            par.name(),
            match dropout_key {
                DropoutKey::Same => "the same on every device",
                DropoutKey::FoldIn => "fold_in(key, axis_index of the batch axes)",
                DropoutKey::Global => "each device's block of the global masks",
            }
        ),
        Parallel::Explicit { par, .. } => format!(
            "Explicit sharding: {}{} on the mesh {}.",
            opts.parallel.label(),
            cp_text(par, opts.cp_order),
            par.name()
        ),
        Parallel::Auto { par, specs } => format!(
            "Automatic partitioning (jit with shardings): {}{} on the mesh {}{}.",
            opts.parallel.label(),
            cp_text(par, opts.cp_order),
            par.name(),
            if specs.is_empty() {
                String::new()
            } else {
                format!(", with {} --spec override(s)", specs.len())
            }
        ),
    }
}

/// ` (zigzag order)` for context parallelism, else nothing.
fn cp_text(par: &Parallelism, order: CpOrder) -> String {
    if par.is_cp() {
        format!(" ({} order)", order.name())
    } else {
        String::new()
    }
}
