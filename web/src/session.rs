//! The training run behind the handle: the settings, both modes' programs, and the trainers of
//! the modes that run. A step takes the trainers out while it awaits the GPU, so the page may
//! call `programs()` or `configure()` meanwhile; a step whose run was replaced is discarded.
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use serde_json::{json, Value};
use shardlab::bench::kernels::{ceilings_with, CeilingRun};
use shardlab::exec::{Backend, MatmulChoice, StepProfile, Trainer};
use shardlab::gpu::{GpuContext, GpuError};
use shardlab::kernels::{self, matmul::MatmulShape, matmul::Variant};
use shardlab::plan::Planned;
use shardlab::profile::{self, Roofline};
use wasm_bindgen::{JsCast, JsValue};

use crate::field_error::FieldError;
use crate::plan::Plan;
use crate::sample::SampleClock;
use crate::settings::{Mode, Settings};

/// The most bytes all simulated devices of all running modes may hold on the one GPU a tab
/// shares with the desktop.
pub const GPU_BUDGET_BYTES: u64 = 2 << 30;

/// Bytes one simulated device of `plan` holds at its peak: the core's memory plan
/// (`plan::MemoryPlan`, which the program summary reports), the same numbers `inspect` shows.
pub fn memory_per_device(plan: &Plan) -> u64 {
    plan.summary.total_bytes
}

/// 1.5 GiB, 12.0 MiB, 900 B.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if n >= size {
            return format!("{:.1} {unit}", n as f64 / size as f64);
        }
    }
    format!("{n} B")
}

/// Measure the simulated collectives' share of the step on the second step, then every this
/// many steps (it re-runs them alone, so not every step).
const COLLECTIVES_EVERY: u64 = 20;

/// The most expensive ops a profiled step lists per mode.
const TOP_OPS: usize = 5;

/// Split runs of each op in a quick profile (the story's look at its categories): the median
/// of three keeps one run hit by the host's load from setting a category's share, at about
/// half a full profile's cost.
const QUICK_PROFILE_REPS: usize = 3;

pub struct Run {
    generation: u64,
    settings: Settings,
    /// The planned modes' modelled steps on the chosen real device (`predict::modes`).
    prediction: Value,
    /// Automatic and shard_map mode's programs (the inspector compares them whatever runs),
    /// less any in `refused`, and explicit mode's once it has run.
    plans: Vec<Plan>,
    /// The modes that do not run and that the core cannot plan these settings in (automatic
    /// mode on a pipeline), each with why, in the page's words: shown where its program would be.
    refused: serde_json::Map<String, Value>,
    /// Per plan: its trainer, built on its mode's first step and kept when the mode stops
    /// running (a mode switched off and on again goes on where it stopped), its measured
    /// collectives, and how many steps it has made.
    trainers: Vec<Option<Trainer>>,
    collectives_ms: Vec<Option<f64>>,
    steps: Vec<u64>,
    /// When the model's sample is next due (`sample.rs`).
    sample_clock: SampleClock,
    busy: bool,
    /// Whether the pipelines the autotuner will time for the run's provisional matmuls are
    /// compiled: `None` before it starts, `Some(false)` while it compiles in the background.
    prepared: Rc<Cell<Option<bool>>>,
}

/// A device's measured ceilings, or why they could not be measured.
type Ceiled = Result<Roofline, String>;

pub struct Inner {
    pub ctx: Arc<GpuContext>,
    generation: u64,
    run: Option<Run>,
    /// The run before the current one, kept with its trainers while both fit the GPU budget: a
    /// change that goes back to its settings (a layout flipped and back, the story's rounds)
    /// resumes it where it stopped instead of building and warming up again.
    parked: Option<Run>,
    /// `ctx`'s ceilings, measured when a profiled step first asks (the floors in its breakdown),
    /// or why they could not be: a profile then goes on without floors.
    roofline: Option<Ceiled>,
}

fn fail(message: impl Into<String>) -> Value {
    json!({"ok": false, "error": message.into()})
}

/// A step whose run was replaced while it awaited: not a failure, the page just drops it.
fn discarded() -> Value {
    json!({"ok": false, "discarded": true})
}

