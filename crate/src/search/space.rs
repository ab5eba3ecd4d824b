//! The search space: every way to run one model on N devices that shardlab can plan, as the
//! levers below multiply it out. A candidate is the options `shardlab plan` would plan.
use crate::ir::CpOrder;
use crate::model::Remat;
use crate::plan::{AxisKind, DropoutKey, Mode, Parallel, Parallelism, Schedule, TrainerOptions, Zero};
use crate::sharding::Mesh;

/// One lever of the search: its name (as a plan states what it assumes) and every variant of
/// a candidate along it, given the device count.
pub struct Lever {
    pub name: &'static str,
    pub vary: fn(&TrainerOptions, usize) -> Vec<TrainerOptions>,
}

/// Every lever the search varies, in the order it multiplies them out (each variant of one
/// lever is varied by the next). A new axis joins through `AxisKind::ALL`; a new lever by one
/// entry here.
pub const LEVERS: [Lever; 5] = [
    Lever {
        name: "mesh of up to four axes",
        vary: meshes,
    },
    Lever {
        name: "zero stage and sequence parallelism",
        vary: axis_options,
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
        name: "pipeline schedule, virtual stages and microbatches",
        vary: pipelines,
    },
];

/// The most axes a searched mesh composes: Llama 3's tp x cp x pp x dp.
pub const MAX_AXES: usize = 4;

/// Every candidate for `devices` devices from `base` (the model, data, optimizer and dtype
/// policy the user chose): `base` varied by each lever of [`LEVERS`] in turn.
pub fn candidates(base: &TrainerOptions, devices: usize) -> Vec<TrainerOptions> {
    LEVERS.iter().fold(vec![base.clone()], |all, lever| {
        all.iter().flat_map(|c| (lever.vary)(c, devices)).collect()
    })
}

/// The ways of dividing `n` into the sizes of `axes`, each above 1 (so that no two meshes
/// name the same partitioning), in increasing size of the first axis.
pub fn mesh_shapes(axes: &[&str], n: usize) -> Vec<Mesh> {
    sizes(axes.len(), n)
        .into_iter()
        .filter_map(|sizes| {
            let named: Vec<(&str, usize)> = axes.iter().copied().zip(sizes).collect();
            Mesh::new(&named).ok()
        })
        .collect()
}

/// Every way to write `n` as an ordered product of `k` factors above 1.
fn sizes(k: usize, n: usize) -> Vec<Vec<usize>> {
    match k {
        0 => vec![],
        1 if n > 1 => vec![vec![n]],
        1 => vec![],
        _ => (2..n)
            .filter(|a| n.is_multiple_of(*a))
            .flat_map(|a| {
                sizes(k - 1, n / a).into_iter().map(move |mut rest| {
                    rest.insert(0, a);
                    rest
                })
            })
            .collect(),
    }
}

/// The longest context-parallel ring the search tries: the longest of published runs (Llama 3
/// 405B's 128K-token stage, cp=16, Dubey et al. 2024).
pub const MAX_RING: usize = 16;

/// On one device the step unpartitioned; on more, every mesh of one to [`MAX_AXES`] distinct
/// axes (in `AxisKind::ALL`'s order, "ep" only for a mixture of experts: the order the axes are listed in changes no plan) whose
/// sizes divide the devices, rings of at most [`MAX_RING`], in shard_map mode ([`modes`]
/// adds automatic).
fn meshes(base: &TrainerOptions, devices: usize) -> Vec<TrainerOptions> {
    if devices <= 1 {
        return vec![TrainerOptions {
            parallel: Parallel::None,
            ..base.clone()
        }];
    }
    let mut out = vec![];
    // "ep" splits a mixture's experts: a dense model's meshes leave it out.
    let ep_bit = 1 << AxisKind::ALL.iter().position(|&k| k == AxisKind::Ep).unwrap_or(0);
    for subset in 1u32..(1 << AxisKind::ALL.len()) {
        if subset.count_ones() as usize > MAX_AXES || (subset & ep_bit != 0 && base.config.moe.is_none()) {
            continue;
        }
        let kinds: Vec<&str> = AxisKind::ALL
            .iter()
            .enumerate()
            .filter(|(i, _)| subset & (1 << i) != 0)
            .map(|(_, k)| k.name())
            .collect();
        for mesh in mesh_shapes(&kinds, devices) {
            if mesh.size_of("cp").unwrap_or(1) > MAX_RING {
                continue;
            }
            let Ok(par) = Parallelism::new(mesh, Zero::Off, false) else {
                continue;
            };
            out.push(TrainerOptions {
                parallel: shard_map(par),
                ..base.clone()
            });
        }
    }
    out
}

