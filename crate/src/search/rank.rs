//! Every candidate of the search space screened in closed form, the best few planned and
//! priced exactly, and those that fit ranked by modelled step time.
//!
//! Tracing and pricing one candidate takes tens of milliseconds to seconds (its program
//! unrolls every block and, in a pipeline, every microbatch), and 4,096 devices make tens of
//! thousands of candidates. So every candidate is first checked (the mesh divides the model),
//! sized in closed form ([`closed_memory`]: parameters, state and gradients exact,
//! activations within [`crate::plan::ACTIVATION_BOUND`]) and timed in closed form
//! ([`estimate_step`]: the same rates and links the exact price uses, on one block's ops).
//! A candidate the closed form proves too large ([`crate::plan::ClosedMemory::at_least`]) is
//! dropped: nothing that fits is. The [`EXACT`] fastest by the estimate are then traced, their
//! memory planned ([`MemoryPlan::of`]) and their step priced on the timeline ([`predict`]);
//! only exact prices are ranked. The estimate orders candidates nearly as the exact price
//! does (tested: on small cases where every candidate can be priced, the search's winner is
//! within 2% of the exact winner), but it is not the price shown.
use super::space::{candidates, LEVERS};
use super::{parallel, plan_command};
use crate::ir::Precision;
use crate::plan::{closed_memory, mesh_text, MemoryPlan, Parallel, Parallelism, PlanError, TrainerOptions};
use crate::profile::{estimate_step, predict, DeviceBytes, DeviceProfile, Placement};
use crate::setting::{Audience, Setting};
use crate::sharding::Mesh;

/// The lever the search applies last, and only where it must (see [`search`]).
pub const MICROBATCHES_LEVER: &str = "microbatches (the fewest that fit)";

/// Candidates traced and priced exactly: the fastest by the closed-form estimate (with the
/// fastest of each set of axes in each mode, see `shortlist`).
pub const EXACT: usize = 10;

/// Block passes (blocks a device runs times the microbatches it runs them on) the exact tier
/// traces in all: what keeps a search of 4,096 devices of a large model within seconds
/// (tracing, planning and scheduling costs about 10 ms of CPU a block pass; BENCHMARKS.md).
pub const TRACE_BUDGET: usize = 512;

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
    /// ZeRO's stage on "dp" (`0` without).
    pub zero: &'static str,
    /// Sequence parallelism on "tp".
    pub sequence_parallel: bool,
    pub remat: &'static str,
    /// Gradient accumulation's microbatches: the fewest that fit (1 where the whole batch fits);
    /// a pipeline's, as its lever chose them.
    pub microbatches: usize,
    /// A pipeline's schedule (`gpipe`, `1f1b`); None for other strategies.
    pub schedule: Option<&'static str>,
    /// A pipeline's chunks of blocks per stage (1: not interleaved).
    pub virtual_stages: usize,
    pub step_ms: f64,
    /// The closed-form estimate the screen ranked it by.
    pub estimate_ms: f64,
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
    /// Candidates the model does not split over the mesh (divisibility), with one reason for
    /// each setting refused: the first, on the fewest axes, says why the larger meshes fail too.
    pub invalid: usize,
    pub invalid_reasons: Vec<String>,
    /// Candidates whose memory per device exceeds the device's: in closed form, or planned.
    pub too_large: usize,
    /// Candidates that may fit but the estimate put behind the [`EXACT`] best: not priced.
    pub screened: usize,
    /// Candidates planned and priced exactly (those that fit are ranked).
    pub priced: usize,
    /// Every candidate priced exactly that fits, fastest first.
    pub ranked: Vec<Ranked>,
}

/// A candidate the screen passed: its options and estimated step.
struct Screened {
    opts: TrainerOptions,
    estimate_s: f64,
}

