//! What the page's controls choose, as JSON, and how it maps onto the core's `TrainerOptions`.
//! Every check is the core's own (GptConfig::validate, Mesh::parse, the partitioners); this file
//! only names the presets, bounds the sizes a browser tab can hold, and says which control an
//! error belongs to.
use serde::{Deserialize, Serialize};
use shardlab::ir::RngLayout;
use shardlab::model::{DataSource, GptConfig, Init, Optimizer};
use shardlab::plan::{DropoutKey, Parallel, Strategy, TrainerOptions};
use shardlab::profile::{preset, Interconnect};
use shardlab::sharding::Mesh;

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
    pub dropout: f32,
    pub rng: Rng,
    pub dropout_key: Key,
    pub combine: bool,
    /// An interconnect preset name (`tpu_v4_ici`, `h100_nvlink`, `pcie4_x16`).
    pub interconnect: String,
}

/// Sizes above these make programs or buffers that a browser tab should not be asked for.
const MAX_DEVICES: usize = 64;
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
    fn new(field: &str, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// An error of the core, whose message names CLI flags: the control is the first flag named,
    /// and the flags read as the page's labels.
    pub fn from_core(message: &str, fallback: &str) -> Self {
        const FLAGS: [(&str, &str); 9] = [
            ("--d-model", "d_model"),
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
            interconnect: "tpu_v4_ici".into(),
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
            dropout: self.dropout,
        }
    }

    pub fn rng_layout(&self) -> RngLayout {
        match self.rng {
            Rng::Original => RngLayout::Original,
            Rng::Partitionable => RngLayout::Partitionable,
        }
    }

    pub fn net(&self) -> Result<Interconnect, FieldError> {
        preset(&self.interconnect).ok_or_else(|| {
            let names: Vec<&str> = shardlab::profile::PRESETS.iter().map(|p| p.name).collect();
            FieldError::new(
                "interconnect",
                format!(
                    "unknown interconnect `{}`: choose one of {}",
                    self.interconnect,
                    names.join(", ")
                ),
            )
        })
    }

    /// Checks what can be checked without building a program: sizes, the mesh, the model.
    pub fn check(&self) -> Result<Mesh, FieldError> {
        let values = [self.layers, self.d_model, self.heads, self.seq, self.batch, self.vocab];
        for ((field, max), v) in LIMITS.iter().zip(values) {
            if v > *max {
                return Err(FieldError::new(
                    field,
                    format!("{field} {v} is more than this page handles (at most {max})"),
                ));
            }
        }
        self.net()?;
        let mesh = Mesh::parse(&self.mesh).map_err(|e| FieldError::new("mesh", e.to_string()))?;
        if mesh.devices() > MAX_DEVICES {
            return Err(FieldError::new(
                "mesh",
                format!(
                    "mesh {} has {} devices; the page simulates at most {MAX_DEVICES}",
                    self.mesh,
                    mesh.devices()
                ),
            ));
        }
        self.config()
            .validate()
            .map_err(|e| FieldError::from_core(&e.to_string(), "d_model"))?;
        Ok(mesh)
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
                specs: vec![],
            },
        };
        TrainerOptions {
            config: self.config(),
            optimizer: Optimizer::AdamW { lr: 3e-3 },
            init: Init::Random { seed: 0 },
            data: DataSource::Copy,
            seed: 0,
            rng_layout: self.rng_layout(),
            parallel,
            combine_all_reduces: self.combine,
        }
    }
}

pub fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Auto => "auto",
        Mode::ShardMap => "shard_map",
        Mode::Both => "both",
    }
}
