//! The JAX script of a training run: Python templates (header, model, one per mode, main
//! loop) with the experiment's settings substituted in.
use std::fmt::Write;

use super::ExportError;
use crate::ir::{CpOrder, Precision, Program, RngLayout, Role};
use crate::model::{param_specs, DataSource, Dataset, Init, Optimizer};
use crate::plan::{self, gradient_pin, AxisKind, DropoutKey, GradientPin, Parallel, Parallelism, TrainerOptions, Zero};
use crate::sharding::PartitionSpec;

const HEADER: &str = include_str!("header.py");
const MODEL: &str = include_str!("model.py");
const SINGLE: &str = include_str!("single.py");
const AUTO: &str = include_str!("auto.py");
const SHARD_MAP: &str = include_str!("shard_map.py");
const PIPELINE: &str = include_str!("pipeline.py");
const MAIN: &str = include_str!("main.py");

/// A standalone Python script that runs `steps` updates of the experiment `opts` describes
/// under JAX: plain jit on one device, jit with in/out shardings (`Parallel::Auto`), or the
/// strategy's shard_map body with explicit collectives (`Parallel::ShardMap`). It prints
/// `{"step":k,"loss":L,"step_ms":t}` per step and `{"done":true,"steps":n,"final_loss":L,...}`
/// like `shardlab train --json`, the done line with the median ms per step after warm-up. Options that `shardlab train` would reject are errors here too.
pub fn jax_script(opts: &TrainerOptions, steps: u64) -> Result<String, ExportError> {
    if steps == 0 {
        return Err(ExportError("--steps must be at least 1".into()));
    }
    let lr = opts.optimizer.lr();
    if !(lr.is_finite() && lr > 0.0) {
        return Err(ExportError(format!("--lr {lr} must be a positive number")));
    }
    let cfg = &opts.config;
    cfg.validate().map_err(|e| ExportError(e.to_string()))?;
    Dataset::new(opts.data.clone(), cfg, opts.seed).map_err(|e| ExportError(e.to_string()))?;
    // The program `shardlab train` would run: it checks the mesh and specs the same way, and
    // its in_specs are the shardings written into the script.
    let program = plan::build(opts).map_err(|e| ExportError(e.to_string()))?.step.program;
    let names: Vec<String> = param_specs(cfg).into_iter().map(|p| p.name).collect();
    let state = state_layouts(opts, &program, &names);
    let mode = match &opts.parallel {
        Parallel::None => SINGLE.to_string(),
        Parallel::Explicit { .. } => {
            return Err(ExportError(
                "explicit mode is not exported yet: export the same run with --mode auto (the same shardings, \
                 jit placing what explicit mode writes as out_sharding= and reshard)"
                    .into(),
            ))
        }
        Parallel::ShardMap { par, .. } if par.is_pipeline() => {
            if par.kinds().iter().any(|k| !matches!(k, AxisKind::Dp | AxisKind::Pp)) || par.zero != Zero::Off {
                return Err(ExportError(format!(
                    "the exported pipeline composes 'dp' and 'pp' only, and the mesh {} has more: export it in \
                     shardlab's own terms with `shardlab inspect`, or drop the other axes",
                    par.name()
                )));
            }
            PIPELINE
                .replace("{{STRATEGY}}", &opts.parallel.label())
                .replace("{{STRATEGY_DOC}}", &composition_doc(par))
                .replace("{{DP_AXIS}}", &py_axis(par, AxisKind::Dp))
                .replace("{{SCHEDULE}}", &format!("\"{}\"", opts.schedule.name()))
        }
        Parallel::ShardMap { par, dropout_key } => {
            shard_map_section(&program, &names, &state, par, *dropout_key, opts.cp_order)?
        }
        Parallel::Auto { par, specs } => {
            // The composition's own constraints (sequence parallelism's), then the user's.
            let mut all = if par.sequence_parallel {
                plan::sequence_parallel_constraints(cfg, par)
            } else {
                vec![]
            };
            all.extend(specs.iter().cloned());
            auto_section(&program, &names, &state, par, &constraints(cfg, &names, &all)?)
        }
    };
    let header = HEADER
        .replace("{{SUMMARY}}", &summary(opts, steps))
        .replace("{{SETTINGS}}", &settings(opts, &program, steps));
    let script = [header.as_str(), MODEL, mode.as_str(), MAIN].concat();
    debug_assert!(!script.contains("{{"), "a template placeholder was left unfilled");
    Ok(script)
}

