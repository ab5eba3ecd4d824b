//! `jit(program, mesh, in_shardings, out_shardings)`: propagate shardings over the global
//! program, then lower it to one per-device (SPMD) program on local shapes, inserting a
//! collective or a slice wherever a value's layout differs from what its consumer needs.
use std::collections::{BTreeMap, HashMap};

use super::assign::{dims_of_spec, spec_of_dims, Dims, Sharding};
use super::propagate::{assignment, propagate};
use crate::ir::{AttnSeq, Builder, CpOrder, Op, Program, RngLayout, SeqBlock, ValueId};
use crate::sharding::{Mesh, NamedSharding, PartitionSpec};

use super::super::PartitionError;

/// One op the partitioner inserted, for the inspector.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Inserted {
    /// Its instruction index in the SPMD program.
    pub instr: usize,
    /// The inserted op (`all_gather`, `psum`, `psum_scatter`, `all_to_all`, `dynamic_slice`,
    /// `random_bits`).
    pub op: String,
    /// The instruction of the global program that needed it (None: a program output).
    pub source_instr: Option<usize>,
    /// That instruction's op name (or `output`).
    pub source_op: String,
    /// The value moved (its name, or `%n` in the global program).
    pub value: String,
    /// Why: the layouts before and after, and the rule that asked for it.
    pub rule: String,
}

/// A partitioned program: the per-device program and what the partitioner inserted.
#[derive(Clone, Debug)]
pub struct AutoProgram {
    /// Runs on every device of the mesh, on local shapes; `in_specs` are the in_shardings.
    pub program: Program,
    pub inserted: Vec<Inserted>,
    /// The propagated sharding of every value of the global program (by ValueId).
    pub global_shardings: Vec<PartitionSpec>,
    /// For every instruction of the global program, where its lowering starts in `program`.
    pub instr_starts: Vec<usize>,
}

impl AutoProgram {
    /// How many of the inserted ops are `op`.
    pub fn count(&self, op: &str) -> usize {
        self.inserted.iter().filter(|r| r.op == op).count()
    }

    /// One line per inserted op: `%12 all_gather of h0.w_fc for dot_general (#40): ...`.
    pub fn report(&self) -> String {
        let mut out = String::new();
        for r in &self.inserted {
            let at = r.source_instr.map(|i| format!(" (#{i})")).unwrap_or_default();
            out += &format!(
                "[{}] {} of {} for {}{at}: {}\n",
                r.instr, r.op, r.value, r.source_op, r.rule
            );
        }
        out
    }
}

/// `jax.jit(f, in_shardings, out_shardings)` of a global program (see [`jit_with_constraints`]).
pub fn jit(
    program: &Program,
    mesh: &Mesh,
    in_shardings: &[PartitionSpec],
    out_shardings: &[Option<PartitionSpec>],
) -> Result<AutoProgram, PartitionError> {
    jit_with_constraints(program, mesh, in_shardings, out_shardings, &BTreeMap::new())
}

fn local_shape(mesh: &Mesh, global: &[usize], dims: &Dims) -> Vec<usize> {
    global
        .iter()
        .zip(dims)
        .map(|(&n, axes)| n / axes.iter().map(|a| mesh.size_of(a).unwrap_or(1)).product::<usize>())
        .collect()
}

fn invalid(what: String, why: impl ToString) -> PartitionError {
    PartitionError::Invalid {
        what,
        why: why.to_string(),
    }
}

/// jit with `with_sharding_constraint`s: each value of `constraints` is pinned to its spec
/// (propagation never changes it, and the lowering lays it out so right where it is made).
pub fn jit_with_constraints(
    program: &Program,
    mesh: &Mesh,
    in_shardings: &[PartitionSpec],
    out_shardings: &[Option<PartitionSpec>],
    constraints: &BTreeMap<ValueId, PartitionSpec>,
) -> Result<AutoProgram, PartitionError> {
    let pins = constraints
        .iter()
        .map(|(v, spec)| (*v, Pin::constraint(spec.clone())))
        .collect();
    jit_pinned(program, mesh, in_shardings, out_shardings, &pins)
}

