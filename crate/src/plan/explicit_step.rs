//! The train step of a composition in explicit mode: the global step (forward, autodiff
//! backward, update) typed with JAX's explicit-sharding rules on a mesh of Explicit (and Auto)
//! axes, its inputs typed as the logical-axis rules lay them out, the choices the model needs
//! written as a JAX user writes them, then run as jit with every value laid out as its type.
use std::collections::BTreeMap;

use super::auto_step::step_shardings;
use super::rules::{Holder, Logical};
use super::{Parallelism, PlanError};
use crate::ir::{Op, Program, ValueId};
use crate::model::{accumulated_train_step_in_order, TrainStep};
use crate::partition::auto::{dims_of_spec, AutoProgram};
use crate::partition::explicit::{
    annotate, bits_sites, explicit_only, lower, typed_lines, BitsSite, Choice, Dims, TypedLine, Want, WantDims,
};
use crate::plan::TrainerOptions;
use crate::setting::{Refusal, Setting};
use crate::sharding::{AxisType, AxisTypes, PartitionSpec};

/// The typed program explicit mode runs, as the CLI and the page show it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ExplicitView {
    /// The mesh's axis types, `dp=explicit,tp=auto`.
    pub axis_types: String,
    /// As `jax.make_mesh(..., axis_types=...)` takes them.
    pub jax_axis_types: String,
    /// The global program, line by line, each value with its type.
    pub lines: Vec<TypedLine>,
    /// The program's choices: each line that writes `out_sharding=` or `reshard`, and why.
    pub choices: Vec<Choice>,
    /// Every draw of dropout bits: its type and what generating it costs each device.
    pub random_bits: Vec<BitsSite>,
}

/// Parses `--axis-types` (`tp=auto,dp=explicit`): an entry that is not AXIS=TYPE, or whose
/// type is none of JAX's, is refused at that axis's type, naming the types.
pub fn parse_axis_types(text: &str) -> Result<Vec<(String, AxisType)>, PlanError> {
    let names = AxisType::ALL.map(AxisType::name).join(", ");
    text.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| {
            let Some((axis, t)) = entry.split_once('=') else {
                let why = format!("`{entry}` is not AXIS=TYPE (e.g. tp=auto); a type is one of {names}");
                return Err(Refusal::named(Setting::AxisType(entry.to_string()), why).into());
            };
            let (axis, t) = (axis.trim(), t.trim());
            let t = AxisType::parse(t).ok_or_else(|| {
                let why = format!("is not an axis type: JAX's are {names}");
                PlanError::from(Refusal::at(Setting::AxisType(axis.to_string()), t, why))
            })?;
            Ok((axis.to_string(), t))
        })
        .collect()
}

/// The mesh's axis types in explicit mode: Explicit but for those `given` (Auto). An axis the
/// mesh lacks, or a Manual one (shard_map's), is refused at its setting.
pub fn explicit_axis_types(par: &Parallelism, given: &[(String, AxisType)]) -> Result<AxisTypes, PlanError> {
    for (axis, t) in given {
        let setting = Setting::AxisType(axis.clone());
        if par.mesh.axis_size(axis).is_err() {
            let why = format!(
                "{} has no axis '{axis}': give a type to one of its axes ({})",
                Setting::Mesh.at(par.name()),
                par.mesh.axis_names().join(", ")
            );
            return Err(Refusal::at(setting, t.name(), why).into());
        }
        if *t == AxisType::Manual {
            let why = format!(
                "is the type jax.shard_map gives the axes its body is written over; a program typed with its \
                 shardings (jax.set_mesh) cannot have one (JAX: \"contains manual axes which is not allowed when \
                 using `jax.set_mesh`\"): use {}, or {} or {}",
                Setting::Mode.at(super::Mode::ShardMap.name()),
                setting.at("explicit"),
                setting.at("auto")
            );
            return Err(Refusal::at(setting, t.name(), why).into());
        }
    }
    AxisTypes::new(&par.mesh, given)
        .map_err(|axis| Refusal::named(Setting::AxisType(axis), "names no mesh axis").into())
}

