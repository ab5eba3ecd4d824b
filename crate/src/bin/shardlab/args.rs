//! Flags shared by the commands that build a run (`train`, `inspect`, `bench compare`, `plan`,
//! `export`): the model, data and optimizer, the partitioning, and the memory budget of those
//! that run steps here.
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::ValueEnum;
use shardlab::exec::Backend;
use shardlab::ir::{CpOrder, Precision, RngLayout};
use shardlab::model::{
    param_specs, read_text_file, train_step_program, Attention, Capacity, DataSource, GptConfig, Init, Moe, Optimizer,
    Remat,
};
use shardlab::plan::{
    binary_bytes, explicit_axis_types, parse_axis_types, parse_size, resolve_spec, AxisKind, DropoutKey, MemoryLimits,
    Mode, Parallel, Parallelism, Preset, Schedule, Strategy, TrainerOptions, Zero, DEFAULT_BUDGET_BYTES,
};
use shardlab::setting::Setting;
use shardlab::sharding::{Mesh, PartitionSpec};

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

/// A flag whose values are a core enum's names (`RngLayout::name`, ...), parsed into the enum
/// itself, so the CLI and the page read the same names into the same type.
pub fn one_of<T: Copy + Send + Sync + 'static>(
    all: &'static [T],
    name: fn(T) -> &'static str,
    help: fn(T) -> &'static str,
) -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(all.iter().map(move |v| PossibleValue::new(name(*v)).help(help(*v)))).map(move |text| {
        all.iter()
            .copied()
            .find(|v| name(*v) == text)
            .expect("one of the possible values")
    })
}

fn parse_capacity(text: &str) -> Result<Capacity, String> {
    Capacity::parse(text).ok_or_else(|| format!("'{text}' is neither a factor (e.g. 1.25) nor `dropless`"))
}

fn attention_help(a: Attention) -> &'static str {
    match a {
        Attention::Fused => {
            "dot_product_attention: the probabilities recomputed in the backward from a saved log-sum-exp"
        }
        Attention::Unfused => "dot_general, softmax, dropout, dot_general: every T x T array held for the backward",
    }
}

fn remat_help(r: Remat) -> &'static str {
    match r {
        Remat::None => "no jax.checkpoint: every activation held for the backward pass",
        Remat::Full => "jax.checkpoint(block, policy=nothing_saveable): each block's input held, the rest recomputed",
        Remat::Dots => {
            "jax.checkpoint(block, policy=dots_with_no_batch_dims_saveable): each block's input and weight matmuls held"
        }
    }
}

pub fn precision_help(p: Precision) -> &'static str {
    match p {
        Precision::F32 => "float32 everywhere (what the sandbox trains in)",
        Precision::Bf16 => {
            "mixed precision: bfloat16 compute, activations and gradients; float32 master weights and optimizer state"
        }
    }
}

/// `--precision`, for the commands that price or export a run (`plan`, `export jax`): the
/// sandbox itself trains f32, so `train` and `bench` do not take it.
#[derive(clap::Args, Clone)]
pub struct PrecisionArg {
    /// The dtype policy: f32, or bf16 mixed precision (bf16 compute, f32 master weights and
    /// optimizer state), as a real run uses it. The sandbox itself trains in f32.
    #[arg(long, value_parser = one_of(&Precision::ALL, Precision::name, precision_help), default_value = "f32")]
    pub precision: Precision,
}

/// `--memory-budget`, on the commands that run steps on this machine (`train`, `inspect`,
/// `bench compare`); `plan` and `export` run nothing here (`plan` checks a device preset's own
/// memory), so they do not take it.
#[derive(clap::Args, Clone, Copy, Default)]
pub struct MemoryBudgetArg {
    #[arg(long = "memory-budget", value_name = "SIZE", value_parser = parse_size, help = memory_budget_help())]
    pub memory_budget: Option<u64>,
}

fn memory_budget_help() -> String {
    format!(
        "What all simulated devices of the run may hold at once on this GPU (this machine with --cpu), \
         e.g. 80GiB, 100G, 512MiB, 80GB or bytes (default {}: wgpu does not report a GPU's memory, so raise it on a \
         GPU with more)",
        binary_bytes(DEFAULT_BUDGET_BYTES)
    )
}

impl MemoryBudgetArg {
    /// The flag as the budget errors name it.
    const FLAG: &'static str = "--memory-budget";