impl Inner {
    pub fn new(ctx: Arc<GpuContext>) -> Self {
        Self {
            ctx,
            generation: 0,
            run: None,
            parked: None,
            roofline: None,
        }
    }

    /// The current run's background compiles, for work that times by wall clock to wait for.
    pub fn background_compiles(&self) -> Option<Rc<Cell<Option<bool>>>> {
        self.run.as_ref().map(|r| r.prepared.clone())
    }

    /// A run for `settings_json`: the parked one if its settings are the same and `resume`
    /// asks for it, else a new one.
    pub fn configure(&mut self, settings_json: &str, resume: bool) -> Value {
        self.generation += 1;
        // A run with a step in flight is dropped (the step is discarded); an idle one is parked.
        let mut previous = self.run.take().filter(|r| !r.busy);
        let settings: Settings = match serde_json::from_str(settings_json) {
            Ok(s) => s,
            Err(e) => {
                self.parked = previous.or(self.parked.take());
                let message = format!("the settings are not valid: {e}");
                return json!({"ok": false, "errors": [FieldError::new("", message)]});
            }
        };
        // Only the mode changed: the same run goes on, each mode's trainer where it stopped
        // (explicit mode, planned only once it runs, is planned into it).
        if let Some(mut run) = previous.take_if(|r| resume && r.switches_to(&settings)) {
            if let Err(errors) = run.plan_modes(&settings) {
                self.parked = Some(run);
                let pipeline = settings.parallelism().ok().and_then(|par| settings.pipeline(&par));
                return json!({"ok": false, "errors": errors, "pipeline": pipeline});
            }
            run.generation = self.generation;
            run.settings = settings;
            run.keep_within(GPU_BUDGET_BYTES.saturating_sub(self.parked.as_ref().map_or(0, Run::held_bytes)));
            let summary = Self::summary(&run, true);
            self.run = Some(run);
            return summary;
        }
        if let Some(mut run) = self.parked.take().filter(|p| resume && p.settings == settings) {
            run.generation = self.generation;
            // Priced again: the device's profile may have changed meanwhile (a calibration).
            if let Ok(device) = run.settings.device_profile() {
                run.prediction = crate::predict::modes(&run.plans, &device);
            }
            self.parked = previous.filter(|p| fits_beside(p, &run));
            let summary = Self::summary(&run, true);
            self.run = Some(run);
            return summary;
        }
        match self.build(settings.clone()) {
            Ok(run) => {
                self.parked = previous.filter(|p| fits_beside(p, &run));
                let summary = Self::summary(&run, false);
                self.run = Some(run);
                summary
            }
            Err(errors) => {
                self.parked = previous;
                // A pipeline's bubble is its settings', whichever mode refuses them.
                let pipeline = settings.parallelism().ok().and_then(|par| settings.pipeline(&par));
                json!({"ok": false, "errors": errors, "pipeline": pipeline})
            }
        }
    }

    /// A mixture's experts and its all-to-alls' cost (`moe::summary`); null for a dense model.
    fn moe(run: &Run) -> Value {
        let cfg = run.settings.config();
        match (cfg.moe, run.settings.parallelism(), run.settings.device_profile()) {
            (Some(moe), Ok(par), Ok(device)) => crate::moe::summary(&moe, cfg.seq, &par, &run.plans, &device),
            _ => Value::Null,
        }
    }

    /// What `configure` answers: the run's sizes, prediction and memory, and whether it resumed
    /// a parked run (then `steps` is how far it had trained).
    fn summary(run: &Run, resumed: bool) -> Value {
        json!({
            "ok": true,
            "settings": run.settings,
            "devices": run.plans[0].summary.devices,
            "modes": run.settings.modes().iter().map(|m| m.name()).collect::<Vec<_>>(),
            "tokens_per_step": run.settings.batch * run.settings.seq,
            "params": run.settings.config().num_params(),
            "prediction": run.prediction,
            "refused": run.refused,
            "pipeline": run.settings.parallelism().ok().and_then(|par| run.settings.pipeline(&par)),
            "memory": Self::memory(run),
            "moe": Self::moe(run),
            "resumed": resumed,
            "steps": run.step(),
            // Every mode that has trained, running or kept: how far it got.
            "mode_steps": run
                .plans
                .iter()
                .zip(&run.steps)
                .filter(|(_, n)| **n > 0)
                .map(|(p, n)| (p.mode.name().to_string(), json!(n)))
                .collect::<serde_json::Map<_, _>>(),
        })
    }