/// `opts`' global step (with gradient accumulation over its microbatches, the sequence in its
/// cp order: zig-zag's reorder is the program's own, as in automatic mode) typed in explicit
/// mode on `par` and jit's result for it: the typed step (its reshards instructions of their
/// own), the partitioned program, and the view of the typed program.
pub(super) fn explicit_train_step(
    opts: &TrainerOptions,
    par: &Parallelism,
    given_types: &[(String, AxisType)],
    overrides: &[(String, PartitionSpec)],
) -> Result<(TrainStep, AutoProgram, ExplicitView), PlanError> {
    let (cfg, opt, microbatches, order) = (&opts.config, opts.optimizer, opts.microbatches, opts.cp_order);
    par.check(cfg, microbatches)?;
    let types = explicit_axis_types(par, given_types)?;
    let global = accumulated_train_step_in_order(cfg, opt, opts.rng_layout, microbatches, par.zigzag_parts(order))?;
    let prog = &global.program;
    // A mixture's expert buffers laid out as automatic mode lays them out (experts over "ep"),
    // and zig-zag's reordered tokens split as (B, T) is.
    let mut implicit = super::moe_constraints(cfg, par, microbatches);
    implicit.extend(super::auto_step::zigzag_constraints(cfg, par, order));
    let s = step_shardings(cfg, opt, par, prog, &implicit, overrides, order)?;
    let typed = |v: ValueId, spec: &PartitionSpec| explicit_only(&dims_of_spec(spec, prog.shape(v).len()), &types);
    // A type shows Explicit axes only: a spec giving an intermediate a type cannot name an Auto one.
    for (name, spec) in s.pinned_by.values() {
        if let Some(axis) = spec.mesh_axes().into_iter().find(|a| types.of(a) == AxisType::Auto) {
            let why = format!(
                "names '{axis}', an Auto axis, and a type shows Explicit axes only (the compiler places Auto ones): \
                 drop '{axis}' from the spec, or make it explicit ({})",
                Setting::AxisType(axis.to_string()).at("explicit")
            );
            return Err(Refusal::at(Setting::Spec(name.clone()), spec, why).into());
        }
    }
    let in_types: Vec<Dims> = prog
        .inputs
        .iter()
        .zip(&s.in_shardings)
        .map(|((v, _), spec)| typed(*v, spec))
        .collect();
    let out_types: Vec<Dims> = prog
        .outputs
        .iter()
        .zip(&s.out_shardings)
        .map(|(v, spec)| typed(*v, spec))
        .collect();
    let mut wants = model_wants(par, prog, &types);
    // FSDP: every parameter gathered over "fsdp" where it is read (its update reads it whole).
    for (((v, role), spec), ty) in prog.inputs.iter().zip(&s.in_shardings).zip(&in_types) {
        if !role.is_param() {
            continue;
        }
        let compute: Dims = ty
            .iter()
            .map(|axes| axes.iter().filter(|a| *a != "fsdp").cloned().collect())
            .collect();
        if &compute != ty {
            let why = format!(
                "FSDP: the parameter all-gathered over 'fsdp' where it is read (stored {})",
                spec.p_text()
            );
            wants.insert(*v, want(compute, why));
        }
    }
    for (v, spec) in &s.constraints {
        let why = match (s.gradient_pins.contains_key(v), s.pinned_by.get(v)) {
            (true, _) => "ZeRO: the gradient split over 'dp' like its optimizer state (a reduce-scatter)".to_string(),
            (false, Some((name, spec))) => format!("the spec override {}", Setting::Spec(name.clone()).at(spec)),
            (false, None) => "a composition's constraint".to_string(),
        };
        wants.insert(*v, want(typed(*v, spec), why));
    }
    wants.extend(bits_wants(prog));
    let annotated = annotate(prog, &par.mesh, &in_types, &wants, Some(&out_types))?;
    let auto = lower(&annotated, &par.mesh, &types, &s.in_shardings, &s.out_shardings)?;
    let at = |i: usize| {
        annotated
            .instr_map
            .get(i)
            .copied()
            .unwrap_or(annotated.program.instrs.len())
    };
    let step = TrainStep {
        program: annotated.program.clone(),
        forward_end: at(global.forward_end),
        backward_end: at(global.backward_end),
        config: global.config.clone(),
        optimizer: global.optimizer,
    };
    let view = ExplicitView {
        axis_types: types.text(),
        jax_axis_types: types.jax_tuple(),
        lines: typed_lines(&annotated),
        choices: annotated.choices.clone(),
        random_bits: bits_sites(&annotated, &par.mesh),
    };
    Ok((step, auto, view))
}

