//! Every candidate of the search space planned, checked against the device's memory and,
//! where it fits, priced; the fitting ones ranked by modelled step time.
use super::plan_command;
use super::space::{candidates, LEVERS};
use crate::ir::Precision;
use crate::plan::{mesh_text, MemoryPlan, Parallel, TrainerOptions};
use crate::profile::{predict, DeviceBytes, DeviceProfile, Placement};
use crate::sharding::Mesh;

/// The lever the search applies last, and only where it must (see [`search`]).
pub const MICROBATCHES_LEVER: &str = "microbatches (the fewest that fit)";

/// Why a search has nothing to show, in one line with the fix.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SearchError(pub String);

/// One configuration that fits, priced.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Ranked {
    /// 1 for the fastest.
    pub rank: usize,
    pub mode: &'static str,
    /// The named strategy, else the mesh.
    pub strategy: String,
    /// As `--mesh` takes it.
    pub mesh: String,
    pub remat: &'static str,
    /// Gradient accumulation's microbatches: the fewest that fit (1 where the whole batch fits);
    /// a pipeline's, as its lever chose them.
    pub microbatches: usize,
    /// A pipeline's schedule (`gpipe`, `1f1b`); None for other strategies.
    pub schedule: Option<&'static str>,
    pub step_ms: f64,
    pub bytes_per_device: DeviceBytes,
    /// What bounds most of its step: compute, memory, communication, bubble or launch.
    pub limiting: &'static str,
    /// That bound's share of the step.
    pub limiting_share: f64,
    /// `shardlab plan ...` of it.
    pub command: String,
    /// The options planned (not serialized: `command` says them).
    #[serde(skip)]
    pub options: TrainerOptions,
}

/// A search's outcome: how many configurations it considered and why it dropped the rest.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SearchResult {
    pub device: String,
    pub devices: usize,
    /// The levers it varied, in order (every candidate is one value of each).
    pub levers: Vec<&'static str>,
    /// What every candidate shares: the dtype policy, attention, dropout.
    pub precision: Precision,
    pub considered: usize,
    /// Candidates the model does not split over the mesh (divisibility), with one reason each
    /// per strategy.
    pub invalid: usize,
    pub invalid_reasons: Vec<String>,
    /// Candidates whose memory per device exceeds the device's.
    pub too_large: usize,
    /// Every candidate that fits, fastest first.
    pub ranked: Vec<Ranked>,
}

/// Plans every candidate of `base` (its model, optimizer and dtype policy) on `devices`
/// devices of `device` (the preset's name `device_name` goes into each command), drops what
/// does not split or does not fit, and ranks the rest by modelled step. Everything that fits is
/// priced; nothing that does not is listed.
pub fn search(
    base: &TrainerOptions,
    device: &DeviceProfile,
    device_name: &str,
    devices: usize,
) -> Result<SearchResult, SearchError> {
    if devices == 0 {
        return Err(SearchError(
            "--devices 0: a plan needs at least 1 device, e.g. --devices 8".into(),
        ));
    }
    if devices > Mesh::MAX_DEVICES {
        return Err(SearchError(format!(
            "--devices {devices}: shardlab plans meshes of at most {} devices; use fewer",
            Mesh::MAX_DEVICES
        )));
    }
    base.config.validate().map_err(|e| SearchError(e.to_string()))?;
    let all = candidates(base, devices);
    let considered = all.len();
    let mut invalid_reasons: Vec<String> = vec![];
    let (mut invalid, mut too_large) = (0, 0);
    let mut ranked = vec![];
    for opts in all {
        let planned = match crate::plan::build(&opts) {
            Ok(p) => p,
            Err(e) => {
                invalid += 1;
                let strategy = strategy_name(&opts.parallel);
                let reason = format!("{strategy}: {e}");
                if !invalid_reasons.iter().any(|r| r.starts_with(&format!("{strategy}:"))) {
                    invalid_reasons.push(reason);
                }
                continue;
            }
        };
        // The memory plan first: a candidate that does not fit is not priced. One that does
        // not fit whole tries gradient accumulation, doubling the microbatches while they
        // divide the batch: more microbatches only add launches and adds, so the fewest that
        // fit is the fastest, and only it is priced.
        let fits = |prog: &crate::ir::Program| MemoryPlan::of(prog).is_ok_and(|m| m.total <= device.memory_bytes);
        let (mut opts, mut planned) = (opts, planned);
        while !fits(&planned.step.program) {
            let mut more = opts.clone();
            more.microbatches *= 2;
            match (more.microbatches <= base.config.batch).then(|| crate::plan::build(&more)) {
                Some(Ok(p)) => (opts, planned) = (more, p),
                _ => break,
            }
        }
        let prog = &planned.step.program;
        if !fits(prog) {
            too_large += 1;
            continue;
        }
        let p = predict(prog, device, Placement::Real);
        let strategy = opts.parallel.label();
        let mesh = opts.parallel.mesh().map_or("-".to_string(), mesh_text);
        ranked.push(Ranked {
            rank: 0,
            mode: opts.parallel.mode_name(),
            strategy,
            mesh,
            remat: opts.config.remat.name(),
            microbatches: opts.microbatches,
            schedule: opts
                .parallel
                .parallelism()
                .filter(|p| p.is_pipeline())
                .map(|_| opts.schedule.name()),
            step_ms: p.step_ms,
            bytes_per_device: p.bytes_per_device,
            limiting: p.limiting,
            limiting_share: p.bounds_ms[p.limiting] / p.step_ms.max(f64::MIN_POSITIVE),
            command: plan_command(&opts, device_name),
            options: opts,
        });
    }
    if ranked.is_empty() && invalid == considered {
        return Err(SearchError(format!(
            "no strategy splits this model over {devices} devices ({}): use a device count that divides --batch {} \
             (data parallelism) or --heads {} (tensor parallelism)",
            invalid_reasons.join("; "),
            base.config.batch,
            base.config.heads
        )));
    }
    if ranked.is_empty() {
        return Err(SearchError(format!(
            "nothing fits: all {} ways to split it over {devices} x {} need more than its {:.1} GiB per device; use more \
             devices, a smaller --batch or --seq, or --precision bf16",
            considered - invalid,
            device.label,
            device.memory_bytes as f64 / (1u64 << 30) as f64
        )));
    }
    ranked.sort_by(|a, b| a.step_ms.total_cmp(&b.step_ms));
    for (i, r) in ranked.iter_mut().enumerate() {
        r.rank = i + 1;
    }
    Ok(SearchResult {
        device: device.label.clone(),
        devices,
        levers: LEVERS.iter().map(|l| l.name).chain([MICROBATCHES_LEVER]).collect(),
        precision: base.config.precision,
        considered,
        invalid,
        invalid_reasons,
        too_large,
        ranked,
    })
}

