//! The JAX script of a training run: Python templates (header, launch, model, ring attention,
//! one per mode, checkpoints, main loop) with the experiment's settings substituted in.
use super::layouts::{constraints, input_spec, param_layouts, py_dict, py_layout, py_spec, state_layouts, Layout};
use super::settings::{settings, summary};
use super::ExportError;
use crate::ir::{CpOrder, Program, Role};
use crate::model::{param_specs, Dataset};
use crate::plan::{self, gradient_pin, GradientPin, Parallel, Strategy, TrainerOptions};
use crate::sharding::PartitionSpec;

const HEADER: &str = include_str!("header.py");
const LAUNCH: &str = include_str!("launch.py");
const MODEL: &str = include_str!("model.py");
const RING: &str = include_str!("ring.py");
const SINGLE: &str = include_str!("single.py");
const AUTO: &str = include_str!("auto.py");
const SHARD_MAP: &str = include_str!("shard_map.py");
const PIPELINE: &str = include_str!("pipeline.py");
const CHECKPOINT: &str = include_str!("checkpoint.py");
const MAIN: &str = include_str!("main.py");

/// A standalone Python script that runs `steps` updates of the experiment `opts` describes
/// under JAX: plain jit on one device, jit with in/out shardings (`Parallel::Auto`), or the
/// strategy's shard_map body with explicit collectives (`Parallel::ShardMap`), on one process
/// or one per host (its flags). It prints `{"step":k,"loss":L,...}` per step and
/// `{"done":true,"steps":n,"final_loss":L,...}` like `shardlab train --json`, the done line
/// with the median ms per step after warm-up. Options that `shardlab train` would reject are
/// errors here too.
pub fn jax_script(opts: &TrainerOptions, steps: u64) -> Result<String, ExportError> {
    check(opts, steps)?;
    // The program `shardlab train` would run: it checks the mesh and specs the same way, and
    // its in_specs are the shardings written into the script.
    let program = plan::build(opts).map_err(|e| ExportError(e.to_string()))?.step.program;
    let names: Vec<String> = param_specs(&opts.config).into_iter().map(|p| p.name).collect();
    let mode = mode_section(opts, &program, &names)?;
    let mesh_axes = program.mesh.as_ref().map_or(vec![], |m| m.axes().to_vec());
    let header = HEADER
        .replace("{{SUMMARY}}", &summary(opts, steps))
        .replace("{{SETTINGS}}", &settings(opts, &mesh_axes, steps));
    let script = [header.as_str(), LAUNCH, MODEL, RING, mode.as_str(), CHECKPOINT, MAIN].concat();
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

/// The section of the script's mode.
fn mode_section(opts: &TrainerOptions, program: &Program, names: &[String]) -> Result<String, ExportError> {
    Ok(match &opts.parallel {
        Parallel::None => SINGLE.to_string(),
        Parallel::ShardMap { strategy, .. } if strategy.is_pipeline() => pipeline_section(opts, *strategy),
        Parallel::ShardMap { strategy, .. } => shard_map_section(opts, program, names, *strategy)?,
        Parallel::Auto { strategy, specs, .. } => {
            // The strategy's own constraints (sequence parallelism's), then the user's.
            let mut all = if *strategy == Strategy::TpSp {
                plan::sequence_parallel_constraints(&opts.config)
            } else {
                vec![]
            };
            all.extend(specs.iter().cloned());
            let pins = constraints(&opts.config, names, &all)?;
            auto_section(opts, program, names, *strategy, &pins)?
        }
    })
}

/// The section for `Parallel::Auto`: the global step under jit with the program's in_shardings,
/// the strategy's pins on the gradients ([`gradient_pin`]) and the `--spec`s on named values
/// as with_sharding_constraints (a `--spec` on a gradient overrides the strategy's pin).
fn auto_section(
    opts: &TrainerOptions,
    program: &Program,
    names: &[String],
    strategy: Strategy,
    constraints: &[(String, PartitionSpec)],
) -> Result<String, ExportError> {
    let specs = |layouts: Vec<Layout>| -> Vec<(String, PartitionSpec)> {
        layouts.into_iter().map(|(n, _, s)| (n, s)).collect()
    };
    let param_specs = specs(param_layouts(&opts.config, program, names)?);
    let state_specs = specs(state_layouts(opts, program, names)?);
    let mut pins: Vec<(String, PartitionSpec)> = vec![];
    let mut update_pins: Vec<(String, PartitionSpec)> = vec![];
    for (name, state) in &state_specs {
        match gradient_pin(strategy, state) {
            GradientPin::Free => {}
            GradientPin::Update(spec) => update_pins.push((name.clone(), spec)),
            GradientPin::Every(spec) => pins.push((format!("d{name}"), spec)),
        }
    }
    for (name, spec) in constraints {
        pins.retain(|(n, _)| n != name);
        pins.push((name.clone(), spec.clone()));
    }
    Ok(AUTO
        .replace("{{PARAM_SPECS}}", &py_dict("PARAM_SPECS", &param_specs))
        .replace("{{STATE_SPECS}}", &py_dict("STATE_SPECS", &state_specs))
        .replace("{{BATCH_SPEC}}", &py_spec(&input_spec(program, Role::Tokens)))
        .replace("{{TARGETS_SPEC}}", &py_spec(&input_spec(program, Role::Targets)))
        .replace("{{CONSTRAINTS}}", &py_dict("CONSTRAINTS", &pins))
        .replace("{{UPDATE_GRAD_SPECS}}", &py_dict("UPDATE_GRAD_SPECS", &update_pins)))
}

/// The section for `Parallel::ShardMap`: the strategy's body with its layouts, written per
/// mesh axis (each axis's name, or None where the strategy has no such axis).
fn shard_map_section(
    opts: &TrainerOptions,
    program: &Program,
    names: &[String],
    strategy: Strategy,
) -> Result<String, ExportError> {
    let layout = py_layout("PARAM_LAYOUT", &param_layouts(&opts.config, program, names)?);
    let state_layout = py_layout("STATE_LAYOUT", &state_layouts(opts, program, names)?);
    let seq_split = strategy.seq_axis().is_some();
    let batch_spec = if seq_split || strategy.axes().contains(&"dp") {
        py_spec(&input_spec(program, Role::Tokens))
    } else {
        "P()".into()
    };
    Ok(SHARD_MAP
        .replace("{{STRATEGY}}", strategy.name())
        .replace("{{STRATEGY_DOC}}", strategy_doc(strategy))
        .replace("{{SP}}", py_bool(strategy == Strategy::TpSp))
        .replace("{{CP_AXIS}}", &axis(strategy, "cp"))
        .replace("{{CP_ORDER}}", &cp_order(opts.cp_order))
        .replace("{{BATCH_SPEC}}", &batch_spec)
        .replace("{{PARAM_LAYOUT}}", &layout)
        .replace("{{STATE_LAYOUT}}", &state_layout)
        .replace("{{GRADIENTS_SPLIT}}", py_bool(strategy == Strategy::Zero2))
        .replace("{{DP_AXIS}}", &axis(strategy, "dp"))
        .replace("{{TP_AXIS}}", &axis(strategy, "tp")))
}

/// The section of a pipeline (shard_map only).
fn pipeline_section(opts: &TrainerOptions, strategy: Strategy) -> String {
    PIPELINE
        .replace("{{STRATEGY}}", strategy.name())
        .replace("{{STRATEGY_DOC}}", strategy_doc(strategy))
        .replace("{{DP_AXIS}}", &axis(strategy, "dp"))
        .replace("{{SCHEDULE}}", &format!("\"{}\"", opts.schedule.name()))
}

/// `"dp"` where the strategy has the mesh axis `name`, else `None`.
fn axis(strategy: Strategy, name: &str) -> String {
    if strategy.axes().contains(&name) {
        format!("\"{name}\"")
    } else {
        "None".into()
    }
}

fn cp_order(order: CpOrder) -> String {
    format!("\"{}\"", order.name())
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// The comment line a shard_map section opens with: what the strategy does.
fn strategy_doc(strategy: Strategy) -> &'static str {
    match strategy {
        Strategy::Dp => "parameters replicated, the batch split over \"dp\",\n# gradients all-reduced (psum).",
        Strategy::Fsdp => {
            "parameters and optimizer state split over \"dp\" (ZeRO-3):\n# all_gather before use, \
             psum_scatter of the gradients."
        }
        Strategy::Zero1 => {
            "ZeRO-1: parameters replicated, the optimizer state split over \"dp\";\n# gradients \
             all-reduced (psum), each device updates its block, all_gather of the updated blocks."
        }
        Strategy::Zero2 => {
            "ZeRO-2: ZeRO-1 with the gradients split too: each microbatch's\n# gradients \
             reduce-scattered (psum_scatter) as they are made, the blocks summed."
        }
        Strategy::Tp => {
            "Megatron over \"tp\": attention heads and MLP columns split,\n# psum after the \
             row-parallel projections."
        }
        Strategy::DpTp => "dp and Megatron tp together on the 2-D mesh {dp, tp}.",
        Strategy::Cp => {
            "context parallelism over \"cp\": the sequence split, attention\n# as ring attention (K and V \
             travel the ring by ppermute)."
        }
        Strategy::DpCp => "dp and context parallelism together on the 2-D mesh {dp, cp}.",
        Strategy::TpSp => {
            "Megatron over \"tp\" with sequence parallelism: the layer-norm\n# and dropout regions split on \
             the sequence, all_gather and psum_scatter around the matmuls."
        }
        Strategy::Pp => {
            "pipeline parallelism over \"pp\": the blocks in contiguous stages,\n# the layer axis of their \
             stacks split; microbatches passed stage to stage by ppermute."
        }
        Strategy::DpPp => "dp and pipeline parallelism together on the 2-D mesh {dp, pp}.",
    }
}