/// Where a value is laid out, pinned (a `with_sharding_constraint`, or the type of a value on
/// an explicit-sharding mesh), and how the inserted ops that lay it out are labelled.
#[derive(Clone, Debug, PartialEq)]
pub struct Pin {
    pub spec: PartitionSpec,
    /// Whether partial sums may stay unreduced across the pin, over axes it does not split
    /// (reduced where a reader needs the sum, as XLA's AllReduceReassociate and reduce-scatter
    /// creation move an all-reduce past adds, transposes and reshards).
    pub keep_partial: bool,
    /// The consumer an inserted op names (`with_sharding_constraint`, `reshard`, `dot_general`).
    pub source_op: String,
    /// Why, as the inserted op's rule says it (`for ...`).
    pub why: String,
}

impl Pin {
    /// A `with_sharding_constraint` on the value.
    pub fn constraint(spec: PartitionSpec) -> Self {
        Self {
            spec,
            keep_partial: false,
            source_op: "with_sharding_constraint".into(),
            why: "with_sharding_constraint".into(),
        }
    }
}

/// [`jit_with_constraints`] with pins that say how their inserted ops are labelled and whether
/// partial sums may cross them.
pub fn jit_pinned(
    program: &Program,
    mesh: &Mesh,
    in_shardings: &[PartitionSpec],
    out_shardings: &[Option<PartitionSpec>],
    pins: &BTreeMap<ValueId, Pin>,
) -> Result<AutoProgram, PartitionError> {
    if program.mesh.is_some() {
        return Err(invalid(
            "jit".into(),
            "takes a program on global shapes, not a per-device program",
        ));
    }
    if in_shardings.len() != program.inputs.len() || out_shardings.len() != program.outputs.len() {
        return Err(invalid(
            "jit".into(),
            format!(
                "the program has {} inputs and {} outputs, but {} in_shardings and {} out_shardings were given",
                program.inputs.len(),
                program.outputs.len(),
                in_shardings.len(),
                out_shardings.len()
            ),
        ));
    }
    let name = |v: ValueId| program.info(v).name.clone().unwrap_or_else(|| v.to_string());
    let check = |what: String, v: ValueId, spec: &PartitionSpec| -> Result<(), PartitionError> {
        let s = NamedSharding::new(mesh.clone(), spec.clone()).map_err(|e| invalid(what.clone(), e))?;
        s.shard_shape(program.shape(v)).map_err(|e| invalid(what, e))?;
        Ok(())
    };
    let mut fixed: BTreeMap<ValueId, PartitionSpec> = BTreeMap::new();
    for ((v, _), spec) in program.inputs.iter().zip(in_shardings) {
        check(
            format!("in_sharding {spec} of `{}` {:?}", name(*v), program.shape(*v)),
            *v,
            spec,
        )?;
        fixed.insert(*v, spec.clone());
    }
    for (k, (v, spec)) in program.outputs.iter().zip(out_shardings).enumerate() {
        if let Some(spec) = spec {
            check(format!("out_shardings[{k}] {spec} of `{}`", name(*v)), *v, spec)?;
            if fixed.get(v).is_some_and(|s| s != spec) {
                return Err(invalid(
                    format!("out_shardings[{k}] of `{}`", name(*v)),
                    "conflicts with its in_sharding",
                ));
            }
            fixed.insert(*v, spec.clone());
        }
    }
    for (v, pin) in pins {
        let spec = &pin.spec;
        if v.index() >= program.values.len() {
            return Err(invalid(
                format!("with_sharding_constraint on {v}"),
                "no such value in the program",
            ));
        }
        let what = format!("with_sharding_constraint {spec} on `{}`", name(*v));
        let constraint = |why: String| PartitionError::Constraint {
            value: *v,
            what: what.clone(),
            why,
        };
        check(what.clone(), *v, spec).map_err(|e| constraint(e.to_string()))?;
        if fixed.get(v).is_some_and(|s| s != spec) {
            return Err(constraint(
                "conflicts with the sharding given for it as an input or output".into(),
            ));
        }
        fixed.insert(*v, spec.clone());
    }
    let prop = propagate(program, mesh, &fixed)?;

    let mut l = Lowering {
        b: Builder::with_mesh(mesh.clone()),
        mesh: mesh.clone(),
        actual: vec![None; program.values.len()],
        cache: HashMap::new(),
        inserted: vec![],
        names: program
            .values
            .iter()
            .enumerate()
            .map(|(v, _)| name(ValueId(v as u32)))
            .collect(),
    };
    for ((v, role), spec) in program.inputs.iter().zip(in_shardings) {
        let info = program.info(*v);
        let dims = dims_of_spec(spec, info.shape.len());
        let local = local_shape(mesh, &info.shape, &dims);
        let nv = l.b.input(&name(*v), &local, info.dtype, role.clone());
        l.actual[v.index()] = Some((nv, Sharding { dims, partial: vec![] }));
    }
    let mut instr_starts = Vec::with_capacity(program.instrs.len());
    let known: Vec<Option<Dims>> = prop.shardings.iter().cloned().map(Some).collect();
    for (i, ins) in program.instrs.iter().enumerate() {
        instr_starts.push(l.b.program().instrs.len());
        let rule = &prop.rules[i];
        let a = assignment(program, mesh, rule, i, &known, true);
        let cause = |k: usize| format!("operand {k} of {}", ins.op.name());
        // Ops linear in their one operand carry partial sums through (the all-reduce moves
        // to where a consumer needs the sum, so a weight gradient's transpose can still be
        // reduce-scattered into the optimizer's shard).
        let mut linear = matches!(
            ins.op,
            Op::Transpose { .. } | Op::Reshape { .. } | Op::Scale { .. } | Op::Reshard { .. } | Op::Split { .. }
        );
        // So does an add of partial sums over the same axes, laid out alike: all-reduce(a) +
        // all-reduce(b) is all-reduce(a + b), which XLA's AllReduceReassociate makes of
        // GSPMD's output on GPU and TPU (its CPU pipeline has no such pass). The microbatches'
        // gradients add up as partial sums, and one all-reduce follows the last. A
        // concatenation of such sums is the sum of the concatenations (zig-zag's reordered
        // dK and dV are reduce-scattered once, where their consumer splits them).
        if matches!(ins.op, Op::Add | Op::Concat { .. }) {
            let laid: Vec<Option<&Sharding>> = ins
                .inputs
                .iter()
                .enumerate()
                .map(|(k, v)| {
                    let s = l.actual[v.index()].as_ref().map(|(_, s)| s)?;
                    (s.dims == a.project(rule, &rule.operands[k]) && !s.partial.is_empty()).then_some(s)
                })
                .collect();
            let same_shape = matches!(ins.op, Op::Concat { .. })
                || ins
                    .inputs
                    .iter()
                    .all(|v| program.shape(*v) == program.shape(ins.inputs[0]));
            linear |= same_shape
                && laid
                    .iter()
                    .all(|s| s.is_some_and(|s| laid[0].is_some_and(|f| f.partial == s.partial)));
        }
        let mut carried: Vec<String> = vec![];
        let mut operands = Vec::with_capacity(ins.inputs.len());
        for (k, v) in ins.inputs.iter().enumerate() {
            let want = a.project(rule, &rule.operands[k]);
            let mut keep = linear;
            if linear {
                let partial = l.actual[v.index()]
                    .as_ref()
                    .map(|(_, s)| s.partial.clone())
                    .unwrap_or_default();
                // A value cannot be split over an axis it is still a partial sum over (each
                // device would hold a different block of a different sum): reduce first.
                keep = !want.iter().flatten().any(|axis| partial.contains(axis));
                carried = if keep { partial } else { vec![] };
            }
            operands.push(l.reshard(*v, &want, keep, Some(i), ins.op.name(), &cause(k))?);
        }
        let mut results: Vec<Sharding> = (0..ins.outputs.len()).map(|r| a.result(rule, r)).collect();
        for r in &mut results {
            r.partial.extend(carried.iter().cloned());
        }
        let locals: Vec<Vec<usize>> = ins
            .outputs
            .iter()
            .zip(&results)
            .map(|(o, s)| local_shape(mesh, program.shape(*o), &s.dims))
            .collect();
        let outs = match &ins.op {
            Op::RandomBits { shape, layout, rows } => {
                let draw = Draw {
                    instr: i,
                    value: ins.outputs[0],
                    key: operands[0],
                    global: shape,
                    layout: *layout,
                };
                vec![match rows {
                    SeqBlock::Zigzag { parts } => l.zigzag_bits(&draw, *parts, &results[0])?,
                    _ => l.random_bits(&draw, &results[0])?,
                }]
            }
            Op::Attention { .. } | Op::AttentionGrad { .. } => {
                let q = a.project(rule, &rule.operands[0]);
                let op = with_query_block(&ins.op, &q[q.len() - 2], mesh)?;
                l.b.emit(op, &operands)
            }
            // The same values: the pin on its result lays them out as its spec says.
            Op::Reshard { .. } => vec![operands[0]],
            op => l.b.emit(local_op(op, &locals), &operands),
        };
        if let Some(e) = l.b.error() {
            return Err(invalid(format!("jit: lowering `{}` (#{i})", ins.op.name()), e));
        }
        for ((o, nv), s) in ins.outputs.iter().zip(outs).zip(results) {
            if let Some(n) = &program.info(*o).name {
                l.b.set_name(nv, n);
            }
            let partial = s.partial.clone();
            l.actual[o.index()] = Some((nv, s));
            if let Some(pin) = pins.get(o) {
                let dims = dims_of_spec(&pin.spec, program.shape(*o).len());
                // A value cannot be split over an axis it is still a partial sum over.
                let keep = pin.keep_partial && !dims.iter().flatten().any(|a| partial.contains(a));
                let pinned = l.reshard(*o, &dims, keep, Some(i), &pin.source_op, &pin.why)?;
                let partial = if keep { partial } else { vec![] };
                l.actual[o.index()] = Some((pinned, Sharding { dims, partial }));
                // The constrained value is the one the program goes on with: it carries the name.
                if let Some(n) = &program.info(*o).name {
                    if pinned != nv {
                        l.b.clear_name(nv);
                        l.b.set_name(pinned, n);
                    }
                }
            }
        }
    }
    let mut out_specs = vec![];
    for (k, v) in program.outputs.iter().enumerate() {
        let dims = match &out_shardings[k] {
            Some(spec) => dims_of_spec(spec, program.shape(*v).len()),
            None => prop.shardings[v.index()].clone(),
        };
        let nv = l.reshard(*v, &dims, false, None, "output", &format!("out_shardings[{k}]"))?;
        l.b.output(nv);
        out_specs.push(spec_of_dims(&dims));
    }
    let mut spmd = l.b.finish()?;
    spmd.in_specs = in_shardings.to_vec();
    // An output can reuse its input's buffer only when both are laid out alike.
    spmd.donations = program
        .donations
        .iter()
        .copied()
        .filter(|&(o, i)| {
            let rank = program.shape(program.outputs[o]).len();
            dims_of_spec(&out_specs[o], rank) == dims_of_spec(&in_shardings[i], rank)
        })
        .collect();
    spmd.out_specs = out_specs;
    // A recomputed op's lowering (with what was inserted for it) is recomputed too.
    let end = |i: usize| instr_starts.get(i + 1).copied().unwrap_or(spmd.instrs.len());
    spmd.recomputed = program
        .recomputed
        .iter()
        .flat_map(|&i| instr_starts[i]..end(i))
        .collect();
    Ok(AutoProgram {
        program: spmd,
        inserted: l.inserted,
        global_shardings: prop.shardings.iter().map(|d| spec_of_dims(d)).collect(),
        instr_starts,
    })
}