fn strategy_name(p: &Parallel) -> String {
    match p {
        Parallel::None => "one device".into(),
        _ => p.label(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GptConfig;
    use crate::profile::a100;

    fn base(batch: usize) -> TrainerOptions {
        TrainerOptions::new(
            GptConfig {
                layers: 2,
                d_model: 64,
                heads: 4,
                seq: 64,
                batch,
                vocab: 128,
                ..GptConfig::tiny()
            },
            Parallel::None,
        )
    }

    #[test]
    fn nothing_that_does_not_fit_is_listed_and_everything_that_fits_is_ranked() {
        let opts = base(16);
        // Each candidate's smallest need over the microbatch counts that split its batch.
        let smallest = |c: &TrainerOptions| {
            (0..)
                .map(|i| 1usize << i)
                .take_while(|&k| k <= c.config.batch)
                .map_while(|k| {
                    crate::plan::build(&TrainerOptions {
                        microbatches: k,
                        ..c.clone()
                    })
                    .ok()
                })
                .map(|p| MemoryPlan::of(&p.step.program).unwrap().total)
                .min()
        };
        // A device whose memory sits between the candidates' needs, so some fit and some not.
        let mut needs: Vec<u64> = candidates(&opts, 4).iter().filter_map(smallest).collect();
        needs.sort_unstable();
        let device = DeviceProfile {
            memory_bytes: needs[needs.len() / 2],
            ..a100()
        };
        let r = search(&opts, &device, "a100", 4).unwrap();
        let fitting = needs.iter().filter(|&&n| n <= device.memory_bytes).count();
        assert_eq!(r.ranked.len(), fitting, "every candidate that fits is ranked");
        assert_eq!(r.too_large, needs.len() - fitting);
        assert_eq!(r.considered, r.invalid + r.too_large + r.ranked.len());
        assert!(r.ranked.iter().all(|c| c.bytes_per_device.total <= device.memory_bytes));
        assert!(r.ranked.windows(2).all(|w| w[0].step_ms <= w[1].step_ms));
        assert_eq!(r.ranked[0].rank, 1);
    }

    #[test]
    fn a_candidate_too_large_whole_is_ranked_with_the_fewest_microbatches_that_fit() {
        use crate::plan::{DropoutKey, Strategy};
        let opts = base(16);
        let dp = |k: usize| TrainerOptions {
            parallel: Parallel::ShardMap {
                par: Strategy::Dp.compose(&Mesh::parse("dp=4").unwrap()).unwrap(),
                dropout_key: DropoutKey::FoldIn,
            },
            microbatches: k,
            ..opts.clone()
        };
        let need = |k| {
            MemoryPlan::of(&crate::plan::build(&dp(k)).unwrap().step.program)
                .unwrap()
                .total
        };
        let (one, two, four) = (need(1), need(2), need(4));
        assert!(
            one > two && two > four,
            "accumulation lowers the peak: {one} {two} {four}"
        );
        // Between K = 2's need and K = 1's: dp fits with 2 microbatches, not with 1, nor is 4 tried.
        let device = DeviceProfile {
            memory_bytes: (one + two) / 2,
            ..a100()
        };
        let r = search(&opts, &device, "a100", 4).unwrap();
        let row = r
            .ranked
            .iter()
            .find(|x| x.mode == "shard_map" && x.strategy == "dp" && x.remat == "none")
            .expect("dp fits with microbatches");
        assert_eq!(row.microbatches, 2);
        assert!(row.command.ends_with("--microbatches 2"), "{}", row.command);
        assert!(r.ranked.iter().all(|x| x.bytes_per_device.total <= device.memory_bytes));
        assert!(r.levers.contains(&MICROBATCHES_LEVER));
    }

    #[test]
    fn hostile_device_counts_are_refused_with_the_fix() {
        let d = a100();
        let e = search(&base(16), &d, "a100", 0).unwrap_err().0;
        assert!(e.contains("--devices 0") && e.contains("--devices 8"), "{e}");
        // 7 devices: the batch of 16 and the 4 heads split over no mesh of 7.
        let e = search(&base(16), &d, "a100", 7).unwrap_err().0;
        assert!(e.contains("no strategy splits") && e.contains("--batch 16"), "{e}");
        let e = search(&base(16), &d, "a100", 1 << 20).unwrap_err().0;
        assert!(e.contains("at most"), "{e}");
    }
}
