//! The shardings written into the script, by state name: MODEL.md's parameters with each
//! block parameter `hN.name` stacked over the layers into `name` (leading axis: the layer),
//! so that the script runs its blocks as one `jax.lax.scan`.
use std::fmt::Write;

use super::ExportError;
use crate::ir::{Program, Role};
use crate::model::{param_specs, GptConfig};
use crate::partition::explicit::{Choice, ChoiceBy, ChoiceKind};
use crate::plan::{AxisKind, StageLayout, TrainerOptions};
use crate::sharding::PartitionSpec;

/// A state array's (or a named value's) name, global (view) shape and spec.
pub type Layout = (String, Vec<usize>, PartitionSpec);

/// The layouts of the program's inputs whose role `which` picks, by parameter name: a
/// pipeline's stack of the stages' copies of block parameter `hN.name` (its leading axis the
/// stage's) as `hN.name` itself.
fn layouts(program: &Program, names: &[String], which: impl Fn(&Role) -> bool) -> Vec<Layout> {
    let mut out = vec![];
    for (pos, (value, role)) in program.inputs.iter().enumerate() {
        if !which(role) {
            continue;
        }
        let spec = program
            .in_specs
            .get(pos)
            .cloned()
            .unwrap_or_else(PartitionSpec::replicated);
        let shape = program.global_shape(program.shape(*value), &spec);
        match role {
            Role::Param(i) | Role::OptState { param: i, .. } => out.push((names[*i].clone(), shape, spec)),
            Role::ParamStack(stack) | Role::OptStateStack { stack, .. } => {
                // A stack of zeros on every stage (a chunk short on all of them) says nothing
                // the stacks of real blocks, laid out alike, do not.
                let Some(first) = stack.params().next() else {
                    continue;
                };
                let entries = spec.entries().iter().skip(1).cloned().collect();
                out.push((names[first].clone(), shape[1..].to_vec(), PartitionSpec::new(entries)));
            }
            _ => {}
        }
    }
    out
}

fn is_param(role: &Role) -> bool {
    matches!(role, Role::Param(_) | Role::ParamStack(_))
}

/// The parameters' layouts, stacked.
pub fn param_layouts(opts: &TrainerOptions, program: &Program, names: &[String]) -> Result<Vec<Layout>, ExportError> {
    stacked(opts, layouts(program, names, is_param))
}

/// Each parameter's optimizer state layout, stacked: the program's (AdamW's m), or under SGD,
/// which has none, the one the composition would give it (ZeRO's blocks: the update still
/// runs on each device's block).
pub fn state_layouts(opts: &TrainerOptions, program: &Program, names: &[String]) -> Result<Vec<Layout>, ExportError> {
    let first_slot = |r: &Role| matches!(r, Role::OptState { slot: 0, .. } | Role::OptStateStack { slot: 0, .. });
    let state = layouts(program, names, first_slot);
    if !state.is_empty() {
        return stacked(opts, state);
    }
    let Some(par) = opts.parallel.parallelism().filter(|p| p.zero.shards_state()) else {
        return param_layouts(opts, program, names);
    };
    let cfg = &opts.config;
    let mode = opts.parallel.mode();
    let zero = param_specs(cfg)
        .iter()
        .map(|ps| {
            let (shape, spec) = par.state_layout(cfg, ps, mode);
            (ps.name.clone(), shape, spec)
        })
        .collect();
    stacked(opts, zero)
}

/// Explicit mode's choices as the script writes them, each by the script's name of the value
/// it types (as [`constraints`] names a pinned value; a block's parameter where the block reads
/// it by its name in the block), a block's alike in every layer.
#[derive(Debug, Default)]
pub struct ExplicitChoices {
    /// `out_sharding=` on the op making the value.
    pub out_shardings: Vec<(String, PartitionSpec)>,
    /// `jax.sharding.reshard` after it.
    pub reshards: Vec<(String, PartitionSpec)>,
    /// The optimizer update's own reshards of its operands (a parameter's stack, dNAME).
    pub update_reshards: Vec<(String, PartitionSpec)>,
}

/// The values the script's model code makes with an op given `out_sharding=`.
const OUT_SHARDING_POINTS: [&str; 9] = ["tok_emb", "heads", "q", "k", "v", "proj", "mlp", "moe.down", "logits"];
/// A mixture's expert buffers, which the script makes by an einsum or a reshape and then
/// moves between the experts' layout and the tokens': a choice of `out_sharding=` on the op
/// making one (shardlab's all-to-all) is written as a reshard after the script's op. Their
/// cotangents can be pinned too (`dmoe.dispatched`).
const MOVED_BY_RESHARD: [&str; 2] = ["moe.dispatched", "moe.expert_out"];
/// How the exported model code can pin one of a block's named values: by a `--spec`
/// (`constraints`), by explicit mode's type (`explicit_choices`), or both.
#[derive(Clone, Copy, PartialEq)]
enum Pin {
    Spec,
    Type,
    Both,
}

