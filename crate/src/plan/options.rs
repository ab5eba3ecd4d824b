//! What a run chooses: the model, data, optimizer and how the step is partitioned.
use super::{DropoutKey, Mode, Schedule, Strategy};
use crate::ir::{CpOrder, RngLayout};
use crate::model::{DataSource, GptConfig, Init, Optimizer};
use crate::sharding::{Mesh, PartitionSpec};

/// How the step is partitioned over simulated devices.
#[derive(Clone, Debug, PartialEq)]
pub enum Parallel {
    /// The global program on one device.
    None,
    /// A hand-written shard_map body.
    ShardMap {
        strategy: Strategy,
        mesh: Mesh,
        dropout_key: DropoutKey,
    },
    /// jit with shardings: the global step, partitioned automatically from the strategy's
    /// in/out shardings (the RNG layout is `TrainerOptions::rng_layout`).
    Auto {
        strategy: Strategy,
        mesh: Mesh,
        /// Specs overriding the strategy's (`--spec name=P(...)`), by name: a parameter's, an
        /// input's (`tokens`) or an intermediate's (`h0.att`); see [`super::resolve_spec`].
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
    /// How context parallelism (`--strategy cp`, `dp_cp`) lays the sequence's blocks over the
    /// "cp" devices; other strategies take the default, contiguous.
    pub cp_order: CpOrder,
    /// The order a pipeline (`--strategy pp`, `dp_pp`) runs its microbatches' passes in;
    /// other strategies take the default.
    pub schedule: Schedule,
}

impl Parallel {
    /// Simulated devices the step runs on.
    pub fn devices(&self) -> usize {
        match self {
            Parallel::None => 1,
            Parallel::ShardMap { mesh, .. } | Parallel::Auto { mesh, .. } => mesh.devices(),
        }
    }

    pub fn mode(&self) -> Mode {
        match self {
            Parallel::None => Mode::Single,
            Parallel::Auto { .. } => Mode::Auto,
            Parallel::ShardMap { .. } => Mode::ShardMap,
        }
    }

    /// The mode's name as the CLI's `--json` lines and the exported JAX scripts write it.
    pub fn mode_name(&self) -> &'static str {
        self.mode().name()
    }

    /// The strategy partitioning the step (None on one device).
    pub fn strategy(&self) -> Option<Strategy> {
        match self {
            Parallel::None => None,
            Parallel::ShardMap { strategy, .. } | Parallel::Auto { strategy, .. } => Some(*strategy),
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
        }
    }

    /// The same run in automatic mode and in shard_map mode, on this strategy and mesh (what
    /// `bench compare` races): the auto one keeps these options' spec overrides, the shard_map
    /// one their dropout key (else the same key on every device). None on one device.
    pub fn auto_and_shard_map(&self) -> Option<(TrainerOptions, TrainerOptions)> {
        let (strategy, mesh, specs, dropout_key) = match &self.parallel {
            Parallel::None => return None,
            Parallel::Auto { strategy, mesh, specs } => (*strategy, mesh, specs.clone(), DropoutKey::Same),
            Parallel::ShardMap {
                strategy,
                mesh,
                dropout_key,
            } => (*strategy, mesh, vec![], *dropout_key),
        };
        let with = |parallel| TrainerOptions {
            parallel,
            ..self.clone()
        };
        Some((
            with(Parallel::Auto {
                strategy,
                mesh: mesh.clone(),
                specs,
            }),
            with(Parallel::ShardMap {
                strategy,
                mesh: mesh.clone(),
                dropout_key,
            }),
        ))
    }
}