/// The top-of-file constants, plain Python literals (numpy is not imported yet).
fn settings(opts: &TrainerOptions, program: &Program, steps: u64) -> String {
    let cfg = &opts.config;
    let py_bool = |b: bool| if b { "True" } else { "False" };
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
    let mesh_axes = match &program.mesh {
        None => "()".to_string(),
        Some(mesh) => py_tuple(mesh.axes().iter().map(|(n, s)| format!("(\"{n}\", {s})")).collect()),
    };
    let mut s = String::new();
    let mut line = |l: String| {
        s.push_str(&l);
        s.push('\n');
    };
    line(format!("LAYERS = {}", cfg.layers));
    line(format!("D_MODEL = {}", cfg.d_model));
    line(format!("HEADS = {}", cfg.heads));
    line(format!("SEQ = {}  # T", cfg.seq));
    line(format!("BATCH = {}  # B, the global batch", cfg.batch));
    line(format!("VOCAB = {}", cfg.vocab));
    line(format!("TIED = {}  # the LM head shares wte", py_bool(cfg.tied)));
    line(format!("DROPOUT = {:?}  # rate, a float32", cfg.dropout));
    let compute = match cfg.precision {
        Precision::F32 => "float32",
        Precision::Bf16 => "bfloat16",
    };
    line(format!(
        "COMPUTE_DTYPE = \"{compute}\"  # --precision {}: {}",
        cfg.precision.name(),
        cfg.precision.describe()
    ));
    let remat = match cfg.remat.policy() {
        Some(p) => format!("\"{}\"", p.jax_name()),
        None => "None".into(),
    };
    line(format!(
        "REMAT = {remat}  # each block under jax.checkpoint with this jax.checkpoint_policies policy (--remat {})",
        cfg.remat.name()
    ));
    line(format!(
        "INIT = \"{init}\"  # formula (MODEL.md) or random (seeded N(0, 0.02))"
    ));
    line(format!("INIT_SEED = {init_seed}"));
    line(format!(
        "DATA = \"{}\"  # formula, copy, reverse, modadd or text",
        opts.data.name()
    ));
    line(format!("TEXT = {text}  # the corpus of DATA = \"text\""));
    line(format!("OPTIMIZER = \"{optimizer}\"  # sgd or adamw"));
    line(format!("LR = {lr:?}  # a float32"));
    line(format!("SEED = {}  # of the data and of the dropout keys", opts.seed));
    line(format!(
        "RNG_PARTITIONABLE = {}  # jax_threefry_partitionable",
        py_bool(opts.rng_layout == RngLayout::Partitionable)
    ));
    line(format!("STEPS = {steps}"));
    line(format!(
        "MICROBATCHES = {}  # gradient accumulation: slices of the batch per update",
        opts.microbatches
    ));
    let mode = opts.parallel.mode_name();
    line(format!(
        "MODE = \"{mode}\"  # single, auto (jit with shardings) or shard_map"
    ));
    line(format!(
        "MESH_AXES = {mesh_axes}  # (name, size) per mesh axis; () for one device"
    ));
    s.trim_end().to_string()
}

