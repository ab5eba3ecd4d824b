//! Typing a global program in explicit mode, op by op, as JAX traces it: each result's type
//! from its op's rule; where the caller wants a type the rule would not give (a choice the
//! program makes), the op is given `out_sharding=` if it takes one, else its result is
//! `reshard`ed; a cotangent is typed like its primal, as JAX's transpose rules type it. An op
//! JAX would refuse (and nobody wants a type there) is refused, with JAX's message and fix.
use std::collections::BTreeMap;

use super::error::{Fix, ShardingTypeError};
use super::rules::{accepts_out_sharding, infer, FixKind, RuleError, Typed};
use super::types::{duplicate_axis, type_text, Dims};
use crate::ir::{Instr, Op, Program, ValueId, ValueInfo};
use crate::partition::auto::spec_of_dims;
use crate::sharding::{Mesh, PartitionSpec};

/// A type the program gives a value, and why (said where the choice is shown).
#[derive(Clone, Debug, PartialEq)]
pub struct Want {
    pub dims: WantDims,
    pub why: String,
}

/// The type wanted: a layout, or one read off other values when they are typed (dim `d` takes
/// the axes of dim `.1` of value `.0`; None: replicated), as `jax.random.bits(key, x.shape,
/// out_sharding=jax.typeof(x).sharding)` reads the masked value's.
#[derive(Clone, Debug, PartialEq)]
pub enum WantDims {
    Spec(Dims),
    From(Vec<Option<(ValueId, usize)>>),
}

/// How a choice is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChoiceKind {
    /// `out_sharding=` on the op that makes the value.
    OutSharding,
    /// `jax.sharding.reshard(x, spec)` after it.
    Reshard,
}

/// A choice the typed program makes: the line that writes it (and causes its collective).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Choice {
    /// The instruction of the typed program that writes it.
    pub instr: usize,
    pub kind: ChoiceKind,
    /// The value it types, by name (`%n` where it has none).
    pub value: String,
    pub spec: String,
    pub why: String,
}

/// A global program typed in explicit mode.
#[derive(Clone, Debug)]
pub struct Annotated {
    /// The program with its reshards (instructions of their own).
    pub program: Program,
    /// Every value's type: its Explicit axes per dimension.
    pub types: Vec<Dims>,
    /// The out_sharding each instruction was given, where the program gives one.
    pub out_sharding: BTreeMap<usize, Dims>,
    pub choices: Vec<Choice>,
    /// For every instruction of the program typed, its index in [`Annotated::program`].
    pub instr_map: Vec<usize>,
}

/// Why a cotangent has the type it has.
const TRANSPOSE: &str = "autodiff: a cotangent is typed like its primal (JAX's transpose rule)";

struct Walk<'a> {
    src: &'a Program,
    mesh: &'a Mesh,
    out: Program,
    types: Vec<Dims>,
    out_sharding: BTreeMap<usize, Dims>,
    choices: Vec<Choice>,
    /// The value readers of an original value read (after its reshard).
    subst: Vec<Option<ValueId>>,
    /// For every value, the original value it is (a reshard's result: its operand's).
    origin: Vec<ValueId>,
}