    /// What a step on `backend` must fit: its limits, with the budget this flag sets.
    pub fn limits(self, backend: &Backend) -> MemoryLimits {
        backend.memory_limits().with_budget_flag(Self::FLAG, self.memory_budget)
    }
}

fn rng_help(l: RngLayout) -> &'static str {
    match l {
        RngLayout::Original => "jax_threefry_partitionable=False: only the global array of bits can be made",
        RngLayout::Partitionable => "jax_threefry_partitionable=True: each device makes its own block",
    }
}

fn mode_help(m: Mode) -> &'static str {
    match m {
        Mode::Single => "The global program on one device",
        Mode::ShardMap => "A hand-written per-device body with explicit collectives (jax.shard_map)",
        Mode::Auto => "The global program partitioned automatically from shardings (jax.jit with shardings)",
        Mode::Explicit => {
            "The global program typed with its shardings (Explicit mesh axes): JAX's sharding rules op by op, \
             out_sharding= and reshard where the program chooses"
        }
    }
}

fn strategy_help(s: Strategy) -> &'static str {
    match s {
        Strategy::Dp => "Data parallelism over 'dp'",
        Strategy::Fsdp => "Parameters and optimizer state split over 'fsdp' (ZeRO-3)",
        Strategy::Zero1 => "ZeRO-1: data parallelism with the optimizer state split over 'dp'",
        Strategy::Zero2 => "ZeRO-2: data parallelism with the optimizer state and gradients split over 'dp'",
        Strategy::Tp => "Megatron tensor parallelism over 'tp'",
        Strategy::DpTp => "Both, on a mesh with 'dp' and 'tp'",
        Strategy::Cp => "Context parallelism over 'cp': the sequence split, ring attention in shard_map mode",
        Strategy::DpCp => "Data and context parallelism, on a mesh with 'dp' and 'cp'",
        Strategy::TpSp => "Megatron tensor parallelism over 'tp' with sequence parallelism",
        Strategy::Pp => "Pipeline parallelism over 'pp': the blocks in stages, microbatches passed by ppermute",
        Strategy::DpPp => "Data and pipeline parallelism, on a mesh with 'dp' and 'pp'",
    }
}

fn schedule_help(s: Schedule) -> &'static str {
    match s {
        Schedule::Gpipe => "Every microbatch's forward, then every backward (holds M microbatches' activations)",
        Schedule::OneFOneB => {
            "Megatron's: a warm-up of pp-s-1 forwards, then one forward and one backward (holds at most pp \
             microbatches); interleaved with --virtual-stages"
        }
        Schedule::ZbH1 => {
            "Zero-bubble ZB-H1: 1F1B with each backward split into input (B) and weight (W) gradients, the W passes \
             filling the drain"
        }
    }
}

fn cp_order_help(o: CpOrder) -> &'static str {
    match o {
        CpOrder::Contiguous => "Device r holds block r of the sequence (the last device has the most causal work)",
        CpOrder::Zigzag => "Device r holds chunks r and 2cp-1-r of 2cp (every device the same causal work)",
    }
}

fn dropout_key_help(k: DropoutKey) -> &'static str {
    match k {
        DropoutKey::Same => "The same key on every device (masks repeat across the batch's shards)",
        DropoutKey::FoldIn => "fold_in(key, axis_index of the batch axes): each shard its own masks",
        DropoutKey::Global => "Each device draws its block of the global masks: the one-device run's",
    }
}

fn zero_help(z: Zero) -> &'static str {
    match z {
        Zero::Off => "Everything replicated over 'dp'",
        Zero::One => "ZeRO-1: the optimizer state split over 'dp'",
        Zero::Two => "ZeRO-2: the optimizer state and the gradients split over 'dp'",
    }
}

fn preset_help(p: Preset) -> &'static str {
    match p {
        Preset::Seed => "The JAX report's run: dp on 8 devices, width 128, dropout 0.1",
        Preset::Dp => "Data parallelism on dp=4, width 64, dropout 0.1",
        Preset::Zero1 => "ZeRO-1 on dp=4, width 64, dropout 0.1",
        Preset::Zero2 => "ZeRO-2 on dp=4, width 64, dropout 0.1",
        Preset::Fsdp => "FSDP on dp=4, width 64, dropout 0.1",
        Preset::Tp => "Tensor parallelism on tp=2, width 64, dropout 0.1",
        Preset::DpTp => "Both on dp=2,tp=2, width 64, dropout 0.1",
        Preset::Cp => "Long context: context parallelism on cp=4, sequence 256, batch 2, width 64, dropout 0.1",
        Preset::TpSp => "Tensor and sequence parallelism on tp=2, width 64, dropout 0.1",
        Preset::Pp => {
            "Pipeline: 4 layers in 4 stages on pp=4, 4 microbatches (GPipe), width 64, dropout 0.1; shard_map mode"
        }
        Preset::Moe => {
            "Mixture of experts: 4 experts of width 128, top-2, capacity 1.25, on dp=2,ep=2, width 64, dropout 0.1"
        }
    }
}