/// One paragraph for the docstring: what this script runs.
fn summary(opts: &TrainerOptions, steps: u64) -> String {
    let cfg = &opts.config;
    let mode = match &opts.parallel {
        Parallel::None => "One device (plain jit).".to_string(),
        Parallel::ShardMap { par, dropout_key } => format!(
            "shard_map: strategy {}{} on the mesh {}, dropout keys {}.",
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
            "Explicit sharding: strategy {}{} on the mesh {}.",
            opts.parallel.label(),
            cp_text(par, opts.cp_order),
            par.name()
        ),
        Parallel::Auto { par, specs } => format!(
            "Automatic partitioning (jit with shardings): strategy {}{} on the mesh {}{}.",
            opts.parallel.label(),
            cp_text(par, opts.cp_order),
            par.name(),
            if specs.is_empty() {
                String::new()
            } else {
                format!(", with {} --spec override(s)", specs.len())
            }
        ),
    };
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
    let mut s = format!(
        "{mode}\nModel: layers {}, d_model {}, heads {}, seq {}, batch {}, vocab {}{}, dropout {}.\n\
         Init {init}; data {}; {opt}; seed {}; RNG layout {}; {steps} steps.{accumulation}",
        cfg.layers,
        cfg.d_model,
        cfg.heads,
        cfg.seq,
        cfg.batch,
        cfg.vocab,
        if cfg.tied { ", tied head" } else { "" },
        cfg.dropout,
        opts.data.name(),
        opts.seed,
        match opts.rng_layout {
            RngLayout::Original => "original",
            RngLayout::Partitionable => "partitionable",
        },
    );
    if opts.combine_all_reduces {
        s.push_str("\n(--combine-all-reduces has no line here: XLA runs its own all-reduce combiner.)");
    }
    s
}

/// ` (zigzag order)` for context parallelism, else nothing.
fn cp_text(par: &Parallelism, order: CpOrder) -> String {
    if par.is_cp() {
        format!(" ({} order)", order.name())
    } else {
        String::new()
    }
}

/// `"tp"` where the mesh has the axis, else `None`.
fn py_axis(par: &Parallelism, kind: AxisKind) -> String {
    if par.has(kind) {
        format!("\"{}\"", kind.name())
    } else {
        "None".into()
    }
}

/// The section for `Parallel::Auto`: the global step under jit with the program's in_shardings,
/// the strategy's pins on the gradients ([`gradient_pin`]) and the `--spec`s on named values
/// as with_sharding_constraints (a `--spec` on a gradient overrides the strategy's pin).
fn auto_section(
    program: &Program,
    names: &[String],
    state: &[Layout],
    par: &Parallelism,
    constraints: &[(String, PartitionSpec)],
) -> String {
    let param_specs: Vec<(String, PartitionSpec)> = layouts(program, names, |r| matches!(r, Role::Param(_)))
        .into_iter()
        .map(|(n, _, s)| (n, s))
        .collect();
    let state_specs: Vec<(String, PartitionSpec)> = state.iter().map(|(n, _, s)| (n.clone(), s.clone())).collect();
    let mut pins: Vec<(String, PartitionSpec)> = vec![];
    let mut update_pins: Vec<(String, PartitionSpec)> = vec![];
    for ((name, state), (_, param)) in state_specs.iter().zip(&param_specs) {
        match gradient_pin(par, param, state) {
            GradientPin::Free => {}
            GradientPin::Update(spec) => update_pins.push((name.clone(), spec)),
            GradientPin::Every(spec) => pins.push((format!("d{name}"), spec)),
        }
    }
    for (name, spec) in constraints {
        pins.retain(|(n, _)| n != name);
        pins.push((name.clone(), spec.clone()));
    }
    AUTO.replace("{{PARAM_SPECS}}", &py_dict("PARAM_SPECS", &param_specs))
        .replace("{{STATE_SPECS}}", &py_dict("STATE_SPECS", &state_specs))
        .replace("{{BATCH_SPEC}}", &py_spec(&input_spec(program, Role::Tokens)))
        .replace("{{TARGETS_SPEC}}", &py_spec(&input_spec(program, Role::Targets)))
        .replace("{{CONSTRAINTS}}", &py_dict("CONSTRAINTS", &pins))
        .replace("{{UPDATE_GRAD_SPECS}}", &py_dict("UPDATE_GRAD_SPECS", &update_pins))
}

/// A parameter's (or its state's) name, global (view) shape and spec.
type Layout = (String, Vec<usize>, PartitionSpec);

