//! What a run chooses: the model, data, optimizer and how the step is partitioned.
use super::{DropoutKey, Mode, Parallelism, Schedule, Strategy};
use crate::ir::{CpOrder, RngLayout};
use crate::model::{DataSource, GptConfig, Init, Optimizer};
use crate::sharding::{AxisType, AxisTypes, Mesh, PartitionSpec};

/// How the step is partitioned over simulated devices.
#[derive(Clone, Debug, PartialEq)]
pub enum Parallel {
    /// The global program on one device.
    None,
    /// A shard_map body composed from each mesh axis's collectives.
    ShardMap { par: Parallelism, dropout_key: DropoutKey },
    /// jit with shardings: the global step, partitioned automatically from the shardings the
    /// logical-axis rules give (the RNG layout is `TrainerOptions::rng_layout`).
    Auto {
        par: Parallelism,
        /// Specs overriding the rules' (`--spec name=P(...)`), by name: a parameter's, an
        /// input's (`tokens`) or an intermediate's (`h0.att`); see [`super::resolve_spec`].
        specs: Vec<(String, PartitionSpec)>,
    },
    /// Explicit sharding: the global step typed op by op with the rules' shardings on a mesh
    /// whose axes are Explicit but for those `axis_types` makes Auto, its choices written as a
    /// JAX user writes them (`out_sharding=`, `reshard`), then run as jit.
    Explicit {
        par: Parallelism,
        /// Axis types other than Explicit, by axis (`--axis-types tp=auto`).
        axis_types: Vec<(String, AxisType)>,
        /// Specs overriding the rules' (as `Auto`'s): a parameter's or an input's sharding, an
        /// intermediate's type (its op's `out_sharding=`, else a `reshard` after it).
        specs: Vec<(String, PartitionSpec)>,
    },
}

/// Everything `shardlab train` chooses.
#[derive(Clone, Debug)]
pub struct TrainerOptions {
    pub config: GptConfig,
    pub optimizer: Optimizer,
    pub init: Init,
    pub data: DataSource,
    pub seed: u64,
    pub rng_layout: RngLayout,
    pub parallel: Parallel,
    /// Run the all-reduce combiner on the step ([`crate::partition::combine_all_reduces`]):
    /// psums over the same axes with no reader in between become one collective.
    pub combine_all_reduces: bool,
    /// Gradient accumulation: the step runs forward and backward on this many equal slices
    /// of the batch in turn, sums their gradients and updates once (1: none).
    pub microbatches: usize,
    /// How context parallelism lays the sequence's blocks over the "cp" devices (meshes without
    /// "cp" take the default, contiguous).
    pub cp_order: CpOrder,
    /// The order a pipeline ("pp") runs its microbatches' passes in; meshes without "pp" take
    /// the default.
    pub schedule: Schedule,
    /// Virtual stages: the chunks of blocks each pipeline stage holds (1: one run of blocks).
    pub virtual_stages: usize,
    /// Blocks per pipeline stage, one count per stage (empty: equal stages).
    pub stage_layers: Vec<usize>,
}

impl Parallel {
    /// Simulated devices the step runs on.
    pub fn devices(&self) -> usize {
        match self {
            Parallel::None => 1,
            Parallel::ShardMap { par, .. } | Parallel::Auto { par, .. } | Parallel::Explicit { par, .. } => {
                par.devices()
            }
        }
    }

    /// The composition partitioning the step (None on one device).
    pub fn parallelism(&self) -> Option<&Parallelism> {
        match self {
            Parallel::None => None,
            Parallel::ShardMap { par, .. } | Parallel::Auto { par, .. } | Parallel::Explicit { par, .. } => Some(par),
        }
    }

    /// The mesh (None on one device).
    pub fn mesh(&self) -> Option<&Mesh> {
        self.parallelism().map(|p| &p.mesh)
    }

    pub fn mode(&self) -> Mode {
        match self {
            Parallel::None => Mode::Single,
            Parallel::Auto { .. } => Mode::Auto,
            Parallel::Explicit { .. } => Mode::Explicit,
            Parallel::ShardMap { .. } => Mode::ShardMap,
        }
    }

