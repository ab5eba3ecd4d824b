//! "Which strategy?" on the page: the core's search (`shardlab::search`) over the page's model
//! on as many devices of the chosen kind as its mesh has, and for each choice the settings that
//! load it into the sandbox (its strategy's preset, mesh, mode and remat policy). Nothing here
//! plans or prices: it calls the core and shapes its answer.
use serde_json::{json, Value};
use shardlab::plan::{Mode, Parallel, Preset, Schedule, Strategy, TrainerOptions};
use shardlab::search::search;

use crate::settings::Settings;

/// How many choices the page lists, as `plan --search` prints.
const TOP: usize = 10;

/// The page's preset of `strategy` (the seed preset is data parallelism too, but also a model).
fn preset_of(strategy: Strategy) -> Option<Preset> {
    Preset::ALL
        .into_iter()
        .find(|p| *p != Preset::Seed && p.strategy() == strategy)
}

/// The search for `s`'s model: `{"ok":true,"device","devices","considered","invalid",
/// "too_large","fits","ranked":[{rank,mode,strategy,mesh,remat,microbatches,schedule,step_ms,bytes,
/// limiting,limiting_share,command,load}]}` (`schedule` null but for a pipeline), `load` the settings changes that run the choice here
/// (null where no page preset has its strategy); or `{"ok":false,"error"}`.
pub fn which_strategy(s: &Settings) -> Value {
    let mesh = match s.check() {
        Ok(m) => m,
        Err(e) => return json!({"ok": false, "error": e.message}),
    };
    let device = match s.device_profile() {
        Ok(d) => d,
        Err(e) => return json!({"ok": false, "error": e.message}),
    };
    let base = match s.options(Mode::Single, &mesh) {
        Ok(o) => TrainerOptions {
            parallel: Parallel::None,
            ..o
        },
        Err(e) => return json!({"ok": false, "error": e.to_string()}),
    };
    let r = match search(&base, &device, &s.device, mesh.devices()) {
        Ok(r) => r,
        Err(e) => return json!({"ok": false, "error": e.0}),
    };
    let ranked: Vec<Value> = r
        .ranked
        .iter()
        .take(TOP)
        .map(|x| {
            let strategy = x.options.parallel.strategy();
            let load = strategy.and_then(preset_of).map(|p| {
                // A pipeline's schedule as the search chose it; the default elsewhere.
                let schedule = x.schedule.unwrap_or(Schedule::default().name());
                json!({"preset": p.name(), "mesh": x.mesh, "mode": x.mode, "remat": x.remat,
                           "microbatches": x.microbatches, "schedule": schedule})
            });
            json!({
                "rank": x.rank,
                "mode": x.mode,
                "strategy": x.strategy,
                "mesh": x.mesh,
                "remat": x.remat,
                "microbatches": x.microbatches,
                "schedule": x.schedule,
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
        "fits": r.ranked.len(),
        "levers": r.levers,
        "ranked": ranked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_lists_what_fits_fastest_first_and_each_loads_as_page_settings() {
        let s = Settings::preset(Preset::Dp);
        let r = which_strategy(&s);
        assert_eq!(r["ok"], true, "{r}");
        let ranked = r["ranked"].as_array().unwrap();
        assert!(!ranked.is_empty() && ranked.len() <= TOP);
        let steps: Vec<f64> = ranked.iter().map(|x| x["step_ms"].as_f64().unwrap()).collect();
        assert!(steps.windows(2).all(|w| w[0] <= w[1]), "{steps:?}");
        // Compositions no page preset names (dp=2,fsdp=2) come without settings to load.
        let loadable: Vec<&Value> = ranked.iter().filter(|x| !x["load"].is_null()).collect();
        assert!(!loadable.is_empty(), "{r}");
        for x in loadable {
            let load = &x["load"];
            let preset = Preset::parse(load["preset"].as_str().unwrap()).unwrap();
            assert_eq!(preset.strategy().name(), x["strategy"], "{x}");
            // Loading it gives settings the page accepts.
            let next = Settings {
                preset,
                mesh: load["mesh"].as_str().unwrap().to_string(),
                remat: shardlab::model::Remat::parse(load["remat"].as_str().unwrap()).unwrap(),
                schedule: Schedule::parse(load["schedule"].as_str().unwrap()).unwrap(),
                ..s.clone()
            };
            next.check().unwrap_or_else(|e| panic!("{x}: {}", e.message));
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