/// The layouts of the program's inputs whose role `which` picks, by parameter name.
fn layouts(program: &Program, names: &[String], which: impl Fn(&Role) -> bool) -> Vec<Layout> {
    let mut out = vec![];
    for (pos, (value, role)) in program.inputs.iter().enumerate() {
        if let Role::Param(i) | Role::OptState { param: i, .. } = role {
            if which(role) {
                let spec = program
                    .in_specs
                    .get(pos)
                    .cloned()
                    .unwrap_or_else(PartitionSpec::replicated);
                let shape = program.global_shape(program.shape(*value), &spec);
                out.push((names[*i].clone(), shape, spec));
            }
        }
    }
    out
}

/// Each parameter's optimizer state layout: the program's (AdamW's m), or under SGD, which
/// has none, the one the strategy would give it (ZeRO's blocks: the update still runs on
/// each device's block).
fn state_layouts(opts: &TrainerOptions, program: &Program, names: &[String]) -> Vec<Layout> {
    let state = layouts(program, names, |r| matches!(r, Role::OptState { slot: 0, .. }));
    if !state.is_empty() {
        return state;
    }
    let params = layouts(program, names, |r| matches!(r, Role::Param(_)));
    let Some(par) = opts.parallel.parallelism().filter(|p| p.zero.shards_state()) else {
        return params;
    };
    param_specs(&opts.config)
        .iter()
        .map(|ps| {
            (
                ps.name.clone(),
                ps.shape.clone(),
                plan::auto_state_spec(&opts.config, par, ps),
            )
        })
        .collect()
}

/// `NAME = {"key": P(...), ...}`, one entry a line.
fn py_dict(var: &str, entries: &[(String, PartitionSpec)]) -> String {
    let mut s = format!("{var} = {{");
    for (name, spec) in entries {
        let _ = write!(s, "\n    \"{name}\": {},", py_spec(spec));
    }
    s.push_str(if entries.is_empty() { "}" } else { "\n}" });
    s
}

/// The `--spec`s that pin a named intermediate (not a parameter, `tokens` or `targets`, which
/// are in_shardings), checked against the values the exported model code can pin: the
/// forward's named activations, the gradients and the updated parameters.
fn constraints(
    cfg: &crate::model::GptConfig,
    params: &[String],
    specs: &[(String, PartitionSpec)],
) -> Result<Vec<(String, PartitionSpec)>, ExportError> {
    let leaf = |p: &String| p.rsplit('.').next().unwrap_or(p).to_string();
    let mut pinnable: Vec<String> = ["x0", "logits", "loss"].map(String::from).to_vec();
    for l in 0..cfg.layers {
        pinnable.extend(["ln1", "qkv", "att", "proj", "x_att", "ln2", "mlp", "x_mlp"].map(|v| format!("h{l}.{v}")));
    }
    pinnable.extend(params.iter().map(|p| format!("d{p}")));
    pinnable.extend(params.iter().map(|p| format!("{p}'")));
    let mut out = Vec::new();
    for (name, spec) in specs {
        if params.iter().any(|p| p == name || leaf(p) == *name) || name == "tokens" || name == "targets" {
            continue;
        }
        if !pinnable.contains(name) {
            return Err(ExportError(format!(
                "--spec {name}={spec}: the exported JAX model has no point for a \
                 with_sharding_constraint on `{name}`; it can pin x0, logits, loss, hN.ln1, hN.qkv, hN.att, \
                 hN.proj, hN.x_att, hN.ln2, hN.mlp, hN.x_mlp, a gradient (dh0.w_fc) or an updated \
                 parameter (h0.w_fc'): \
                 drop this --spec to export"
            )));
        }
        out.push((name.clone(), spec.clone()));
    }
    Ok(out)
}

/// `NAME = {"name": ((global shape), P(...)), ...}`.
fn py_layout(var: &str, entries: &[Layout]) -> String {
    let mut layout = format!("{var} = {{\n");
    for (name, shape, spec) in entries {
        let shape = py_tuple(shape.iter().map(|n| n.to_string()).collect());
        let _ = writeln!(layout, "    \"{name}\": ({shape}, {}),", py_spec(spec));
    }
    layout.push('}');
    layout
}

