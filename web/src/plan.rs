//! One mode's per-device program as the inspector shows it: the text, which lines are
//! collectives or random-bit generation (and which the partitioner inserted, and why), the
//! core's summary, and where each parameter's blocks live. Everything is read off the core's
//! program; nothing here decides how a program is built.
use serde::Serialize;
use serde_json::{json, Value};
use shardlab::ir::{Op, Program, Role};
use shardlab::plan::{self, Inserted, Parallelism, PlanError, Planned};
use shardlab::profile::{category, summarize, Category, ProgramSummary};

use crate::field_error::FieldError;
use crate::settings::{Mode, Settings};

/// A line of the program text worth a highlight.
#[derive(Clone, Debug, Serialize)]
pub struct Mark {
    /// Line of the program text (0-based).
    pub line: usize,
    pub instr: usize,
    /// `collective`, `rng_replicated` (every device makes the global bits, then keeps its block),
    /// `rng`, `inserted`, or `recomputed` (any other op jax.checkpoint recomputes).
    pub kind: &'static str,
    /// The op as HLO names it (`all-reduce`, `random_bits`, ...).
    pub op: String,
    /// In automatic mode: the partitioner's record of why it inserted this op.
    pub inserted: Option<Inserted>,
    /// Whether it recomputes a forward value for the backward pass (jax.checkpoint).
    pub recomputed: bool,
}

/// One mode, built: its plan (which the trainer runs as is) and what the inspector shows.
pub struct Plan {
    pub mode: Mode,
    pub planned: Planned,
    pub summary: ProgramSummary,
    /// The inspector's JSON for this mode (text, marks, summary, inserted, layouts).
    pub view: Value,
}

impl Plan {
    pub fn build(settings: &Settings, mode: Mode, par: &Parallelism) -> Result<Plan, PlanError> {
        let planned = plan::build(&settings.options(mode, par))?;
        let (program, inserted) = (&planned.step.program, &planned.inserted);
        let summary = summarize(program);
        let text = program.to_text();
        let marks = marks(program, &text, &summary, inserted.as_deref().unwrap_or(&[]));
        // The text is a header, one line per input, one per instruction, then `return`.
        let first_instr_line = text.lines().count().saturating_sub(1 + program.instrs.len());
        let view = json!({
            "mode": mode.name(),
            "text": text,
            "first_instr_line": first_instr_line,
            "marks": marks,
            "summary": summary_json(&summary),
            "inserted": inserted,
            "layouts": layouts(program),
            // In explicit mode, the typed global program as `shardlab inspect` prints it.
            "explicit": planned.explicit,
        });
        Ok(Plan {
            mode,
            planned,
            summary,
            view,
        })
    }
}

/// Why the core cannot plan a mode, at the control of the setting it refused, in the page's
/// words (a pipeline jit cannot express is refused at the mode).
pub fn refusal(e: &PlanError) -> FieldError {
    FieldError::plan(e)
}

/// The planned modes' programs, and for each mode that cannot express the settings and does
/// not run, why (its program pane says so).
pub type ModePlans = (Vec<Plan>, serde_json::Map<String, Value>);

/// The modes' plans, or the settings' refusals. Automatic and shard_map are always planned, for
/// the inspector to set side by side; explicit mode when it runs. A control shows the refusals
/// of the running modes that refuse it, each in its mode's words, or where none does, the first
/// of a mode planned beside them: two modes' different words for one fault are not two faults.
pub fn plan_modes(settings: &Settings, par: &Parallelism) -> Result<ModePlans, Vec<FieldError>> {
    let (mut plans, mut refused) = (vec![], serde_json::Map::new());
    // Each refusal with whether its mode runs.
    let mut errors: Vec<(FieldError, bool)> = vec![];
    let runs = |m: Mode| settings.modes().contains(&m);
    for mode in Mode::PARTITIONED
        .into_iter()
        .filter(|&m| m != Mode::Explicit || runs(m))
    {
        let e = match Plan::build(settings, mode, par) {
            Ok(plan) => {
                plans.push(plan);
                continue;
            }
            Err(e) => refusal(&e),
        };
        if e.field == "mode" && !runs(mode) {
            refused.insert(mode.name().into(), json!(e.message));
            continue;
        }
        // Any other refusal is the settings', whichever mode finds it.
        if !errors.iter().any(|(x, _)| x.field == e.field && x.message == e.message) {
            errors.push((e, runs(mode)));
        }
    }
    let running_at = |field: &str| errors.iter().any(|(x, r)| *r && x.field == field);
    let first_at = |field: &str| errors.iter().position(|(x, _)| x.field == field);
    let shown: Vec<FieldError> = errors
        .iter()
        .enumerate()
        .filter(|(i, (e, running))| *running || (!running_at(&e.field) && first_at(&e.field) == Some(*i)))
        .map(|(_, (e, _))| e.clone())
        .collect();
    match shown.is_empty() {
        true => Ok((plans, refused)),
        false => Err(shown),
    }
}

