//! What the page's controls choose, as JSON, and how it maps onto the core's `TrainerOptions`.
//! The model's, the specs' and the partitioners' checks are the core's (GptConfig::validate,
//! PartitionSpec::parse, plan::resolve_spec); this file names the presets, bounds what a
//! browser tab can hold (the mesh's size and shape, array sizes), and says which control an
//! error belongs to.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use shardlab::ir::{CpOrder, RngLayout};
use shardlab::kernels::attention::check_head_dim;
use shardlab::model::{Attention, Capacity, Dataset, GptConfig, Init, Moe, Remat};
use shardlab::plan::{
    check_page_limits, check_page_mesh, check_page_sizes, check_pipeline_layout, explicit_axis_types, parse_axis_types,
    stage_activations, Action, AxisKind, DropoutKey, Parallel, Parallelism, Pass, PassTimes, PlanError, Schedule,
    StageLayout, Table, TrainerOptions, Zero, PAGE_MAX_SPECS, TOKENS,
};

pub use shardlab::plan::{Mode, Preset};
use shardlab::profile::{device_preset, presets, DeviceProfile};
use shardlab::setting::{Refusal, Setting};
use shardlab::sharding::{Mesh, PartitionSpec};

use crate::field_error::FieldError;
pub use crate::modes::Modes;
use crate::task::{Opt, Task, DEFAULT_LR};

/// The page's state: every control, and nothing else (it round-trips through the URL hash).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub preset: Preset,
    pub mode: Modes,
    /// The mesh as `--mesh` takes it: any of the axes dp, fsdp, tp, cp and pp, `dp=2,tp=2,pp=2`.
    pub mesh: String,
    /// ZeRO's stage on "dp"; links written before the control existed read as the preset's.
    #[serde(default)]
    pub zero: Zero,
    /// Megatron sequence parallelism on "tp"; links written before read as the preset's.
    #[serde(default)]
    pub sequence_parallel: bool,
    pub layers: usize,
    pub d_model: usize,
    pub heads: usize,
    pub seq: usize,
    pub batch: usize,
    pub vocab: usize,
    /// f64 so the page's number round-trips exactly (0.1 stays 0.1 in the hash); the core
    /// gets it as f32.
    pub dropout: f64,
    /// One fused dot_product_attention op, or the composition op by op; links written before
    /// the choice existed read as fused, the model's default.
    #[serde(default)]
    pub attention: Attention,
    /// What each block's backward recomputes (jax.checkpoint's policy); links written before
    /// the choice existed read as none.
    #[serde(default)]
    pub remat: Remat,
    /// A mixture of experts in every block in place of the dense MLP (0: the dense MLP); links
    /// written before the controls existed read as dense.
    #[serde(default)]
    pub experts: usize,
    /// The mixture's other settings, as `--top-k`, `--expert-width`, `--capacity` and
    /// `--aux-loss` take them, kept while `experts` is 0 so that giving the model experts again
    /// finds them; links written before read as the model's defaults (`dormant`).
    #[serde(default = "dormant::top_k")]
    pub top_k: usize,
    #[serde(default = "dormant::expert_width")]
    pub expert_width: usize,
    /// A factor (`1.25`) or `dropless`, as the flag's text: a factor the model refuses (0, NaN)
    /// is kept as typed, for its refusal to land at the control.
    #[serde(default = "dormant::capacity")]
    pub capacity: String,
    /// f64 for the same reason as dropout; the core gets it as f32.
    #[serde(default = "dormant::aux_loss")]
    pub aux_loss: f64,
    pub rng: RngLayout,
    pub dropout_key: DropoutKey,
    pub combine: bool,
    /// Gradient accumulation: microbatches per step (1: none); links written before the
    /// control existed read as 1.
    #[serde(default = "one")]
    pub microbatches: usize,
    /// How context parallelism lays the sequence's blocks on the ring (`--cp-order`); links
    /// written before the control existed read as contiguous.
    #[serde(default)]
    pub cp_order: CpOrder,
    /// The order a pipeline runs its microbatches' passes in (`--schedule`); links written
    /// before the control existed read as GPipe.
    #[serde(default)]
    pub schedule: Schedule,
    /// Chunks of blocks per pipeline stage (`--virtual-stages`; interleaved 1F1B's v); links
    /// written before the control existed read as 1.
    #[serde(default = "one")]
    pub virtual_stages: usize,
    /// Blocks per pipeline stage, first stage first (`--stage-layers`; empty: equal stages,
    /// which links written before the control existed read as).
    #[serde(default)]
    pub stage_layers: Vec<usize>,
    /// Explicit mode's mesh axes of another type than Explicit, as `--axis-types` writes them
    /// (`tp=auto`; empty: every axis Explicit, as links before the control read).
    #[serde(default)]
    pub axis_types: String,
    /// The kind of real device the cost model prices the step on: a device preset's name
    /// (`tpu_v4`, `h100`, ...).
    pub device: String,
    /// What the model learns, and how (`task.rs`).
    pub task: Task,
    pub optimizer: Opt,
    /// f64 for the same reason as dropout; the core gets it as f32.
    pub lr: f64,
    /// Automatic mode's PartitionSpecs beyond the preset's, by value name (see `editor`):
    /// `w_fc` → `P(None, 'tp')`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub specs: BTreeMap<String, String>,
}