#[derive(clap::Args, Clone)]
pub struct ModelArgs {
    /// Transformer blocks.
    #[arg(long, default_value_t = 2, conflicts_with = "preset")]
    pub layers: usize,
    /// Width of the residual stream (d).
    #[arg(long = "d-model", default_value_t = 64, conflicts_with = "preset")]
    pub d_model: usize,
    /// Attention heads (must divide d-model).
    #[arg(long, default_value_t = 4, conflicts_with = "preset")]
    pub heads: usize,
    /// Sequence length T.
    #[arg(long, default_value_t = 32, conflicts_with = "preset")]
    pub seq: usize,
    /// Batch size B.
    #[arg(long, default_value_t = 8, conflicts_with = "preset")]
    pub batch: usize,
    /// Vocabulary size V.
    #[arg(long, default_value_t = 32, conflicts_with = "preset")]
    pub vocab: usize,
    /// Share the LM head with the token embedding.
    #[arg(long, conflicts_with = "preset")]
    pub tied: bool,
    /// Dropout rate (0 = off).
    #[arg(long, default_value_t = 0.0, conflicts_with = "preset")]
    pub dropout: f32,
    /// How attention runs: one fused op (no T x T array held), or its four unfused ops.
    #[arg(long, value_parser = one_of(&Attention::ALL, Attention::name, attention_help), default_value = "fused")]
    pub attention: Attention,

    /// Mixture of experts: E experts in every block in place of the dense MLP (0 = dense).
    #[arg(long, default_value_t = 0, conflicts_with = "preset")]
    pub experts: usize,
    /// Experts each token is routed to (default 2, at most --experts).
    #[arg(long = "top-k", requires = "experts")]
    pub top_k: Option<usize>,
    /// Each expert's hidden units (default 4 x d-model, the dense MLP's).
    #[arg(long = "expert-width", requires = "experts")]
    pub expert_width: Option<usize>,
    /// Slots per expert and sequence: a factor of the even share (ceil(factor x T x k / E),
    /// the choices past them dropped in GShard's order; default 1.25, Switch's), or `dropless`.
    #[arg(long, value_parser = parse_capacity, requires = "experts", allow_negative_numbers = true)]
    pub capacity: Option<Capacity>,
    /// Switch's load-balancing loss coefficient (default 0.01).
    #[arg(long = "aux-loss", requires = "experts", allow_negative_numbers = true)]
    pub aux_loss: Option<f32>,
    /// What the cost model assumes of routing: the busiest expert-parallel device's routed
    /// tokens over the mean (default 1.25; 1 for routing forced even). The capacity caps it.
    #[arg(long = "expert-imbalance", requires = "experts", allow_negative_numbers = true)]
    pub expert_imbalance: Option<f32>,