/// The section for `Parallel::ShardMap`: the strategy's body with its layouts.
fn shard_map_section(
    program: &Program,
    names: &[String],
    state: &[Layout],
    par: &Parallelism,
    dropout_key: DropoutKey,
    cp_order: CpOrder,
) -> Result<String, ExportError> {
    let layout = py_layout(
        "PARAM_LAYOUT",
        &layouts(program, names, |r| matches!(r, Role::Param(_))),
    );
    let state_layout = py_layout("STATE_LAYOUT", state);
    // The script's body names one data axis: "dp", or FSDP's "fsdp".
    let data_axis = match par.batch_axes().as_slice() {
        [] => "None".to_string(),
        [one] => format!("\"{one}\""),
        _ => {
            return Err(ExportError(format!(
                "the exported shard_map body splits the batch over one data axis, and the mesh {} has both 'dp' and \
                 'fsdp': export --mode auto, or one of the two axes",
                par.name()
            )))
        }
    };
    let key = match dropout_key {
        DropoutKey::Same => "\"same\"",
        DropoutKey::FoldIn => "\"fold_in\"",
        DropoutKey::Global => "\"global\"",
    };
    let batch_spec = input_spec(program, Role::Tokens);
    let py_bool = |b: bool| if b { "True" } else { "False" };
    Ok(SHARD_MAP
        .replace(
            "{{STRATEGY}}",
            &Parallel::ShardMap {
                par: par.clone(),
                dropout_key,
            }
            .label(),
        )
        .replace("{{SP}}", py_bool(par.sequence_parallel))
        .replace("{{CP_AXIS}}", &py_axis(par, AxisKind::Cp))
        .replace("{{CP_ORDER}}", &format!("\"{}\"", cp_order.name()))
        .replace("{{BATCH_SPEC}}", &py_spec(&batch_spec))
        .replace("{{STRATEGY_DOC}}", &composition_doc(par))
        .replace("{{PARAM_LAYOUT}}", &layout)
        .replace("{{STATE_LAYOUT}}", &state_layout)
        .replace("{{GRADIENTS_SPLIT}}", py_bool(par.zero.shards_gradients()))
        .replace("{{DP_AXIS}}", &data_axis)
        .replace("{{TP_AXIS}}", &py_axis(par, AxisKind::Tp))
        .replace("{{DROPOUT_KEY}}", key))
}

/// The comment lines a shard_map section opens with: what each mesh axis does, one line an
/// axis.
fn composition_doc(par: &Parallelism) -> String {
    let mut lines: Vec<String> = par
        .kinds()
        .into_iter()
        .map(|k| format!("\"{}\" splits {}", k.name(), k.splits()))
        .collect();
    if par.zero != Zero::Off {
        lines.push(format!(
            "ZeRO-{} splits the optimizer state over \"dp\"",
            par.zero.name()
        ));
    }
    if par.sequence_parallel {
        lines.push("sequence parallelism splits the layer-norm and dropout regions over \"tp\"".into());
    }
    lines.join(";\n# ") + "."
}

/// The in_sharding of the `tokens` or `targets` input.
fn input_spec(program: &Program, role: Role) -> PartitionSpec {
    program
        .inputs
        .iter()
        .position(|(_, r)| *r == role)
        .and_then(|pos| program.in_specs.get(pos).cloned())
        .unwrap_or_else(PartitionSpec::replicated)
}

/// `P("dp", None)`, `P(("dp", "tp"),)`, `P()`.
fn py_spec(spec: &PartitionSpec) -> String {
    let entries: Vec<String> = spec
        .entries()
        .iter()
        .map(|axes| match axes.len() {
            0 => "None".to_string(),
            1 => format!("\"{}\"", axes[0]),
            _ => py_tuple(axes.iter().map(|a| format!("\"{a}\"")).collect()),
        })
        .collect();
    if entries.iter().all(|e| e == "None") {
        return "P()".into();
    }
    format!("P({})", entries.join(", "))
}

/// A Python tuple literal: `()`, `(x,)`, `(x, y)`.
fn py_tuple(items: Vec<String>) -> String {
    match items.len() {
        0 => "()".into(),
        1 => format!("({},)", items[0]),
        _ => format!("({})", items.join(", ")),
    }
}