    /// The mode's name as the CLI's `--json` lines and the exported JAX scripts write it.
    pub fn mode_name(&self) -> &'static str {
        self.mode().name()
    }

    /// The named strategy the composition is, if any (None on one device, and for a
    /// composition no preset names).
    pub fn strategy(&self) -> Option<Strategy> {
        self.parallelism().and_then(Strategy::of)
    }

    /// What partitions the step, in a word: the strategy's name, else the mesh (`dp=2,tp=2,pp=2`),
    /// `single` on one device.
    pub fn label(&self) -> String {
        match (self.strategy(), self.parallelism()) {
            (Some(s), _) => s.name().to_string(),
            (None, Some(par)) => par.name(),
            (None, None) => "single".into(),
        }
    }

    /// The mesh axes' types: every axis Auto in automatic mode, Manual in shard_map mode (the
    /// body is per device over all of them), Explicit in explicit mode but for those set Auto.
    /// None on one device; an axis type naming an axis the mesh lacks is the error.
    pub fn axis_types(&self) -> Option<Result<AxisTypes, String>> {
        match self {
            Parallel::None => None,
            Parallel::Auto { par, .. } => Some(Ok(AxisTypes::all(&par.mesh, AxisType::Auto))),
            Parallel::ShardMap { par, .. } => Some(Ok(AxisTypes::all(&par.mesh, AxisType::Manual))),
            Parallel::Explicit { par, axis_types, .. } => Some(AxisTypes::new(&par.mesh, axis_types)),
        }
    }
}

impl TrainerOptions {
    /// A run of `config` partitioned by `parallel`, with the defaults of a run: AdamW at 3e-3
    /// (the CLI's and the page's), seeded random init, the copy task, seed 0, the
    /// partitionable RNG layout, no all-reduce combiner, no gradient accumulation.
    pub fn new(config: GptConfig, parallel: Parallel) -> Self {
        TrainerOptions {
            config,
            optimizer: Optimizer::AdamW { lr: 3e-3 },
            init: Init::Random { seed: 0 },
            data: DataSource::Copy,
            seed: 0,
            rng_layout: RngLayout::Partitionable,
            parallel,
            combine_all_reduces: false,
            microbatches: 1,
            cp_order: CpOrder::Contiguous,
            schedule: Schedule::Gpipe,
            virtual_stages: 1,
            stage_layers: vec![],
        }
    }

    /// The pipeline's schedule and layout, as the options say.
    pub fn pipeline(&self) -> super::PipelinePlan {
        super::PipelinePlan {
            schedule: self.schedule,
            chunks: self.virtual_stages,
            stage_layers: self.stage_layers.clone(),
        }
    }

    /// The same run in each of JAX's three modes on this composition, in
    /// [`Mode::PARTITIONED`]'s order (what `bench compare` races): automatic and explicit mode
    /// keep these options' spec overrides (and explicit mode its axis types), shard_map mode
    /// their dropout key (else the same key on every device). None on one device.
    pub fn in_every_mode(&self) -> Option<[TrainerOptions; 3]> {
        let (par, specs, axis_types, dropout_key) = match &self.parallel {
            Parallel::None => return None,
            Parallel::Auto { par, specs } => (par, specs.clone(), vec![], DropoutKey::Same),
            Parallel::Explicit { par, axis_types, specs } => (par, specs.clone(), axis_types.clone(), DropoutKey::Same),
            Parallel::ShardMap { par, dropout_key } => (par, vec![], vec![], *dropout_key),
        };
        let with = |parallel: Parallel| TrainerOptions {
            parallel,
            ..self.clone()
        };
        Some([
            with(Parallel::Auto {
                par: par.clone(),
                specs: specs.clone(),
            }),
            with(Parallel::Explicit {
                par: par.clone(),
                axis_types,
                specs,
            }),
            with(Parallel::ShardMap {
                par: par.clone(),
                dropout_key,
            }),
        ])
    }
}