    /// The run of `settings`, or every different reason it cannot run, each at its control.
    fn build(&self, settings: Settings) -> Result<Run, Vec<FieldError>> {
        let par = settings.check().map_err(|e| vec![e])?;
        let device = settings.device_profile().map_err(|e| vec![e])?;
        let (plans, refused) = crate::plan::plan_modes(&settings, &par)?;
        check_memory(&settings, &plans).map_err(|e| vec![e])?;
        let prediction = crate::predict::modes(&plans, &device);
        let count = plans.len();
        Ok(Run {
            generation: self.generation,
            settings,
            prediction,
            plans,
            refused,
            trainers: (0..count).map(|_| None).collect(),
            collectives_ms: vec![None; count],
            steps: vec![0; count],
            sample_clock: SampleClock::default(),
            busy: false,
            prepared: Rc::default(),
        })
    }

    /// The memory of the run's modes: per device and on this GPU, as the page shows it.
    pub fn memory(run: &Run) -> Value {
        let per: serde_json::Map<String, Value> = run
            .plans
            .iter()
            .map(|p| (p.mode.name().to_string(), json!(memory_per_device(p))))
            .collect();
        json!({"per_device": per, "budget": GPU_BUDGET_BYTES})
    }

    /// The current settings as a runnable JAX script (shardlab export jax) for `mode`
    /// (`auto`, `shard_map`, or `explicit` when it runs), `steps` steps long.
    pub fn export_jax(&self, mode: &str, steps: u64) -> Value {
        let Some(run) = &self.run else {
            return fail("no valid settings yet: configure first");
        };
        let Some(plan) = run.plans.iter().find(|p| p.mode.name() == mode) else {
            let planned: Vec<&str> = run.plans.iter().map(|p| p.mode.name()).collect();
            return fail(format!(
                "mode `{mode}` is not planned here: use {}",
                planned.join(" or ")
            ));
        };
        match shardlab::export::jax_script(&plan.planned.options, steps) {
            Ok(script) => json!({
                "ok": true,
                "script": script,
                "filename": format!("shardlab_{mode}_{}.py", plan.planned.options.parallel.label().replace([',', '='], "_")),
            }),
            Err(e) => fail(e.to_string()),
        }
    }

    pub fn mask_overlap(&self) -> Value {
        let Some(run) = &self.run else {
            return fail("no valid settings yet: configure first");
        };
        let dp = run.plans[0]
            .planned
            .options
            .parallel
            .parallelism()
            .map_or(1, |p| p.batch_split());
        crate::masks::overlap(&run.settings, dp)
    }

    /// The first example of step 0's batch, with how the page shows its tokens
    /// (`sample::example`).
    pub fn example(&self) -> Value {
        let Some(run) = &self.run else {
            return fail("no valid settings yet: configure first");
        };
        let opts = &run.plans[0].planned.options;
        match shardlab::model::Dataset::new(opts.data.clone(), &opts.config, opts.seed) {
            Ok(data) => crate::sample::example(&run.settings, &data),
            Err(e) => fail(e.to_string()),
        }
    }

    /// The current run's mesh and both modes' plans (for `values`: pictures, collective groups).
    pub fn plans(&self) -> Option<(&[Plan], shardlab::sharding::Mesh)> {
        let run = self.run.as_ref()?;
        Some((&run.plans, run.settings.parallelism().ok()?.mesh))
    }

    pub fn timelines(&self, overlap: bool) -> Value {
        let Some(run) = &self.run else {
            return fail("no valid settings yet: configure first");
        };
        match run.settings.device_profile() {
            Ok(device) => crate::timeline::timelines(&run.plans, &device, overlap),
            Err(e) => fail(e.message),
        }
    }