/// Attention on a device's block of the queries: the mesh axes that shard them tell the op
/// which block it holds, so its causal mask compares global positions (keys are gathered whole).
/// Queries in a global zig-zag order become the device's zig-zag chunks, where the axes split
/// them into that order's blocks.
fn with_query_block(op: &Op, axes: &[String], mesh: &Mesh) -> Result<Op, PartitionError> {
    let (Op::Attention { scale, rate, seq } | Op::AttentionGrad { scale, rate, seq }) = op else {
        return Ok(op.clone());
    };
    let zigzag = match seq.q {
        SeqBlock::Zigzag { parts } => Some(parts),
        _ => None,
    };
    if axes.is_empty() && zigzag.is_none() {
        return Ok(op.clone());
    }
    let parts = mesh.axes_size(&strs(axes))?;
    let order = match zigzag {
        None => CpOrder::Contiguous,
        Some(z) if z == parts => CpOrder::Zigzag,
        Some(z) => {
            return Err(PartitionError::Invalid {
                what: format!("jit: `{}`", op.name()),
                why: format!(
                    "its queries run in zig-zag order of {z} blocks (the 'cp' axis's), and their sharding {} cuts \
                     them into {parts}: leave the sequence split over 'cp' alone",
                    if axes.is_empty() {
                        "whole".to_string()
                    } else {
                        format!("over {}", axes.join(", "))
                    }
                ),
            })
        }
    };
    let q = SeqBlock::Part {
        axes: axes.to_vec(),
        parts,
        shift: 0,
        order,
    };
    let seq = AttnSeq { q, ..seq.clone() };
    Ok(match op {
        Op::Attention { .. } => Op::Attention {
            scale: *scale,
            rate: *rate,
            seq,
        },
        _ => Op::AttentionGrad {
            scale: *scale,
            rate: *rate,
            seq,
        },
    })
}

