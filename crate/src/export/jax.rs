//! The JAX script of a training run: Python templates (header, launch, model, ring attention,
//! one per mode, checkpoints, main loop) with the experiment's settings substituted in.
use super::layouts::{
    constraints, explicit_choices, input_spec, param_layouts, py_dict, py_layout, py_spec, py_tuple, state_layouts,
    Layout,
};
use super::settings::{settings, summary};
use super::ExportError;
use crate::ir::{Program, Role};
use crate::model::{param_specs, Dataset};
use crate::plan::{
    self, gradient_pin, AxisKind, DropoutKey, ExplicitView, GradientPin, Parallel, Parallelism, TrainerOptions, Zero,
};
use crate::sharding::PartitionSpec;

const HEADER: &str = include_str!("header.py");
const LAUNCH: &str = include_str!("launch.py");
const MODEL: &str = include_str!("model.py");
const MOE: &str = include_str!("moe.py");
const RING: &str = include_str!("ring.py");
const SINGLE: &str = include_str!("single.py");
const AUTO: &str = include_str!("auto.py");
const EXPLICIT: &str = include_str!("explicit.py");
const COMPOSE: &str = include_str!("compose.py");
const SHARD_MAP: &str = include_str!("shard_map.py");
const PIPELINE: &str = include_str!("pipeline.py");
const CHECKPOINT: &str = include_str!("checkpoint.py");
const MAIN: &str = include_str!("main.py");

/// A standalone Python script that runs `steps` updates of the experiment `opts` describes
/// under JAX: plain jit on one device, jit with in/out shardings (`Parallel::Auto`), the global
/// step typed on Explicit mesh axes with the typed program's `out_sharding=` and `reshard`
/// choices (`Parallel::Explicit`), or the composition's shard_map body with explicit
/// collectives (`Parallel::ShardMap`), on one process
/// or one per host (its flags). It prints `{"step":k,"loss":L,...}` per step and
/// `{"done":true,"steps":n,"final_loss":L,...}` like `shardlab train --json`, the done line
/// with the median ms per step after warm-up. Options that `shardlab train` would reject are
/// errors here too.
pub fn jax_script(opts: &TrainerOptions, steps: u64) -> Result<String, ExportError> {
    check(opts, steps)?;
    // The program `shardlab train` would run: it checks the mesh and specs the same way, and
    // its in_specs are the shardings written into the script.
    let planned = plan::build(opts).map_err(|e| ExportError(e.to_string()))?;
    let program = planned.step.program;
    let names: Vec<String> = param_specs(&opts.config).into_iter().map(|p| p.name).collect();
    let mode = mode_section(opts, &program, planned.explicit.as_ref(), &names)?;
    let mesh_axes = program.mesh.as_ref().map_or(vec![], |m| m.axes().to_vec());
    let header = HEADER
        .replace("{{SUMMARY}}", &summary(opts, steps))
        .replace("{{SETTINGS}}", &settings(opts, &mesh_axes, steps));
    let script = [
        header.as_str(),
        LAUNCH,
        MODEL,
        MOE,
        RING,
        mode.as_str(),
        CHECKPOINT,
        MAIN,
    ]
    .concat();
    debug_assert!(!script.contains("{{"), "a template placeholder was left unfilled");
    Ok(script)
}

/// What `shardlab train` checks before it plans: the steps, the learning rate, the model and
/// the data.
fn check(opts: &TrainerOptions, steps: u64) -> Result<(), ExportError> {
    if steps == 0 {
        return Err(ExportError("--steps must be at least 1".into()));
    }
    let lr = opts.optimizer.lr();
    if !(lr.is_finite() && lr > 0.0) {
        return Err(ExportError(format!("--lr {lr} must be a positive number")));
    }
    opts.config.validate().map_err(|e| ExportError(e.to_string()))?;
    Dataset::new(opts.data.clone(), &opts.config, opts.seed).map_err(|e| ExportError(e.to_string()))?;
    Ok(())
}

/// The comment a jit section opens with, per mode.
const AUTO_DOC: &str = "\
# ---------------------------------------------- automatic partitioning: jit with shardings
# The global step, unchanged; the strategy is only the in/out shardings below. XLA's SPMD
# partitioner inserts the collectives (shardlab's --mode auto does the same).";
const EXPLICIT_DOC: &str = "\
# -------------------------------------------------- explicit sharding: typed global arrays
# The global step on Explicit mesh axes (jax.make_mesh's default since JAX 0.9, and
# jax.set_mesh): every value's type carries its sharding (jax.typeof(x) prints f32[8@dp,64]),
# and JAX types each op as it traces it. Where the result's type needs a choice, the model
# code writes the one shardlab's explicit program makes (below): out_sharding= on the op, or
# jax.sharding.reshard after it. Dropout bits are drawn typed like the values they mask
# (jax.random.bernoulli(..., out_sharding=jax.typeof(x).sharding)); JAX's autodiff types each
# cotangent like its primal. The step runs under jit with the in/out shardings below.";