    pub fn programs(&self) -> Value {
        let Some(run) = &self.run else {
            return fail("no valid settings yet: configure first");
        };
        let modes: serde_json::Map<String, Value> = run
            .plans
            .iter()
            .map(|p| (p.mode.name().to_string(), p.view.clone()))
            .collect();
        json!({"ok": true, "modes": modes, "refused": run.refused})
    }
}

impl Run {
    /// The plan indices of the modes that run, in the settings' order.
    fn running(&self) -> Vec<usize> {
        self.settings
            .modes()
            .iter()
            .filter_map(|m| self.plans.iter().position(|p| p.mode == *m))
            .collect()
    }

    /// The step the run is at: the furthest of its running modes.
    fn step(&self) -> u64 {
        self.running().iter().map(|&k| self.steps[k]).max().unwrap_or(0)
    }

    /// Whether `settings` are this run's with only the mode changed.
    fn switches_to(&self, settings: &Settings) -> bool {
        settings.mode != self.settings.mode
            && Settings {
                mode: self.settings.mode,
                ..settings.clone()
            } == self.settings
    }

    /// Plans the modes `settings` run that this run has not (explicit mode is planned only
    /// once it runs), then checks the GPU budget: each refusal at its control.
    fn plan_modes(&mut self, settings: &Settings) -> Result<(), Vec<FieldError>> {
        let par = settings.check().map_err(|e| vec![e])?;
        let device = settings.device_profile().map_err(|e| vec![e])?;
        for mode in settings.modes() {
            if self.plans.iter().any(|p| p.mode == mode) {
                continue;
            }
            let plan = Plan::build(settings, mode, &par).map_err(|e| vec![crate::plan::refusal(&e)])?;
            self.plans.push(plan);
            self.trainers.push(None);
            self.collectives_ms.push(None);
            self.steps.push(0);
            self.prediction = crate::predict::modes(&self.plans, &device);
        }
        check_memory(settings, &self.plans).map_err(|e| vec![e])
    }

    /// Bytes the run holds on the GPU: its running modes, and the stopped ones it keeps.
    fn held_bytes(&self) -> u64 {
        let running = self.running();
        self.plans
            .iter()
            .enumerate()
            .filter(|(k, _)| running.contains(k) || self.trainers[*k].is_some())
            .fold(0u64, |total, (_, p)| {
                total.saturating_add(memory_per_device(p).saturating_mul(p.summary.devices as u64))
            })
    }

    /// Drops the stopped modes' trainers when they would not fit `budget` beside the running.
    fn keep_within(&mut self, budget: u64) {
        if self.held_bytes() <= budget {
            return;
        }
        let running = self.running();
        for k in (0..self.plans.len()).filter(|k| !running.contains(k)) {
            self.trainers[k] = None;
            self.collectives_ms[k] = None;
            self.steps[k] = 0;
        }
    }
}

/// Bytes all simulated devices of the running modes of `plans` hold on the one GPU.
pub fn resident_bytes(settings: &Settings, plans: &[Plan]) -> u64 {
    plans
        .iter()
        .filter(|p| settings.modes().contains(&p.mode))
        .fold(0u64, |total, p| {
            total.saturating_add(memory_per_device(p).saturating_mul(p.summary.devices as u64))
        })
}

/// Whether `parked` may stay resident beside `run` within the page's GPU budget.
fn fits_beside(parked: &Run, run: &Run) -> bool {
    parked.held_bytes().saturating_add(run.held_bytes()) <= GPU_BUDGET_BYTES
}