/// The op on local shapes: ops whose attributes carry a shape get their result's local one.
fn local_op(op: &Op, locals: &[Vec<usize>]) -> Op {
    match op {
        Op::Reshape { .. } => Op::Reshape {
            shape: locals[0].clone(),
        },
        Op::BroadcastInDim { dims, .. } => Op::BroadcastInDim {
            shape: locals[0].clone(),
            dims: dims.clone(),
        },
        Op::Full { value, .. } => Op::Full {
            shape: locals[0].clone(),
            value: *value,
        },
        other => other.clone(),
    }
}

/// A random_bits instruction of the global program being lowered: its number, its value, the
/// key's SPMD value, the global shape and the layout.
struct Draw<'a> {
    instr: usize,
    value: ValueId,
    key: ValueId,
    global: &'a [usize],
    layout: RngLayout,
}

struct Lowering {
    b: Builder,
    mesh: Mesh,
    /// Per global value: its SPMD value and how that is laid out (maybe partial sums).
    actual: Vec<Option<(ValueId, Sharding)>>,
    /// Resharded copies already made: (global value, wanted dims, partial kept) -> SPMD value.
    cache: HashMap<(ValueId, Dims, bool), ValueId>,
    inserted: Vec<Inserted>,
    names: Vec<String>,
}