/// A block's named values the exported model code has a point for, and how each is pinned.
const BLOCK_VALUES: [(&str, Pin); 16] = [
    ("ln1", Pin::Both),
    ("qkv", Pin::Both),
    ("heads", Pin::Type),
    ("q", Pin::Type),
    ("k", Pin::Type),
    ("v", Pin::Type),
    ("att", Pin::Both),
    ("proj", Pin::Both),
    ("x_att", Pin::Both),
    ("ln2", Pin::Both),
    ("mlp", Pin::Both),
    ("x_mlp", Pin::Both),
    ("moe.slots", Pin::Spec),
    ("moe.dispatched", Pin::Both),
    ("moe.down", Pin::Both),
    ("moe.expert_out", Pin::Both),
];

/// Whether the block value `v` is pinned `by` a spec or a type.
fn pinned_by(v: &str, by: Pin) -> bool {
    BLOCK_VALUES
        .iter()
        .any(|(name, p)| *name == v && (*p == by || *p == Pin::Both))
}

/// The choices of explicit mode's typed program the script writes: the program's own (by its
/// author), and the optimizer update's. What JAX writes itself is left out: autodiff's
/// cotangents, jit's out_shardings, and the dropout bits (`bits`: their instructions), which
/// the script draws typed like what they mask, the rule the program's choices follow. A choice
/// on a value the model code has no point for is refused.
pub fn explicit_choices(
    layers: usize,
    params: &[String],
    choices: &[Choice],
    bits: &[usize],
) -> Result<ExplicitChoices, ExportError> {
    let mut out = ExplicitChoices::default();
    for c in choices {
        let list = match (c.by, c.kind) {
            (ChoiceBy::Autodiff | ChoiceBy::Outputs, _) => continue,
            (ChoiceBy::Program, _) if bits.contains(&c.instr) => continue,
            (ChoiceBy::Program, ChoiceKind::OutSharding) => &mut out.out_shardings,
            (ChoiceBy::Program, ChoiceKind::Reshard) => &mut out.reshards,
            (ChoiceBy::Update, _) => &mut out.update_reshards,
        };
        let spec = PartitionSpec::parse(&c.spec).map_err(|e| ExportError(format!("{}: {e}", c.spec)))?;
        let (name, spec) = choice_name(c, spec, params).ok_or_else(|| no_point(c))?;
        let list = match c.kind {
            ChoiceKind::OutSharding if MOVED_BY_RESHARD.contains(&name.as_str()) => &mut out.reshards,
            ChoiceKind::OutSharding if !OUT_SHARDING_POINTS.contains(&name.as_str()) => return Err(no_point(c)),
            _ => list,
        };
        match list.iter().find(|(n, _)| *n == name) {
            Some((_, s)) if *s == spec => {}
            Some(_) => return Err(per_layer_spec(&c.value, layers)),
            None => list.push((name, spec)),
        }
    }
    Ok(out)
}

/// The script's name of the value a choice types, and the spec as the script applies it: a
/// block parameter read in the block by its name there (one layer's), resharded for the update
/// as its stack (the layer axis in front); a gradient or update by its stack.
fn choice_name(c: &Choice, spec: PartitionSpec, params: &[String]) -> Option<(String, PartitionSpec)> {
    let name = c.value.as_str();
    if params.iter().any(|p| p == name) {
        return Some(match (layer_of(name), c.by) {
            (Some((_, leaf)), ChoiceBy::Update) => (leaf.to_string(), with_layer_axis(&spec)),
            (Some((_, leaf)), _) => (leaf.to_string(), spec),
            (None, _) => (name.to_string(), spec),
        });
    }
    if name == "tok_emb" {
        return Some((name.to_string(), spec));
    }
    script_name(name, &spec, params, Pin::Type).ok().map(|(n, s, _)| (n, s))
}

fn no_point(c: &Choice) -> ExportError {
    let how = match c.kind {
        ChoiceKind::OutSharding => "out_sharding=",
        ChoiceKind::Reshard => "reshard to ",
    };
    ExportError(format!(
        "explicit mode types `{}` with {how}{} ({}), and the exported JAX model has no point to write it: \
         export with --mode auto, or drop the --spec that asks for it",
        c.value, c.spec, c.why
    ))
}