impl Settings {
    /// The controls a preset sets (the user may change any of them afterwards): its model,
    /// mesh, microbatches, schedule, RNG layout, dropout keys and the modes it runs are the
    /// core's ([`Preset`]); priced on a TPU v4, learning the copy task with AdamW.
    pub fn preset(p: Preset) -> Settings {
        let c = p.config();
        let moe = c.moe.unwrap_or_else(|| dormant::moe(c.d_model));
        Settings {
            preset: p,
            mode: Modes::of(p.modes()),
            mesh: p.mesh().into(),
            zero: p.parallelism().zero,
            sequence_parallel: p.parallelism().sequence_parallel,
            layers: c.layers,
            d_model: c.d_model,
            heads: c.heads,
            seq: c.seq,
            batch: c.batch,
            vocab: c.vocab,
            dropout: shortest(c.dropout),
            attention: c.attention,
            remat: c.remat,
            experts: c.moe.map_or(0, |m| m.experts),
            top_k: moe.top_k,
            expert_width: moe.width,
            capacity: moe.capacity.text(),
            aux_loss: shortest(moe.aux),
            rng: p.rng_layout(),
            dropout_key: p.dropout_key(),
            combine: false,
            microbatches: p.microbatches(),
            cp_order: CpOrder::Contiguous,
            schedule: p.schedule(),
            virtual_stages: 1,
            stage_layers: vec![],
            axis_types: String::new(),
            device: "tpu_v4".into(),
            task: Task::Copy,
            optimizer: Opt::Adamw,
            lr: DEFAULT_LR,
            specs: BTreeMap::new(),
        }
    }

    /// The composition the mesh and its axes' options say (the core's refusal, where they do
    /// not compose).
    pub fn parallelism(&self) -> Result<Parallelism, PlanError> {
        Parallelism::new(Mesh::parse(&self.mesh)?, self.zero, self.sequence_parallel)
    }

    pub fn config(&self) -> GptConfig {
        GptConfig {
            layers: self.layers,
            d_model: self.d_model,
            heads: self.heads,
            seq: self.seq,
            batch: self.batch,
            vocab: self.vocab,
            tied: false,
            dropout: self.dropout as f32,
            attention: self.attention,
            remat: self.remat,
            precision: Default::default(),
            moe: (self.experts > 0).then(|| self.moe()),
        }
    }

    /// The mixture of experts the controls say (whatever `experts` is); a capacity that does
    /// not parse reads as NaN, which `check_capacity` refuses first.
    fn moe(&self) -> Moe {
        Moe {
            experts: self.experts,
            top_k: self.top_k,
            width: self.expert_width,
            capacity: Capacity::parse(self.capacity.trim()).unwrap_or(Capacity::Factor(f32::NAN)),
            aux: self.aux_loss as f32,
            // The page prices the assumed load; its routing chart shows the measured one.
            imbalance: shardlab::model::ASSUMED_IMBALANCE,
        }
    }

    /// The capacity's text is a factor or `dropless`; which factors the model takes, it says.
    fn check_capacity(&self) -> Result<(), Refusal> {
        if Capacity::parse(self.capacity.trim()).is_some() {
            return Ok(());
        }
        let text: String = self.capacity.chars().take(24).collect();
        Err(Refusal::at(
            Setting::Capacity,
            format!("“{text}”"),
            format!(
                "is neither a factor nor dropless: use a factor above 0 such as 1.25 (Switch's), or {}",
                Setting::Capacity.at("dropless")
            ),
        ))
    }

    pub fn rng_layout(&self) -> RngLayout {
        self.rng
    }