/// Refuses a run whose simulated devices would not fit the page's GPU budget, naming the memory
/// per device (before any buffer or parameter exists).
fn check_memory(settings: &Settings, plans: &[Plan]) -> Result<(), FieldError> {
    let total = resident_bytes(settings, plans);
    let mut per_device: u64 = 0;
    let mut devices = 0;
    for p in plans.iter().filter(|p| settings.modes().contains(&p.mode)) {
        per_device = per_device.max(memory_per_device(p));
        devices = p.summary.devices;
    }
    if total <= GPU_BUDGET_BYTES {
        return Ok(());
    }
    Err(FieldError::new(
        "batch",
        format!(
            "this run needs {} per device, {} for its {devices} simulated devices{}, and the page allows {} on this GPU: lower batch, seq, d_model or layers",
            human_bytes(per_device),
            human_bytes(total),
            match settings.modes().len() {
                1 => String::new(),
                n => format!(" in its {n} modes"),
            },
            human_bytes(GPU_BUDGET_BYTES)
        ),
    ))
}

/// What a step needs while it awaits, taken out of the run.
struct Taken {
    ctx: Arc<GpuContext>,
    roofline: Option<Ceiled>,
    generation: u64,
    step: u64,
    modes: Vec<Mode>,
    /// The running modes' plan indices: where their trainers go back after the step.
    running: Vec<usize>,
    trainers: Vec<Option<Trainer>>,
    collectives_ms: Vec<Option<f64>>,
    sample_clock: SampleClock,
    prepared: Rc<Cell<Option<bool>>>,
}

/// One step of the running modes; `profile` measures where its time goes: `full`, its
/// categories from five split runs of each op beside their floors on the device's ceilings
/// (measured once); else from three, without floors (the story's quick look).
pub async fn step(inner: &Rc<RefCell<Inner>>, profile: bool, full: bool) -> Value {
    let taken = {
        let mut i = inner.borrow_mut();
        let ctx = i.ctx.clone();
        let roofline = i.roofline.clone();
        let Some(run) = i.run.as_mut() else {
            return fail("no valid settings yet: fix the settings shown in red first");
        };
        if run.busy {
            return fail("a step is already running: await it before asking for the next");
        }
        run.busy = true;
        let running = run.running();
        Taken {
            ctx,
            roofline,
            generation: run.generation,
            step: run.step(),
            modes: running.iter().map(|&k| run.plans[k].mode).collect(),
            trainers: running.iter().map(|&k| run.trainers[k].take()).collect(),
            collectives_ms: running.iter().map(|&k| run.collectives_ms[k].take()).collect(),
            running,
            sample_clock: std::mem::take(&mut run.sample_clock),
            prepared: run.prepared.clone(),
        }
    };
    let (planned, settings) = {
        let i = inner.borrow();
        let Some(run) = i.run.as_ref().filter(|r| r.generation == taken.generation) else {
            return discarded();
        };
        let opts: Vec<_> = taken
            .modes
            .iter()
            .map(|m| {
                let p = run
                    .plans
                    .iter()
                    .find(|p| p.mode == *m)
                    .expect("a running mode is planned");
                p.planned.clone()
            })
            .collect();
        (opts, run.settings.clone())
    };
    let mut taken = taken;
    let result = run_modes(&mut taken, &planned, &settings, profile, full).await;
    let mut i = inner.borrow_mut();
    // The ceilings are the device's: kept unless the device was replaced meanwhile.
    if Arc::ptr_eq(&i.ctx, &taken.ctx) {
        i.roofline = i.roofline.take().or(taken.roofline.take());
    }
    let Some(run) = i.run.as_mut().filter(|r| r.generation == taken.generation) else {
        return discarded();
    };
    run.busy = false;
    match result {
        Ok((modes, retuned_ms)) => {
            for (j, &k) in taken.running.iter().enumerate() {
                run.trainers[k] = taken.trainers[j].take();
                run.collectives_ms[k] = taken.collectives_ms[j];
                run.steps[k] += 1;
            }
            run.sample_clock = taken.sample_clock;
            json!({"ok": true, "step": taken.step, "modes": modes, "retuned_ms": retuned_ms})
        }
        Err(e) => {
            // The trainers may hold half-updated state: the next step starts over.
            for &k in &taken.running {
                run.trainers[k] = None;
                run.collectives_ms[k] = None;
                run.steps[k] = 0;
            }
            fail(format!("{e} (the run restarts from step 0 on the next step)"))
        }
    }
}