/// The summary as the page reads it: per-kind totals, random bits and memory per device.
fn summary_json(s: &ProgramSummary) -> Value {
    json!({
        "devices": s.devices,
        "instructions": s.instructions,
        "flops_per_device": s.flops,
        "rng_bits_per_device": s.rng_bits,
        "collectives": s.collective_totals(),
        "peak_bytes_per_device": {
            "params": s.params_bytes,
            "optimizer_state": s.optimizer_state_bytes,
            "gradients": s.gradients_bytes,
            "activations": s.activations_bytes,
            "total": s.total_bytes,
        },
        "warnings": s.warnings,
    })
}

fn marks(prog: &Program, text: &str, s: &ProgramSummary, inserted: &[Inserted]) -> Vec<Mark> {
    // The text is a header (per-device programs), one line per input, one per instruction,
    // then `return`: instruction i is at line `first + i`.
    let lines = text.lines().count();
    let first = lines.saturating_sub(1 + prog.instrs.len());
    let mut sliced = vec![false; prog.values.len()];
    for ins in &prog.instrs {
        if let Op::ShardSlice { .. } = ins.op {
            for v in &ins.inputs {
                sliced[v.index()] = true;
            }
        }
    }
    let mut out = vec![];
    for (i, ins) in prog.instrs.iter().enumerate() {
        let kind = match category(ins) {
            Category::Collectives => "collective",
            Category::Rng if matches!(ins.op, Op::RandomBits { .. } | Op::RandomBitsBlock { .. }) => {
                let replicated = matches!(ins.op, Op::RandomBits { .. })
                    && prog.devices() > 1
                    && ins.outputs.iter().any(|o| sliced[o.index()]);
                if replicated {
                    "rng_replicated"
                } else {
                    "rng"
                }
            }
            _ if prog.is_recomputed(i) => "recomputed",
            _ => continue,
        };
        let op = s
            .collectives
            .iter()
            .find(|c| c.instr == i)
            .map_or_else(|| ins.op.name().to_string(), |c| c.kind.hlo_name().to_string());
        out.push(Mark {
            line: first + i,
            instr: i,
            kind,
            op,
            inserted: inserted.iter().find(|r| r.instr == i).cloned(),
            recomputed: prog.is_recomputed(i),
        });
    }
    // Inserted ops that are neither collectives nor random bits (dynamic_slice) are marked too.
    for r in inserted {
        if !out.iter().any(|m| m.instr == r.instr) && r.instr < prog.instrs.len() {
            out.push(Mark {
                line: first + r.instr,
                instr: r.instr,
                kind: "inserted",
                op: r.op.clone(),
                inserted: Some(r.clone()),
                recomputed: prog.is_recomputed(r.instr),
            });
        }
    }
    out.sort_by_key(|m| m.line);
    out
}