    pub fn device_profile(&self) -> Result<DeviceProfile, FieldError> {
        if self.device == crate::this_gpu::THIS {
            return crate::this_gpu::profile().ok_or_else(|| {
                FieldError::new(
                    "device",
                    "this GPU is not calibrated yet: pick “this GPU” again to calibrate it",
                )
            });
        }
        device_preset(&self.device).ok_or_else(|| {
            let names: Vec<String> = std::iter::once(crate::this_gpu::THIS.to_string())
                .chain(presets().into_iter().map(|p| p.name))
                .collect();
            FieldError::new(
                "device",
                format!("unknown device `{}`: choose one of {}", self.device, names.join(", ")),
            )
        })
    }

    /// Checks what can be checked without building a program, each refusal the core's at its
    /// setting's control: the page's bounds, the composition and the page's mesh, the model,
    /// the task, the arrays a tab can hold, the specs' texts. The planner says the rest (the
    /// axes' options, the schedule, the cp order) as it builds each mode.
    pub fn check(&self) -> Result<Parallelism, FieldError> {
        let refused = |e: Refusal| FieldError::refused(&e);
        self.check_capacity().map_err(refused)?;
        let cfg = self.config();
        check_page_limits(&cfg, self.microbatches, self.virtual_stages, self.lr).map_err(refused)?;
        // Before the model's own checks, which on wasm32 can only say that a size overflows.
        check_page_sizes(&cfg).map_err(refused)?;
        self.device_profile()?;
        let par = self.parallelism().map_err(|e| FieldError::plan(&e))?;
        check_page_mesh(&par).map_err(refused)?;
        cfg.validate().map_err(|e| FieldError::model(&e, "d_model"))?;
        Dataset::new(self.task.data(), &cfg, 0).map_err(|e| FieldError::model(&e, "task"))?;
        check_head_dim(&cfg).map_err(refused)?;
        // The layout first: where stage layers are given, they say what "pp" splits.
        check_pipeline_layout(
            &cfg,
            &par,
            self.schedule,
            self.virtual_stages,
            &self.stage_layers,
            self.microbatches,
        )
        .map_err(|e| FieldError::plan(&e))?;
        par.check_with_stages(&cfg, self.microbatches, &self.stage_layers)
            .map_err(|e| FieldError::plan(&e))?;
        self.check_axis_types(&par)?;
        self.check_spec_texts(&par)?;
        Ok(par)
    }

    /// The pipeline's stages, microbatches, virtual stages and schedule; the share of the step
    /// each stage idles waiting for the pipeline to fill and drain (the core's
    /// [`Schedule::bubble`]); and the diagram: each stage's passes placed in time by the
    /// schedule's own table, a forward, an input-gradient and a weight-gradient pass taking one
    /// unit each (an unsplit backward two). None off a pipeline, and where the schedule cannot
    /// lay its passes out so (its refusal is at its control).
    pub fn pipeline(&self, par: &Parallelism) -> Option<serde_json::Value> {
        let (v, m) = (self.virtual_stages, self.microbatches);
        let cfg = self.config();
        if !par.is_pipeline() || check_pipeline_layout(&cfg, par, self.schedule, v, &self.stage_layers, m).is_err() {
            return None;
        }
        let stages = par.size(AxisKind::Pp);
        let table = Table::new(self.schedule, stages, m, v);
        let times = PassTimes::EVEN;
        // A chunk's passes take as long as its blocks: a unit for an equal chunk's share.
        let layout = StageLayout::new(cfg.layers, stages, v, &self.stage_layers);
        let share = (stages * v) as f64 / cfg.layers as f64;
        let timing = table.timing(
            &|s, a: &Action| {
                layout.run(s, a.chunk).1 as f64
                    * share
                    * match a.pass {
                        Pass::Forward => times.forward,
                        Pass::Backward if table.split => times.backward,
                        Pass::Backward => times.backward + times.weight,
                        Pass::Weight => times.weight,
                    }
            },
            0.0,
        );
        Some(serde_json::json!({
            "stages": stages,
            "microbatches": m,
            "virtual_stages": v,
            "stage_layers": self.stage_layers,
            "schedule": self.schedule.name(),
            "bubble": self.schedule.bubble(stages, m, v, times),
            "formula": self.schedule.bubble_text(v),
            "diagram": timing,
            // Beside each stage's row: the microbatch chunks it holds at once, and its
            // activations at their peak in closed form (shard_map's program).
            "in_flight": table.in_flight(),
            "stage_activations": stage_activations(&self.options(Mode::ShardMap, par)),
        }))
    }

