//! The sharding editor's names and checks: automatic mode's PartitionSpec per parameter group
//! (a block parameter's short name, `w_fc`, applies to every block; its full name, `h0.w_fc`,
//! to one), per token batch (`tokens`), and per intermediate value (a
//! `jax.lax.with_sharding_constraint`, named as the program text names it: `h0.att`). These are
//! the names the CLI's `--spec` takes, matched and checked by the core
//! (`shardlab::plan::resolve_spec`), so the page and the CLI agree.
use std::collections::BTreeMap;

use serde_json::{json, Value};
use shardlab::ir::Role;
use shardlab::model::{param_specs, train_step_program, ParamSpec};
use shardlab::plan::{auto_param_spec, block_leaf, group_name, params_named, resolve_spec, SpecTarget, TOKENS};
use shardlab::sharding::{Mesh, NamedSharding, PartitionSpec};

use crate::picture::spec_text;
use crate::settings::{parse_spec_on, Settings};
use shardlab::setting::Audience;

/// `spec` fits a value of `shape` on `mesh` (the core's check).
fn fits(mesh: &Mesh, spec: &PartitionSpec, shape: &[usize]) -> bool {
    NamedSharding::new(mesh.clone(), spec.clone())
        .and_then(|s| s.shard_shape(shape))
        .is_ok()
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
        .filter(|s| fits(mesh, s, shape))
        .map(|s| spec_text(&s))
        .collect()
}

/// Checks one spec (`text`) for the value `name` under `settings` on `mesh`, as the planner
/// will: the spec, or the reason in the page's words. The editor's fields are parameters, the
/// token batch and intermediates, so another input of the step (`targets`, `key`) is refused.
pub fn check_one(settings: &Settings, mesh: &Mesh, name: &str, text: &str) -> Result<PartitionSpec, String> {
    let spec = parse_spec_on(text, &mesh.axis_names())?;
    let cfg = settings.config();
    let optimizer = settings.optimizer.optimizer(settings.lr);
    let global = train_step_program(&cfg, optimizer, settings.rng_layout()).map_err(|e| e.to_string())?;
    let prog = &global.program;
    let page_words = |e: String| {
        e.replace(
            &format!("--spec {name}={spec}"),
            &format!("{} on {name}", spec_text(&spec)),
        )
    };
    let target = resolve_spec(&param_specs(&cfg), prog, mesh, name, &spec).map_err(|e| page_words(e.to_string()))?;
    if let SpecTarget::Values { inputs, .. } = &target {
        let other = inputs
            .iter()
            .find(|v| !matches!(prog.inputs.iter().find(|(i, _)| i == *v), Some((_, Role::Tokens))));
        if other.is_some() {
            return Err(format!(
                "“{name}” is an input of the step: only parameters, tokens and intermediate values take a spec here"
            ));
        }
    }
    Ok(spec)
}

/// The editor's fields under `settings`: each parameter group with its preset spec, shape,
/// suggestions and per-block members; the token batch; and the specs that name intermediates
/// (the with_sharding_constraints), each spec as the page writes it.
pub fn groups(settings: &Settings) -> Value {
    let par = match settings.parallelism() {
        Ok(p) => p,
        Err(e) => return json!({"ok": false, "error": e.text(Audience::Page)}),
    };
    let mesh = &par.mesh;
    let cfg = settings.config();
    let params = param_specs(&cfg);
    let preset = |p: &ParamSpec| spec_text(&auto_param_spec(&cfg, &par, p));
    let mut groups: BTreeMap<String, Value> = BTreeMap::new();
    let mut order: Vec<String> = vec![];
    for p in &params {
        let group = group_name(&p.name).to_string();
        let entry = groups.entry(group.clone()).or_insert_with(|| {
            order.push(group.clone());
            json!({
                "name": group,
                "shape": p.shape,
                "preset": preset(p),
                "options": suggestions(mesh, &p.shape),
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
    let tokens_preset = par.tokens_spec(&cfg);
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
        "batch": {"name": TOKENS, "shape": batch, "preset": spec_text(&tokens_preset), "options": suggestions(mesh, &batch)},
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
    let par = match settings.parallelism() {
        Ok(p) => p,
        Err(e) => return json!({"ok": false, "error": format!("fix the mesh first: {}", e.text(Audience::Page))}),
    };
    match check_one(&settings, &par.mesh, name, text) {
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
        let mesh = s.parallelism().unwrap().mesh;
        (s, mesh)
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
        // The refusal says its hint once, with the mesh's own axes, and no CLI backticks.
        let e = check_one(&s, &mesh, "w_fc", "P(dp").unwrap_err();
        assert_eq!(e.matches("write").count(), 1, "{e}");
        assert!(e.contains("write one like P('dp', None) or P()"), "{e}");
        assert!(!e.contains("tp") && !e.contains('`'), "{e}");
        let two = Mesh::new(&[("dp", 2), ("tp", 2)]).unwrap();
        let e = check_one(&s, &two, "w_fc", "P(dp").unwrap_err();
        assert!(e.contains("P(('dp', 'tp'), None)"), "{e}");
        assert!(check_one(&s, &mesh, TOKENS, "P('dp')").is_ok());
        assert!(check_one(&s, &mesh, "h0.att", "P()").is_ok());
        let e = check_one(&s, &mesh, "nothing", "P()").unwrap_err();
        assert!(e.contains("no parameter or named value `nothing`"), "{e}");
        let e = check_one(&s, &mesh, "h0.w_fc.m", "P()").unwrap_err();
        assert!(e.contains("give `h0.w_fc` the spec"), "{e}");
        let e = check_one(&s, &mesh, "targets", "P()").unwrap_err();
        assert!(e.contains("only parameters, tokens and intermediate values"), "{e}");
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