fn want(dims: Dims, why: impl Into<String>) -> Want {
    Want {
        dims: WantDims::Spec(dims),
        why: why.into(),
    }
}

/// The types the model's program gives its named activations where the layout changes or an
/// op needs a choice, from the logical-axis rules: the embedding's gather and the row-parallel
/// projections `out_sharding=` the residual stream's layout, the heads split as the
/// column-parallel weights split them, the keys whole along the sequence (every query reads
/// every key), and, under sequence parallelism, each layer norm's output whole over "tp" before
/// the column-parallel matmul. Where the rules already give a value its type, nothing is written.
fn model_wants(par: &Parallelism, prog: &Program, types: &AxisTypes) -> BTreeMap<ValueId, Want> {
    use Logical::{Batch, Embed, Expert, Heads, Length};
    let gathered = Parallelism {
        sequence_parallel: false,
        ..par.clone()
    };
    let residual: &[Option<Logical>] = &[Some(Batch), Some(Length), Some(Embed)];
    let mut out = BTreeMap::new();
    for (k, info) in prog.values.iter().enumerate() {
        let Some(name) = &info.name else { continue };
        let leaf = name.rsplit('.').next().unwrap_or(name);
        let block = name.starts_with('h') && name.contains('.');
        let (p, logical, why): (&Parallelism, &[Option<Logical>], &str) = match (block, leaf) {
            (false, "tok_emb") => (
                par,
                residual,
                "the embedding's gather, laid out as the residual stream (batch, length, embed)",
            ),
            (true, "ln1" | "ln2") => (
                &gathered,
                residual,
                "the column-parallel matmul's input: the sequence whole over 'tp' (sequence parallelism's all-gather)",
            ),
            (true, "heads") => (
                &gathered,
                &[Some(Batch), Some(Length), None, Some(Heads), None],
                "the heads split as the column-parallel weights split them",
            ),
            (true, "k" | "v") => (
                &gathered,
                &[Some(Batch), Some(Heads), None, None],
                "every query reads every key: the keys whole along the sequence",
            ),
            (true, "down") => (
                par,
                &[Some(Expert), Some(Batch), None],
                "a mixture's experts' row-parallel matmul: its partial sums reduced, each expert where its weights are",
            ),
            (true, "proj" | "mlp") => (
                par,
                residual,
                "the row-parallel projection's result in the residual stream's layout: its partial sums reduced",
            ),
            _ => continue,
        };
        if logical.len() != info.shape.len() {
            continue;
        }
        let spec = p.spec(&info.shape, logical, Holder::Param);
        let dims = explicit_only(&dims_of_spec(&spec, info.shape.len()), types);
        out.insert(ValueId(k as u32), want(dims, why));
    }
    out
}

/// Each draw of dropout bits typed like the values it masks, as a JAX user draws them in
/// explicit mode (`jax.random.bits(key, x.shape, out_sharding=jax.typeof(x).sharding)`):
/// without it the bits would be replicated, every device generating all of them.
fn bits_wants(prog: &Program) -> BTreeMap<ValueId, Want> {
    let why = "dropout bits typed like the values they mask: jax.random.bits(..., out_sharding=jax.typeof(x).sharding)";
    let mut out = BTreeMap::new();
    for ins in &prog.instrs {
        if !matches!(ins.op, Op::RandomBits { .. }) {
            continue;
        }
        let bits = ins.outputs[0];
        let Some(reader) = prog.instrs.iter().find(|r| r.inputs.contains(&bits)) else {
            continue;
        };
        let rank = prog.shape(bits).len();
        let from: Vec<Option<(ValueId, usize)>> = match reader.op {
            Op::Dropout { .. } => (0..rank).map(|d| Some((reader.inputs[0], d))).collect(),
            Op::Attention { .. } | Op::AttentionGrad { .. } => {
                let (q, k) = (reader.inputs[0], reader.inputs[1]);
                (0..rank - 1)
                    .map(|d| Some((q, d)))
                    .chain([Some((k, rank - 2))])
                    .collect()
            }
            _ => continue,
        };
        out.insert(
            bits,
            Want {
                dims: WantDims::From(from),
                why: why.to_string(),
            },
        );
    }
    out
}
