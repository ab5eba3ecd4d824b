//! The sharding editor's names and checks: automatic mode's PartitionSpec per parameter group
//! (a block parameter's short name, `w_fc`, applies to every block; its full name, `h0.w_fc`,
//! to one), per token batch (`tokens`), and per intermediate value (a
//! `jax.lax.with_sharding_constraint`, named as the program text names it: `h0.att`). These are
//! the names the CLI's `--spec` and the core's planner take; every check here is the core's
//! (PartitionSpec::parse, NamedSharding), so the page and the CLI agree.
use std::collections::BTreeMap;

use serde_json::{json, Value};
use shardlab::ir::Role;
use shardlab::model::{param_specs, train_step_program, ParamSpec};
use shardlab::plan::auto_param_spec;
use shardlab::sharding::{Mesh, NamedSharding, PartitionSpec};

use crate::picture::spec_text;
use crate::settings::{FieldError, Mode, Settings};

/// The token batch's name (the global step's input; the targets follow it).
pub const TOKENS: &str = "tokens";
/// More specs than this in one link are not a hand-made edit.
const MAX_SPECS: usize = 256;

/// A block parameter's short name (`w_fc` for `h0.w_fc`), None for a model-level one (`wte`).
fn block_leaf(name: &str) -> Option<&str> {
    let (block, leaf) = name.split_once('.')?;
    (block.starts_with('h') && block[1..].parse::<usize>().is_ok()).then_some(leaf)
}

/// The parameters a spec name covers: its full name, or every block's parameter of that short name.
fn params_named<'a>(params: &'a [ParamSpec], name: &str) -> Vec<&'a ParamSpec> {
    params
        .iter()
        .filter(|p| p.name == name || block_leaf(&p.name) == Some(name))
        .collect()
}

/// `spec` fits a value of `shape` on `mesh` (the core's check), else why not.
fn fits(mesh: &Mesh, spec: &PartitionSpec, what: &str, shape: &[usize]) -> Result<(), String> {
    NamedSharding::new(mesh.clone(), spec.clone())
        .and_then(|s| s.shard_shape(shape))
        .map(|_| ())
        .map_err(|e| format!("{} on {what} {shape:?}: {e}", spec_text(spec)))
}

/// The specs worth offering for a value of `shape` on `mesh`: `P()`, each axis on each
/// dimension it divides, and on two axes both axes on two dimensions or on one.
pub fn suggestions(mesh: &Mesh, shape: &[usize]) -> Vec<String> {
    let axes: Vec<&str> = mesh.axis_names();
    let rank = shape.len();
    let with = |entries: Vec<Vec<&str>>| {
        let mut e: Vec<Vec<String>> = (0..rank).map(|_| vec![]).collect();
        for (d, axes) in entries.into_iter().enumerate() {
            e[d] = axes.into_iter().map(String::from).collect();
        }
        PartitionSpec::new(e)
    };
    let mut out = vec![PartitionSpec::replicated()];
    let place = |picks: &[(usize, Vec<&str>)]| {
        let mut entries: Vec<Vec<&str>> = vec![vec![]; rank];
        for (d, a) in picks {
            entries[*d].clone_from(a);
        }
        with(entries)
    };
    for d in 0..rank {
        for a in &axes {
            out.push(place(&[(d, vec![a])]));
        }
        if axes.len() == 2 {
            out.push(place(&[(d, axes.clone())]));
            for e in 0..rank {
                if e != d {
                    out.push(place(&[(d, vec![axes[0]]), (e, vec![axes[1]])]));
                }
            }
        }
    }
    out.into_iter()
        .filter(|s| fits(mesh, s, "", shape).is_ok())
        .map(|s| spec_text(&s))
        .collect()
}

/// Checks one spec (`text`) for the value `name` under `settings` on `mesh`; the spec, or the
/// reason in the page's words.
pub fn check_one(settings: &Settings, mesh: &Mesh, name: &str, text: &str) -> Result<PartitionSpec, String> {
    let spec = PartitionSpec::parse(text.trim()).map_err(|e| format!("{e} (write it like P('dp', None) or P())"))?;
    let cfg = settings.config();
    let params = param_specs(&cfg);
    let hits = params_named(&params, name);
    if !hits.is_empty() {
        for p in hits {
            fits(mesh, &spec, &p.name, &p.shape)?;
        }
        return Ok(spec);
    }
    if name == TOKENS {
        fits(mesh, &spec, "the token batch", &[cfg.batch, cfg.seq])?;
        return Ok(spec);
    }
    // Any other name is an intermediate of the global step, as the program text names it.
    let optimizer = settings.options(Mode::Auto, mesh).optimizer;
    let global = train_step_program(&cfg, optimizer, settings.rng_layout()).map_err(|e| e.to_string())?;
    let prog = &global.program;
    let Some(v) = (0..prog.values.len()).find(|v| prog.values[*v].name.as_deref() == Some(name)) else {
        let mut groups: Vec<&str> = params.iter().map(|p| block_leaf(&p.name).unwrap_or(&p.name)).collect();
        groups.dedup();
        return Err(format!(
            "there is no value “{name}”: name a parameter ({}, or one block's, like h0.w_fc), tokens, or a value as the program text names it (h0.att, logits)",
            groups.join(", ")
        ));
    };
    if let Some((_, role)) = prog.inputs.iter().find(|(i, _)| i.index() == v) {
        let fix = match role {
            Role::OptState { param, .. } => format!(
                "it is laid out like its parameter: give {} a spec instead",
                params[*param].name
            ),
            _ => "only parameters, tokens and intermediate values take a spec here".to_string(),
        };
        return Err(format!("“{name}” is an input of the step: {fix}"));
    }
    fits(mesh, &spec, name, &prog.values[v].shape)?;
    Ok(spec)
}

