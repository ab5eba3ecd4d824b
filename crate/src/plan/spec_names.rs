//! What the name of a spec override names (`--spec NAME=P(...)`, a field of the page's
//! sharding editor): a parameter's full name (`h0.w_fc`) or, for block parameters, its name in
//! every block (`w_fc`); else any named value of the global train step, as the program text
//! names it: an input (`tokens`, `targets`) or an intermediate (`h0.att`, `logits`, a gradient
//! `dh0.w_fc`). The CLI and the page both match names here, so a name means the same in each.
use std::collections::BTreeSet;

use super::PlanError;
use crate::ir::{Program, Role, ValueId};
use crate::model::ParamSpec;
use crate::setting::{Refusal, Setting};
use crate::sharding::{Mesh, NamedSharding, PartitionSpec};

/// The token batch's name: an input of the global step (the targets are another).
pub const TOKENS: &str = "tokens";

/// What one spec name names.
#[derive(Clone, Debug, PartialEq)]
pub enum SpecTarget {
    /// Parameters, by index: the spec is their in_sharding, and their optimizer state and
    /// update follow it.
    Params(Vec<usize>),
    /// Named values of the step: an input's spec is its in_sharding, an intermediate's a
    /// `jax.lax.with_sharding_constraint`.
    Values {
        inputs: Vec<ValueId>,
        intermediates: Vec<ValueId>,
    },
}

/// A block parameter's short name (`w_fc` for `h0.w_fc`); None for a model-level one (`wte`).
pub fn block_leaf(name: &str) -> Option<&str> {
    let (block, leaf) = name.split_once('.')?;
    let index = block.strip_prefix('h')?;
    (!index.is_empty() && index.bytes().all(|b| b.is_ascii_digit())).then_some(leaf)
}

/// The name a parameter's spec is given under for every block: its short name in a block,
/// else its own.
pub fn group_name(name: &str) -> &str {
    block_leaf(name).unwrap_or(name)
}

/// The parameters `name` covers: the one of that full name, or every block's of that short name.
pub fn params_named<'a>(params: &'a [ParamSpec], name: &str) -> Vec<&'a ParamSpec> {
    params
        .iter()
        .filter(|p| p.name == name || block_leaf(&p.name) == Some(name))
        .collect()
}

/// What `name` names in `prog` (the global train step, whose parameters are `params`), with
/// `spec` checked to fit each value it names on `mesh`. Every error names the override
/// (`--spec NAME=SPEC`) and says what to write instead.
pub fn resolve_spec(
    params: &[ParamSpec],
    prog: &Program,
    mesh: &Mesh,
    name: &str,
    spec: &PartitionSpec,
) -> Result<SpecTarget, PlanError> {
    let setting = Setting::Spec(name.to_string());
    let refuse = |why: String| PlanError::from(Refusal::at(setting.clone(), spec, why));
    let fits = |value: &str, shape: &[usize]| {
        NamedSharding::new(mesh.clone(), spec.clone())
            .and_then(|s| s.shard_shape(shape))
            .map(|_| ())
            .map_err(|e| {
                let what = format!("{} for {value} {shape:?}", setting.at(spec));
                PlanError::from(Refusal::new(setting.clone(), format!("{what}: {e}")))
            })
    };
    let hits = params_named(params, name);
    if !hits.is_empty() {
        for p in &hits {
            fits(&format!("parameter `{}`", p.name), &p.shape)?;
        }
        return Ok(SpecTarget::Params(hits.iter().map(|p| p.index).collect()));
    }
    let (mut inputs, mut intermediates) = (vec![], vec![]);
    for v in (0..prog.values.len() as u32).map(ValueId) {
        let info = prog.info(v);
        if info.name.as_deref() != Some(name) {
            continue;
        }
        match prog.inputs.iter().find(|(i, _)| *i == v).map(|(_, role)| role) {
            Some(Role::OptState { param, .. }) => {
                return Err(refuse(format!(
                    "`{name}` is optimizer state, laid out like its parameter: give `{}` the spec instead",
                    params[*param].name
                )))
            }
            Some(_) => inputs.push(v),
            None => intermediates.push(v),
        }
        fits(&format!("`{name}`"), &info.shape)?;
    }
    if inputs.is_empty() && intermediates.is_empty() {
        let groups: BTreeSet<&str> = params.iter().map(|p| group_name(&p.name)).collect();
        return Err(refuse(format!(
            "there is no parameter or named value `{name}`; parameters are {}, and other values are named as the \
             program text shows (tokens, h0.att, logits, ...)",
            groups.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(SpecTarget::Values { inputs, intermediates })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::RngLayout;
    use crate::model::{param_specs, train_step_program, GptConfig, Optimizer};

    /// Two blocks, so a short name covers several parameters.
    fn two_blocks() -> GptConfig {
        GptConfig {
            layers: 2,
            ..GptConfig::tiny()
        }
    }

    fn resolve(name: &str, spec: &str) -> Result<SpecTarget, PlanError> {
        let cfg = two_blocks();
        let step = train_step_program(&cfg, Optimizer::AdamW { lr: 1e-3 }, RngLayout::Original).unwrap();
        let mesh = Mesh::new(&[("dp", 2)]).unwrap();
        resolve_spec(
            &param_specs(&cfg),
            &step.program,
            &mesh,
            name,
            &PartitionSpec::parse(spec).unwrap(),
        )
    }

    #[test]
    fn a_short_name_covers_every_block_and_a_full_name_one() {
        let params = param_specs(&two_blocks());
        let blocks = params.iter().filter(|p| p.name.ends_with(".w_fc")).count();
        assert!(blocks > 1);
        assert_eq!(params_named(&params, "w_fc").len(), blocks);
        assert_eq!(params_named(&params, "h1.w_fc").len(), 1);
        assert_eq!(block_leaf("wte"), None);
        assert_eq!(block_leaf("hx.w_fc"), None);
        assert_eq!(group_name("h3.b_qkv"), "b_qkv");
    }

    #[test]
    fn inputs_and_intermediates_are_matched_by_the_program_texts_names() {
        assert!(
            matches!(resolve("tokens", "P()"), Ok(SpecTarget::Values { inputs, intermediates }) if inputs.len() == 1 && intermediates.is_empty())
        );
        assert!(
            matches!(resolve("h0.att", "P()"), Ok(SpecTarget::Values { inputs, intermediates }) if inputs.is_empty() && intermediates.len() == 1)
        );
        assert!(matches!(resolve("w_fc", "P(None, 'dp')"), Ok(SpecTarget::Params(p)) if p.len() > 1));
    }

    #[test]
    fn a_spec_that_does_not_fit_or_names_nothing_is_refused_with_the_override_named() {
        let e = resolve("w_fc", "P('tp')").unwrap_err().to_string();
        assert!(e.starts_with("--spec w_fc=") && e.contains("tp"), "{e}");
        let e = resolve("nope", "P()").unwrap_err().to_string();
        assert!(e.contains("no parameter or named value `nope`"), "{e}");
        let e = resolve("h0.w_fc.m", "P()").unwrap_err().to_string();
        assert!(e.contains("give `h0.w_fc` the spec"), "{e}");
    }
}
