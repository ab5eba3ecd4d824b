//! What the page's controls choose, as JSON, and how it maps onto the core's `TrainerOptions`.
//! Every check is the core's own (GptConfig::validate, Mesh::parse, the partitioners); this file
//! only names the presets, bounds the sizes a browser tab can hold, and says which control an
//! error belongs to.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use shardlab::ir::RngLayout;
use shardlab::model::{GptConfig, Init};
use shardlab::plan::{DropoutKey, Parallel, Strategy, TrainerOptions};
use shardlab::profile::{device_preset, presets, DeviceProfile};
use shardlab::sharding::Mesh;

use crate::task::{check_lr, Opt, Task, DEFAULT_LR};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    /// The JAX report's run: dp on 8 devices, dropout 0.1, the original RNG layout.
    Seed,
    Dp,
    Fsdp,
    Tp,
    DpTp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Auto,
    ShardMap,
    /// Both, one step of each in turn.
    Both,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rng {
    Original,
    Partitionable,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Key {
    Same,
    FoldIn,
}

/// The page's state: every control, and nothing else (it round-trips through the URL hash).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub preset: Preset,
    pub mode: Mode,
    /// `dp=4` or `dp=2,tp=2`.
    pub mesh: String,
    pub layers: usize,
    pub d_model: usize,
    pub heads: usize,
    pub seq: usize,
    pub batch: usize,
    pub vocab: usize,
    /// f64 so the page's number round-trips exactly (0.1 stays 0.1 in the hash); the core
    /// gets it as f32.
    pub dropout: f64,
    pub rng: Rng,
    pub dropout_key: Key,
    pub combine: bool,
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

/// Sizes above these make programs or buffers that a browser tab should not be asked for.
pub const MAX_DEVICES: usize = 64;
/// The most elements of one global array: 2 GiB of f32, so its byte count fits a 32-bit usize.
const MAX_ELEMENTS: u64 = 1 << 29;
const MAX_DROPOUT: f64 = 0.95;
const LIMITS: [(&str, usize); 6] = [
    ("layers", 12),
    ("d_model", 1024),
    ("heads", 64),
    ("seq", 512),
    ("batch", 512),
    ("vocab", 4096),
];

/// One problem with the settings: the control it belongs to and what to do.
#[derive(Clone, Debug, Serialize)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub(crate) fn new(field: &str, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// An error of the core, whose message names CLI flags: the control is the first flag named,
    /// and the flags read as the page's labels.
    pub fn from_core(message: &str, fallback: &str) -> Self {
        const FLAGS: [(&str, &str); 11] = [
            ("--d-model", "d_model"),
            ("--lr", "lr"),
            ("--data", "task"),
            ("--heads", "heads"),
            ("--layers", "layers"),
            ("--batch", "batch"),
            ("--seq", "seq"),
            ("--vocab", "vocab"),
            ("--dropout", "dropout"),
            ("--mesh", "mesh"),
            ("--strategy", "mesh"),
        ];
        let first = FLAGS
            .iter()
            .filter_map(|(flag, field)| message.find(flag).map(|at| (at, *field)))
            .min_by_key(|(at, _)| *at);
        let mut text = message.to_string();
        for (flag, field) in FLAGS {
            text = text.replace(flag, field);
        }
        Self::new(first.map_or(fallback, |(_, f)| f), text)
    }
}

impl Settings {
    /// The controls a preset sets (the user may change any of them afterwards).
    pub fn preset(p: Preset) -> Settings {
        let base = Settings {
            preset: p,
            mode: Mode::Both,
            mesh: "dp=4".into(),
            layers: 2,
            d_model: 64,
            heads: 4,
            seq: 32,
            batch: 8,
            vocab: 32,
            dropout: 0.1,
            rng: Rng::Original,
            dropout_key: Key::Same,
            combine: false,
            device: "tpu_v4".into(),
            task: Task::Copy,
            optimizer: Opt::Adamw,
            lr: DEFAULT_LR,
            specs: BTreeMap::new(),
        };
        match p {
            Preset::Seed => Settings {
                mesh: "dp=8".into(),
                d_model: 128,
                seq: 64,
                batch: 32,
                vocab: 256,
                ..base
            },
            Preset::Dp | Preset::Fsdp => base,
            Preset::Tp => Settings {
                mesh: "tp=2".into(),
                ..base
            },
            Preset::DpTp => Settings {
                mesh: "dp=2,tp=2".into(),
                ..base
            },
        }
    }