async fn run_modes(
    t: &mut Taken,
    plans: &[Planned],
    settings: &Settings,
    profile: bool,
    full: bool,
) -> Result<(serde_json::Map<String, Value>, Option<f64>), String> {
    if profile {
        // A profile times the step by wall clock: not beside the background compiles, and on
        // the kernels the run keeps.
        settled(Some(t.prepared.clone())).await;
        if full && t.roofline.is_none() {
            // A measurement that fails costs the floors, not the step.
            let c = ceilings_with(&t.ctx, CeilingRun::PAGE).await;
            t.roofline = Some(c.map(|c| c.roofline()).map_err(|e| e.to_string()));
        }
    }
    let retuned_ms = retune(t).await?;
    let mut order: Vec<usize> = (0..t.modes.len()).collect();
    // Where several modes run, each goes first in turn, so none always runs on a warmer GPU.
    order.rotate_left(t.step as usize % t.modes.len().max(1));
    let mut out = serde_json::Map::new();
    for k in order {
        let planned = &plans[k];
        let mut build_ms = None;
        let mut build = None;
        if t.trainers[k].is_none() {
            let t0 = shardlab::gpu::now_ms();
            let clock = t.ctx.pipelines.clock();
            let choice = MatmulChoice::Provisional(first_guess(&t.ctx));
            let trainer = Trainer::from_plan_with(Backend::Gpu(t.ctx.clone()), planned.clone(), choice)
                .await
                .map_err(|e| e.to_string())?;
            build_ms = Some(shardlab::gpu::now_ms() - t0);
            build = Some(t.ctx.pipelines.clock().since(&clock));
            t.trainers[k] = Some(trainer);
        }
        let trainer = t.trainers[k].as_mut().expect("built above");
        let (stats, prof) = if profile {
            let reps = if full {
                shardlab::exec::PROFILE_REPS
            } else {
                QUICK_PROFILE_REPS
            };
            trainer.profile_step_with(reps).await.map_err(|e| e.to_string())?
        } else {
            (trainer.step().await.map_err(|e| e.to_string())?, None)
        };
        // A profiled automatic step re-runs forward and backward, so only plain steps' losses
        // are judged.
        if !profile && !stats.loss.is_finite() {
            return Err(format!(
                "the {} loss became {} at step {}: training stopped. Lower the dropout or the model size, then press Reset",
                t.modes[k].name(),
                stats.loss,
                t.step + 1
            ));
        }
        let breakdown = prof.map(|p| breakdown(trainer, &p, t.roofline.as_ref().filter(|_| full)));
        // The step's routing, read back as the loss is (a profiled step ran it again).
        let routing = match (profile, settings.config().moe, settings.parallelism()) {
            (false, Some(moe), Ok(par)) => trainer
                .routing()
                .await
                .map_err(|e| e.to_string())?
                .map(|r| crate::moe::routing(&r, &par, &moe)),
            _ => None,
        };
        t.ctx.check().map_err(|e: GpuError| e.to_string())?;
        if t.step == 1 || (t.step > 1 && t.step.is_multiple_of(COLLECTIVES_EVERY)) || t.collectives_ms[k].is_none() {
            t.collectives_ms[k] = trainer.collectives_ms().await.map_err(|e| e.to_string())?;
        }
        let collectives_ms = t.collectives_ms[k].unwrap_or(0.0);
        // What the first running mode now predicts for the task's example (step 0's first),
        // and writes for the text task, on plain steps when the clock says: it reads the
        // parameters back and runs the forward on the CPU.
        let sample = if !profile && k == 0 {
            t.sample_clock.stepped(stats.step_ms);
            if t.sample_clock.due() {
                let s = crate::sample::take(trainer, settings).await?;
                t.sample_clock.sampled(s["ms"].as_f64().unwrap_or(0.0));
                Some(s)
            } else {
                None
            }
        } else {
            None
        };
        let tokens = (settings.batch * settings.seq) as f64;
        out.insert(
            t.modes[k].name().to_string(),
            json!({
                "step": stats.step,
                "loss": stats.loss,
                "step_ms": stats.step_ms,
                "tokens_per_s": tokens * 1e3 / stats.step_ms.max(1e-6),
                "collectives_measured_ms": collectives_ms,
                "build_ms": build_ms,
                "build": build,
                "provisional_matmuls": trainer.provisional_matmuls().len(),
                "profiled": profile,
                "breakdown": breakdown,
                "example_prediction": sample.as_ref().map(|s| s["prediction"].clone()),
                "sample": sample,
                "routing": routing,
            }),
        );
    }
    prepare(t);
    Ok((out, retuned_ms))
}

