//! The search space: every way to run one model on N devices that shardlab can plan, as the
//! levers below multiply it out. A candidate is the options `shardlab plan` would plan.
use crate::model::Remat;
use crate::plan::{AxisKind, DropoutKey, Parallel, Schedule, Strategy, TrainerOptions};
use crate::sharding::Mesh;

/// One lever of the search: its name (as a plan states what it assumes) and every variant of
/// a candidate along it, given the device count.
pub struct Lever {
    pub name: &'static str,
    pub vary: fn(&TrainerOptions, usize) -> Vec<TrainerOptions>,
}

/// Every lever the search varies, in the order it multiplies them out (each variant of one
/// lever is varied by the next). A new strategy joins through `Strategy::ALL` (its mesh axes
/// from `Strategy::axes`); a new lever, such as gradient accumulation's microbatches or a
/// pipeline schedule, by one entry here.
pub const LEVERS: [Lever; 4] = [
    Lever {
        name: "strategy and mesh",
        vary: strategies_and_meshes,
    },
    Lever {
        name: "mode",
        vary: modes,
    },
    Lever {
        name: "remat",
        vary: remats,
    },
    Lever {
        name: "pipeline schedule and microbatches",
        vary: pipelines,
    },
];

/// Every candidate for `devices` devices from `base` (the model, data, optimizer and dtype
/// policy the user chose): `base` varied by each lever of [`LEVERS`] in turn.
pub fn candidates(base: &TrainerOptions, devices: usize) -> Vec<TrainerOptions> {
    LEVERS.iter().fold(vec![base.clone()], |all, lever| {
        all.iter().flat_map(|c| (lever.vary)(c, devices)).collect()
    })
}

