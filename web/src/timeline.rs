//! The timeline panel's data: both modes' modelled steps on the chosen real device, laid out in
//! time per device by the core (`shardlab::profile::model_step`), with overlap on or off, and
//! the same timelines as a Chrome trace-event file for the download. Every span keeps its
//! instruction, so the page can name the op, say which rule inserted it, and select it in the
//! program view; nothing here places a span.
use serde_json::{json, Value};
use shardlab::profile::{model_step, DeviceProfile, OpSource, Placement, Span, Trace, IDLE};

use crate::plan::Plan;

/// One span as the panel draws it.
fn span(s: &Span, plan: &Plan) -> Value {
    let inserted = s.instr.and_then(|i| {
        plan.planned
            .inserted
            .as_deref()
            .and_then(|rs| rs.iter().find(|r| r.instr == i))
            .map(|r| format!("inserted for {} of `{}`: {}", r.source_op, r.value, r.rule))
    });
    json!({
        "start_ms": s.start_ms,
        "dur_ms": s.dur_ms,
        "kind": s.kind,
        "category": s.category,
        "name": s.name,
        "instr": s.instr,
        "inserted": inserted,
    })
}

/// `{"ok":true,"device","label","overlap","step_ms","modes":{"auto":{"step_ms","serial_ms",
/// "comm_stream","rows":[{"label","idle_ms","compute":[span],"comm":[span]}]}},"trace":{...}}`:
/// `step_ms` is the longer mode's, the panel's common time axis; a row's `idle_ms` is the time
/// its device waits for the others (a pipeline's bubble), the core's breakdown of its row.
pub fn timelines(plans: &[Plan], device: &DeviceProfile, overlap: bool) -> Value {
    let mut trace = Trace::new();
    let mut modes = serde_json::Map::new();
    let mut longest: f64 = 0.0;
    for plan in plans {
        let (prediction, timeline) = model_step(&plan.planned.step.program, device, Placement::Real, overlap);
        let name = plan.mode.name();
        trace.add(name, &timeline, &[OpSource::of_planned(&plan.planned)]);
        longest = longest.max(timeline.step_ms);
        let rows: Vec<Value> = timeline
            .devices
            .iter()
            .enumerate()
            .map(|(d, row)| {
                let spans = |ss: &[Span]| {
                    ss.iter()
                        .filter(|s| s.dur_ms > 0.0)
                        .map(|s| span(s, plan))
                        .collect::<Vec<_>>()
                };
                json!({
                    "label": row.label,
                    "idle_ms": timeline.device_breakdown_ms(d)[IDLE],
                    "compute": spans(&row.compute),
                    "comm": spans(&row.comm),
                })
            })
            .collect();
        modes.insert(
            name.into(),
            json!({
                "step_ms": timeline.step_ms,
                "serial_ms": prediction.serial_ms,
                "overlap": timeline.overlap,
                "comm_stream": timeline.comm_stream,
                "rows": rows,
            }),
        );
    }
    json!({
        "ok": true,
        "device": device.name,
        "label": device.label,
        "overlap": overlap,
        "step_ms": longest,
        "modes": modes,
        "trace": trace.to_json(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{Mode, Preset, Settings};

    fn seed_plans() -> (Vec<Plan>, DeviceProfile) {
        let s = Settings::preset(Preset::Seed);
        let par = s.parallelism().unwrap();
        let plans = [Mode::Auto, Mode::ShardMap]
            .into_iter()
            .map(|m| Plan::build(&s, m, &par).unwrap())
            .collect();
        (plans, s.device_profile().unwrap())
    }

    #[test]
    fn both_modes_have_a_row_per_device_whose_spans_cover_the_step() {
        let (plans, device) = seed_plans();
        let t = timelines(&plans, &device, true);
        for mode in ["auto", "shard_map"] {
            let m = &t["modes"][mode];
            let rows = m["rows"].as_array().unwrap();
            assert_eq!(rows.len(), 8, "{mode}");
            for row in rows {
                let sum: f64 = row["compute"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s["dur_ms"].as_f64().unwrap())
                    .sum();
                let step = m["step_ms"].as_f64().unwrap();
                assert!((sum - step).abs() <= 1e-6 * step.max(1.0), "{mode}: {sum} vs {step}");
            }
        }
        assert!(t["step_ms"].as_f64().unwrap() >= t["modes"]["shard_map"]["step_ms"].as_f64().unwrap());
    }

    #[test]
    fn a_pipeline_has_a_row_per_stage_each_with_its_idle_time() {
        let s = Settings::preset(Preset::Pp);
        let par = s.parallelism().unwrap();
        let plan = Plan::build(&s, Mode::ShardMap, &par).unwrap();
        let t = timelines(&[plan], &s.device_profile().unwrap(), true);
        let m = &t["modes"]["shard_map"];
        assert!(t["modes"].get("auto").is_none(), "automatic mode is refused, not drawn");
        let rows = m["rows"].as_array().unwrap();
        let labels: Vec<&str> = rows.iter().map(|r| r["label"].as_str().unwrap()).collect();
        assert_eq!(labels, ["pp=0", "pp=1", "pp=2", "pp=3"]);
        for row in rows {
            // The row's idle spans, summed, are its idle time.
            let spans: f64 = row["compute"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| s["category"] == IDLE)
                .map(|s| s["dur_ms"].as_f64().unwrap())
                .sum();
            let idle = row["idle_ms"].as_f64().unwrap();
            assert!((0.0..=m["step_ms"].as_f64().unwrap()).contains(&idle), "{idle}");
            assert!((spans - idle).abs() <= 1e-9 + 1e-6 * idle, "{spans} vs {idle}");
        }
    }

    #[test]
    fn automatic_modes_inserted_ops_say_their_rule_and_overlap_off_is_the_serial_sum() {
        let (plans, device) = seed_plans();
        let t = timelines(&plans, &device, true);
        let spans = t["modes"]["auto"]["rows"][0]["compute"].as_array().unwrap().clone();
        assert!(spans
            .iter()
            .any(|s| s["inserted"].as_str().is_some_and(|r| r.contains("inserted for"))));
        let off = timelines(&plans, &device, false);
        for mode in ["auto", "shard_map"] {
            let (step, serial) = (
                off["modes"][mode]["step_ms"].as_f64().unwrap(),
                off["modes"][mode]["serial_ms"].as_f64().unwrap(),
            );
            assert!((step - serial).abs() <= 1e-6 * serial, "{mode}: {step} vs {serial}");
            assert!(t["modes"][mode]["step_ms"].as_f64().unwrap() <= step + 1e-9);
        }
        let events = t["trace"]["traceEvents"].as_array().unwrap();
        let processes = events.iter().filter(|e| e["name"] == "process_name").count();
        assert_eq!(processes, 16, "a process per device of each mode");
    }
}
