//! Flags shared by `train`, `inspect` and `bench train`: the model, data and optimizer.
use clap::ValueEnum;
use shardlab::ir::RngLayout;
use shardlab::model::{param_specs, read_text_file, DataSource, GptConfig, Init, Optimizer};
use shardlab::plan::{DropoutKey, Parallel, Strategy, TrainerOptions};
use shardlab::sharding::{Mesh, NamedSharding, PartitionSpec};

/// The most bytes `--spec-file` reads: far more than every parameter's spec takes.
const MAX_SPEC_FILE_BYTES: u64 = 1 << 20;

#[derive(Clone, Copy, ValueEnum)]
pub enum InitArg {
    Formula,
    Random,
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
pub enum DataArg {
    Formula,
    Copy,
    Reverse,
    Modadd,
    Text,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum OptArg {
    Sgd,
    Adamw,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum RngArg {
    Original,
    Partitionable,
}

#[derive(clap::Args, Clone)]
pub struct ModelArgs {
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Width of the residual stream (d).
    #[arg(long = "d-model", default_value_t = 64)]
    pub d_model: usize,
    /// Attention heads (must divide d-model).
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Sequence length T.
    #[arg(long, default_value_t = 32)]
    pub seq: usize,
    /// Batch size B.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Vocabulary size V.
    #[arg(long, default_value_t = 32)]
    pub vocab: usize,
    /// Share the LM head with the token embedding.
    #[arg(long)]
    pub tied: bool,
    /// Dropout rate (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f32,
    /// Parameter init: docs/MODEL.md's formula, or seeded random.
    #[arg(long, value_enum, default_value_t = InitArg::Random)]
    pub init: InitArg,
    /// Training data.
    #[arg(long, value_enum, default_value_t = DataArg::Copy)]
    pub data: DataArg,
    /// Text file for --data text (character level).
    #[arg(long, value_name = "FILE")]
    pub text: Option<String>,
    /// Optimizer.
    #[arg(long, value_enum, default_value_t = OptArg::Adamw)]
    pub opt: OptArg,
    /// Learning rate (default: 0.1 for sgd, 3e-3 for adamw).
    #[arg(long)]
    pub lr: Option<f32>,
    /// Seed of the random init, the data and dropout.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Random-bit layout of dropout (JAX's jax_threefry_partitionable False / True);
    /// default partitionable (original with --preset seed).
    #[arg(long, value_enum)]
    pub rng: Option<RngArg>,
    /// A named setup: `seed` is the JAX report's data-parallel run (dp on 8 devices, dropout
    /// 0.1, original RNG layout, layers 2, d-model 128, heads 4, seq 64, batch 32, vocab 256).
    /// It replaces the model flags and the strategy; --rng, --mesh, --mode and --steps still apply.
    #[arg(long, value_enum)]
    pub preset: Option<PresetArg>,
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
pub enum PresetArg {
    Seed,
}

impl ModelArgs {
    pub fn config(&self) -> GptConfig {
        GptConfig {
            layers: self.layers,
            d_model: self.d_model,
            heads: self.heads,
            seq: self.seq,
            batch: self.batch,
            vocab: self.vocab,
            tied: self.tied,
            dropout: self.dropout,
        }
    }

    pub fn init(&self) -> Init {
        match self.init {
            InitArg::Formula => Init::Formula,
            InitArg::Random => Init::Random { seed: self.seed },
        }
    }

    pub fn optimizer(&self) -> Result<Optimizer, String> {
        let lr = self.lr;
        if let Some(lr) = lr {
            if !(lr.is_finite() && lr > 0.0) {
                return Err(format!("--lr {lr} must be a positive number"));
            }
        }
        Ok(match self.opt {
            OptArg::Sgd => Optimizer::Sgd { lr: lr.unwrap_or(0.1) },
            OptArg::Adamw => Optimizer::AdamW { lr: lr.unwrap_or(3e-3) },
        })
    }

    pub fn data(&self) -> Result<DataSource, String> {
        match (self.data, &self.text) {
            (DataArg::Text, Some(path)) => DataSource::from_text_file(path).map_err(|e| e.to_string()),
            (DataArg::Text, None) => Err("--data text needs --text FILE".into()),
            (_, Some(_)) => Err("--text FILE is only used with --data text: add --data text".into()),
            (DataArg::Formula, None) => Ok(DataSource::Formula),
            (DataArg::Copy, None) => Ok(DataSource::Copy),
            (DataArg::Reverse, None) => Ok(DataSource::Reverse),
            (DataArg::Modadd, None) => Ok(DataSource::ModAdd),
        }
    }

    pub fn rng_layout(&self) -> RngLayout {
        match (self.rng, self.preset) {
            (Some(RngArg::Original), _) | (None, Some(PresetArg::Seed)) => RngLayout::Original,
            (Some(RngArg::Partitionable), _) | (None, None) => RngLayout::Partitionable,
        }
    }

    /// Applies `--preset` to the model flags and the parallelism flags.
    pub fn apply_preset(&mut self, parallel: &mut ParallelArgs) {
        if self.preset == Some(PresetArg::Seed) {
            (self.layers, self.d_model, self.heads, self.seq, self.batch, self.vocab) = (2, 128, 4, 64, 32, 256);
            self.dropout = 0.1;
            self.tied = false;
            self.init = InitArg::Random;
            self.data = DataArg::Copy;
            self.text = None;
            parallel.strategy = Some(StrategyArg::Dp);
            parallel.mesh.get_or_insert_with(|| "dp=8".into());
            if parallel.mode == ModeArg::Single {
                parallel.mode = ModeArg::ShardMap;
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
pub enum ModeArg {
    /// The global program on one device.
    Single,
    /// A hand-written per-device body with explicit collectives (jax.shard_map).
    #[value(name = "shard_map")]
    ShardMap,
    /// The global program partitioned automatically from shardings (jax.jit with shardings).
    Auto,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum StrategyArg {
    Dp,
    Fsdp,
    Tp,
    #[value(name = "dp_tp")]
    DpTp,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum DropoutKeyArg {
    /// The same key on every device (masks repeat across "dp" shards).
    Same,
    /// fold_in(key, axis_index("dp")).
    #[value(name = "fold_in")]
    FoldIn,
}

/// How the step is partitioned over simulated devices.
#[derive(clap::Args, Clone)]
pub struct ParallelArgs {
    /// Partitioning mode.
    #[arg(long, value_enum, default_value_t = ModeArg::Single)]
    pub mode: ModeArg,
    /// Parallelism strategy (with --mode shard_map or auto; default dp).
    #[arg(long, value_enum)]
    pub strategy: Option<StrategyArg>,
    /// Device mesh, e.g. dp=4 or dp=2,tp=2 (default: dp=4 for dp and fsdp, tp=2, dp=2,tp=2).
    #[arg(long)]
    pub mesh: Option<String>,
    /// Dropout keys in shard_map mode (default same).
    #[arg(long = "dropout-key", value_enum)]
    pub dropout_key: Option<DropoutKeyArg>,
    /// With --mode auto: a parameter's sharding, overriding the strategy's, e.g.
    /// --spec 'w_fc=P(None,"tp")' (repeatable; a block parameter's short name applies to every block).
    #[arg(long = "spec", value_name = "NAME=SPEC")]
    pub specs: Vec<String>,
    /// Merge independent all-reduces into one (XLA's all-reduce combiner).
    #[arg(long = "combine-all-reduces")]
    pub combine_all_reduces: bool,
    /// With --mode auto: a file of NAME=SPEC lines (# starts a comment).
    #[arg(long = "spec-file", value_name = "FILE")]
    pub spec_file: Option<String>,
}

/// A `--spec` entry and where it came from (`--spec`, or `--spec-file FILE line N`).
pub struct SpecOverride {
    pub origin: String,
    pub name: String,
    pub spec: PartitionSpec,
}

impl ParallelArgs {
    /// `--spec` and `--spec-file` entries, parsed, each with its origin.
    pub fn spec_overrides(&self) -> Result<Vec<SpecOverride>, String> {
        let mut lines: Vec<(String, String)> = self.specs.iter().map(|s| ("--spec".to_string(), s.clone())).collect();
        if let Some(path) = &self.spec_file {
            let text = read_text_file("--spec-file", path, MAX_SPEC_FILE_BYTES).map_err(|e| e.to_string())?;
            for (n, line) in text.lines().enumerate() {
                let line = line.split('#').next().unwrap_or("").trim();
                if !line.is_empty() {
                    lines.push((format!("--spec-file {path} line {}", n + 1), line.to_string()));
                }
            }
        }
        lines
            .into_iter()
            .map(|(origin, entry)| {
                let (name, spec) = entry
                    .split_once('=')
                    .ok_or_else(|| format!("{origin}: `{entry}` is not NAME=SPEC, e.g. w_fc=P(None,'tp')"))?;
                let spec = PartitionSpec::parse(spec.trim()).map_err(|e| format!("{origin}: {e}"))?;
                Ok(SpecOverride {
                    origin,
                    name: name.trim().to_string(),
                    spec,
                })
            })
            .collect()
    }

    /// Flags the chosen mode would ignore are errors, not silently dropped.
    fn check_mode_flags(&self) -> Result<(), String> {
        if self.mode != ModeArg::Auto && (!self.specs.is_empty() || self.spec_file.is_some()) {
            return Err("--spec and --spec-file need --mode auto".into());
        }
        if self.mode != ModeArg::ShardMap && self.dropout_key.is_some() {
            return Err(
                "--dropout-key applies only to --mode shard_map (in automatic mode the partitioner derives the keys)"
                    .into(),
            );
        }
        if self.mode == ModeArg::Single {
            for (given, flag) in [
                (self.mesh.is_some(), "--mesh"),
                (self.strategy.is_some(), "--strategy"),
                (self.combine_all_reduces, "--combine-all-reduces"),
            ] {
                if given {
                    return Err(format!(
                        "{flag} needs --mode shard_map or --mode auto (--mode single runs one device)"
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn parallel(&self) -> Result<Parallel, String> {
        self.check_mode_flags()?;
        if self.mode == ModeArg::Single {
            return Ok(Parallel::None);
        }
        let strategy = match self.strategy.unwrap_or(StrategyArg::Dp) {
            StrategyArg::Dp => Strategy::Dp,
            StrategyArg::Fsdp => Strategy::Fsdp,
            StrategyArg::Tp => Strategy::Tp,
            StrategyArg::DpTp => Strategy::DpTp,
        };
        let text = self.mesh.clone().unwrap_or_else(|| strategy.example_mesh().to_string());
        let mesh = Mesh::parse(&text).map_err(|e| format!("--mesh {text}: {e}"))?;
        if self.mode == ModeArg::Auto {
            return Ok(Parallel::Auto {
                strategy,
                mesh,
                specs: self.spec_overrides()?.into_iter().map(|o| (o.name, o.spec)).collect(),
            });
        }
        Ok(Parallel::ShardMap {
            strategy,
            mesh,
            dropout_key: match self.dropout_key {
                Some(DropoutKeyArg::FoldIn) => DropoutKey::FoldIn,
                Some(DropoutKeyArg::Same) | None => DropoutKey::Same,
            },
        })
    }
}

/// Checks each `--spec` override against the model's parameters and the mesh, so an error
/// names the file and line it came from.
fn check_overrides(cfg: &GptConfig, mesh: &Mesh, overrides: &[SpecOverride]) -> Result<(), String> {
    let params = param_specs(cfg);
    let leaf = |name: &str| name.rsplit('.').next().unwrap_or(name).to_string();
    for o in overrides {
        let hits: Vec<_> = params
            .iter()
            .filter(|p| p.name == o.name || leaf(&p.name) == o.name)
            .collect();
        if hits.is_empty() {
            let mut names: Vec<String> = params.iter().map(|p| leaf(&p.name)).collect();
            names.sort();
            names.dedup();
            return Err(format!(
                "{}: there is no parameter `{}`; parameters are {}",
                o.origin,
                o.name,
                names.join(", ")
            ));
        }
        for p in hits {
            NamedSharding::new(mesh.clone(), o.spec.clone())
                .and_then(|s| s.shard_shape(&p.shape))
                .map_err(|e| {
                    format!(
                        "{}: {}={} for parameter `{}` {:?}: {e}",
                        o.origin, o.name, o.spec, p.name, p.shape
                    )
                })?;
        }
    }
    Ok(())
}

/// The trainer options the model and parallelism flags choose (after `--preset`), checked.
pub fn trainer_options(model: &ModelArgs, parallel: &ParallelArgs) -> Result<TrainerOptions, String> {
    let opts = TrainerOptions {
        config: model.config(),
        optimizer: model.optimizer()?,
        init: model.init(),
        data: model.data()?,
        seed: model.seed,
        rng_layout: model.rng_layout(),
        parallel: parallel.parallel()?,
        combine_all_reduces: parallel.combine_all_reduces,
    };
    opts.config.validate().map_err(|e| e.to_string())?;
    if let Parallel::Auto { mesh, .. } = &opts.parallel {
        check_overrides(&opts.config, mesh, &parallel.spec_overrides()?)?;
    }
    Ok(opts)
}