    /// Rematerialization: which activations each block's backward pass recomputes.
    #[arg(long, value_parser = one_of(&Remat::ALL, Remat::name, remat_help), default_value = "none")]
    pub remat: Remat,
    /// Parameter init: docs/MODEL.md's formula, or seeded random.
    #[arg(long, value_enum, default_value_t = InitArg::Random, conflicts_with = "preset")]
    pub init: InitArg,
    /// Training data.
    #[arg(long, value_enum, default_value_t = DataArg::Copy, conflicts_with = "preset")]
    pub data: DataArg,
    /// Text file for --data text (character level).
    #[arg(long, value_name = "FILE", conflicts_with = "preset")]
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
    /// default partitionable (original with a --preset).
    #[arg(long, value_parser = one_of(&RngLayout::ALL, RngLayout::name, rng_help))]
    pub rng: Option<RngLayout>,
    /// A named setup, the page's presets: `seed` is the JAX report's data-parallel run (dp on 8
    /// devices, dropout 0.1, original RNG layout, layers 2, d-model 128, heads 4, seq 64, batch
    /// 32, vocab 256); the others are its strategies on a smaller model. It replaces the model
    /// flags (given with it, they are refused rather than ignored) and the strategy; --rng,
    /// --mesh, --mode, --microbatches and --steps still apply.
    #[arg(long, value_parser = one_of(&Preset::ALL, Preset::name, preset_help))]
    pub preset: Option<Preset>,
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
            attention: self.attention,
            remat: self.remat,
            precision: Default::default(),
            moe: self.moe(),
        }
    }

    /// The mixture of experts the flags ask for (None: dense); the core checks its settings.
    fn moe(&self) -> Option<Moe> {
        if self.experts == 0 {
            return None;
        }
        let m = Moe::new(self.experts, self.d_model);
        Some(Moe {
            top_k: self.top_k.unwrap_or(m.top_k),
            width: self.expert_width.unwrap_or(m.width),
            capacity: self.capacity.unwrap_or(m.capacity),
            aux: self.aux_loss.unwrap_or(m.aux),
            imbalance: self.expert_imbalance.unwrap_or(m.imbalance),
            ..m
        })
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
            (Some(layout), _) => layout,
            (None, Some(preset)) => preset.rng_layout(),
            (None, None) => RngLayout::Partitionable,
        }
    }

    /// Applies `--preset` to the model flags and the parallelism flags.
    pub fn apply_preset(&mut self, parallel: &mut ParallelArgs) {
        if let Some(preset) = self.preset {
            let c = preset.config();
            (self.layers, self.d_model, self.heads, self.seq, self.batch, self.vocab) =
                (c.layers, c.d_model, c.heads, c.seq, c.batch, c.vocab);
            self.dropout = c.dropout;
            self.tied = c.tied;
            self.init = InitArg::Random;
            self.data = DataArg::Copy;
            self.text = None;
            if let Some(moe) = c.moe {
                (self.experts, self.top_k, self.expert_width) = (moe.experts, Some(moe.top_k), Some(moe.width));
                (self.capacity, self.aux_loss) = (Some(moe.capacity), Some(moe.aux));
            }
            parallel.strategy = preset.strategy();
            parallel.mesh.get_or_insert_with(|| preset.mesh().into());
            parallel.microbatches.get_or_insert(preset.microbatches());
            if parallel.mode == Mode::Single {
                parallel.mode = Mode::ShardMap;
            }
        }
    }
}

