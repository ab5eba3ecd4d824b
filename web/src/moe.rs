//! The mixture of experts as the page shows it: where the experts live and what their two
//! all-to-alls cost (from the planned programs and the modelled timeline), and each step's
//! routing (the routers' own counts, read back after the step) as tokens per expert per
//! device, the choices dropped, and how far the busiest device's experts are above the mean:
//! the device the step waits for.
use serde_json::{json, Value};
use shardlab::exec::Routing;
use shardlab::ir::Op;
use shardlab::model::Moe;
use shardlab::plan::{AxisKind, Parallelism};
use shardlab::profile::{model_step, DeviceProfile, Placement, SpanKind};

use crate::plan::Plan;

/// The axes a mixture's tokens are split over (the rest, tp, repeat them).
const TOKEN_AXES: [AxisKind; 3] = [AxisKind::Dp, AxisKind::Fsdp, AxisKind::Ep];

/// One step's routing on `par`: for every device, the experts it holds and, per expert, the
/// choices of its ep group's sequences that the expert kept (its tokens) and dropped; the
/// step's choices and drops (each token counted once, not on every tp device); and the busiest
/// device's tokens against the mean. Counts are the step's routers' together (every block's).
pub fn routing(r: &Routing, par: &Parallelism, moe: &Moe) -> Value {
    let devices = r.routed.first().map_or(0, Vec::len);
    let sum = |counts: &[Vec<Vec<u32>>], d: usize, e: usize| -> u64 {
        counts.iter().map(|router| u64::from(router[d][e])).sum()
    };
    let ep = if par.has(AxisKind::Ep) {
        par.size(AxisKind::Ep)
    } else {
        1
    };
    let local = moe.experts / ep.max(1);
    let coords = |d: usize| par.mesh.device_coords(d).unwrap_or_default();
    let ep_dim = par.mesh.axis_names().iter().position(|a| *a == AxisKind::Ep.name());
    let rows: Vec<Value> = (0..devices)
        .map(|d| {
            let mine = coords(d);
            // The devices whose sequences this device's experts take: its ep group.
            let group: Vec<usize> = (0..devices)
                .filter(|&o| {
                    let theirs = coords(o);
                    (0..mine.len()).all(|i| Some(i) == ep_dim || mine[i] == theirs[i])
                })
                .collect();
            let first = ep_dim.map_or(0, |i| mine[i]) * local;
            let experts: Vec<Value> = (first..first + local)
                .map(|e| {
                    let routed: u64 = group.iter().map(|&o| sum(&r.routed, o, e)).sum();
                    let kept: u64 = group.iter().map(|&o| sum(&r.kept, o, e)).sum();
                    json!({"expert": e, "tokens": kept, "dropped": routed - kept})
                })
                .collect();
            let tokens: u64 = experts.iter().map(|x| x["tokens"].as_u64().unwrap_or(0)).sum();
            json!({"device": d, "experts": experts, "tokens": tokens})
        })
        .collect();
    // Each token once: the devices at the first coordinate of every axis that repeats them.
    let repeats: Vec<usize> = par
        .mesh
        .axis_names()
        .iter()
        .enumerate()
        .filter(|(_, a)| !TOKEN_AXES.iter().any(|k| k.name() == **a))
        .map(|(i, _)| i)
        .collect();
    let holders: Vec<usize> = (0..devices)
        .filter(|&d| repeats.iter().all(|&i| coords(d)[i] == 0))
        .collect();
    let total = |counts: &[Vec<Vec<u32>>]| -> u64 {
        holders
            .iter()
            .flat_map(|&d| (0..r.experts).map(move |e| (d, e)))
            .map(|(d, e)| sum(counts, d, e))
            .sum()
    };
    let (choices, kept) = (total(&r.routed), total(&r.kept));
    let loads: Vec<u64> = rows.iter().map(|x| x["tokens"].as_u64().unwrap_or(0)).collect();
    let busiest = (0..loads.len())
        .max_by_key(|&d| (loads[d], std::cmp::Reverse(d)))
        .unwrap_or(0);
    let mean = loads.iter().sum::<u64>() as f64 / loads.len().max(1) as f64;
    json!({
        "routers": r.routed.len(),
        "experts": r.experts,
        "devices": rows,
        "choices": choices,
        "dropped": choices - kept,
        "busiest": busiest,
        "busiest_tokens": loads.get(busiest).copied().unwrap_or(0),
        "mean_tokens": mean,
        "imbalance": if mean > 0.0 { loads.get(busiest).copied().unwrap_or(0) as f64 / mean } else { 1.0 },
    })
}