    /// Explicit mode's axis types: each names an axis of the mesh and a type a program typed
    /// with its shardings may have; given only where explicit mode runs.
    fn check_axis_types(&self, par: &Parallelism) -> Result<(), FieldError> {
        let given = parse_axis_types(&self.axis_types).map_err(|e| FieldError::plan(&e))?;
        if let (Some((axis, t)), false) = (given.first(), self.modes().contains(&Mode::Explicit)) {
            let why = format!(
                "types an axis of explicit mode's program, and {} does not run it: add explicit to the mode, or make \
                 every axis explicit",
                Setting::Mode.at(self.mode.name())
            );
            return Err(FieldError::refused(&Refusal::at(
                Setting::AxisType(axis.clone()),
                t.name(),
                why,
            )));
        }
        explicit_axis_types(par, &given).map_err(|e| FieldError::plan(&e))?;
        Ok(())
    }

    /// The specs are few enough and each parses. What each names, and whether it fits, the
    /// planner checks as it builds the step ([`shardlab::plan::resolve_spec`]), once.
    fn check_spec_texts(&self, par: &Parallelism) -> Result<(), FieldError> {
        if self.specs.len() > PAGE_MAX_SPECS {
            return Err(FieldError::new(
                "",
                format!(
                    "{} specs are more than the page takes (at most {PAGE_MAX_SPECS})",
                    self.specs.len()
                ),
            ));
        }
        let axes = par.mesh.axis_names();
        for (name, text) in &self.specs {
            parse_spec_on(text, &axes).map_err(|message| FieldError::new(&format!("spec.{name}"), message))?;
        }
        Ok(())
    }

    /// The specs as the planner takes them (`Parallel::Auto`'s `specs`): the token batch's
    /// spec applies to the targets too, as the editor shows one field for both. Unparsable
    /// entries are left out (`check` refuses them first).
    pub fn spec_overrides(&self) -> Vec<(String, PartitionSpec)> {
        let mut out = vec![];
        for (name, text) in &self.specs {
            let Ok(spec) = parse_spec(text) else { continue };
            if name == TOKENS && !self.specs.contains_key("targets") {
                out.push(("targets".to_string(), spec.clone()));
            }
            out.push((name.clone(), spec));
        }
        out
    }

    /// The modes this setting runs, in order.
    pub fn modes(&self) -> Vec<Mode> {
        self.mode.list()
    }

    /// The trainer options of one mode (`Auto` or `ShardMap`) on the composition `par` (of
    /// [`Settings::check`]), as `shardlab train` builds them.
    pub fn options(&self, mode: Mode, par: &Parallelism) -> TrainerOptions {
        let parallel = match mode {
            Mode::ShardMap => Parallel::ShardMap {
                par: par.clone(),
                dropout_key: self.dropout_key,
            },
            Mode::Auto => Parallel::Auto {
                par: par.clone(),
                specs: self.spec_overrides(),
            },
            Mode::Explicit => Parallel::Explicit {
                par: par.clone(),
                // Checked in `check`.
                axis_types: parse_axis_types(&self.axis_types).unwrap_or_default(),
                specs: self.spec_overrides(),
            },
            Mode::Single => Parallel::None,
        };
        TrainerOptions {
            config: self.config(),
            optimizer: self.optimizer.optimizer(self.lr),
            init: Init::Random { seed: 0 },
            data: self.task.data(),
            seed: 0,
            rng_layout: self.rng_layout(),
            parallel,
            combine_all_reduces: self.combine,
            microbatches: self.microbatches,
            cp_order: self.cp_order,
            schedule: self.schedule,
            virtual_stages: self.virtual_stages,
            stage_layers: self.stage_layers.clone(),
        }
    }
}

fn one() -> usize {
    1
}

/// An f32's shortest decimal as f64, so the link says 0.1 and not 0.10000000149011612.
fn shortest(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(0.0)
}

/// What a dense model's mixture controls hold, and links written before them read: the
/// model's defaults ([`Moe::new`]) for 4 experts of the presets' width.
mod dormant {
    use shardlab::model::Moe;

    pub fn moe(d_model: usize) -> Moe {
        Moe::new(4, d_model)
    }

    fn of_width_64() -> Moe {
        moe(64)
    }

    pub fn top_k() -> usize {
        of_width_64().top_k
    }

    pub fn expert_width() -> usize {
        of_width_64().width
    }

    pub fn capacity() -> String {
        of_width_64().capacity.text()
    }

    pub fn aux_loss() -> f64 {
        super::shortest(of_width_64().aux)
    }
}

/// A spec as the page writes it, or why it does not parse in the page's words.
pub fn parse_spec(text: &str) -> Result<PartitionSpec, String> {
    parse_spec_on(text, &["dp"])
}