/// Screens every candidate of `base` (its model, optimizer and dtype policy) on `devices`
/// devices of `device` in closed form, plans and prices the [`EXACT`] fastest by the estimate,
/// drops what does not split or does not fit, and ranks the rest by modelled step (the
/// preset's name `device_name` goes into each command).
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
    let mut considered = all.len();
    let mut invalid_reasons: Vec<String> = vec![];
    let mut refused: Vec<Setting> = vec![];
    let (mut invalid, mut too_large) = (0, 0);
    let mut passed: Vec<Screened> = vec![];
    for outcome in parallel::map(&all, |opts| screen(opts, device)) {
        match outcome {
            Screen::Invalid { setting, reason } => {
                invalid += 1;
                if !refused.contains(&setting) {
                    refused.push(setting);
                    invalid_reasons.push(reason);
                }
            }
            Screen::TooLarge => too_large += 1,
            Screen::Passed(s) => passed.push(*s),
        }
    }
    let twins = explicit_twins(&passed);
    considered += twins.len();
    passed.extend(twins);
    passed.sort_by(|a, b| a.estimate_s.total_cmp(&b.estimate_s));
    // The first is priced whatever its size; the rest while the trace budget lasts.
    let mut budget = TRACE_BUDGET;
    let chosen: Vec<&Screened> = shortlist(&passed)
        .into_iter()
        .enumerate()
        .filter(|(i, s)| {
            let passes = block_passes(&s.opts);
            let take = *i == 0 || passes <= budget;
            if take {
                budget = budget.saturating_sub(passes);
            }
            take
        })
        .map(|(_, s)| s)
        .collect();
    let priced = chosen.len();
    let mut ranked = vec![];
    for r in parallel::map(&chosen, |s| price(s, device, device_name, base)) {
        match r {
            Some(r) => ranked.push(r),
            None => too_large += 1,
        }
    }
    let screened = passed.len() - priced;
    if ranked.is_empty() && invalid == considered {
        return Err(SearchError(format!(
            "no mesh splits this model over {devices} devices ({}): use a device count that divides --batch {} (data \
             parallelism) or --heads {} (tensor parallelism)",
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
        screened,
        priced,
        ranked,
    })
}

/// One candidate's screen: why it does not split (its axes first, as the reasons list them),
/// that it cannot fit, or its estimate.
enum Screen {
    Invalid { setting: Setting, reason: String },
    TooLarge,
    Passed(Box<Screened>),
}

/// The closed-form screen of one candidate on `device`: the checks, memory (with gradient
/// accumulation where the whole batch does not fit: doubling the microbatches while they split
/// the batch, as more only add launches and adds, so the fewest that fit is the fastest; a
/// pipeline's microbatches are its own lever) and the step estimate.
fn screen(opts: &TrainerOptions, device: &DeviceProfile) -> Screen {
    if let Err(e) = check(opts) {
        return Screen::Invalid {
            setting: e.setting(),
            reason: format!("{}: {}", axes_name(&opts.parallel), e.text(Audience::Cli)),
        };
    }
    let fits = |o: &TrainerOptions| closed_memory(o).at_least() <= device.memory_bytes;
    let mut opts = opts.clone();
    while !fits(&opts) && !is_pipeline(&opts) {
        let more = TrainerOptions {
            microbatches: opts.microbatches * 2,
            ..opts.clone()
        };
        if check(&more).is_err() {
            break;
        }
        opts = more;
    }
    if !fits(&opts) {
        return Screen::TooLarge;
    }
    let estimate_s = estimate_step(&opts, device).step_s;
    Screen::Passed(Box::new(Screened { opts, estimate_s }))
}

/// Whether the model splits over the candidate's mesh as its options ask, without tracing:
/// the checks [`crate::plan::build`] runs first.
fn check(opts: &TrainerOptions) -> Result<(), PlanError> {
    let Some(par) = opts.parallel.parallelism() else {
        return Ok(crate::model::check_microbatches(
            opts.config.batch,
            opts.microbatches,
            1,
        )?);
    };
    par.check(&opts.config, opts.microbatches)?;
    par.check_cp(&opts.config, opts.cp_order, opts.parallel.mode())
}

/// Explicit mode beside each automatic candidate that passed the screen. Explicit partitions the
/// same global program as automatic, so the screen (the closed-form estimate and memory, the
/// checks) says the same of both and runs once; the programs differ where explicit's choices
/// (`out_sharding=`, `reshard`) place collectives otherwise, which the exact tier prices.
fn explicit_twins(passed: &[Screened]) -> Vec<Screened> {
    passed
        .iter()
        .filter_map(|s| match &s.opts.parallel {
            Parallel::Auto { par, specs } => Some(Screened {
                opts: TrainerOptions {
                    parallel: Parallel::Explicit {
                        par: par.clone(),
                        axis_types: vec![],
                        specs: specs.clone(),
                    },
                    ..s.opts.clone()
                },
                estimate_s: s.estimate_s,
            }),
            _ => None,
        })
        .collect()
}

fn is_pipeline(opts: &TrainerOptions) -> bool {
    opts.parallel.parallelism().is_some_and(Parallelism::is_pipeline)
}

/// The candidates to price exactly, fastest by the estimate first: the [`EXACT`] fastest, and
/// the fastest of each set of mesh axes in each mode. The estimate prices the same ops at other
/// sizes within one set of axes, so it orders those as the exact price does; across sets it
/// leaves out what differs most on small models (the small ops between the matmuls, the
/// lowering's fusions, how jit and shard_map lay out the same step), so each set's best is
/// priced too.
fn shortlist(passed: &[Screened]) -> Vec<&Screened> {
    let mut seen: Vec<(String, &'static str)> = vec![];
    passed
        .iter()
        .enumerate()
        .filter(|(i, s)| {
            let key = (axes_name(&s.opts.parallel), s.opts.parallel.mode_name());
            let first = !seen.contains(&key);
            if first {
                seen.push(key);
            }
            *i < EXACT || first
        })
        .map(|(_, s)| s)
        .collect()
}

/// The candidate planned, its memory checked against the device (with more microbatches if it
/// does not fit whole, as the screen chose them) and its step priced; None if it does not fit.
fn price(s: &Screened, device: &DeviceProfile, device_name: &str, base: &TrainerOptions) -> Option<Ranked> {
    let fits = |prog: &crate::ir::Program| MemoryPlan::of(prog).is_ok_and(|m| m.total <= device.memory_bytes);
    let mut opts = s.opts.clone();
    let mut planned = crate::plan::build(&opts).ok()?;
    while !fits(&planned.step.program) && !is_pipeline(&opts) {
        let mut more = opts.clone();
        more.microbatches *= 2;
        match (more.microbatches <= base.config.batch).then(|| crate::plan::build(&more)) {
            Some(Ok(p)) => (opts, planned) = (more, p),
            _ => break,
        }
    }
    let prog = &planned.step.program;
    if !fits(prog) {
        return None;
    }
    let p = predict(prog, device, Placement::Real);
    let par = opts.parallel.parallelism();
    Some(Ranked {
        rank: 0,
        mode: opts.parallel.mode_name(),
        strategy: opts.parallel.label(),
        mesh: par.map_or("-".to_string(), |p| mesh_text(&p.mesh)),
        zero: par.map_or("0", |p| p.zero.name()),
        sequence_parallel: par.is_some_and(|p| p.sequence_parallel),
        remat: opts.config.remat.name(),
        microbatches: opts.microbatches,
        schedule: par.filter(|p| p.is_pipeline()).map(|_| opts.schedule.name()),
        virtual_stages: opts.virtual_stages,
        step_ms: p.step_ms,
        estimate_ms: s.estimate_s * 1e3,
        bytes_per_device: p.bytes_per_device,
        limiting: p.limiting,
        limiting_share: p.bounds_ms[p.limiting] / p.step_ms.max(f64::MIN_POSITIVE),
        command: plan_command(&opts, device_name),
        options: opts,
    })
}

/// Block passes a device's program of `opts` unrolls: its blocks, times the microbatches it
/// runs them on (a pipeline's ticks, with the fill and the drain). What tracing and pricing it
/// take grows with.
pub fn block_passes(opts: &TrainerOptions) -> usize {
    let pp = opts
        .parallel
        .parallelism()
        .map_or(1, |p| p.size(crate::plan::AxisKind::Pp));
    let passes = if pp > 1 {
        opts.microbatches + pp - 1
    } else {
        opts.microbatches
    };
    passes.saturating_mul(opts.config.layers / pp)
}

/// The axes of a candidate's mesh, as an invalid candidate's reason names them.
fn axes_name(p: &Parallel) -> String {
    match p.parallelism() {
        None => "one device".into(),
        Some(par) => par.kinds().iter().map(|k| k.name()).collect::<Vec<_>>().join(" x "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GptConfig;
    use crate::plan::Mode;
    use crate::profile::{a100, h100, tpu_v4};

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

    /// Every candidate that splits, planned (with the fewest microbatches that fit) and priced
    /// exactly: what the search would rank with no screen.
    fn priced_exactly(opts: &TrainerOptions, device: &DeviceProfile, devices: usize) -> Vec<Ranked> {
        let screened: Vec<Screened> = candidates(opts, devices)
            .into_iter()
            .filter(|c| check(c).is_ok())
            .map(|c| Screened {
                estimate_s: estimate_step(&c, device).step_s,
                opts: c,
            })
            .collect();
        let twins = explicit_twins(&screened);
        screened
            .iter()
            .chain(&twins)
            .filter_map(|s| price(s, device, "x", opts))
            .collect()
    }

    /// How much slower than the exact winner the search's winner may be: the estimate leaves
    /// out the small ops and fusions that separate near ties (a few percent on these models).
    const SCREEN_SLACK: f64 = 0.02;

    #[test]
    fn the_screens_winner_is_within_two_percent_of_the_exact_winner_where_every_candidate_can_be_priced() {
        // Small models on 4 devices: every composition of dp, fsdp, tp, cp and pp with its
        // options, modes, remats and schedules priced exactly, beside the search's screen.
        let models = [
            base(16),
            TrainerOptions {
                config: GptConfig {
                    d_model: 256,
                    heads: 8,
                    seq: 128,
                    precision: Precision::Bf16,
                    dropout: 0.1,
                    ..base(32).config
                },
                ..base(32)
            },
        ];
        for opts in &models {
            for device in [a100(), h100(), tpu_v4()] {
                let all = priced_exactly(opts, &device, 4);
                let best = all.iter().min_by(|a, b| a.step_ms.total_cmp(&b.step_ms)).unwrap();
                let r = search(opts, &device, "x", 4).unwrap();
                let winner = &r.ranked[0];
                assert!(
                    winner.step_ms <= best.step_ms * (1.0 + SCREEN_SLACK),
                    "{}: the search's winner {} at {:.4} ms, the exact winner {} at {:.4} ms (its estimate {:.4} \
                     ms) of {} candidates",
                    device.name,
                    winner.command,
                    winner.step_ms,
                    best.command,
                    best.step_ms,
                    best.estimate_ms,
                    all.len()
                );
            }
        }
    }

    #[test]
    fn what_is_ranked_fits_and_every_candidate_is_accounted_for() {
        let opts = base(16);
        let exact = priced_exactly(&opts, &a100(), 4);
        let mut needs: Vec<u64> = exact.iter().map(|r| r.bytes_per_device.total).collect();
        needs.sort_unstable();
        // A device whose memory sits between the candidates' needs, so some fit and some not.
        let device = DeviceProfile {
            memory_bytes: needs[needs.len() / 2],
            ..a100()
        };
        let r = search(&opts, &device, "a100", 4).unwrap();
        assert_eq!(r.considered, r.invalid + r.too_large + r.screened + r.ranked.len());
        assert!(r.too_large > 0 && !r.ranked.is_empty());
        assert!(r.ranked.iter().all(|c| c.bytes_per_device.total <= device.memory_bytes));
        assert!(r.ranked.windows(2).all(|w| w[0].step_ms <= w[1].step_ms));
        assert_eq!(r.ranked[0].rank, 1);
        // Four-axis meshes are among the candidates on 16 devices.
        let wide = search(&base(64), &a100(), "a100", 16).unwrap();
        assert!(wide.considered > 1000, "{}", wide.considered);
        // One reason per refused axis, on its own smallest mesh: 4 heads and 2 layers refuse
        // tp and pp of 16 and every mesh that holds them, as one line each.
        assert_eq!(
            wide.invalid_reasons,
            [
                "tp: --mesh tp=16 does not divide --heads 4: tensor parallelism splits heads; use tp = one of 1, 2, 4, \
                 or a head count that is a multiple of 16",
                "pp: --mesh pp=16 is more stages than --layers 2: every stage runs at least one block; use pp = one \
                 of 1, 2",
            ],
            "{:#?}",
            wide.invalid_reasons
        );
    }

    #[test]
    fn explicit_mode_is_ranked_beside_automatic_on_its_own_programs_price() {
        let r = search(&base(16), &a100(), "a100", 4).unwrap();
        let mode_of = |m: Mode| r.ranked.iter().filter(move |x| x.mode == m.name());
        assert!(mode_of(Mode::Explicit).count() > 0, "{:#?}", r.ranked);
        for x in mode_of(Mode::Explicit) {
            assert!(x.command.contains("--mode explicit"), "{}", x.command);
            // Its automatic twin, where priced too, is the same configuration in the other mode.
            let twin = x.command.replace("--mode explicit", "--mode auto");
            if let Some(auto) = mode_of(Mode::Auto).find(|a| a.command == twin) {
                assert_eq!(auto.estimate_ms, x.estimate_ms, "{twin}");
            }
        }
    }

    #[test]
    fn a_candidate_too_large_whole_is_priced_with_the_fewest_microbatches_that_fit() {
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
        // Between K = 2's need and K = 1's: dp fits with 2 microbatches, not with 1.
        let device = DeviceProfile {
            memory_bytes: (one + two) / 2,
            ..a100()
        };
        let s = Screened {
            opts: dp(1),
            estimate_s: 0.0,
        };
        let row = price(&s, &device, "a100", &opts).expect("dp fits with microbatches");
        assert_eq!(row.microbatches, 2);
        assert!(row.command.ends_with("--microbatches 2"), "{}", row.command);
        let r = search(&opts, &device, "a100", 4).unwrap();
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
        assert!(e.contains("no mesh splits") && e.contains("--batch 16"), "{e}");
        let e = search(&base(16), &d, "a100", 1 << 20).unwrap_err().0;
        assert!(e.contains("at most"), "{e}");
    }
}
