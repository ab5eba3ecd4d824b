//! "Which strategy?" on the page: the core's search (`shardlab::search`) over the page's model
//! on as many devices of the chosen kind as its mesh has, and for each choice the settings that
//! load it into the sandbox (its strategy's preset, mesh, mode and remat policy). Nothing here
//! plans or prices: it calls the core and shapes its answer.
use serde_json::{json, Value};
use shardlab::plan::{Mode, Parallel, Schedule, TrainerOptions};
use shardlab::search::search;

use crate::settings::Settings;

/// How many choices the page lists, as `plan --search` prints.
const TOP: usize = 10;

/// The search for `s`'s model: `{"ok":true,"device","devices","considered","invalid",
/// "too_large","screened","priced","fits","ranked":[{rank,mode,strategy,mesh,remat,microbatches,schedule,step_ms,bytes,
/// limiting,limiting_share,command,load}]}` (`schedule` null but for a pipeline), `load` the settings changes that run the choice here
/// (its mesh, the axes' options, mode, remat, microbatches, schedule, cp order); or `{"ok":false,"error"}`.
pub fn which_strategy(s: &Settings) -> Value {
    let par = match s.check() {
        Ok(p) => p,
        Err(e) => return json!({"ok": false, "error": e.message}),
    };
    let device = match s.device_profile() {
        Ok(d) => d,
        Err(e) => return json!({"ok": false, "error": e.message}),
    };
    let base = TrainerOptions {
        parallel: Parallel::None,
        ..s.options(Mode::Single, &par)
    };
    let r = match search(&base, &device, &s.device, par.devices()) {
        Ok(r) => r,
        Err(e) => return json!({"ok": false, "error": e.0}),
    };
    let ranked: Vec<Value> = r
        .ranked
        .iter()
        .take(TOP)
        .map(|x| {
            // Any composition loads: its mesh, its axes' options, and a pipeline's schedule as the
            // search chose it (the default elsewhere).
            let load = x.options.parallel.parallelism().map(|par| {
                let schedule = x.schedule.unwrap_or(Schedule::default().name());
                json!({"mesh": x.mesh, "zero": par.zero.name(), "sequence_parallel": par.sequence_parallel,
                       "mode": x.mode, "remat": x.remat, "microbatches": x.microbatches, "schedule": schedule,
                       "virtual_stages": x.virtual_stages, "stage_layers": [],
                       "cp_order": x.options.cp_order.name()})
            });
            json!({
                "rank": x.rank,
                "mode": x.mode,
                "strategy": x.strategy,
                "mesh": x.mesh,
                "remat": x.remat,
                "microbatches": x.microbatches,
                "schedule": x.schedule,
                "virtual_stages": x.virtual_stages,
                "step_ms": x.step_ms,
                "bytes": x.bytes_per_device.total,
                "limiting": x.limiting,
                "limiting_share": x.limiting_share,
                "command": x.command,
                "load": load,
            })
        })
        .collect();
    json!({
        "ok": true,
        "device": r.device,
        "devices": r.devices,
        "considered": r.considered,
        "invalid": r.invalid,
        "too_large": r.too_large,
        "screened": r.screened,
        "priced": r.priced,
        "fits": r.ranked.len(),
        "levers": r.levers,
        "ranked": ranked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardlab::plan::Preset;

    #[test]
    fn the_search_lists_what_fits_fastest_first_and_each_loads_as_page_settings() {
        for p in [Preset::Dp, Preset::Moe] {
            the_search_loads_as_page_settings(&Settings::preset(p));
        }
    }

    fn the_search_loads_as_page_settings(s: &Settings) {
        let r = which_strategy(s);
        assert_eq!(r["ok"], true, "{r}");
        let ranked = r["ranked"].as_array().unwrap();
        assert!(!ranked.is_empty() && ranked.len() <= TOP);
        // Every configuration is accounted for: split or not, fits or not, screened or priced.
        let n = |k: &str| r[k].as_u64().unwrap();
        assert_eq!(
            n("considered"),
            n("invalid") + n("too_large") + n("screened") + n("fits"),
            "{r}"
        );
        let steps: Vec<f64> = ranked.iter().map(|x| x["step_ms"].as_f64().unwrap()).collect();
        assert!(steps.windows(2).all(|w| w[0] <= w[1]), "{steps:?}");
        for x in ranked {
            let load = &x["load"];
            // Loading it gives settings the page accepts, on the same composition.
            let next = Settings {
                mesh: load["mesh"].as_str().unwrap().to_string(),
                zero: serde_json::from_value(load["zero"].clone()).unwrap(),
                sequence_parallel: load["sequence_parallel"].as_bool().unwrap(),
                remat: shardlab::model::Remat::parse(load["remat"].as_str().unwrap()).unwrap(),
                schedule: Schedule::parse(load["schedule"].as_str().unwrap()).unwrap(),
                virtual_stages: load["virtual_stages"].as_u64().unwrap() as usize,
                ..s.clone()
            };
            let par = next.check().unwrap_or_else(|e| panic!("{x}: {}", e.message));
            assert_eq!(shardlab::plan::mesh_text(&par.mesh), x["mesh"], "{x}");
        }
    }

    #[test]
    fn a_device_count_no_strategy_splits_says_so() {
        let s = Settings {
            mesh: "dp=3".into(),
            ..Settings::preset(Preset::Dp)
        };
        let r = which_strategy(&s);
        assert_eq!(r["ok"], false, "{r}");
    }
}