/// The section of the script's mode.
fn mode_section(
    opts: &TrainerOptions,
    program: &Program,
    explicit: Option<&ExplicitView>,
    names: &[String],
) -> Result<String, ExportError> {
    Ok(match &opts.parallel {
        Parallel::None => SINGLE.to_string(),
        Parallel::Explicit { par, .. } => {
            let view = explicit.expect("explicit mode plans a typed program");
            explicit_section(opts, program, names, par, view)?
        }
        Parallel::ShardMap { par, dropout_key } => {
            let body = if par.is_pipeline() {
                PIPELINE
                    .replace("{{SCHEDULE}}", &format!("\"{}\"", opts.schedule.name()))
                    .replace("{{PASSES}}", &py_passes(opts, par))
            } else {
                SHARD_MAP.to_string()
            };
            composition_section(opts, program, names, par, *dropout_key)? + &body
        }
        Parallel::Auto { par, specs } => {
            // The composition's own constraints (sequence parallelism's, a mixture's expert
            // buffers', zig-zag's tokens), then the user's.
            let mut all = plan::composition_constraints(&opts.config, par, opts.microbatches, opts.cp_order);
            all.extend(moe_slots(&all));
            all.extend(specs.iter().cloned());
            let pins = constraints(&opts.config, names, &all)?;
            auto_section(opts, program, names, par, &pins)?
        }
    })
}

/// `shardlab train`'s schedule as the script's PASSES: per lockstep step, per stage, its pass
/// `("F" | "B" | "W", microbatch, chunk)` or None, one step a line.
fn py_passes(opts: &TrainerOptions, par: &Parallelism) -> String {
    let pp = par.size(AxisKind::Pp);
    let table = plan::Table::new(opts.schedule, pp, opts.microbatches, opts.virtual_stages);
    let steps: Vec<String> = table
        .steps()
        .into_iter()
        .map(|step| {
            let mut at = vec!["None".to_string(); pp];
            for (s, a) in step {
                let pass = match a.pass {
                    plan::Pass::Forward => "F",
                    plan::Pass::Backward => "B",
                    plan::Pass::Weight => "W",
                };
                at[s] = format!("(\"{pass}\", {}, {})", a.microbatch, a.chunk);
            }
            format!("    {},", py_tuple(at))
        })
        .collect();
    format!("(\n{}\n)", steps.join("\n"))
}

/// To automatic mode's pins of a mixture's expert buffers ([`plan::moe_constraints`], among
/// `pins`), the dispatch's own result laid out as the tokens are (`hN.moe.slots`, in expert_out's layout):
/// each sequence's slots made where its tokens are, as shardlab's dispatch makes them, so that
/// the pin on `moe.dispatched` moves them by all-to-all (left to itself, XLA gathers the routing
/// over "ep" instead).
fn moe_slots(pins: &[(String, PartitionSpec)]) -> Vec<(String, PartitionSpec)> {
    pins.iter()
        .filter(|(name, _)| name.starts_with('h'))
        .filter_map(|(name, spec)| {
            Some((
                format!("{}.moe.slots", name.strip_suffix(".moe.expert_out")?),
                spec.clone(),
            ))
        })
        .collect()
}

/// The section for `Parallel::Auto`: the global step under jit with the program's in_shardings,
/// the composition's pins on the gradients ([`gradient_pin`]) and the `--spec`s on named
/// values as with_sharding_constraints (a `--spec` on a gradient overrides the composition's
/// pin).
fn auto_section(
    opts: &TrainerOptions,
    program: &Program,
    names: &[String],
    par: &Parallelism,
    constraints: &[(String, PartitionSpec)],
) -> Result<String, ExportError> {
    let (param_specs, state_specs) = jit_specs(opts, program, names)?;
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
    jit_section(AUTO_DOC, program, &param_specs, &state_specs, &pins, &update_pins)
}