/// The ways of dividing `n` into the sizes of `axes` (each above 1, so that no two strategies
/// name the same partitioning), in increasing size of the first axis.
pub fn mesh_shapes(axes: &[&str], n: usize) -> Vec<Mesh> {
    let text = |sizes: &[usize]| {
        axes.iter()
            .zip(sizes)
            .map(|(a, s)| format!("{a}={s}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let shapes: Vec<Vec<usize>> = match axes.len() {
        1 if n > 1 => vec![vec![n]],
        2 => (2..n)
            .filter(|a| n.is_multiple_of(*a) && n / a > 1)
            .map(|a| vec![a, n / a])
            .collect(),
        _ => vec![],
    };
    shapes.iter().filter_map(|s| Mesh::parse(&text(s)).ok()).collect()
}

/// The longest context-parallel ring the search tries: the longest of published runs (Llama 3
/// 405B's 128K-token stage, cp=16, Dubey et al. 2024). Each device of a causal ring does
/// different attention work, so pricing one schedules every device's row; rings of 32 and
/// more would take the search past its 10 s for no run anyone makes.
pub const MAX_RING: usize = 16;

/// On one device the step unpartitioned; on more, each strategy on each mesh of its axes
/// (in shard_map mode; [`modes`] adds automatic), rings of at most [`MAX_RING`].
fn strategies_and_meshes(base: &TrainerOptions, devices: usize) -> Vec<TrainerOptions> {
    if devices <= 1 {
        return vec![TrainerOptions {
            parallel: Parallel::None,
            ..base.clone()
        }];
    }
    Strategy::ALL
        .into_iter()
        .flat_map(|strategy| {
            let axes: Vec<&str> = strategy.axes().iter().map(|k| k.name()).collect();
            mesh_shapes(&axes, devices)
                .into_iter()
                .filter(|mesh| mesh.axis_size("cp").unwrap_or(1) <= MAX_RING)
                .filter_map(move |mesh| strategy.compose(&mesh).ok())
                .map(|par| TrainerOptions {
                    parallel: Parallel::ShardMap {
                        // Each data-parallel shard its own masks, as a real run needs; where
                        // the body draws every device's block of the one-device masks (the
                        // sequence split, a pipeline) they differ already and there is no key
                        // to choose.
                        dropout_key: if par.draws_mask_blocks() {
                            DropoutKey::Same
                        } else {
                            DropoutKey::FoldIn
                        },
                        par,
                    },
                    ..base.clone()
                })
        })
        .collect()
}

/// A partitioned candidate in each of JAX's three modes: the hand-written shard_map body, jit
/// with the strategy's shardings, and the global program typed with them (explicit sharding).
fn modes(base: &TrainerOptions, _: usize) -> Vec<TrainerOptions> {
    let Some([auto, explicit, shard_map]) = base.in_every_mode() else {
        return vec![base.clone()];
    };
    vec![shard_map, auto, explicit]
}

/// Each rematerialization policy.
fn remats(base: &TrainerOptions, _: usize) -> Vec<TrainerOptions> {
    Remat::ALL
        .into_iter()
        .map(|remat| {
            let mut c = base.clone();
            c.config.remat = remat;
            c
        })
        .collect()
}

/// A pipeline under each schedule, with pp, 2 pp and 4 pp microbatches (those that split each
/// "dp" shard's rows): more microbatches shrink the bubble, (pp - 1) / (M + pp - 1), and GPipe
/// holds them all where 1F1B does not. Other candidates pass through.
fn pipelines(base: &TrainerOptions, _: usize) -> Vec<TrainerOptions> {
    let Some(par) = base.parallel.parallelism().filter(|p| p.is_pipeline()) else {
        return vec![base.clone()];
    };
    let pp = par.size(AxisKind::Pp);
    let rows = base.config.batch / par.batch_split();
    let counts: Vec<usize> = [pp, 2 * pp, 4 * pp]
        .into_iter()
        .filter(|m| *m <= rows && rows.is_multiple_of(*m))
        .collect();
    // A batch too small for pp microbatches still runs (mostly bubble): one per row.
    let counts = if counts.is_empty() { vec![rows.max(1)] } else { counts };
    Schedule::ALL
        .into_iter()
        .flat_map(|schedule| {
            counts.iter().map(move |&m| TrainerOptions {
                schedule,
                microbatches: m,
                ..base.clone()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GptConfig;
    use crate::plan::Mode;

    #[test]
    fn meshes_divide_the_devices_over_the_strategys_axes() {
        let texts = |axes: &[&str], n| mesh_shapes(axes, n).iter().map(|m| m.to_string()).collect::<Vec<_>>();
        assert_eq!(mesh_shapes(&["dp"], 8).len(), 1);
        assert_eq!(mesh_shapes(&["dp"], 1).len(), 0);
        let two = texts(&["dp", "tp"], 16);
        assert_eq!(two.len(), 3, "2x8, 4x4, 8x2: {two:?}");
        assert!(mesh_shapes(&["dp", "tp"], 7).is_empty(), "a prime has no 2-D split");
    }

    #[test]
    fn every_strategy_mesh_mode_and_remat_is_a_candidate() {
        let base = TrainerOptions::new(GptConfig::tiny(), Parallel::None);
        let all = candidates(&base, 8);
        // dp, fsdp, tp on one mesh each and dp_tp on 2x4 and 4x2, in the three modes, at every remat.
        let meshes: usize = Strategy::ALL
            .iter()
            .filter(|s| !s.axes().contains(&AxisKind::Pp))
            .map(|s| mesh_shapes(&s.axes().iter().map(|k| k.name()).collect::<Vec<_>>(), 8).len())
            .sum();
        // Pipelines: pp=8, dp_pp 2x4 and 4x2, each under both schedules (batch 2: one
        // microbatch per row, the only count that splits it).
        let pipelines = 3 * Schedule::ALL.len();
        assert_eq!(all.len(), (meshes + pipelines) * Mode::PARTITIONED.len() * Remat::ALL.len());
        for mode in Mode::PARTITIONED {
            assert!(all
                .iter()
                .any(|c| c.parallel.mode() == mode && c.config.remat == Remat::Dots));
        }
        // One device: the step unpartitioned, at every remat.
        assert_eq!(candidates(&base, 1).len(), Remat::ALL.len());
    }
}