/// Types `prog` (a global program) on `mesh`: its inputs typed `in_types` (Explicit axes
/// only), values wanted as `wants` say, its outputs retyped to `out_types` where they differ
/// (None: as they come). A want on a program input types what its readers read, but for the
/// optimizer's updates, which read the input as stored.
pub fn annotate(
    prog: &Program,
    mesh: &Mesh,
    in_types: &[Dims],
    wants: &BTreeMap<ValueId, Want>,
    out_types: Option<&[Dims]>,
) -> Result<Annotated, ShardingTypeError> {
    let mut w = Walk {
        src: prog,
        mesh,
        out: Program {
            values: prog.values.clone(),
            inputs: prog.inputs.clone(),
            outputs: vec![],
            donations: prog.donations.clone(),
            precision: prog.precision,
            like_primal: prog.like_primal.clone(),
            ..Default::default()
        },
        types: prog.values.iter().map(|v| vec![vec![]; v.shape.len()]).collect(),
        out_sharding: BTreeMap::new(),
        choices: vec![],
        subst: vec![None; prog.values.len()],
        origin: (0..prog.values.len() as u32).map(ValueId).collect(),
    };
    for ((v, _), t) in prog.inputs.iter().zip(in_types) {
        w.types[v.index()] = t.clone();
    }
    let like: BTreeMap<ValueId, &crate::ir::LikePrimal> = prog.like_primal.iter().map(|r| (r.value, r)).collect();
    let mut instr_map = Vec::with_capacity(prog.instrs.len());
    let mut recomputed = vec![];
    for (i, ins) in prog.instrs.iter().enumerate() {
        let updates = matches!(ins.op, Op::SgdUpdate { .. } | Op::AdamWUpdate { .. });
        let mut operands = Vec::with_capacity(ins.inputs.len());
        for v in &ins.inputs {
            let input = prog.inputs.iter().any(|(x, _)| x == v);
            if input && updates {
                operands.push(*v);
                continue;
            }
            if input && w.subst[v.index()].is_none() {
                if let Some(want) = wants.get(v) {
                    let dims = w.want_dims(want)?;
                    if dims != w.types[v.index()] {
                        w.reshard(*v, dims, &want.why);
                    }
                }
            }
            operands.push(w.subst[v.index()].unwrap_or(*v));
        }
        if updates {
            w.update_on_blocks(&mut operands);
        }
        // The types each result must take in turn, and why: a cotangent its primal's (JAX's
        // transpose rule), then what the program wants of it.
        let mut chains: Vec<Vec<(Dims, String)>> = vec![];
        for o in &ins.outputs {
            let mut chain = vec![];
            if let Some(r) = like.get(o) {
                let primal = &w.types[r.primal.index()];
                chain.push((
                    r.dims.iter().map(|&d| primal[d].clone()).collect(),
                    TRANSPOSE.to_string(),
                ));
            }
            if let Some(want) = wants.get(o) {
                chain.push((w.want_dims(want)?, want.why.clone()));
            }
            chains.push(chain);
        }
        let at = w.out.instrs.len();
        instr_map.push(at);
        if prog.is_recomputed(i) {
            recomputed.push(at);
        }
        let first: Vec<Option<&(Dims, String)>> = chains.iter().map(|c| c.first()).collect();
        let types = w.type_op(ins, &operands, &first)?;
        for (o, t) in ins.outputs.iter().zip(&types) {
            w.types[o.index()] = t.clone();
        }
        w.out.instrs.push(Instr {
            op: ins.op.clone(),
            inputs: operands,
            outputs: ins.outputs.clone(),
        });
        // Each type still to take: a reshard right after the op.
        for ((o, t), chain) in ins.outputs.iter().zip(&types).zip(&chains) {
            let (mut v, mut cur) = (*o, t.clone());
            for (dims, why) in chain {
                if *dims != cur {
                    v = w.reshard(v, dims.clone(), why);
                    cur = dims.clone();
                }
            }
        }
    }
    for (k, v) in prog.outputs.iter().enumerate() {
        let v = w.subst[v.index()].unwrap_or(*v);
        let v = match out_types.map(|t| &t[k]) {
            Some(want) if &w.types[v.index()] != want => w.reshard(v, want.clone(), "the step's out_shardings"),
            _ => v,
        };
        w.out.outputs.push(v);
    }
    w.out.recomputed = recomputed;
    Ok(Annotated {
        program: w.out,
        types: w.types,
        out_sharding: w.out_sharding,
        choices: w.choices,
        instr_map,
    })
}