/// The section for `Parallel::Explicit`: the global step under jit with the program's
/// in/out_shardings, as in automatic mode but with no with_sharding_constraint (a type changes
/// by reshard), the mesh's axis types, and the typed program's choices by the names of the
/// values they type ([`explicit_choices`]).
fn explicit_section(
    opts: &TrainerOptions,
    program: &Program,
    names: &[String],
    par: &Parallelism,
    view: &ExplicitView,
) -> Result<String, ExportError> {
    let (param_specs, state_specs) = jit_specs(opts, program, names)?;
    let jit = jit_section(EXPLICIT_DOC, program, &param_specs, &state_specs, &[], &[])?;
    let types = opts
        .parallel
        .axis_types()
        .expect("explicit mode has a mesh")
        .map_err(|axis| {
            ExportError(format!(
                "--axis-types names '{axis}', which the mesh {} lacks",
                par.name()
            ))
        })?;
    let axis_types: Vec<String> = types
        .axes()
        .iter()
        .map(|(axis, t)| format!("\"{axis}\": jax.sharding.{}", t.jax_name()))
        .collect();
    let bits: Vec<usize> = view.random_bits.iter().map(|b| b.instr).collect();
    let choices = explicit_choices(opts.config.layers, names, &view.choices, &bits)?;
    Ok(jit
        + &EXPLICIT
            .replace("{{AXIS_TYPES}}", &format!("{{{}}}", axis_types.join(", ")))
            .replace("{{OUT_SHARDINGS}}", &py_dict("OUT_SHARDINGS", &choices.out_shardings))
            .replace("{{RESHARDS}}", &py_dict("RESHARDS", &choices.reshards))
            .replace(
                "{{UPDATE_RESHARDS}}",
                &py_dict("UPDATE_RESHARDS", &choices.update_reshards),
            ))
}

/// The in_shardings of the parameters and of their optimizer state, by state name.
type Specs = Vec<(String, PartitionSpec)>;
fn jit_specs(opts: &TrainerOptions, program: &Program, names: &[String]) -> Result<(Specs, Specs), ExportError> {
    let specs = |layouts: Vec<Layout>| layouts.into_iter().map(|(n, _, s)| (n, s)).collect();
    Ok((
        specs(param_layouts(opts, program, names)?),
        specs(state_layouts(opts, program, names)?),
    ))
}

/// The global step under jit with in/out shardings: the parameters', their state's and the
/// inputs' specs, with_sharding_constraints on named values, and the gradient pins of the update.
fn jit_section(
    doc: &str,
    program: &Program,
    param_specs: &[(String, PartitionSpec)],
    state_specs: &[(String, PartitionSpec)],
    pins: &[(String, PartitionSpec)],
    update_pins: &[(String, PartitionSpec)],
) -> Result<String, ExportError> {
    Ok(AUTO
        .replace("{{MODE_DOC}}", doc)
        .replace("{{PARAM_SPECS}}", &py_dict("PARAM_SPECS", param_specs))
        .replace("{{STATE_SPECS}}", &py_dict("STATE_SPECS", state_specs))
        .replace("{{BATCH_SPEC}}", &py_spec(&input_spec(program, Role::Tokens)))
        .replace("{{TARGETS_SPEC}}", &py_spec(&input_spec(program, Role::Targets)))
        .replace("{{CONSTRAINTS}}", &py_dict("CONSTRAINTS", pins))
        .replace("{{UPDATE_GRAD_SPECS}}", &py_dict("UPDATE_GRAD_SPECS", update_pins)))
}

/// What every shard_map body composes, per mesh axis: the layouts, which axes split the
/// batch, the sequence and the heads, ZeRO's stage and how dropout masks are drawn.
fn composition_section(
    opts: &TrainerOptions,
    program: &Program,
    names: &[String],
    par: &Parallelism,
    dropout_key: DropoutKey,
) -> Result<String, ExportError> {
    let layout = py_layout("PARAM_LAYOUT", &param_layouts(opts, program, names)?);
    let state_layout = py_layout("STATE_LAYOUT", &state_layouts(opts, program, names)?);
    let axes = |a: Vec<&str>| py_tuple(a.iter().map(|n| format!("\"{n}\"")).collect());
    Ok(COMPOSE
        .replace("{{MESH}}", &par.name())
        .replace("{{COMPOSITION_DOC}}", &composition_doc(par))
        .replace("{{PARAM_LAYOUT}}", &layout)
        .replace("{{STATE_LAYOUT}}", &state_layout)
        .replace("{{BATCH_AXES}}", &axes(par.batch_axes()))
        .replace("{{SEQ_AXES}}", &axes(par.seq_axes()))
        .replace("{{TP_AXIS}}", &py_axis(par, AxisKind::Tp))
        .replace("{{SP}}", py_bool(par.sequence_parallel))
        .replace("{{CP_AXIS}}", &py_axis(par, AxisKind::Cp))
        .replace("{{EP_AXIS}}", &py_axis(par, AxisKind::Ep))
        .replace("{{CP_ORDER}}", &format!("\"{}\"", opts.cp_order.name()))
        .replace("{{ZERO}}", par.zero.name())
        .replace(
            "{{MASK_BLOCKS}}",
            py_bool(par.draws_mask_blocks() || dropout_key == DropoutKey::Global),
        )
        .replace("{{BATCH_SPEC}}", &py_spec(&input_spec(program, Role::Tokens))))
}

/// `"tp"` where the mesh has the axis, else `None`.
fn py_axis(par: &Parallelism, kind: AxisKind) -> String {
    if par.has(kind) {
        format!("\"{}\"", kind.name())
    } else {
        "None".into()
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
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