/// Every spec of the settings, checked; the first problem at its field (`spec.NAME`).
pub fn check_specs(settings: &Settings, mesh: &Mesh) -> Result<(), FieldError> {
    if settings.specs.len() > MAX_SPECS {
        return Err(FieldError {
            field: String::new(),
            message: format!(
                "{} specs are more than the page takes (at most {MAX_SPECS})",
                settings.specs.len()
            ),
        });
    }
    for (name, text) in &settings.specs {
        check_one(settings, mesh, name, text).map_err(|message| FieldError {
            field: format!("spec.{name}"),
            message,
        })?;
    }
    Ok(())
}

/// A planning error at the control it belongs to: the spec field of the value it names (a
/// with_sharding_constraint the partitioner cannot honour), else as the core's errors go.
pub fn plan_error(settings: &Settings, message: &str) -> FieldError {
    let named = settings
        .specs
        .keys()
        .filter(|n| message.contains(&format!("`{n}`")) || message.contains(&format!("--spec {n}=")))
        .max_by_key(|n| n.len());
    match named {
        Some(n) => FieldError {
            field: format!("spec.{n}"),
            message: message.replace("--spec ", "spec "),
        },
        None => FieldError::from_core(message, "mesh"),
    }
}

/// The settings' specs as the planner takes them (`TrainerOptions`' `specs`): the token
/// batch's spec applies to the targets too. Unparsable entries are left out (check_specs
/// refuses them first).
pub fn overrides(settings: &Settings) -> Vec<(String, PartitionSpec)> {
    let mut out = vec![];
    for (name, text) in &settings.specs {
        let Ok(spec) = PartitionSpec::parse(text) else { continue };
        if name == TOKENS && !settings.specs.contains_key("targets") {
            out.push(("targets".to_string(), spec.clone()));
        }
        out.push((name.clone(), spec));
    }
    out
}

/// The editor's fields under `settings`: each parameter group with its preset spec, shape,
/// suggestions and per-block members; the token batch; and the specs that name intermediates
/// (the with_sharding_constraints), each spec as the page writes it.
pub fn groups(settings: &Settings) -> Value {
    let mesh = match settings.mesh() {
        Ok(m) => m,
        Err(e) => return json!({"ok": false, "error": e.message}),
    };
    let cfg = settings.config();
    let strategy = settings.strategy();
    let params = param_specs(&cfg);
    let preset = |p: &ParamSpec| spec_text(&auto_param_spec(&cfg, strategy, &mesh, p));
    let mut groups: BTreeMap<String, Value> = BTreeMap::new();
    let mut order: Vec<String> = vec![];
    for p in &params {
        let group = block_leaf(&p.name).unwrap_or(&p.name).to_string();
        let entry = groups.entry(group.clone()).or_insert_with(|| {
            order.push(group.clone());
            json!({
                "name": group,
                "shape": p.shape,
                "preset": preset(p),
                "options": suggestions(&mesh, &p.shape),
                "layers": [],
            })
        });
        if block_leaf(&p.name).is_some() {
            if let Some(layers) = entry["layers"].as_array_mut() {
                layers.push(json!({"name": p.name, "preset": preset(p)}));
            }
        }
    }
    let batch = [cfg.batch, cfg.seq];
    let tokens_preset = if strategy.axes().contains(&"dp") {
        PartitionSpec::from_axes(&[Some("dp"), None])
    } else {
        PartitionSpec::replicated()
    };
    let is_field = |name: &str| name == TOKENS || !params_named(&params, name).is_empty();
    let constraints: Vec<Value> = settings
        .specs
        .iter()
        .filter(|(n, _)| !is_field(n))
        .map(|(n, s)| json!({"name": n, "spec": s}))
        .collect();
    json!({
        "ok": true,
        "axes": mesh.axes(),
        "groups": order.iter().map(|g| groups[g].clone()).collect::<Vec<_>>(),
        "batch": {"name": TOKENS, "shape": batch, "preset": spec_text(&tokens_preset), "options": suggestions(&mesh, &batch)},
        "constraints": constraints,
    })
}