    pub fn strategy(&self) -> Strategy {
        match self.preset {
            Preset::Seed | Preset::Dp => Strategy::Dp,
            Preset::Fsdp => Strategy::Fsdp,
            Preset::Tp => Strategy::Tp,
            Preset::DpTp => Strategy::DpTp,
        }
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
        }
    }

    pub fn rng_layout(&self) -> RngLayout {
        match self.rng {
            Rng::Original => RngLayout::Original,
            Rng::Partitionable => RngLayout::Partitionable,
        }
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

    /// Checks what can be checked without building a program: sizes, the mesh, the model, the
    /// task. Every size is derived in u64 with checked arithmetic before the core sees it, so
    /// nothing wraps on wasm32 (where usize is 32 bits).
    pub fn check(&self) -> Result<Mesh, FieldError> {
        let values = [self.layers, self.d_model, self.heads, self.seq, self.batch, self.vocab];
        for ((field, max), v) in LIMITS.iter().zip(values) {
            if v == 0 {
                return Err(FieldError::new(field, format!("{field} must be at least 1")));
            }
            if v > *max {
                return Err(FieldError::new(
                    field,
                    format!("{field} {v} is more than this page handles (at most {max})"),
                ));
            }
        }
        if !(0.0..=MAX_DROPOUT).contains(&self.dropout) {
            return Err(FieldError::new(
                "dropout",
                format!("dropout {} must be between 0 and {MAX_DROPOUT}", self.dropout),
            ));
        }
        check_lr(self.lr)?;
        self.device_profile()?;
        let mesh = self.mesh()?;
        self.check_axes(&mesh)?;
        if !self.d_model.is_multiple_of(self.heads) {
            let fits: Vec<String> = (1..=self.d_model.min(LIMITS[2].1))
                .filter(|h| self.d_model.is_multiple_of(*h))
                .map(|h| h.to_string())
                .collect();
            return Err(FieldError::new(
                "heads",
                format!(
                    "heads {} does not divide d_model {}: each head gets d_model / heads features, so choose one of {}",
                    self.heads,
                    self.d_model,
                    fits.join(", ")
                ),
            ));
        }
        self.task.check(self.vocab, self.seq)?;
        self.check_sizes()?;
        self.config()
            .validate()
            .map_err(|e| FieldError::from_core(&e.to_string(), "d_model"))?;
        crate::editor::check_specs(self, &mesh)?;
        Ok(mesh)
    }

    /// The mesh: one or two named axes whose sizes multiply (checked) to at most MAX_DEVICES.
    pub fn mesh(&self) -> Result<Mesh, FieldError> {
        let bad = |why: String| FieldError::new("mesh", why);
        let mut axes: Vec<(&str, usize)> = vec![];
        let mut devices: u64 = 1;
        for part in self.mesh.split(',') {
            let Some((name, size)) = part.split_once('=') else {
                return Err(bad(format!("“{part}” is not an axis like dp=4")));
            };
            let (name, size) = (name.trim(), size.trim());
            let size: u64 = size
                .parse()
                .map_err(|_| bad(format!("the size “{size}” of axis “{name}” is not a whole number")))?;
            if size == 0 {
                return Err(bad(format!(
                    "axis “{name}” has size 0: every axis needs at least 1 device"
                )));
            }
            devices = devices.saturating_mul(size);
            if devices > MAX_DEVICES as u64 {
                return Err(bad(format!(
                    "mesh {} has more than {MAX_DEVICES} devices; the page simulates at most {MAX_DEVICES}",
                    self.mesh
                )));
            }
            // Bounded by MAX_DEVICES above, so it fits usize on every target.
            axes.push((name, size as usize));
        }
        if axes.len() > 2 {
            return Err(bad(format!(
                "mesh {} has {} axes; the presets use one or two (dp, tp)",
                self.mesh,
                axes.len()
            )));
        }
        Mesh::new(&axes).map_err(|e| bad(e.to_string()))
    }

    /// The mesh has every axis the preset's strategy needs.
    fn check_axes(&self, mesh: &Mesh) -> Result<(), FieldError> {
        let strategy = self.strategy();
        let needs = strategy.axes();
        let has = mesh.axis_names();
        if needs.iter().all(|a| has.contains(a)) {
            return Ok(());
        }
        let quoted = |xs: &[&str]| xs.iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join(" and ");
        let example = match strategy {
            Strategy::Dp | Strategy::Fsdp => "dp=4",
            Strategy::Tp => "tp=2",
            Strategy::DpTp => "dp=2,tp=2",
        };
        Err(FieldError::new(
            "mesh",
            format!(
                "the {} preset needs a mesh with {} {} (e.g. {example}); {} has {}",
                preset_name(self.preset),
                if needs.len() == 1 { "axis" } else { "axes" },
                quoted(needs),
                self.mesh,
                quoted(&has)
            ),
        ))
    }

    /// The largest arrays of a step, counted in u64 before anything is built: none may exceed
    /// MAX_ELEMENTS (so no element or byte count wraps on wasm32).
    fn check_sizes(&self) -> Result<(), FieldError> {
        let [b, t, d, h, v] = [self.batch, self.seq, self.d_model, self.heads, self.vocab].map(|x| x as u64);
        let arrays: [(&str, &str, &str, [u64; 4]); 4] = [
            ("attention scores", "batch × heads × seq × seq", "seq", [b, h, t, t]),
            ("logits", "batch × seq × vocab", "vocab", [b, t, v, 1]),
            ("MLP activations", "batch × seq × 4 × d_model", "d_model", [b, t, 4, d]),
            ("embedding", "vocab × d_model", "vocab", [v, d, 1, 1]),
        ];
        for (name, formula, field, dims) in arrays {
            let n = dims.iter().try_fold(1u64, |acc, x| acc.checked_mul(*x));
            match n {
                Some(n) if n <= MAX_ELEMENTS => {}
                _ => {
                    let shown = n.map_or_else(|| "more than 2^64".to_string(), group_digits);
                    let gib = n.map_or(f64::INFINITY, |n| n as f64 * 4.0 / (1u64 << 30) as f64);
                    return Err(FieldError::new(
                        field,
                        format!(
                            "the {name} would have {shown} elements ({formula}, {gib:.1} GiB as f32); the page handles at most {} per array: lower {field} or batch",
                            group_digits(MAX_ELEMENTS)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The modes this setting runs, in order.
    pub fn modes(&self) -> &'static [Mode] {
        match self.mode {
            Mode::Auto => &[Mode::Auto],
            Mode::ShardMap => &[Mode::ShardMap],
            Mode::Both => &[Mode::Auto, Mode::ShardMap],
        }
    }

    /// The trainer options of one mode (`Auto` or `ShardMap`), as `shardlab train` builds them.
    pub fn options(&self, mode: Mode, mesh: &Mesh) -> TrainerOptions {
        let strategy = self.strategy();
        let parallel = match mode {
            Mode::ShardMap => Parallel::ShardMap {
                strategy,
                mesh: mesh.clone(),
                dropout_key: match self.dropout_key {
                    Key::Same => DropoutKey::Same,
                    Key::FoldIn => DropoutKey::FoldIn,
                },
            },
            _ => Parallel::Auto {
                strategy,
                mesh: mesh.clone(),
                specs: crate::editor::overrides(self),
            },
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
        }
    }
}

pub fn preset_name(p: Preset) -> &'static str {
    match p {
        Preset::Seed => "seed",
        Preset::Dp => "dp",
        Preset::Fsdp => "fsdp",
        Preset::Tp => "tp",
        Preset::DpTp => "dp_tp",
    }
}

/// 8589934592 as 8,589,934,592.
pub fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Auto => "auto",
        Mode::ShardMap => "shard_map",
        Mode::Both => "both",
    }
}