/// A shard_map body on `par`, each data-parallel shard with its own masks as a real run
/// needs; where the body draws every device's block of the one-device masks (the sequence
/// split, a pipeline) they differ already and there is no key to choose.
fn shard_map(par: Parallelism) -> Parallel {
    Parallel::ShardMap {
        dropout_key: if par.draws_mask_blocks() {
            DropoutKey::Same
        } else {
            DropoutKey::FoldIn
        },
        par,
    }
}

/// Each ZeRO stage where the mesh has "dp", and sequence parallelism on and off where it has
/// "tp"; a "cp" ring in zig-zag order where the model allows it (causal attention's work is
/// then the same on every device, which contiguous blocks never beat).
fn axis_options(base: &TrainerOptions, _: usize) -> Vec<TrainerOptions> {
    let Some(par) = base.parallel.parallelism() else {
        return vec![base.clone()];
    };
    let zeros: &[Zero] = if par.has(AxisKind::Dp) {
        &Zero::ALL
    } else {
        &[Zero::Off]
    };
    let sps: &[bool] = if par.has(AxisKind::Tp) {
        &[false, true]
    } else {
        &[false]
    };
    let mut out = vec![];
    for &zero in zeros {
        for &sp in sps {
            if let Ok(p) = Parallelism::new(par.mesh.clone(), zero, sp) {
                let zigzag = p.is_cp() && p.check_cp(&base.config, CpOrder::Zigzag, Mode::ShardMap).is_ok();
                out.push(TrainerOptions {
                    parallel: shard_map(p),
                    cp_order: if zigzag { CpOrder::Zigzag } else { base.cp_order },
                    ..base.clone()
                });
            }
        }
    }
    out
}

