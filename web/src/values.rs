//! The inspector's questions about one value or one op of a built plan: where a named value's
//! blocks live in either mode (`picture`), and which devices a collective groups
//! (`collective`). Automatic mode answers from jit's own shardings (`Planned::values`);
//! shard_map mode from its in_specs, or from the body's per-device shape against the global
//! shape of the same named value.
use serde_json::{json, Value};
use shardlab::ir::varying_axes;
use shardlab::sharding::Mesh;

use crate::picture::{collective_groups, infer_spec, layout};
use crate::plan::Plan;
use crate::settings::Mode;

fn fail(message: impl Into<String>) -> Value {
    json!({"ok": false, "error": message.into()})
}

fn plan_of<'a>(plans: &'a [Plan], mode: &str) -> Result<&'a Plan, Value> {
    plans
        .iter()
        .find(|p| p.mode.name() == mode)
        .ok_or_else(|| fail(format!("unknown mode `{mode}`: use auto or shard_map")))
}

/// The picture of the value `name` in `mode`'s program, with how its layout was found.
pub fn picture(plans: &[Plan], mesh: &Mesh, mode: &str, name: &str) -> Value {
    let plan = match plan_of(plans, mode) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let auto = plans.iter().find(|p| p.mode == Mode::Auto);
    let global = auto.and_then(|a| a.planned.values.iter().find(|v| v.name == name));
    let answer = |pic: Result<crate::picture::Picture, String>, how: &str| match pic {
        Ok(pic) => json!({"ok": true, "mode": mode, "how": how, "picture": pic}),
        Err(e) => fail(format!("{name}: {e}")),
    };
    if plan.mode == Mode::Auto {
        return match global {
            Some(v) => answer(layout(mesh, name, &v.shape, &v.spec), "the sharding jit gave it"),
            None => fail(format!(
                "“{name}” is not a named value of the global step: pictures cover parameters, optimizer state, tokens, activations, gradients and updates"
            )),
        };
    }
    let prog = &plan.planned.step.program;
    let named = |v: usize| prog.values[v].name.as_deref() == Some(name);
    if let Some(pos) = prog.inputs.iter().position(|(v, _)| named(v.index())) {
        return match prog.input_sharding(pos) {
            Ok(s) => {
                let shape = prog.global_shape(prog.shape(prog.inputs[pos].0), &s.spec);
                answer(layout(mesh, name, &shape, &s.spec), "its in_spec")
            }
            Err(e) => fail(e.to_string()),
        };
    }
    let Some(v) = (0..prog.values.len()).rev().find(|v| named(*v)) else {
        return fail(format!("“{name}” is not a named value of the shard_map body"));
    };
    let Some(global) = global else {
        return fail(format!("“{name}” has no global counterpart to draw it against"));
    };
    let vma = varying_axes(prog);
    match infer_spec(mesh, &global.shape, &prog.values[v].shape, &vma[v]) {
        Some((spec, unreduced)) => {
            let mut out = answer(
                layout(mesh, name, &global.shape, &spec),
                "its per-device shape in the body against its global shape",
            );
            out["picture"]["unreduced_over"] = json!(unreduced);
            out
        }
        None => fail(format!(
            "“{name}” is {:?} per device and {:?} globally: not blocks of one array",
            prog.values[v].shape, global.shape
        )),
    }
}

/// The device groups of instruction `instr` of `mode`'s program (a collective), as the mesh
/// diagram draws them: `{"ok":true,"op","axes":["dp"],"groups":[[0,2],[1,3]]}`.
pub fn collective(plans: &[Plan], mesh: &Mesh, mode: &str, instr: usize) -> Value {
    let plan = match plan_of(plans, mode) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let Some(ins) = plan.planned.step.program.instrs.get(instr) else {
        return fail(format!("the {mode} program has no instruction {instr}"));
    };
    match collective_groups(mesh, &ins.op) {
        None => fail(format!("{} is not a collective", ins.op.name())),
        Some(Err(e)) => fail(e),
        Some(Ok((axes, groups))) => json!({"ok": true, "op": ins.op.name(), "axes": axes, "groups": groups}),
    }
}