/// How the step is partitioned over simulated devices.
#[derive(clap::Args, Clone)]
pub struct ParallelArgs {
    /// Partitioning mode.
    #[arg(long, value_parser = one_of(&Mode::ALL, Mode::name, mode_help), default_value = "single")]
    pub mode: Mode,
    /// A named composition (with --mode shard_map, auto or explicit): its mesh axes and their
    /// options.
    /// Without it, --mesh alone composes any axes.
    #[arg(long, value_parser = one_of(&Strategy::ALL, Strategy::name, strategy_help))]
    pub strategy: Option<Strategy>,
    /// Device mesh: any of the axes dp (the batch), fsdp (the batch, and the parameters with
    /// their optimizer state), tp (heads and MLP columns), cp (the sequence), pp (the blocks
    /// into stages) and ep (a mixture's experts, and the batch), in any order and sizes that divide the model, e.g. dp=2,tp=2,pp=2
    /// (default dp=4, or --strategy's example).
    #[arg(long)]
    pub mesh: Option<String>,
    /// ZeRO's stage on the 'dp' axis: 1 splits the optimizer state, 2 the gradients too
    /// (default 0; stage 3 is an 'fsdp' axis).
    #[arg(long, value_parser = one_of(&Zero::ALL, Zero::name, zero_help))]
    pub zero: Option<Zero>,
    /// Megatron sequence parallelism on the 'tp' axis: the layer-norm and dropout regions
    /// split on the sequence.
    #[arg(long = "sequence-parallel")]
    pub sequence_parallel: bool,
    /// With a 'cp' axis: how the sequence's blocks lie on the ring (default contiguous).
    #[arg(long = "cp-order", value_parser = one_of(&CpOrder::ALL, CpOrder::name, cp_order_help))]
    pub cp_order: Option<CpOrder>,
    /// With a 'pp' axis: the order of the microbatches' passes (default gpipe).
    #[arg(long, value_parser = one_of(&Schedule::ALL, Schedule::name, schedule_help))]
    pub schedule: Option<Schedule>,
    /// With a 'pp' axis: chunks of blocks per stage, interleaved over the stages (Megatron's
    /// virtual pipeline stages, MaxText's pipeline repeats; default 1). The bubble shrinks to
    /// (pp-1)/(v*M) of the ideal step.
    #[arg(long = "virtual-stages", value_name = "V")]
    pub virtual_stages: Option<usize>,
    /// With a 'pp' axis: blocks per stage, one count per stage, e.g. 5,6,6,5 (default equal
    /// stages): a lighter last stage balances the head. With virtual stages, one count per
    /// virtual stage in model order may be given instead (0 for a chunk that only embeds or
    /// only runs the head).
    #[arg(long = "stage-layers", value_name = "COUNTS")]
    pub stage_layers: Option<String>,
    /// Dropout keys in shard_map mode (default same).
    #[arg(long = "dropout-key", value_parser = one_of(&DropoutKey::ALL, DropoutKey::name, dropout_key_help))]
    pub dropout_key: Option<DropoutKey>,
    /// With --mode auto or explicit: a sharding overriding the strategy's, e.g. --spec
    /// 'w_fc=P(None,"tp")' (repeatable): a parameter's (a block parameter's short name applies to
    /// every block), an input's (tokens) or an intermediate's as the program text names it
    /// (h0.att), which becomes a with_sharding_constraint (auto) or its type: its op's
    /// out_sharding=, else a reshard after it (explicit).
    #[arg(long = "spec", value_name = "NAME=SPEC")]
    pub specs: Vec<String>,
    /// With --mode explicit: mesh axes of another type than Explicit, e.g. --axis-types tp=auto
    /// (Auto: left to the compiler's propagation, absent from the types; Manual is shard_map's).
    #[arg(long = "axis-types", value_name = "AXIS=TYPE,...")]
    pub axis_types: Option<String>,
    /// Merge independent all-reduces into one (XLA's all-reduce combiner).
    #[arg(long = "combine-all-reduces")]
    pub combine_all_reduces: bool,
    /// Gradient accumulation: forward and backward on this many equal slices of the batch
    /// (of each data-parallel shard's rows) in turn, one update (default 1: none; a --preset's
    /// own, 4 for pp). With a 'pp' axis: the microbatches through the pipeline.
    #[arg(long)]
    pub microbatches: Option<usize>,
    /// With --mode auto or explicit: a file of NAME=SPEC lines (# starts a comment).
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
    /// `--stage-layers 5,6,6,5` as counts (none: equal stages); whether they fit the mesh is
    /// the plan's to check.
    pub fn stage_layers(&self) -> Result<Vec<usize>, String> {
        let Some(text) = &self.stage_layers else {
            return Ok(vec![]);
        };
        shardlab::plan::parse_stage_layers(text).map_err(|e| format!("--stage-layers {text}: {e}"))
    }

