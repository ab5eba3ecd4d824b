//! Each published run planned and priced as `shardlab plan` would (its device preset, real
//! placement, collectives overlapping compute), beside its published step. No figure is fitted
//! to a row: every device figure comes from a datasheet or a published measurement
//! (profile/device.rs), and the table says which, if any, were fitted.
//!
//! A run whose program would take minutes to trace and schedule (more than [`TRACE_LIMIT`]
//! block passes times the rows its timeline schedules: a pipeline of hundreds of microbatches
//! over dozens of blocks a stage, a ring of 16) is priced in closed form instead: memory by
//! [`closed_memory`], the step by [`estimate_step`]; its row says so.
use super::table::{PublishedRun, TableError};
use crate::model::Optimizer;
use crate::plan::{
    closed_memory, gathered_norms, DropoutKey, Mode, Parallel, Parallelism, Strategy, TrainerOptions, Zero,
};
use crate::profile::{device_preset, estimate_step, predict, DeviceProfile, Placement};
use crate::search::{block_passes, plan_command};

/// Device figures fitted to rows of the table, and on which rows: none. A figure fitted here
/// would be named with its rows, and the MAPE over those rows would not count as a check.
pub const FITTED: [&str; 0] = [];

/// Block passes (blocks a device runs, times the microbatches it runs them on, times the
/// timeline's rows: one per pipeline stage and ring position) past which a run is priced in
/// closed form: tracing and scheduling such a program takes minutes.
pub const TRACE_LIMIT: usize = 512;

/// What tracing and scheduling `opts` costs, in block passes on the timeline's rows.
pub fn trace_cost(opts: &TrainerOptions) -> usize {
    let rows = opts.parallel.parallelism().map_or(1, |p| {
        p.size(crate::plan::AxisKind::Pp) * p.size(crate::plan::AxisKind::Cp)
    });
    block_passes(opts).saturating_mul(rows)
}

/// How a run was priced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pricing {
    /// Its program traced, its memory planned by liveness and its step scheduled.
    Traced,
    /// In closed form: too many block passes to trace ([`TRACE_LIMIT`]).
    ClosedForm,
}

/// One run: predicted against published.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PublishedCheck {
    pub row: usize,
    pub name: String,
    pub device: String,
    pub devices: usize,
    pub published_ms: f64,
    pub predicted_ms: f64,
    /// (predicted - published) / published, in percent: negative when the model is faster.
    pub error_pct: f64,
    /// Traced, or in closed form.
    pub pricing: Pricing,
    /// Bytes per device it needs: the traced plan's total, or the closed form's (its state, its
    /// gradients and its activations all at once).
    pub bytes_per_device: u64,
    /// Whether the planned step fits the device's memory.
    pub fits: bool,
    /// What the pricing assumes beyond the row's words: a layout shardlab does not build,
    /// priced by the one it names.
    pub assumed: Vec<String>,
    /// `shardlab plan ...` of what was priced.
    pub command: String,
    pub source: String,
}

/// The table's runs priced, and the mean absolute percentage error over them.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PublishedReport {
    pub checks: Vec<PublishedCheck>,
    pub mape_pct: f64,
    /// Device figures fitted to rows (none): see [`FITTED`].
    pub fitted: Vec<String>,
}