/// The matmul variant a trainer's untuned shape classes run until the autotuner has tuned them
/// (`MatmulChoice::Provisional`): one that compiles fast and runs well enough. On a CPU adapter
/// (SwiftShader, lavapipe) compiling dominates: block8 takes one pipeline of about a second,
/// while tiled runs slowly and tex16 compiles for seconds; on a GPU, the classic tiled kernel.
fn first_guess(ctx: &GpuContext) -> Variant {
    if ctx.summary.is_cpu() {
        Variant::Block8
    } else {
        Variant::Tiled
    }
}

/// Starts compiling, in the background, the provisional variant's pipelines for a typical
/// aligned matmul as soon as the page has a GPU: the first step needs them, and on SwiftShader
/// they take about a second that the page's own start-up can hide.
pub fn prewarm(ctx: &Arc<GpuContext>) {
    let ctx = ctx.clone();
    wasm_bindgen_futures::spawn_local(async move {
        let typical = MatmulShape::new(1, 64, 64, 64);
        // Only a head start: a failure shows again, as a value, where the step builds.
        let _ = kernels::matmul::prepare(&ctx, &typical, Some(first_guess(&ctx))).await;
    });
}

/// The provisional matmuls of the running trainers, one of each shape.
fn provisional(t: &Taken) -> Vec<MatmulShape> {
    let mut shapes: Vec<MatmulShape> = vec![];
    for s in t.trainers.iter().flatten().flat_map(|tr| tr.provisional_matmuls()) {
        if !shapes.contains(s) {
            shapes.push(*s);
        }
    }
    shapes
}

/// After a step that ran provisional matmuls: compiles, in the background, the pipelines the
/// autotuner will time for them (the compiles do not hold up the queue, so training goes on).
fn prepare(t: &Taken) {
    let shapes = provisional(t);
    if shapes.is_empty() || t.prepared.get().is_some() {
        return;
    }
    t.prepared.set(Some(false));
    let (ctx, prepared) = (t.ctx.clone(), t.prepared.clone());
    wasm_bindgen_futures::spawn_local(async move {
        for s in &shapes {
            // A failure here only leaves work to the tuner, which reports its own errors.
            if kernels::matmul::prepare(&ctx, s, None).await.is_err() {
                break;
            }
        }
        prepared.set(Some(true));
    });
}

/// Resolves once the background compiles behind `compiling` (`Inner::background_compiles`) are done.
pub async fn settled(compiling: Option<Rc<Cell<Option<bool>>>>) {
    let Some(prepared) = compiling else { return };
    while prepared.get() == Some(false) {
        pause_ms(50).await;
    }
}