/// `hN.name` (N a layer) as `(N, name)`.
fn layer_of(name: &str) -> Option<(usize, &str)> {
    let (head, leaf) = name.split_once('.')?;
    Some((head.strip_prefix('h')?.parse().ok()?, leaf))
}

/// A layer's spec with the stack's leading layer axis in front, whole.
pub fn with_layer_axis(spec: &PartitionSpec) -> PartitionSpec {
    if spec.is_empty() {
        return spec.clone();
    }
    PartitionSpec::new(std::iter::once(vec![]).chain(spec.entries().iter().cloned()).collect())
}

/// How a pipeline's blocks lie on its stages (None without a pipeline): the layout
/// `shardlab train` runs, which the script's block stacks take.
pub fn pipeline_layout(opts: &TrainerOptions) -> Option<StageLayout> {
    let par = opts.parallel.parallelism().filter(|p| p.is_pipeline())?;
    Some(StageLayout::new(
        opts.config.layers,
        par.size(AxisKind::Pp),
        opts.virtual_stages,
        &opts.stage_layers,
    ))
}

/// A block's stack over the layers: (L, ...) with the layer axis whole; in a pipeline
/// (chunks, pp, rows, ...) with "pp" splitting the stage axis, so that each stage holds its
/// chunks' rows (MaxText's stacking of a circular pipeline's stages and repeats).
fn layer_axes(
    layers: usize,
    pipeline: Option<&StageLayout>,
    shape: Vec<usize>,
    spec: &PartitionSpec,
) -> (Vec<usize>, PartitionSpec) {
    match pipeline {
        None => ([vec![layers], shape].concat(), with_layer_axis(spec)),
        Some(l) => (
            [vec![l.chunks, l.stages, l.rows()], shape].concat(),
            PartitionSpec::new(
                [vec![], vec!["pp".to_string()], vec![]]
                    .into_iter()
                    .chain(spec.entries().iter().cloned())
                    .collect(),
            ),
        ),
    }
}

/// Per-layer layouts as the state's: every `hN.name` of the layers folded into one `name`
/// ([`layer_axes`]), which needs every layer's spec to be the same.
fn stacked(opts: &TrainerOptions, per_layer: Vec<Layout>) -> Result<Vec<Layout>, ExportError> {
    let layers = opts.config.layers;
    let pipeline = pipeline_layout(opts);
    let mut out: Vec<Layout> = vec![];
    for (name, shape, spec) in per_layer {
        let Some((layer, leaf)) = layer_of(&name) else {
            out.push((name, shape, spec));
            continue;
        };
        let (shape, spec) = layer_axes(layers, pipeline.as_ref(), shape, &spec);
        let stack = (leaf.to_string(), shape, spec);
        match out.iter().find(|(n, _, _)| n == leaf) {
            None if layer == 0 => out.push(stack),
            Some(first) if *first == stack => {}
            _ => return Err(per_layer_spec(&name, layers)),
        }
    }
    Ok(out)
}

/// The refusal of a pin that differs between layers.
fn per_layer_spec(name: &str, layers: usize) -> ExportError {
    ExportError(format!(
        "--spec {name}: the exported script runs the blocks as one jax.lax.scan, so a block's \
         value or parameter is laid out alike in every layer: give the same --spec for h0 to h{} \
         (or a parameter's for all layers by its name alone, as w_fc=...)",
        layers - 1
    ))
}

/// The `--spec`s that pin a named intermediate (not a parameter, `tokens` or `targets`, which
/// are in_shardings), checked against the values the exported model code can pin, and named as
/// the script names them: a block's activation by its name in the block (`att`), a block
/// parameter's gradient and update by its stack (`dw_fc`, `w_out'`). A block's pin must be
/// given alike for every layer, as the scan applies it to each.
pub fn constraints(
    cfg: &GptConfig,
    params: &[String],
    specs: &[(String, PartitionSpec)],
) -> Result<Vec<(String, PartitionSpec)>, ExportError> {
    let leaf = |p: &String| p.rsplit('.').next().unwrap_or(p).to_string();
    let mut out: Vec<(String, PartitionSpec, Vec<usize>)> = Vec::new();
    for (name, spec) in specs {
        if params.iter().any(|p| p == name || leaf(p) == *name) || name == "tokens" || name == "targets" {
            continue;
        }
        let (script_name, spec, layer) = script_name(name, spec, params, Pin::Spec)?;
        match out.iter_mut().find(|(n, _, _)| *n == script_name) {
            Some((_, s, layers)) if *s == spec => layers.extend(layer),
            Some(_) => return Err(per_layer_spec(name, cfg.layers)),
            None => out.push((script_name, spec, layer.into_iter().collect())),
        }
    }
    let mut pins = vec![];
    for (name, spec, mut layers) in out {
        layers.sort_unstable();
        layers.dedup();
        if !layers.is_empty() && layers.len() != cfg.layers {
            return Err(per_layer_spec(&format!("h{}.{name}", layers[0]), cfg.layers));
        }
        pins.push((name, spec));
    }
    Ok(pins)
}