fn strs(axes: &[String]) -> Vec<&str> {
    axes.iter().map(String::as_str).collect()
}

impl Lowering {
    fn record(&mut self, op: &str, source: Option<usize>, source_op: &str, v: ValueId, rule: String) {
        self.inserted.push(Inserted {
            instr: self.b.program().instrs.len() - 1,
            op: op.to_string(),
            source_instr: source,
            source_op: source_op.to_string(),
            value: self.names[v.index()].clone(),
            rule,
        });
    }

    /// Global value `v` laid out as `want` (no partial sums unless `keep_partial`): the
    /// collectives and slices that take it there from where it is, each recorded.
    fn reshard(
        &mut self,
        v: ValueId,
        want: &Dims,
        keep_partial: bool,
        source: Option<usize>,
        source_op: &str,
        why: &str,
    ) -> Result<ValueId, PartitionError> {
        let (mut x, from) = self.actual[v.index()].clone().expect("operands are lowered before use");
        if from.dims == *want && (from.partial.is_empty() || keep_partial) {
            return Ok(x);
        }
        if let Some(&c) = self.cache.get(&(v, want.clone(), keep_partial)) {
            return Ok(c);
        }
        let kept = if keep_partial { from.partial.clone() } else { vec![] };
        let target = Sharding {
            dims: want.clone(),
            partial: kept,
        }
        .text();
        let mut cur = from.clone();
        let rec = |l: &mut Self, op: &str, what: String| {
            let rule = format!("{what}: {} -> {target} for {why}", from.text());
            l.record(op, source, source_op, v, rule);
        };
        // 1. Partial sums: reduce-scatter into a dim the consumer wants split over those axes,
        //    all-reduce the rest.
        if !cur.partial.is_empty() && !keep_partial {
            for (d, want_d) in want.iter().enumerate() {
                let have = cur.dims[d].clone();
                if want_d.len() > have.len() && want_d[..have.len()] == have[..] {
                    let extra: Vec<String> = want_d[have.len()..].to_vec();
                    if extra.iter().all(|a| cur.partial.contains(a)) {
                        x = self.b.psum_scatter(x, &strs(&extra), d, true);
                        rec(
                            self,
                            "psum_scatter",
                            format!("reduce-scatter of partial sums into dim {d}"),
                        );
                        cur.dims[d] = want_d.clone();
                        cur.partial.retain(|a| !extra.contains(a));
                    }
                }
            }
            if !cur.partial.is_empty() {
                let axes = std::mem::take(&mut cur.partial);
                x = self.b.psum(x, &strs(&axes));
                rec(self, "psum", "all-reduce of partial sums".into());
            }
        }
        // 2. One axis moving between dims: all-to-all.
        for d1 in 0..want.len() {
            for d2 in 0..want.len() {
                let Some(a) = cur.dims[d1].last().cloned() else {
                    continue;
                };
                if d1 == d2 || want[d1][..] != cur.dims[d1][..cur.dims[d1].len() - 1] {
                    continue;
                }
                let mut moved = cur.dims[d2].clone();
                moved.push(a.clone());
                if want[d2] == moved {
                    x = self.b.all_to_all(x, &[a.as_str()], d2, d1);
                    rec(self, "all_to_all", format!("'{a}' moves from dim {d1} to dim {d2}"));
                    cur.dims[d1].pop();
                    cur.dims[d2] = moved;
                }
            }
        }
        // 3. All-gather the axes a dim has beyond what the consumer wants there.
        for (d, want_d) in want.iter().enumerate() {
            let common = cur.dims[d].iter().zip(want_d).take_while(|(a, b)| a == b).count();
            if common < cur.dims[d].len() {
                let axes: Vec<String> = cur.dims[d][common..].to_vec();
                x = self.b.all_gather(x, &strs(&axes), d, true);
                rec(self, "all_gather", format!("all-gather of dim {d}"));
                cur.dims[d].truncate(common);
            }
        }
        // 4. Dynamic-slice: each device keeps its block of a dim the consumer wants split.
        for d in 0..want.len() {
            if cur.dims[d].len() < want[d].len() {
                let axes: Vec<String> = want[d][cur.dims[d].len()..].to_vec();
                let parts = self.mesh.axes_size(&strs(&axes))?;
                x = self.b.emit1(Op::ShardSlice { dim: d, axes, parts }, &[x]);
                rec(self, "dynamic_slice", format!("dynamic-slice of dim {d}"));
                cur.dims[d] = want[d].clone();
            }
        }
        if let Some(e) = self.b.error() {
            return Err(invalid(
                format!("jit: resharding `{}` for {why}", self.names[v.index()]),
                e,
            ));
        }
        self.cache.insert((v, want.clone(), keep_partial), x);
        Ok(x)
    }