/// For every parameter: its global shape, PartitionSpec and each device's index ranges (as
/// `jax.debug.visualize_array_sharding` draws them).
fn layouts(prog: &Program) -> Vec<Value> {
    let devices = prog.devices();
    let mut out = vec![];
    for (pos, (v, role)) in prog.inputs.iter().enumerate() {
        if !matches!(role, Role::Param(_) | Role::Tokens) {
            continue;
        }
        let Ok(sharding) = prog.input_sharding(pos) else {
            continue;
        };
        let global = prog.global_shape(prog.shape(*v), &sharding.spec);
        let blocks: Option<Vec<Vec<[usize; 2]>>> = (0..devices)
            .map(|d| {
                sharding
                    .device_indices(d, &global)
                    .ok()
                    .map(|r| r.iter().map(|r| [r.start, r.end]).collect())
            })
            .collect();
        if let Some(blocks) = blocks {
            out.push(json!({
                "name": prog.info(*v).name.clone().unwrap_or_default(),
                "shape": global,
                "spec": sharding.spec.to_string(),
                "blocks": blocks,
            }));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Preset;

    fn refused(s: &Settings, mode: Mode) -> FieldError {
        let par = match s.check() {
            Ok(p) => p,
            Err(e) => return e,
        };
        let e = plan::build(&s.options(mode, &par)).expect_err("the core refuses it");
        refusal(&e)
    }

    #[test]
    fn automatic_mode_on_a_pipeline_is_refused_at_the_mode_control_in_the_cores_words() {
        let s = Settings::preset(Preset::Pp);
        let e = refused(&s, Mode::Auto);
        assert_eq!(e.field, "mode");
        for words in [
            "mode auto: cannot run a pipeline (mesh pp=4) yet",
            "collective-permute",
            "Use mode shard_map",
        ] {
            assert!(e.message.contains(words), "{words}: {}", e.message);
        }
        assert!(!e.message.contains("--"), "{}", e.message);
    }

    #[test]
    fn a_control_shows_each_running_modes_refusal_in_its_words() {
        // A pipeline: automatic and explicit mode each refuse it at the mode control, in their
        // own words; shard_map runs it.
        let s = Settings {
            mode: crate::modes::Modes::ALL,
            ..Settings::preset(Preset::Pp)
        };
        let Err(errors) = plan_modes(&s, &s.check().unwrap()) else {
            panic!("planned")
        };
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["mode", "mode"], "{errors:?}");
        assert!(errors[0].message.contains("mode auto") && errors[1].message.contains("mode explicit"));
    }

    #[test]
    fn where_a_planned_mode_refuses_a_control_beside_a_running_one_only_the_running_modes_shows() {
        // Unfused attention on a zig-zag ring: automatic (and explicit) mode refuse the
        // reordered queries, shard_map the ring, each at the attention control. Automatic and
        // shard_map are planned whatever runs; explicit says what automatic says.
        let ring = "cannot run ring attention";
        for (mode, words) in [
            ("auto", vec!["reorders the queries"]),
            ("shard_map", vec![ring]),
            ("auto+explicit", vec!["reorders the queries"]),
            ("both", vec!["reorders the queries", ring]),
        ] {
            let s = Settings {
                mode: crate::modes::Modes::parse(mode).unwrap(),
                cp_order: shardlab::ir::CpOrder::Zigzag,
                attention: shardlab::model::Attention::Unfused,
                ..Settings::preset(Preset::Cp)
            };
            let par = s.check().unwrap_or_else(|e| panic!("{}", e.message));
            let Err(errors) = plan_modes(&s, &par) else {
                panic!("{mode}: planned")
            };
            assert_eq!(errors.len(), words.len(), "{mode}: {errors:?}");
            for (e, words) in errors.iter().zip(words) {
                assert_eq!(e.field, "attention");
                assert!(e.message.contains(words), "{mode}: {}", e.message);
            }
        }
    }

    #[test]
    fn explicit_modes_view_carries_the_typed_program_and_the_other_modes_none() {
        let s = Settings {
            mesh: "dp=2,tp=2".into(),
            ..Settings::preset(Preset::DpTp)
        };
        let par = s.check().unwrap();
        let typed = Plan::build(&s, Mode::Explicit, &par).unwrap().view["explicit"]["lines"].clone();
        let lines = typed.as_array().expect("typed lines");
        assert!(
            lines.iter().any(|l| l["text"].as_str().unwrap().contains("@dp")),
            "{typed}"
        );
        assert!(Plan::build(&s, Mode::Auto, &par).unwrap().view["explicit"].is_null());
    }

    #[test]
    fn stages_that_do_not_split_the_layers_are_refused_at_the_pp_axis() {
        // 4 blocks over pp=3; over pp=8, more stages than blocks.
        for (mesh, words) in [
            ("pp=3", "multiple of 3, or pp = one of 1, 2, 4"),
            ("pp=8", "more stages than layers 4"),
        ] {
            let s = Settings {
                mesh: mesh.into(),
                microbatches: 1,
                ..Settings::preset(Preset::Pp)
            };
            for mode in [Mode::Auto, Mode::ShardMap] {
                let e = refused(&s, mode);
                assert_eq!(e.field, "mesh.pp", "{mesh} {mode:?}: {}", e.message);
                assert!(e.message.contains(words), "{mesh} {mode:?}: {}", e.message);
            }
        }
    }
}