/// `check_one` for the page: `{"ok":true,"spec":"P('dp', None)"}` (the spec as written back) or
/// `{"ok":false,"error":...}`.
pub fn check_json(settings_json: &str, name: &str, text: &str) -> Value {
    let settings: Settings = match serde_json::from_str(settings_json) {
        Ok(s) => s,
        Err(e) => return json!({"ok": false, "error": format!("the settings are not valid: {e}")}),
    };
    let mesh = match settings.mesh() {
        Ok(m) => m,
        Err(e) => return json!({"ok": false, "error": format!("fix the mesh first: {}", e.message)}),
    };
    match check_one(&settings, &mesh, name, text) {
        Ok(spec) => json!({"ok": true, "spec": spec_text(&spec)}),
        Err(e) => json!({"ok": false, "error": e}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Preset;

    fn dp() -> (Settings, Mesh) {
        let s = Settings::preset(Preset::Dp);
        let mesh = s.mesh().unwrap();
        (s, mesh)
    }

    #[test]
    fn a_short_name_covers_every_block_and_a_full_name_one() {
        let (s, _) = dp();
        let params = param_specs(&s.config());
        let all: Vec<&str> = params_named(&params, "w_fc").iter().map(|p| p.name.as_str()).collect();
        assert_eq!(all, vec!["h0.w_fc", "h1.w_fc"]);
        assert_eq!(params_named(&params, "h1.w_fc").len(), 1);
        assert_eq!(block_leaf("wte"), None);
    }

    #[test]
    fn specs_are_checked_by_the_core_with_the_value_named() {
        let (s, mesh) = dp();
        assert_eq!(
            spec_text(&check_one(&s, &mesh, "w_fc", "P(None,'dp')").unwrap()),
            "P(None, 'dp')"
        );
        let e = check_one(&s, &mesh, "w_fc", "P('tp')").unwrap_err();
        assert!(e.contains("tp"), "{e}");
        let e = check_one(&s, &mesh, "w_fc", "P(dp").unwrap_err();
        assert!(e.contains("write it like"), "{e}");
        assert!(check_one(&s, &mesh, TOKENS, "P('dp')").is_ok());
        assert!(check_one(&s, &mesh, "h0.att", "P()").is_ok());
        let e = check_one(&s, &mesh, "nothing", "P()").unwrap_err();
        assert!(e.contains("no value “nothing”"), "{e}");
        let e = check_one(&s, &mesh, "h0.w_fc.m", "P()").unwrap_err();
        assert!(e.contains("give h0.w_fc a spec"), "{e}");
    }

    #[test]
    fn a_bad_spec_in_the_settings_is_an_error_at_its_field() {
        let (mut s, mesh) = dp();
        s.specs.insert("w_qkv".into(), "P('dp', 'dp')".into());
        assert_eq!(check_specs(&s, &mesh).unwrap_err().field, "spec.w_qkv");
    }

    #[test]
    fn a_constraint_the_partitioner_refuses_is_an_error_at_its_field() {
        let (mut s, _) = dp();
        s.specs.insert("h0.w_fc'".into(), "P('dp')".into());
        let msg = "jit: with_sharding_constraint PartitionSpec('dp',) on `h0.w_fc'`: conflicts with the sharding given for it as an input or output";
        assert_eq!(plan_error(&s, msg).field, "spec.h0.w_fc'");
        assert_eq!(plan_error(&s, "--mesh needs dp").field, "mesh");
    }

    #[test]
    fn the_token_batchs_spec_covers_the_targets() {
        let (mut s, _) = dp();
        s.specs.insert(TOKENS.into(), "P()".into());
        let names: Vec<String> = overrides(&s).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, vec!["targets", "tokens"]);
    }

    #[test]
    fn suggestions_fit_the_shape_and_the_editor_lists_groups_and_constraints() {
        let mesh = Mesh::new(&[("dp", 2), ("tp", 2)]).unwrap();
        let s = suggestions(&mesh, &[4, 6]);
        assert!(s.contains(&"P()".to_string()) && s.contains(&"P('dp', 'tp')".to_string()));
        assert!(!suggestions(&mesh, &[3, 3]).iter().any(|x| x.contains("dp")));
        let (mut settings, _) = dp();
        settings.specs.insert("h0.att".into(), "P()".into());
        settings.specs.insert("w_fc".into(), "P()".into());
        let g = groups(&settings);
        let w_fc = g["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == "w_fc")
            .unwrap();
        assert_eq!(w_fc["layers"].as_array().unwrap().len(), 2);
        assert_eq!(g["constraints"], json!([{"name": "h0.att", "spec": "P()"}]));
        assert_eq!(g["batch"]["preset"], "P('dp', None)");
    }
}