    /// The global bits of `draw`, in order, on every device.
    fn whole_bits(&mut self, draw: &Draw) -> ValueId {
        let bits = Op::RandomBits {
            shape: draw.global.to_vec(),
            layout: draw.layout,
            rows: SeqBlock::Whole,
        };
        self.b.emit1(bits, &[draw.key])
    }

    /// random_bits laid out as `s`. Partitionable: each device makes only its block.
    /// Original: an element's bits depend on the global size through counters spread over
    /// the whole array, so (as XLA does) every device makes the global bits and slices.
    fn random_bits(&mut self, draw: &Draw, s: &Sharding) -> Result<ValueId, PartitionError> {
        let &Draw {
            instr: i,
            value: v,
            key,
            global,
            layout,
        } = draw;
        let sharded = s.dims.iter().any(|d| !d.is_empty());
        if sharded && layout == RngLayout::Partitionable {
            let spec = spec_of_dims(&s.dims);
            let shape = local_shape(&self.mesh, global, &s.dims);
            return Ok(self.b.emit1(
                Op::RandomBitsBlock {
                    global: global.to_vec(),
                    spec,
                    shape,
                    layout,
                    seq: AttnSeq::default(),
                },
                &[key],
            ));
        }
        let full = self.whole_bits(draw);
        if !sharded {
            return Ok(full);
        }
        self.record(
            "random_bits",
            Some(i),
            "random_bits",
            v,
            format!(
                "original layout: every device generates the global {global:?} bits (replicated), then slices its block of {}",
                s.text()
            ),
        );
        self.actual[v.index()] = Some((full, Sharding::replicated(global.len())));
        let why = "random_bits in the original layout";
        self.reshard(v, &s.dims, false, Some(i), "random_bits", why)
    }