/// Where the experts live and what moving the tokens costs, per mode: `None` for a dense
/// model. `{"experts","top_k","ep","experts_per_device","slots","dropless","modes":{"auto":
/// {"all_to_alls","bytes","ms","step_ms"}}}`: the all-to-alls each device issues per step and
/// the bytes they move (the program summary's), and their time in the modelled step on
/// `device` (the timeline's, on its first device), beside the whole step's.
pub fn summary(moe: &Moe, seq: usize, par: &Parallelism, plans: &[Plan], device: &DeviceProfile) -> Value {
    let ep = if par.has(AxisKind::Ep) {
        par.size(AxisKind::Ep)
    } else {
        1
    };
    let mut modes = serde_json::Map::new();
    for plan in plans {
        let prog = &plan.planned.step.program;
        let a2a = plan
            .summary
            .collectives
            .iter()
            .filter(|c| matches!(prog.instrs[c.instr].op, Op::AllToAll { .. }));
        let (count, bytes) = a2a.fold((0, 0), |(n, b), c| (n + 1, b + c.bytes));
        let (_, timeline) = model_step(prog, device, Placement::Real, true);
        let ms: f64 = timeline.devices.first().map_or(0.0, |row| {
            row.comm
                .iter()
                .chain(&row.compute)
                .filter(|s| s.kind == SpanKind::Op)
                .filter(|s| {
                    s.instr
                        .is_some_and(|i| matches!(prog.instrs[i].op, Op::AllToAll { .. }))
                })
                .map(|s| s.dur_ms)
                .sum()
        });
        modes.insert(
            plan.mode.name().into(),
            json!({"all_to_alls": count, "bytes": bytes, "ms": ms, "step_ms": timeline.step_ms}),
        );
    }
    json!({
        "experts": moe.experts,
        "top_k": moe.top_k,
        "ep": ep,
        "experts_per_device": moe.experts / ep.max(1),
        "slots": moe.slots(seq),
        "dropless": matches!(moe.capacity, shardlab::model::Capacity::Dropless),
        "device": device.label,
        "modes": modes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardlab::sharding::Mesh;

    fn par(mesh: &str) -> Parallelism {
        Parallelism::new(Mesh::parse(mesh).unwrap(), Default::default(), false).unwrap()
    }

    #[test]
    fn each_device_takes_its_experts_tokens_from_its_ep_group_and_drops_count_once() {
        // dp=2,ep=2, 4 experts (2 a device), one router: device d routed[d][e] / kept[d][e].
        let routed = vec![vec![
            vec![4, 0, 2, 2],
            vec![3, 1, 2, 2],
            vec![1, 1, 3, 3],
            vec![2, 2, 2, 2],
        ]];
        let kept = vec![vec![
            vec![3, 0, 2, 2],
            vec![3, 1, 2, 2],
            vec![1, 1, 3, 3],
            vec![2, 2, 2, 2],
        ]];
        let r = Routing {
            experts: 4,
            routed,
            kept,
        };
        let moe = Moe::new(4, 8);
        let v = routing(&r, &par("dp=2,ep=2"), &moe);
        // Device 0 (dp=0, ep=0) holds experts 0 and 1 of devices 0 and 1's sequences.
        let d0 = &v["devices"][0];
        assert_eq!(d0["experts"][0], json!({"expert": 0, "tokens": 6, "dropped": 1}));
        assert_eq!(d0["experts"][1], json!({"expert": 1, "tokens": 1, "dropped": 0}));
        // Device 1 (dp=0, ep=1): experts 2 and 3 of the same sequences.
        assert_eq!(v["devices"][1]["tokens"], 8);
        assert_eq!(v["devices"][3]["experts"][0]["expert"], 2);
        assert_eq!((v["choices"].as_u64(), v["dropped"].as_u64()), (Some(32), Some(1)));
        assert_eq!(v["busiest"], 3);
        assert_eq!(v["busiest_tokens"], 10);
        assert!((v["imbalance"].as_f64().unwrap() - 10.0 / 7.75).abs() < 1e-9);
    }

    #[test]
    fn tensor_parallel_devices_repeat_their_tokens_and_are_counted_once() {
        let one = vec![vec![2, 2], vec![2, 2]];
        let r = Routing {
            experts: 2,
            routed: vec![one.clone()],
            kept: vec![one],
        };
        let v = routing(&r, &par("tp=2"), &Moe::new(2, 8));
        assert_eq!(v["choices"], 4);
        // Without ep each device's experts take its own sequences: both tp devices the same.
        assert_eq!(v["devices"][0]["tokens"], v["devices"][1]["tokens"]);
        assert_eq!(v["imbalance"], 1.0);
    }
}