/// The options `shardlab plan` would plan for `run`, and what they assume beyond its row: a
/// mixture over "ep" says that shardlab holds the non-expert parameters whole on every device.
pub fn run_options(run: &PublishedRun) -> Result<(TrainerOptions, Vec<String>), String> {
    let par = match &run.strategy {
        Some(name) => {
            let strategy = Strategy::parse(name).ok_or_else(|| {
                format!(
                    "parallelism: strategy `{name}` is not one shardlab prices; use one of {}, or give the mesh alone \
                     (e.g. tp=8,pp=2,dp=4)",
                    Strategy::ALL.map(|s| s.name()).join(", ")
                )
            })?;
            if run.zero != Zero::Off || run.sequence_parallel {
                return Err(format!(
                    "parallelism: strategy `{name}` names its own options; give zero= and sp with a mesh alone"
                ));
            }
            strategy.compose(&run.mesh).map_err(|e| e.to_string())?
        }
        None => Parallelism::new(run.mesh.clone(), run.zero, run.sequence_parallel).map_err(|e| e.to_string())?,
    };
    let parallel = match run.mode {
        Mode::Auto => Parallel::Auto { par, specs: vec![] },
        // Each data shard its own masks; where the body draws every device's block of the
        // one-device masks (a pipeline, the sequence split) they differ already.
        _ => Parallel::ShardMap {
            dropout_key: if par.draws_mask_blocks() {
                DropoutKey::Same
            } else {
                DropoutKey::FoldIn
            },
            par,
        },
    };
    // shardlab's "ep" holds a mixture's experts split and every other parameter whole on
    // each device: a run that also shards those over its expert-parallel GPUs (FSDP on the
    // same devices) needs less memory than the plan priced for it.
    let mut assumed = match (&run.config.moe, parallel.parallelism()) {
        (Some(_), Some(p)) if p.has(crate::plan::AxisKind::Ep) && !p.has(crate::plan::AxisKind::Fsdp) => vec![
            "ep holds every non-expert parameter (and its optimizer state) whole on each device: the memory of a run \
             that shards them over the same GPUs is less than this plan's"
                .to_string(),
        ],
        _ => vec![],
    };
    let mut opts = TrainerOptions::new(run.config.clone(), parallel);
    opts.optimizer = Optimizer::AdamW { lr: 3e-4 };
    opts.microbatches = run.microbatches;
    opts.schedule = run.schedule;
    opts.cp_order = run.cp_order;
    opts.virtual_stages = run.virtual_stages;
    opts.stage_layers = run.stage_layers.clone();
    // jit's sequence parallelism holds each block's layer norms' outputs as the all-gather made
    // them; Megatron's (and a shard_map body's) holds a device's rows and gathers them again in
    // the backward.
    let gathered = gathered_norms(&opts);
    if gathered > 0 {
        assumed.push(format!(
            "jit's sequence parallelism holds each block's layer-norm outputs gathered over tp for the backward, where \
             Megatron's keeps a device's rows and gathers them again (Korthikanti et al. 2022, section 4.2.2): the \
             busiest stage holds {:.1} GiB more than such a run",
            gathered as f64 / (1u64 << 30) as f64
        ));
    }
    Ok((opts, assumed))
}