/// A partitioned candidate as a hand-written shard_map body and as jit with the rules'
/// shardings (but a pipeline, which jit does not build yet). Explicit mode joins after the
/// screen (`rank::explicit_twins`): it screens as automatic does, so it is screened once.
fn modes(base: &TrainerOptions, _: usize) -> Vec<TrainerOptions> {
    let Some([auto, _, shard_map]) = base.in_every_mode() else {
        return vec![base.clone()];
    };
    if shard_map.parallel.parallelism().is_some_and(Parallelism::is_pipeline) {
        return vec![shard_map];
    }
    vec![shard_map, auto]
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

/// A pipeline under each schedule, with pp, 2 pp, 4 pp and 8 pp microbatches (those that split
/// each data shard's rows): more microbatches shrink the bubble, (pp - 1) / (M + pp - 1), and
/// GPipe holds them all where 1F1B does not. 1F1B also runs interleaved, two chunks a stage
/// where they split its blocks (Megatron-LM's virtual stages: the bubble halves for more sends
/// between stages). Other candidates pass through.
fn pipelines(base: &TrainerOptions, _: usize) -> Vec<TrainerOptions> {
    let Some(par) = base.parallel.parallelism().filter(|p| p.is_pipeline()) else {
        return vec![base.clone()];
    };
    let pp = par.size(AxisKind::Pp);
    let rows = base.config.batch / par.batch_split().max(1);
    let counts: Vec<usize> = [pp, 2 * pp, 4 * pp, 8 * pp]
        .into_iter()
        .filter(|m| *m <= rows && rows.is_multiple_of(*m))
        .collect();
    // A batch too small for pp microbatches still runs (mostly bubble): one per row.
    let counts = if counts.is_empty() { vec![rows.max(1)] } else { counts };
    let interleaves = (base.config.layers / pp).is_multiple_of(2);
    Schedule::ALL
        .into_iter()
        .flat_map(|schedule| counts.iter().map(move |&m| (schedule, m)))
        .flat_map(|(schedule, m)| {
            let v2 = schedule == Schedule::OneFOneB && interleaves && m.is_multiple_of(pp);
            [1, 2]
                .into_iter()
                .filter(move |&v| v == 1 || v2)
                .map(move |v| (schedule, m, v))
        })
        .map(|(schedule, microbatches, virtual_stages)| TrainerOptions {
            schedule,
            microbatches,
            virtual_stages,
            ..base.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GptConfig;
    use crate::plan::Mode;

    #[test]
    fn meshes_divide_the_devices_over_their_axes() {
        let texts = |axes: &[&str], n| {
            mesh_shapes(axes, n)
                .iter()
                .map(crate::plan::mesh_text)
                .collect::<Vec<_>>()
        };
        assert_eq!(texts(&["dp"], 8), ["dp=8"]);
        assert!(mesh_shapes(&["dp"], 1).is_empty());
        assert_eq!(texts(&["dp", "tp"], 16), ["dp=2,tp=8", "dp=4,tp=4", "dp=8,tp=2"]);
        assert!(mesh_shapes(&["dp", "tp"], 7).is_empty(), "a prime has no 2-D split");
        assert_eq!(texts(&["dp", "tp", "pp"], 8), ["dp=2,tp=2,pp=2"], "every axis above 1");
        // 2^12 over four axes: the compositions of 12 into 4 positive parts, C(11, 3).
        assert_eq!(mesh_shapes(&["dp", "fsdp", "tp", "pp"], 4096).len(), 165);
    }

    #[test]
    fn every_mesh_of_up_to_four_axes_with_its_options_modes_and_remats_is_a_candidate() {
        let base = TrainerOptions::new(
            GptConfig {
                batch: 64,
                ..GptConfig::tiny()
            },
            Parallel::None,
        );
        let all = candidates(&base, 8);
        let has = |mesh: &str, zero: Zero, sp: bool, mode: Mode| {
            all.iter().any(|c| {
                c.parallel.mode() == mode
                    && c.parallel.parallelism().is_some_and(|p| {
                        crate::plan::mesh_text(&p.mesh) == mesh && p.zero == zero && p.sequence_parallel == sp
                    })
            })
        };
        assert!(has("dp=8", Zero::Two, false, Mode::Auto));
        assert!(has("dp=2,fsdp=2,tp=2", Zero::One, true, Mode::ShardMap));
        assert!(has("tp=2,cp=2,pp=2", Zero::Off, true, Mode::ShardMap));
        // No pipeline in jit, no ZeRO without dp, no sequence parallelism without tp.
        assert!(!has("dp=4,pp=2", Zero::Off, false, Mode::Auto));
        assert!(!has("fsdp=8", Zero::One, false, Mode::ShardMap));
        assert!(!has("cp=8", Zero::Off, true, Mode::ShardMap));
        assert!(all
            .iter()
            .all(|c| c.parallel.parallelism().is_some_and(|p| p.kinds().len() <= MAX_AXES)));
        // One device: the step unpartitioned, at every remat.
        assert_eq!(candidates(&base, 1).len(), Remat::ALL.len());
    }

    #[test]
    fn a_ring_is_searched_in_zigzag_order_where_the_model_allows_it_and_its_command_says_so() {
        // A sequence of 32 splits into 2 x cp chunks for every ring of 8 devices or fewer.
        let base = TrainerOptions::new(
            GptConfig {
                batch: 64,
                seq: 32,
                ..GptConfig::tiny()
            },
            Parallel::None,
        );
        let rings = |c: &&TrainerOptions| c.parallel.parallelism().is_some_and(Parallelism::is_cp);
        let all = candidates(&base, 8);
        assert!(all.iter().filter(rings).count() > 0);
        for c in all.iter().filter(rings) {
            let sp = c.parallel.parallelism().is_some_and(|p| p.sequence_parallel);
            // Sequence parallelism would split zig-zag's two chunks again: contiguous there.
            let want = if sp { CpOrder::Contiguous } else { CpOrder::Zigzag };
            assert_eq!(c.cp_order, want, "{}", crate::search::plan_command(c, "h100"));
            assert_eq!(
                crate::search::plan_command(c, "h100").contains("--cp-order zigzag"),
                !sp
            );
        }
    }

    #[test]
    fn one_f_one_b_is_also_tried_interleaved_where_two_chunks_split_a_stage_and_its_command_says_so() {
        let base = |layers| {
            TrainerOptions::new(
                GptConfig {
                    layers,
                    batch: 64,
                    ..GptConfig::tiny()
                },
                Parallel::None,
            )
        };
        let pp2 = |c: &&TrainerOptions| {
            c.parallel
                .parallelism()
                .is_some_and(|p| crate::plan::mesh_text(&p.mesh) == "dp=4,pp=2")
        };
        let all = candidates(&base(4), 8);
        let interleaved: Vec<_> = all.iter().filter(pp2).filter(|c| c.virtual_stages == 2).collect();
        assert!(!interleaved.is_empty());
        for c in &interleaved {
            assert_eq!(c.schedule, Schedule::OneFOneB);
            assert!(c.microbatches.is_multiple_of(2), "{}", c.microbatches);
            assert!(crate::search::plan_command(c, "h100").contains("--schedule 1f1b --virtual-stages 2"));
        }
        // One block a stage: nothing to interleave.
        assert!(candidates(&base(2), 8)
            .iter()
            .filter(pp2)
            .all(|c| c.virtual_stages == 1));
    }
}