/// A pinnable shardlab name as the script's, with its spec and its layer (None outside the
/// blocks); an unknown name is refused.
fn script_name(
    name: &str,
    spec: &PartitionSpec,
    params: &[String],
    by: Pin,
) -> Result<(String, PartitionSpec, Option<usize>), ExportError> {
    let param = |n: &str| params.iter().any(|p| p == n);
    if ["x0", "logits", "loss"].contains(&name) || crate::model::ZIGZAG_INPUTS.contains(&name) {
        return Ok((name.to_string(), spec.clone(), None));
    }
    if let Some((layer, v)) = layer_of(name).filter(|(_, v)| pinned_by(v, by)) {
        return Ok((v.to_string(), spec.clone(), Some(layer)));
    }
    // A cotangent the script pins: a mixture's expert buffer's (`dh0.moe.dispatched`).
    let buffer = name.strip_prefix('d').and_then(layer_of);
    if let Some((layer, v)) = buffer.filter(|(_, v)| MOVED_BY_RESHARD.contains(v)) {
        return Ok((format!("d{v}"), spec.clone(), Some(layer)));
    }
    // A gradient `dNAME` or an updated parameter `NAME'`: a block parameter's by its stack.
    let (p, wrap): (&str, fn(&str) -> String) = match (name.strip_prefix('d'), name.strip_suffix('\'')) {
        (Some(p), _) if param(p) => (p, |n| format!("d{n}")),
        (_, Some(p)) if param(p) => (p, |n| format!("{n}'")),
        _ => return Err(unpinnable(name, spec)),
    };
    Ok(match layer_of(p) {
        Some((layer, leaf)) => (wrap(leaf), with_layer_axis(spec), Some(layer)),
        None => (wrap(p), spec.clone(), None),
    })
}

fn unpinnable(name: &str, spec: &PartitionSpec) -> ExportError {
    ExportError(format!(
        "--spec {name}={spec}: the exported JAX model has no point for a \
         with_sharding_constraint on `{name}`; it can pin x0, logits, loss, zig-zag's tokens.zigzag and \
         targets.zigzag, hN.ln1, hN.qkv, hN.att, \
         hN.proj, hN.x_att, hN.ln2, hN.mlp, hN.x_mlp, a mixture's hN.moe.slots, hN.moe.dispatched, hN.moe.down and \
         hN.moe.expert_out (and their cotangents, dhN.moe.dispatched), a gradient (dh0.w_fc) or an updated \
         parameter (h0.w_fc'): drop this --spec to export"
    ))
}

/// The in_sharding of the `tokens` or `targets` input.
pub fn input_spec(program: &Program, role: Role) -> PartitionSpec {
    program
        .inputs
        .iter()
        .position(|(_, r)| *r == role)
        .and_then(|pos| program.in_specs.get(pos).cloned())
        .unwrap_or_else(PartitionSpec::replicated)
}

/// `NAME = {"key": P(...), ...}`, one entry a line.
pub fn py_dict(var: &str, entries: &[(String, PartitionSpec)]) -> String {
    let mut s = format!("{var} = {{");
    for (name, spec) in entries {
        let _ = write!(s, "\n    \"{name}\": {},", py_spec(spec));
    }
    s.push_str(if entries.is_empty() { "}" } else { "\n}" });
    s
}

/// `NAME = {"name": ((global shape), P(...)), ...}`.
pub fn py_layout(var: &str, entries: &[Layout]) -> String {
    let mut layout = format!("{var} = {{\n");
    for (name, shape, spec) in entries {
        let shape = py_tuple(shape.iter().map(|n| n.to_string()).collect());
        let _ = writeln!(layout, "    \"{name}\": ({shape}, {}),", py_spec(spec));
    }
    layout.push('}');
    layout
}

/// `P("dp", None)`, `P(("dp", "tp"),)`, `P()`.
pub fn py_spec(spec: &PartitionSpec) -> String {
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
pub fn py_tuple(items: Vec<String>) -> String {
    match items.len() {
        0 => "()".into(),
        1 => format!("({},)", items[0]),
        _ => format!("({})", items.join(", ")),
    }
}