impl Walk<'_> {
    fn name(&self, v: ValueId) -> String {
        self.out.info(v).name.clone().unwrap_or_else(|| v.to_string())
    }

    fn want_dims(&self, want: &Want) -> Result<Dims, ShardingTypeError> {
        Ok(match &want.dims {
            WantDims::Spec(d) => d.clone(),
            WantDims::From(from) => from
                .iter()
                .map(|f| match f {
                    Some((v, d)) => {
                        let v = self.subst[v.index()].unwrap_or(*v);
                        self.types[v.index()][*d].clone()
                    }
                    None => vec![],
                })
                .collect(),
        })
    }

    /// An optimizer update whose operands are laid out at different granularities (ZeRO: the
    /// gradient or the state split over 'dp' as well, the parameter not) runs on each device's
    /// block, as a ZeRO user writes it: every coarser operand resharded to the finest one's type
    /// (a slice, no communication); the step's out_shardings gather the parameter back. Operands
    /// that do not refine into one type are left for the rule to refuse.
    fn update_on_blocks(&mut self, operands: &mut [ValueId]) {
        let finest = operands
            .iter()
            .map(|v| self.types[v.index()].clone())
            .max_by_key(|t| t.iter().map(Vec::len).sum::<usize>())
            .unwrap_or_default();
        let refines = |t: &Dims| t.len() == finest.len() && t.iter().zip(&finest).all(|(a, b)| b.starts_with(a));
        let why = "ZeRO: the update runs on each device's block, the operand resharded like the finest of them";
        for v in operands.iter_mut() {
            let t = self.types[v.index()].clone();
            if t != finest && refines(&t) {
                // The reshard is the update's own: later readers of the value still read it as it was.
                let orig = self.origin[v.index()];
                let before = self.subst[orig.index()];
                let r = self.reshard(*v, finest.clone(), why);
                self.subst[orig.index()] = before;
                // A stored input keeps its name (the step's parameters are found by it).
                let name = self.out.values[r.index()].name.take();
                self.out.values[v.index()].name = name;
                *v = r;
            }
        }
    }

    /// Appends `reshard(v, dims)` (the readers after it read it) and records the choice.
    fn reshard(&mut self, v: ValueId, dims: Dims, why: &str) -> ValueId {
        let info = self.out.info(v).clone();
        let r = ValueId(self.out.values.len() as u32);
        self.out.values.push(ValueInfo {
            name: None,
            ..info.clone()
        });
        self.types.push(dims.clone());
        let orig = self.origin[v.index()];
        self.origin.push(orig);
        self.subst[orig.index()] = Some(r);
        // The resharded value is the one the program goes on with: it carries the name.
        if let Some(n) = info.name {
            self.out.values[v.index()].name = None;
            self.out.values[r.index()].name = Some(n);
        }
        let spec = spec_of_dims(&dims);
        self.choices.push(Choice {
            instr: self.out.instrs.len(),
            kind: ChoiceKind::Reshard,
            value: self.name(r),
            spec: spec.p_text(),
            why: why.to_string(),
        });
        self.out.instrs.push(Instr {
            op: Op::Reshard { spec },
            inputs: vec![v],
            outputs: vec![r],
        });
        r
    }

    /// The types of `ins`'s results on `operands`, given the types `desired` of them: as
    /// out_sharding where the op takes one and its rule would not give that type (or raises),
    /// else by the rule (a result of another type is resharded by the caller).
    fn type_op(
        &mut self,
        ins: &Instr,
        operands: &[ValueId],
        first: &[Option<&(Dims, String)>],
    ) -> Result<Vec<Dims>, ShardingTypeError> {
        let typed: Vec<Typed> = operands
            .iter()
            .map(|v| Typed {
                shape: self.out.shape(*v),
                dtype: self.out.info(*v).dtype,
                dims: &self.types[v.index()],
            })
            .collect();
        let outs: Vec<&[usize]> = ins.outputs.iter().map(|o| self.src.shape(*o)).collect();
        if let Op::Reshard { spec } = &ins.op {
            let dims = crate::partition::auto::dims_of_spec(spec, outs[0].len());
            return Ok(vec![dims]);
        }
        let inferred = infer(&ins.op, &typed, &outs, None, self.mesh);
        let chosen = match (first, accepts_out_sharding(&ins.op)) {
            ([Some((want, why))], true) if inferred.as_ref().map_or(true, |t| &t[0] != want) => {
                Some((want.clone(), why.clone()))
            }
            _ => None,
        };
        match (chosen, inferred) {
            (Some((want, why)), _) => {
                let at = self.out.instrs.len();
                self.out_sharding.insert(at, want.clone());
                self.choices.push(Choice {
                    instr: at,
                    kind: ChoiceKind::OutSharding,
                    value: self.name(ins.outputs[0]),
                    spec: spec_of_dims(&want).p_text(),
                    why,
                });
                Ok(vec![want])
            }
            (None, Ok(types)) => Ok(types),
            (None, Err(e)) => Err(self.refusal(ins, operands, &typed, e)),
        }
    }

    fn refusal(&self, ins: &Instr, operands: &[ValueId], typed: &[Typed], e: RuleError) -> ShardingTypeError {
        let args: Vec<String> = operands
            .iter()
            .zip(typed)
            .map(|(v, t)| format!("{v}: {}", type_text(t.dtype, t.shape, t.dims)))
            .collect();
        let outs: Vec<String> = ins.outputs.iter().map(|o| o.to_string()).collect();
        let attrs = ins.op.attrs();
        let line = format!(
            "{} = {}({}){}{}",
            outs.join(", "),
            ins.op.name(),
            args.join(", "),
            if attrs.is_empty() { "" } else { " " },
            attrs
        );
        let (value, spec) = match (e.fix, e.operand) {
            (FixKind::Reshard, Some(k)) => (operands[k], e.suggestion.clone()),
            _ => (ins.outputs[0], e.suggestion.clone()),
        };
        let spec = spec.filter(|d| duplicate_axis(d).is_none()).map(|d| spec_of_dims(&d));
        let named = self.out.info(value).name.is_some();
        let name = self.name(value);
        let p = spec.as_ref().map_or("P(...)".to_string(), PartitionSpec::p_text);
        let code = match e.fix {
            FixKind::OutSharding => format!("give {} out_sharding={p}", ins.op.name()),
            FixKind::Reshard => format!("{name} = jax.sharding.reshard({name}, {p})"),
            FixKind::AutoAxes => format!("run {} under jax.sharding.auto_axes", ins.op.name()),
        };
        ShardingTypeError {
            instr: self.out.instrs.len(),
            op: ins.op.name().to_string(),
            line,
            message: e.message,
            fix: Box::new(Fix {
                kind: e.fix,
                value: name,
                named,
                spec: spec.map(|s| s.p_text()),
                code,
            }),
        }
    }
}