    /// `--spec` and `--spec-file` entries, parsed, each with its origin.
    pub fn spec_overrides(&self) -> Result<Vec<SpecOverride>, String> {
        let mut lines: Vec<(String, String)> = self.specs.iter().map(|s| ("--spec".to_string(), s.clone())).collect();
        if let Some(path) = &self.spec_file {
            let text = read_text_file(Setting::SpecFile, path, MAX_SPEC_FILE_BYTES).map_err(|e| e.to_string())?;
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
        if !matches!(self.mode, Mode::Auto | Mode::Explicit) && (!self.specs.is_empty() || self.spec_file.is_some()) {
            return Err("--spec and --spec-file need --mode auto or --mode explicit".into());
        }
        if self.mode != Mode::Explicit && self.axis_types.is_some() {
            return Err(
                "--axis-types needs --mode explicit: automatic mode's mesh axes are all Auto, shard_map's body is \
                 written per device over all of them (Manual)"
                    .into(),
            );
        }
        if self.mode != Mode::ShardMap && self.dropout_key.is_some() {
            return Err(
                "--dropout-key applies only to --mode shard_map (in automatic mode the partitioner derives the keys)"
                    .into(),
            );
        }
        if self.strategy.is_some() && (self.zero.is_some() || self.sequence_parallel) {
            return Err(
                "--strategy names a composition with its own ZeRO stage and sequence parallelism: give --mesh with \
                 --zero or --sequence-parallel instead (e.g. --mesh dp=4 --zero 1), or --strategy alone"
                    .into(),
            );
        }
        if self.mode == Mode::Single {
            for (given, flag) in [
                (self.mesh.is_some(), "--mesh"),
                (self.strategy.is_some(), "--strategy"),
                (self.zero.is_some(), "--zero"),
                (self.sequence_parallel, "--sequence-parallel"),
                (self.combine_all_reduces, "--combine-all-reduces"),
            ] {
                if given {
                    return Err(format!(
                        "{flag} needs --mode shard_map, auto or explicit (--mode single runs one device)"
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn parallel(&self) -> Result<Parallel, String> {
        self.check_mode_flags()?;
        if self.mode == Mode::Single {
            return Ok(Parallel::None);
        }
        let text = match (&self.mesh, self.strategy) {
            (Some(m), _) => m.clone(),
            (None, Some(s)) => s.example_mesh().to_string(),
            (None, None) => Strategy::Dp.example_mesh().to_string(),
        };
        let mesh = Mesh::parse(&text).map_err(|e| format!("--mesh {text}: {e}"))?;
        let par = match self.strategy {
            Some(s) => s.compose(&mesh),
            None => Parallelism::new(mesh, self.zero.unwrap_or_default(), self.sequence_parallel),
        }
        .map_err(|e| e.to_string())?;
        // A flag given for an axis the mesh lacks would be ignored: refused, even at its default.
        for (given, flag, kind, axis) in [
            (
                self.schedule.is_some(),
                "--schedule",
                "a pipeline's microbatches",
                AxisKind::Pp,
            ),
            (
                self.cp_order.is_some(),
                "--cp-order",
                "context parallelism's blocks",
                AxisKind::Cp,
            ),
        ] {
            if given && !par.has(axis) {
                return Err(format!(
                    "{flag} orders {kind}, and --mesh {} has no '{}' axis: add one (e.g. --mesh {}={})",
                    par.name(),
                    axis.name(),
                    axis.name(),
                    if axis == AxisKind::Pp { 2 } else { 4 }
                ));
            }
        }
        let specs = || -> Result<Vec<(String, PartitionSpec)>, String> {
            Ok(self.spec_overrides()?.into_iter().map(|o| (o.name, o.spec)).collect())
        };
        if self.mode == Mode::Auto {
            return Ok(Parallel::Auto { par, specs: specs()? });
        }
        if self.mode == Mode::Explicit {
            let given = match &self.axis_types {
                Some(text) => parse_axis_types(text).map_err(|e| e.to_string())?,
                None => vec![],
            };
            explicit_axis_types(&par, &given).map_err(|e| e.to_string())?;
            return Ok(Parallel::Explicit {
                par,
                axis_types: given,
                specs: specs()?,
            });
        }
        Ok(Parallel::ShardMap {
            par,
            dropout_key: self.dropout_key.unwrap_or(DropoutKey::Same),
        })
    }
}

/// Checks each `--spec` override as the planner will match it ([`resolve_spec`]: a
/// parameter, an input or an intermediate of the global step), so an error names the file and
/// line it came from.
fn check_overrides(opts: &TrainerOptions, mesh: &Mesh, overrides: &[SpecOverride]) -> Result<(), String> {
    let global = train_step_program(&opts.config, opts.optimizer, opts.rng_layout).map_err(|e| e.to_string())?;
    let params = param_specs(&opts.config);
    for o in overrides {
        resolve_spec(&params, &global.program, mesh, &o.name, &o.spec).map_err(|e| {
            let e = e.to_string();
            let own = format!("--spec {}={}", o.name, o.spec);
            match e.strip_prefix(&own) {
                Some(rest) => format!("{}: {}={}{rest}", o.origin, o.name, o.spec),
                None => format!("{}: {e}", o.origin),
            }
        })?;
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
        microbatches: parallel.microbatches.unwrap_or(1),
        cp_order: parallel.cp_order.unwrap_or_default(),
        schedule: parallel.schedule.unwrap_or_default(),
        virtual_stages: parallel.virtual_stages.unwrap_or(1),
        stage_layers: parallel.stage_layers()?,
    };
    opts.config.validate().map_err(|e| e.to_string())?;
    if let Parallel::Auto { par, .. } | Parallel::Explicit { par, .. } = &opts.parallel {
        check_overrides(&opts, &par.mesh, &parallel.spec_overrides()?)?;
    }
    Ok(opts)
}