/// Resolves after `ms` milliseconds (the browser's timer; the page stays responsive).
async fn pause_ms(ms: i32) {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        let set_timeout = js_sys::Reflect::get(&js_sys::global(), &"setTimeout".into())
            .ok()
            .and_then(|f| f.dyn_into::<js_sys::Function>().ok());
        match set_timeout {
            Some(f) => {
                let _ = f.call2(&JsValue::NULL, &resolve, &ms.into());
            }
            None => {
                let _ = resolve.call0(&JsValue::NULL);
            }
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}

/// At the step boundary once the background compiles are done: tunes the provisional matmuls'
/// classes (timing runs only) and rebuilds every running trainer's dispatches with the tuned
/// variants, so the next step runs them throughout. Returns how long that took.
async fn retune(t: &mut Taken) -> Result<Option<f64>, String> {
    if t.prepared.get() != Some(true) || provisional(t).is_empty() {
        return Ok(None);
    }
    let t0 = shardlab::gpu::now_ms();
    for trainer in t.trainers.iter_mut().flatten() {
        trainer.retune().await.map_err(|e| e.to_string())?;
    }
    Ok(Some(shardlab::gpu::now_ms() - t0))
}

/// Where a profiled step's time went, measured by wall clock with split submissions (the
/// core's `exec::step_profile`, read by `profile::breakdown`, as `bench train --ops` shows it):
/// the step, its phases, and its ops summed per category. The categories plus the one
/// submission the step pays add up to the step (the ops are scaled to their phase's time).
fn breakdown(trainer: &Trainer, p: &StepProfile, roofline: Option<&Ceiled>) -> Value {
    let b = profile::breakdown(trainer.program(), p);
    // The step's floor on this device's ceilings, charged as the profile charges time.
    let floor = roofline.and_then(|r| r.as_ref().ok()).map(|&r| {
        let f = profile::profiled_floor(trainer.program(), p, r);
        let categories: serde_json::Map<String, Value> = f
            .categories_ms
            .iter()
            .map(|(c, ms)| (c.name().to_string(), json!(ms)))
            .collect();
        json!({
            "step_ms": f.total_ms,
            "categories_ms": categories,
            "fma_gflops": r.flops / 1e9,
            "copy_gbps": r.bytes_per_s / 1e9,
        })
    });
    let categories: serde_json::Map<String, Value> = b
        .categories_ms
        .iter()
        .map(|(c, ms)| (c.name().to_string(), json!(ms)))
        .collect();
    let phases: serde_json::Map<String, Value> = b
        .phases_ms
        .iter()
        .map(|(name, ms)| (name.to_string(), json!(ms)))
        .collect();
    let top: Vec<Value> = b
        .ops
        .iter()
        .take(TOP_OPS)
        .map(|o| json!({"op": o.op, "shape": o.shape, "category": o.category.name(), "phase": o.phase, "ms": o.ms}))
        .collect();
    // A pipeline's bubble with each pass at its measured time, beside the formula's.
    let pipeline = profile::measured_bubble(trainer.program(), p, &trainer.options().pipeline());
    json!({
        "pipeline": pipeline,
        "step_ms": b.step_ms,
        "submit_ms": b.submit_overhead_ms,
        "phases_ms": phases,
        "phases_sum_ms": b.phases_sum_ms,
        "categories_ms": categories,
        "categories_sum_ms": b.categories_sum_ms,
        "top_ops": top,
        "floor": floor,
        "floor_error": roofline.and_then(|r| r.as_ref().err()),
    })
}

/// Drops the trainers (and replaces a lost device) so the next step starts over.
pub async fn reset(inner: &Rc<RefCell<Inner>>, new_device: bool) -> Value {
    // The browser reports a lost device asynchronously: the page may know before the context.
    let lost = new_device || matches!(inner.borrow().ctx.check(), Err(GpuError::DeviceLost(_)));
    if lost {
        match GpuContext::new().await {
            // wasm is single-threaded; the core's Backend::Gpu holds an Arc all the same.
            #[allow(clippy::arc_with_non_send_sync)]
            Ok(ctx) => {
                let mut i = inner.borrow_mut();
                i.ctx = Arc::new(ctx);
                i.roofline = None;
            }
            Err(e) => return fail(format!("could not open a new GPU device: {e}")),
        }
    }
    let mut i = inner.borrow_mut();
    // Reset starts over: no parked run resumes (after a lost device its buffers are gone too).
    i.parked = None;
    i.generation += 1;
    let generation = i.generation;
    let Some(run) = i.run.as_mut() else {
        return json!({"ok": true, "new_device": lost});
    };
    run.generation = generation;
    run.trainers = (0..run.plans.len()).map(|_| None).collect();
    run.collectives_ms = vec![None; run.plans.len()];
    run.steps = vec![0; run.plans.len()];
    run.sample_clock = SampleClock::default();
    run.busy = false;
    run.prepared = Rc::default();
    json!({"ok": true, "new_device": lost})
}