    /// Bits whose rows (dimension n - 2) are those of queries in a global zig-zag order of
    /// `parts` blocks: with the rows split over the axes of the order's blocks, each device
    /// draws its zig-zag chunks' rows (its block, in the partitionable layout; in the original
    /// layout the global bits, then its chunks' rows); with the rows whole, the global bits
    /// reordered.
    fn zigzag_bits(&mut self, draw: &Draw, parts: usize, s: &Sharding) -> Result<ValueId, PartitionError> {
        let (global, v) = (draw.global, draw.value);
        let d = global.len() - 2;
        let axes = s.dims[d].clone();
        let (bits, laid) = if axes.is_empty() {
            let full = self.whole_bits(draw);
            (
                crate::model::reorder(&mut self.b, full, d, parts, false),
                Sharding::replicated(global.len()),
            )
        } else {
            if self.mesh.axes_size(&strs(&axes))? != parts {
                return Err(PartitionError::Invalid {
                    what: "jit: `random_bits`".into(),
                    why: format!(
                        "its rows are queries in zig-zag order of {parts} blocks, and their sharding over {} cuts \
                         them otherwise: leave the sequence split over 'cp' alone",
                        axes.join(", ")
                    ),
                });
            }
            let q = SeqBlock::Part {
                axes: axes.clone(),
                parts,
                shift: 0,
                order: CpOrder::Zigzag,
            };
            let mut dims = vec![vec![]; global.len()];
            dims[d] = axes;
            if draw.layout == RngLayout::Partitionable {
                let mut rest = s.dims.clone();
                rest[d] = vec![];
                let block = Op::RandomBitsBlock {
                    global: global.to_vec(),
                    spec: spec_of_dims(&rest),
                    shape: local_shape(&self.mesh, global, &s.dims),
                    layout: draw.layout,
                    seq: AttnSeq { q, kv: SeqBlock::Whole },
                };
                return Ok(self.b.emit1(block, &[draw.key]));
            }
            let full = self.whole_bits(draw);
            let rows = self.b.emit1(Op::SeqTake { dim: d, seq: q }, &[full]);
            (rows, Sharding { dims, partial: vec![] })
        };
        self.actual[v.index()] = Some((bits, laid));
        self.reshard(
            v,
            &s.dims,
            false,
            Some(draw.instr),
            "random_bits",
            "random_bits in zig-zag order",
        )
    }
}