/// [`parse_spec`] on a mesh of `axes`: the refusal's examples name those axes (a tuple of two
/// only where the mesh has two), once, without the CLI's backticks.
pub fn parse_spec_on(text: &str, axes: &[&str]) -> Result<PartitionSpec, String> {
    PartitionSpec::parse(text.trim()).map_err(|e| match e {
        shardlab::sharding::ShardingError::SpecSyntax { text, reason } => {
            let first = axes.first().copied().unwrap_or("dp");
            let examples = match axes {
                [a, b, ..] => format!("P('{a}', None), P(('{a}', '{b}'), None) or P()"),
                _ => format!("P('{first}', None) or P()"),
            };
            // The core marks code with backticks, as a terminal shows it; the page quotes it.
            let reason: String = reason
                .split('`')
                .enumerate()
                .map(|(i, part)| {
                    if i % 2 == 1 {
                        format!("“{part}”")
                    } else {
                        part.to_string()
                    }
                })
                .collect();
            format!("“{text}” is not a PartitionSpec: {reason}; write one like {examples}")
        }
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_presets_controls_are_the_cores_preset_and_pass_the_checks() {
        for p in Preset::ALL {
            let s = Settings::preset(p);
            assert_eq!(s.config(), p.config(), "{p:?}");
            assert_eq!(s.dropout.to_string(), p.config().dropout.to_string(), "{p:?}");
            assert_eq!(s.parallelism().unwrap(), p.parallelism());
            assert_eq!((s.rng_layout(), s.dropout_key), (p.rng_layout(), p.dropout_key()));
            assert_eq!(
                (s.microbatches, s.schedule, s.modes()),
                (p.microbatches(), p.schedule(), p.modes().to_vec())
            );
            s.check().unwrap_or_else(|e| panic!("{p:?}: {}", e.message));
        }
    }

    #[test]
    fn hostile_mixture_settings_are_refused_at_their_control_naming_the_fix() {
        let moe = Settings::preset(Preset::Moe);
        let refused = |change: &dyn Fn(&mut Settings)| {
            let mut s = moe.clone();
            change(&mut s);
            let e = s.check().expect_err("refused");
            (e.field, e.message)
        };
        let (field, message) = refused(&|s| s.top_k = 5);
        assert_eq!(field, "top_k");
        assert_eq!(
            message,
            "top-k 5 must be between 1 and experts 4: each token chooses among the experts"
        );
        let (field, message) = refused(&|s| s.experts = 3);
        assert_eq!(field, "mesh.ep");
        assert!(message.starts_with("ep=2 does not divide experts 3"), "{message}");
        assert!(message.contains("use ep = one of 1, 3"), "{message}");
        for text in ["0", "NaN", "-1"] {
            let (field, message) = refused(&|s| s.capacity = text.into());
            assert_eq!(field, "capacity", "{text}");
            assert!(message.contains("must be a number above 0"), "{message}");
            assert!(message.contains("capacity factor dropless"), "{message}");
        }
        let (field, message) = refused(&|s| s.capacity = "lots".into());
        assert_eq!(field, "capacity");
        assert!(
            message.starts_with("capacity factor “lots”: is neither a factor nor dropless"),
            "{message}"
        );
        let (field, message) = refused(&|s| s.expert_width = 0);
        assert_eq!(field, "expert_width");
        assert_eq!(
            message,
            "expert width 0: each expert needs at least 1 hidden unit (the dense MLP has 4 x d_model)"
        );
        let (field, message) = refused(&|s| s.top_k = 0);
        assert_eq!(field, "top_k");
        assert!(
            message.starts_with("top-k 0 must be between 1 and experts 4"),
            "{message}"
        );
        let (field, message) = refused(&|s| s.experts = 65);
        assert_eq!(
            (field.as_str(), message.as_str()),
            ("experts", "experts 65: is more than this page handles: use 0 to 64")
        );
        // ep needs experts; pipelines do not carry a mixture's loss yet.
        let (field, message) = refused(&|s| s.experts = 0);
        assert_eq!(field, "mesh.ep");
        assert!(message.contains("give it experts (e.g. experts 8)"), "{message}");
        let (field, message) = refused(&|s| s.mesh = "ep=2,pp=2".into());
        assert_eq!(field, "mesh.pp");
        assert!(message.contains("drop the pp axis"), "{message}");
        // A dense model ignores its dormant mixture controls; dropless is a capacity.
        let mut dense = Settings::preset(Preset::Dp);
        dense.top_k = 64;
        assert!(dense.check().is_ok() && dense.config().moe.is_none());
        let mut dropless = moe.clone();
        dropless.capacity = "dropless".into();
        assert_eq!(dropless.config().moe.unwrap().capacity, Capacity::Dropless);
        dropless.check().unwrap();
    }

    #[test]
    fn a_link_written_before_the_mixture_controls_reads_as_a_dense_model() {
        let mut old = serde_json::to_value(Settings::preset(Preset::Dp)).unwrap();
        for k in ["experts", "top_k", "expert_width", "capacity", "aux_loss"] {
            old.as_object_mut().unwrap().remove(k);
        }
        let s: Settings = serde_json::from_value(old).unwrap();
        assert_eq!(s, Settings::preset(Preset::Dp));
    }

    #[test]
    fn zigzag_is_refused_without_a_cp_axis_and_runs_in_every_mode() {
        let mut s = Settings::preset(Preset::Dp);
        s.cp_order = CpOrder::Zigzag;
        let par = s.check().unwrap();
        let e = shardlab::plan::build(&s.options(Mode::ShardMap, &par)).unwrap_err();
        let e = FieldError::plan(&e);
        assert_eq!(e.field, "cp_order");
        assert!(
            e.message.contains("has no 'cp' axis: add one (e.g. cp=4)"),
            "{}",
            e.message
        );
        // Every mode runs: shard_map on the zig-zag ring, jit (automatic and explicit mode) on
        // its reordered sequence.
        let mut s = Settings::preset(Preset::Cp);
        s.cp_order = CpOrder::Zigzag;
        let par = s.check().unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!(s.options(Mode::ShardMap, &par).cp_order, CpOrder::Zigzag);
        assert_eq!(s.options(Mode::Auto, &par).cp_order, CpOrder::Zigzag);
        assert_eq!(s.options(Mode::Explicit, &par).cp_order, CpOrder::Zigzag);
        for mode in Mode::PARTITIONED {
            shardlab::plan::build(&s.options(mode, &par)).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        }
        // 2 x cp = 8 chunks: a sequence of 252 does not split into them, which the planner
        // says, at the seq control.
        s.seq = 252;
        let par = s.check().unwrap();
        let e = shardlab::plan::build(&s.options(Mode::ShardMap, &par)).unwrap_err();
        let e = FieldError::plan(&e);
        assert_eq!(e.field, "seq", "{}", e.message);
        assert!(e.message.contains("zig-zag chunks"), "{}", e.message);
    }

    #[test]
    fn a_schedule_is_refused_off_a_pipeline_and_carried_into_the_pipelines_options() {
        let mut s = Settings::preset(Preset::Dp);
        s.schedule = Schedule::OneFOneB;
        let par = s.check().unwrap();
        let e = FieldError::plan(&shardlab::plan::build(&s.options(Mode::ShardMap, &par)).unwrap_err());
        assert_eq!(e.field, "schedule");
        assert!(
            e.message.contains("has no 'pp' axis: add one (e.g. pp=2)"),
            "{}",
            e.message
        );
        let mut s = Settings::preset(Preset::Pp);
        s.schedule = Schedule::OneFOneB;
        let par = s.check().unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!(s.options(Mode::ShardMap, &par).schedule, Schedule::OneFOneB);
    }

    #[test]
    fn a_link_without_a_schedule_reads_as_gpipe() {
        let mut v = serde_json::to_value(Settings::preset(Preset::Pp)).unwrap();
        assert_eq!(v["schedule"], "gpipe");
        v.as_object_mut().unwrap().remove("schedule");
        let s: Settings = serde_json::from_value(v).unwrap();
        assert_eq!(s.schedule, Schedule::Gpipe);
        v = serde_json::to_value(Settings::preset(Preset::Pp)).unwrap();
        v["schedule"] = "zigzag".into();
        assert!(serde_json::from_value::<Settings>(v).is_err());
    }

    #[test]
    fn the_pipeline_diagram_idles_each_stage_the_closed_form_bubble_and_places_every_pass() {
        let mut s = Settings::preset(Preset::Pp);
        s.layers = 8;
        for (schedule, v) in [
            (Schedule::Gpipe, 1),
            (Schedule::OneFOneB, 1),
            (Schedule::OneFOneB, 2),
            (Schedule::Gpipe, 2),
        ] {
            (s.schedule, s.virtual_stages) = (schedule, v);
            let par = s
                .check()
                .unwrap_or_else(|e| panic!("{schedule:?} v={v}: {}", e.message));
            let p = s.pipeline(&par).unwrap();
            let timing: serde_json::Value = p["diagram"].clone();
            let stages = timing["slots"].as_array().unwrap();
            let makespan = timing["makespan"].as_f64().unwrap();
            for (k, slots) in stages.iter().enumerate() {
                let slots = slots.as_array().unwrap();
                // A forward and a backward of every microbatch on every chunk.
                assert_eq!(slots.len(), 2 * s.microbatches * v, "{schedule:?} v={v} stage {k}");
                // The letters the page's diagram draws by.
                assert!(slots
                    .iter()
                    .all(|x| ["F", "B"].contains(&x["action"]["pass"].as_str().unwrap())));
                let busy: f64 = slots
                    .iter()
                    .map(|x| x["end"].as_f64().unwrap() - x["start"].as_f64().unwrap())
                    .sum();
                let idle = 1.0 - busy / makespan;
                let bubble = p["bubble"].as_f64().unwrap();
                assert!(
                    (idle - bubble).abs() < 1e-9,
                    "{schedule:?} v={v} stage {k}: idles {idle}, the formula {bubble}"
                );
            }
        }
        // Refused at the control, and no diagram drawn of what cannot be laid out (ZB-H1 runs
        // one chunk per stage; three chunks do not divide two blocks).
        for (schedule, v) in [(Schedule::OneFOneB, 3), (Schedule::ZbH1, 2)] {
            (s.schedule, s.virtual_stages) = (schedule, v);
            let e = s.check().unwrap_err();
            assert_eq!(e.field, "virtual_stages", "{}", e.message);
            assert!(s.pipeline(&s.parallelism().unwrap()).is_none(), "{schedule:?} v={v}");
        }
    }

    #[test]
    fn a_stage_draws_passes_as_long_as_its_blocks_and_a_list_that_does_not_fit_is_refused_at_its_control() {
        let mut s = Settings::preset(Preset::Pp);
        (s.layers, s.stage_layers) = (8, vec![1, 3, 3, 1]);
        let par = s.check().unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!(s.options(Mode::ShardMap, &par).stage_layers, [1, 3, 3, 1]);
        let p = s.pipeline(&par).unwrap();
        let busy: Vec<f64> = p["diagram"]["slots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|stage| {
                let slots = stage.as_array().unwrap();
                slots
                    .iter()
                    .map(|x| x["end"].as_f64().unwrap() - x["start"].as_f64().unwrap())
                    .sum()
            })
            .collect();
        // Passes as long as the stage's blocks: the middle stages three times the outer ones.
        assert!(
            (busy[1] - 3.0 * busy[0]).abs() < 1e-9 && busy[1] == busy[2] && busy[0] == busy[3],
            "{busy:?}"
        );
        // Lists that do not fit the mesh or the model, each refused at the list's control.
        for (layers, why) in [
            (vec![1, 3, 3], "lists 3 stages"),
            (vec![2, 3, 3, 1], "adds up to 9 blocks"),
            (vec![0, 4, 3, 1], "gives a stage no blocks"),
        ] {
            s.stage_layers = layers;
            let e = s.check().unwrap_err();
            assert_eq!(e.field, "stage_layers", "{}", e.message);
            assert!(e.message.contains(why), "{}", e.message);
            assert!(s.pipeline(&par).is_none());
        }
        // Without a pipeline there are no stages to size.
        let mut dp = Settings::preset(Preset::Dp);
        dp.stage_layers = vec![1, 1];
        assert_eq!(dp.check().unwrap_err().field, "stage_layers");
    }

    #[test]
    fn explicit_modes_axis_types_type_the_program_and_hostile_ones_are_refused_at_the_axis() {
        use crate::modes::Modes;
        use shardlab::sharding::AxisType;
        let mut s = Settings::preset(Preset::DpTp);
        s.mode = Modes::of(&[Mode::Auto, Mode::Explicit]);
        s.axis_types = "tp=auto".into();
        let par = s.check().unwrap_or_else(|e| panic!("{}", e.message));
        let Parallel::Explicit { axis_types, .. } = s.options(Mode::Explicit, &par).parallel else {
            panic!("not explicit")
        };
        assert_eq!(axis_types, [("tp".to_string(), AxisType::Auto)]);
        assert!(crate::plan::Plan::build(&s, Mode::Explicit, &par).is_ok());
        for (text, modes, field, why) in [
            (
                "tp=manual",
                &[Mode::Explicit][..],
                "axis_type.tp",
                "jax.shard_map gives",
            ),
            ("cp=auto", &[Mode::Explicit], "axis_type.cp", "has no axis 'cp'"),
            ("tp=sideways", &[Mode::Explicit], "axis_type.tp", "is not an axis type"),
            ("tp", &[Mode::Explicit], "axis_type.tp", "is not AXIS=TYPE"),
            (
                "tp=auto",
                &[Mode::Auto, Mode::ShardMap],
                "axis_type.tp",
                "does not run it",
            ),
        ] {
            (s.axis_types, s.mode) = (text.into(), Modes::of(modes));
            let e = s.check().unwrap_err();
            assert_eq!(e.field, field, "{text}: {}", e.message);
            assert!(e.message.contains(why), "{text}: {}", e.message);
        }
    }

    #[test]
    fn the_pipelines_bubble_is_the_cores_and_shrinks_as_the_microbatches_grow() {
        let mut s = Settings::preset(Preset::Pp);
        let par = s.check().unwrap();
        let bubble = |s: &Settings| s.pipeline(&par).unwrap()["bubble"].as_f64().unwrap();
        let mut last = 1.0;
        for m in [1, 2, 4, 8] {
            s.microbatches = m;
            s.check().unwrap_or_else(|e| panic!("{m}: {}", e.message));
            assert_eq!(bubble(&s), Schedule::Gpipe.bubble_fraction(4, m));
            assert!(bubble(&s) < last, "{m}");
            last = bubble(&s);
        }
        let dp = Settings::preset(Preset::Dp);
        assert!(dp.pipeline(&dp.parallelism().unwrap()).is_none());
        // No microbatch is no pipeline: refused at the control, naming the fix.
        s.microbatches = 0;
        let e = s.check().unwrap_err();
        assert_eq!(e.field, "microbatches");
        assert!(e.message.contains("use 1"), "{}", e.message);
    }

    #[test]
    fn sizes_outside_the_cores_page_limits_are_refused_at_their_control() {
        use shardlab::plan::page_limit;
        use shardlab::setting::Setting;
        let limit = |s: Setting| page_limit(&s).expect("a page limit");
        let mut s = Settings::preset(Preset::Dp);
        s.vocab = limit(Setting::Vocab).min as usize - 1;
        assert_eq!(s.check().unwrap_err().field, "vocab");
        let mut s = Settings::preset(Preset::Dp);
        s.layers = limit(Setting::Layers).max as usize + 1;
        assert_eq!(s.check().unwrap_err().field, "layers");
        let mut s = Settings::preset(Preset::Dp);
        s.dropout = limit(Setting::Dropout).max + 0.01;
        assert_eq!(s.check().unwrap_err().field, "dropout");
    }

    #[test]
    fn microbatch_counts_that_do_not_split_each_devices_rows_are_refused_at_their_control() {
        // The dp preset: batch 8 over dp=4, two rows a device.
        let mut s = Settings::preset(Preset::Dp);
        for (k, words) in [
            (0, "microbatches 0: must be at least 1; use 1 or more"),
            (3, "microbatches 3 does not divide batch 8"),
            (16, "microbatches 16 is more than batch 8"),
            (
                4,
                "each data-parallel shard holds (batch 8 over 4 devices): every device splits its own rows; use one of \
                 1, 2",
            ),
        ] {
            s.microbatches = k;
            let e = s.check().unwrap_err();
            assert_eq!(e.field, "microbatches", "{k}");
            assert!(e.message.contains(words), "{k}: {}", e.message);
        }
        s.microbatches = 2;
        assert!(s.check().is_ok());
    }

    #[test]
    fn a_link_without_microbatches_reads_as_one() {
        let mut v = serde_json::to_value(Settings::preset(Preset::Zero2)).unwrap();
        v.as_object_mut().unwrap().remove("microbatches");
        let s: Settings = serde_json::from_value(v).unwrap();
        assert_eq!(s.microbatches, 1);
        assert_eq!(s.parallelism().unwrap().zero, Zero::Two);
    }

    #[test]
    fn a_spec_that_does_not_parse_is_an_error_at_its_field() {
        let mut s = Settings::preset(Preset::Dp);
        s.specs.insert("w_qkv".into(), "P('dp'".into());
        let e = s.check().unwrap_err();
        assert_eq!(e.field, "spec.w_qkv");
        assert!(
            e.message.contains("write one like P('dp', None) or P()"),
            "{}",
            e.message
        );
    }

    #[test]
    fn the_token_batchs_spec_covers_the_targets() {
        let mut s = Settings::preset(Preset::Dp);
        s.specs.insert(TOKENS.into(), "P()".into());
        let names: Vec<String> = s.spec_overrides().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, vec!["targets", "tokens"]);
    }
}