/// Prices every run; an unknown device or a plan that cannot be built is refused naming the
/// row.
pub fn price_runs(runs: &[PublishedRun], file: &str) -> Result<PublishedReport, TableError> {
    let mut checks = Vec::with_capacity(runs.len());
    for run in runs {
        let at = |why: String| TableError(format!("{file} row {} (`{}`): {why}", run.row, run.name));
        let device = device_preset(&run.device).ok_or_else(|| {
            at(format!(
                "hardware: no device preset `{}`; use one of {}",
                run.device,
                crate::profile::presets()
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        let (opts, assumed) = run_options(run).map_err(at)?;
        let (pricing, predicted_ms, bytes) = price(&opts, &device).map_err(at)?;
        let published_ms = run.published_seconds() * 1e3;
        checks.push(PublishedCheck {
            row: run.row,
            name: run.name.clone(),
            device: device.label.clone(),
            devices: run.devices,
            published_ms,
            predicted_ms,
            error_pct: 100.0 * (predicted_ms - published_ms) / published_ms,
            pricing,
            bytes_per_device: bytes,
            fits: bytes <= device.memory_bytes,
            assumed,
            command: plan_command(&opts, &run.device),
            source: run.source.clone(),
        });
    }
    let mape_pct = checks.iter().map(|c| c.error_pct.abs()).sum::<f64>() / checks.len().max(1) as f64;
    Ok(PublishedReport {
        checks,
        mape_pct,
        fitted: FITTED.iter().map(|s| s.to_string()).collect(),
    })
}

/// (how, milliseconds a step, bytes per device) of `opts` on `device`.
fn price(opts: &TrainerOptions, device: &DeviceProfile) -> Result<(Pricing, f64, u64), String> {
    if trace_cost(opts) > TRACE_LIMIT {
        if let Some(p) = opts.parallel.parallelism() {
            crate::plan::check_pipeline_layout(
                &opts.config,
                p,
                opts.schedule,
                opts.virtual_stages,
                &opts.stage_layers,
                opts.microbatches,
            )
            .and_then(|()| p.check_with_stages(&opts.config, opts.microbatches, &opts.stage_layers))
            .map_err(|e| e.to_string())?;
        }
        let bytes = closed_memory(opts).total;
        return Ok((Pricing::ClosedForm, estimate_step(opts, device).step_s * 1e3, bytes));
    }
    let planned = crate::plan::build(opts).map_err(|e| e.to_string())?;
    let p = predict(&planned.step.program, device, Placement::Real);
    Ok((Pricing::Traced, p.step_ms, p.bytes_per_device.total))
}

#[cfg(test)]
mod tests {
    use super::super::table::{parse_table, TABLE, TABLE_PATH};
    use super::*;
    use crate::model::Remat;
    use crate::plan::StageLayout;

    #[test]
    fn every_published_run_is_priced_with_what_it_assumes_said() {
        let runs = parse_table(TABLE, TABLE_PATH).unwrap();
        let report = price_runs(&runs, TABLE_PATH).unwrap();
        assert_eq!(report.checks.len(), runs.len());
        for (c, r) in report.checks.iter().zip(&runs) {
            assert!(c.predicted_ms > 0.0 && c.predicted_ms.is_finite(), "{c:?}");
            assert!(c.command.contains("--precision bf16"), "{}", c.command);
            if r.microbatches > 1 {
                assert!(
                    c.command.contains(&format!("--microbatches {}", r.microbatches)),
                    "{}",
                    c.command
                );
            }
            let (opts, _) = run_options(r).unwrap();
            for flag in crate::search::composition_flags(opts.parallel.parallelism().unwrap()) {
                assert!(c.command.contains(&flag), "{flag}: {}", c.command);
            }
            // A plan that holds more than the run (what it assumes says so) may not fit.
            assert!(
                c.fits || !c.assumed.is_empty(),
                "every published run fits its GPUs: {c:?}"
            );
        }
        assert!(report.fitted.is_empty());
    }

    #[test]
    fn megatron_lms_3d_runs_are_priced_within_20_percent_of_their_published_step() {
        use super::super::table::{FlopCount, Published};
        let runs: Vec<PublishedRun> = parse_table(TABLE, TABLE_PATH)
            .unwrap()
            .into_iter()
            .filter(|r| {
                matches!(
                    r.published,
                    Published::FlopsPerDevice {
                        count: FlopCount::Megatron,
                        ..
                    }
                )
            })
            .collect();
        // Table 1's 39.1B to 1T rows: tp=8 with pp from 2 to 64 and dp on top.
        assert_eq!(runs.len(), 6);
        assert!(runs.iter().all(|r| r.mesh.axis_size("tp").ok() == Some(8)));
        let report = price_runs(&runs, TABLE_PATH).unwrap();
        for c in &report.checks {
            assert!(c.error_pct.abs() <= 20.0, "{}: {:+.1}%: {c:?}", c.name, c.error_pct);
            assert!(c.fits, "{c:?}");
        }
    }

    #[test]
    fn the_published_mixture_of_experts_run_is_derived_and_priced_within_25_percent() {
        let runs: Vec<PublishedRun> = parse_table(TABLE, TABLE_PATH)
            .unwrap()
            .into_iter()
            .filter(|r| r.config.moe.is_some())
            .collect();
        assert_eq!(runs.len(), 1);
        let r = &runs[0];
        let moe = r.config.moe.unwrap();
        assert_eq!(
            (moe.experts, moe.top_k, r.mesh.axis_size("ep").ok(), r.microbatches),
            (128, 8, Some(8), 16)
        );
        // The stand-in's GELU experts: two matrices of 1152 columns hold SwiGLU's three of 768.
        assert_eq!(2 * moe.width, 3 * 768);
        // The published step agrees with the published throughput: 512 x 4096 tokens at 12,040
        // a second on each of 8 GPUs.
        let from_throughput = 512.0 * 4096.0 / (12_040.0 * 8.0);
        assert!((r.published_seconds() / from_throughput - 1.0).abs() < 1e-3, "{r:?}");
        let report = price_runs(&runs, TABLE_PATH).unwrap();
        let c = &report.checks[0];
        assert!(c.error_pct.abs() <= 25.0, "{}: {:+.1}%: {c:?}", c.name, c.error_pct);
        assert!(c.command.contains("--experts 128 --top-k 8"), "{}", c.command);
        assert!(c.assumed.iter().any(|a| a.contains("non-expert")), "{c:?}");
    }

    #[test]
    fn llama_3s_runs_are_set_as_its_paper_ran_them_and_fit_their_h100s() {
        let runs: Vec<PublishedRun> = parse_table(TABLE, TABLE_PATH)
            .unwrap()
            .into_iter()
            .filter(|r| r.name.starts_with("Llama 3"))
            .collect();
        assert_eq!(runs.len(), 3);
        let report = price_runs(&runs, TABLE_PATH).unwrap();
        for (r, c) in runs.iter().zip(&report.checks) {
            // Tensor parallelism as Korthikanti et al. (section 3.3.2 cites it): with sequence
            // parallelism. The 8K runs without activation checkpointing (section 3.3.2's last
            // sentence on pipelining); the 128K run's is not said, so it recomputes.
            assert!(r.sequence_parallel, "{}", c.command);
            let long = r.config.seq == 131_072;
            let remat = if long { Remat::Full } else { Remat::None };
            assert_eq!(r.config.remat, remat, "{}", c.name);
            // The published step: 6N + 12 l h s FLOPs a token, 16M tokens, at R per GPU.
            let tokens = (r.config.batch * r.config.seq) as f64;
            assert_eq!(tokens, 2048.0 * 8192.0);
            let flops = tokens * (6.0 * 405e9 + 12.0 * 126.0 * 16384.0 * r.config.seq as f64);
            let rate = [430e12, 400e12, 380e12][c.row - runs[0].row];
            assert!((c.published_ms / 1e3 / (flops / (rate * r.devices as f64)) - 1.0).abs() < 1e-9);
            // The layer norms' outputs held as Megatron holds them (a device's rows, gathered
            // again in the backward), each run fits its H100s with nothing assumed.
            let (opts, _) = run_options(r).unwrap();
            assert_eq!(gathered_norms(&opts), 0, "{}", c.name);
            assert!(c.assumed.is_empty(), "{c:?}");
            let h100 = device_preset("h100").unwrap().memory_bytes;
            assert!(c.fits && c.bytes_per_device <= h100, "{c:?}");
            // Interleaved 1F1B in chunks of one block, the first chunk only the embedding and
            // the last only the head (section 3.3.2): V = 8 on 16 stages of 7, 8, ..., 8, 7.
            let layout = StageLayout::new(126, 16, r.virtual_stages, &r.stage_layers);
            assert_eq!(
                (r.virtual_stages, layout.run(0, 0).1, layout.run(15, 7).1),
                (8, 0, 0),
                "{}",
                c.name
            );
            let blocks: Vec<usize> = (0..16).map(|s| layout.stage_blocks(s)).collect();
            assert!(
                blocks[1..15].iter().all(|&b| b == 8) && (blocks[0], blocks[15]) == (7, 7),
                "{blocks:?}"
            );
        }
        // The 8K runs differ in their microbatches alone (32 and 16 a DP group, so in their
        // bubbles): per token the model parts them as Table 4's rates do, 430 / 400.
        let per_token = |c: &PublishedCheck| c.predicted_ms * c.devices as f64;
        let ratio = per_token(&report.checks[1]) / per_token(&report.checks[0]);
        assert!((ratio / (430.0 / 400.0) - 1.0).abs() < 0.03, "{ratio}");
    }

    #[test]
    fn an_unknown_device_or_strategy_is_refused_naming_the_row() {
        let mut runs = parse_table(TABLE, TABLE_PATH).unwrap();
        runs[0].device = "tpu_v9".into();
        let e = price_runs(&runs, "t.md").unwrap_err().0;
        assert!(
            e.starts_with("t.md row 1 (`llm.c GPT-2 124M`): hardware: no device preset `tpu_v9`"),
            "{e}"
        );
        let mut runs = parse_table(TABLE, TABLE_PATH).unwrap();
        // Expert parallelism: no strategy of shardlab's (pp became one with issue 28).
        runs[1].strategy = Some("ep".into());
        let e = price_runs(&runs, "t.md").unwrap_err().0;
        assert!(e.contains("row 2") && e.contains("strategy `ep`"), "{e}");
    }
}
