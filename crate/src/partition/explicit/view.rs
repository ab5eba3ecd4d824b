//! The typed program as a reader sees it, and where its random bits live: data for the CLI's
//! text and JSON and for the page.
use super::annotate::{Annotated, ChoiceKind};
use super::types::type_text;
use crate::ir::{numel, Op, RngLayout};
use crate::partition::auto::spec_of_dims;
use crate::sharding::Mesh;

/// One line of the typed program: an input or an instruction, each result with its type.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TypedLine {
    /// The instruction (None for a program input).
    pub instr: Option<usize>,
    /// `%12 = dot_general(%3, %7) contracting=([2],[0]) out_sharding=P('dp', None, None) :
    /// f32[8@dp,4,16]  # h0.proj`.
    pub text: String,
    /// Each result's type, `f32[8@dp,4,16]`.
    pub types: Vec<String>,
    /// The index in [`Annotated::choices`] of the choice the line writes, if any.
    pub choice: Option<usize>,
}

/// Every line of `a`'s program, typed.
pub fn typed_lines(a: &Annotated) -> Vec<TypedLine> {
    let p = &a.program;
    let ty = |v: crate::ir::ValueId| type_text(p.info(v).dtype, p.shape(v), &a.types[v.index()]);
    let name = |v: crate::ir::ValueId| p.info(v).name.clone();
    let mut lines = vec![];
    for (v, _) in &p.inputs {
        let t = ty(*v);
        lines.push(TypedLine {
            instr: None,
            text: format!("{v} = parameter {} : {t}", name(*v).unwrap_or_default()),
            types: vec![t],
            choice: None,
        });
    }
    for (i, ins) in p.instrs.iter().enumerate() {
        let lhs: Vec<String> = ins.outputs.iter().map(|v| v.to_string()).collect();
        let args: Vec<String> = ins.inputs.iter().map(|v| v.to_string()).collect();
        let types: Vec<String> = ins.outputs.iter().map(|v| ty(*v)).collect();
        let mut text = format!("{} = {}({})", lhs.join(", "), ins.op.name(), args.join(", "));
        let attrs = ins.op.attrs();
        if !attrs.is_empty() {
            text += &format!(" {attrs}");
        }
        if let Some(d) = a.out_sharding.get(&i) {
            text += &format!(" out_sharding={}", spec_of_dims(d).p_text());
        }
        text += &format!(" : {}", types.join(", "));
        let mut notes: Vec<String> = ins.outputs.iter().filter_map(|v| name(*v)).collect();
        if p.is_recomputed(i) {
            notes.push("recomputed (jax.checkpoint)".into());
        }
        let choice = a.choices.iter().position(|c| c.instr == i);
        if let Some(c) = choice.map(|c| &a.choices[c]) {
            let how = match c.kind {
                ChoiceKind::OutSharding => "out_sharding",
                ChoiceKind::Reshard => "reshard",
            };
            notes.push(format!("{how}: {}", c.why));
        }
        if !notes.is_empty() {
            text += &format!("  # {}", notes.join("; "));
        }
        lines.push(TypedLine {
            instr: Some(i),
            text,
            types,
            choice,
        });
    }
    lines
}

/// Where one draw of random bits lives in explicit mode and what making it costs each device.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BitsSite {
    pub instr: usize,
    /// The value the bits mask, or the bits' own name.
    pub value: String,
    /// The bits' type, `u32[8@dp,16,64]`.
    pub ty: String,
    /// The out_sharding the draw was given (`jax.random.bits(..., out_sharding=...)`), if any.
    pub out_sharding: Option<String>,
    pub layout: String,
    pub global_elements: u64,
    /// Elements each device generates: its block (partitionable layout, sharded type), else
    /// the whole array (the original layout cannot make a block alone; a replicated type is
    /// the whole array everywhere).
    pub generated_per_device: u64,
    pub generation: String,
}

/// Every `random_bits` of `a`'s program: its type and its generation on each device.
pub fn bits_sites(a: &Annotated, mesh: &Mesh) -> Vec<BitsSite> {
    let p = &a.program;
    let mut out = vec![];
    for (i, ins) in p.instrs.iter().enumerate() {
        let Op::RandomBits { shape, layout, .. } = &ins.op else {
            continue;
        };
        let v = ins.outputs[0];
        let dims = &a.types[v.index()];
        let split: usize = dims.iter().flatten().map(|x| mesh.size_of(x).unwrap_or(1)).product();
        let global = numel(shape) as u64;
        let masked = p
            .instrs
            .iter()
            .find(|r| r.inputs.contains(&v))
            .and_then(|r| r.outputs.first())
            .and_then(|o| p.info(*o).name.clone());
        let (generated, generation) = match (split > 1, layout) {
            (true, RngLayout::Partitionable) => (
                global / split as u64,
                format!("each device generates its block (1/{split} of the bits): the partitionable layout"),
            ),
            (true, RngLayout::Original) => (
                global,
                "every device generates all the bits, then slices its block: the original layout makes no block alone"
                    .to_string(),
            ),
            (false, _) => (
                global,
                "replicated: every device generates all the bits (no out_sharding)".to_string(),
            ),
        };
        out.push(BitsSite {
            instr: i,
            value: masked.unwrap_or_else(|| v.to_string()),
            ty: type_text(p.info(v).dtype, shape, dims),
            out_sharding: a.out_sharding.get(&i).map(|d| spec_of_dims(d).p_text()),
            layout: layout.name().to_string(),
            global_elements: global,
            generated_per_device: generated,
            generation,
        });
    }
    out
}
