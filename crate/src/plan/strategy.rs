//! The named strategies, each a preset of the composition ([`Parallelism`]): its axes and their
//! options, in one table. The names stay for the CLI (`--strategy`), the page and links. Also
//! the step's other choices: the mode, the pipeline's schedule and the dropout key.
use super::axes::{AxisKind, Zero};
use super::{Parallelism, PlanError};
use crate::setting::{Refusal, Setting};
use crate::sharding::Mesh;

/// A named composition, as the CLI (`--strategy`), the page and links name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Params replicated, batch split over "dp", pmean of the gradients.
    Dp,
    /// Params and optimizer state split over "fsdp" (ZeRO-3): all_gather before use,
    /// psum_scatter of grads.
    Fsdp,
    /// ZeRO-1: data parallelism with the optimizer state split over "dp": gradients all-reduced,
    /// each device updates its block of every parameter, all_gather of the updated blocks.
    Zero1,
    /// ZeRO-2: ZeRO-1 with the gradients split too: reduce-scattered as each is made, so each
    /// device holds only its block of them.
    Zero2,
    /// Megatron over "tp": attention heads and MLP columns split, psum after the row-parallel
    /// projections.
    Tp,
    /// Both, on a 2-D mesh {dp, tp}.
    DpTp,
    /// Context parallelism over "cp": the sequence split, every device holding its block of
    /// every activation; attention is ring attention in shard_map mode (K and V travel the
    /// ring by ppermute), and K and V all-gathered by the partitioner in automatic mode.
    Cp,
    /// Data and context parallelism on a 2-D mesh {dp, cp}.
    DpCp,
    /// Megatron tensor parallelism with sequence parallelism (Korthikanti et al., 2022): the
    /// layer-norm and dropout regions between the column- and row-parallel matmuls split on
    /// the sequence over the same "tp" axis, each all-reduce becoming a reduce-scatter and an
    /// all-gather.
    TpSp,
    /// Pipeline parallelism over "pp": the blocks split into contiguous stages, microbatches
    /// passed stage to stage by ppermute (activations forward, their gradients backward).
    Pp,
    /// Data and pipeline parallelism on a 2-D mesh {dp, pp}.
    DpPp,
}

impl Strategy {
    pub const ALL: [Strategy; 11] = [
        Strategy::Dp,
        Strategy::Zero1,
        Strategy::Zero2,
        Strategy::Fsdp,
        Strategy::Tp,
        Strategy::DpTp,
        Strategy::Cp,
        Strategy::DpCp,
        Strategy::TpSp,
        Strategy::Pp,
        Strategy::DpPp,
    ];

    /// The name the CLI (`--strategy`), the page and the exported scripts use.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Dp => "dp",
            Strategy::Fsdp => "fsdp",
            Strategy::Zero1 => "zero1",
            Strategy::Zero2 => "zero2",
            Strategy::Tp => "tp",
            Strategy::DpTp => "dp_tp",
            Strategy::Cp => "cp",
            Strategy::DpCp => "dp_cp",
            Strategy::TpSp => "tp_sp",
            Strategy::Pp => "pp",
            Strategy::DpPp => "dp_pp",
        }
    }

    pub fn parse(name: &str) -> Option<Strategy> {
        Strategy::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The mesh axes the strategy composes.
    pub fn axes(self) -> &'static [AxisKind] {
        self.preset().axes
    }

    /// A mesh the strategy runs on, as `--mesh` takes it (the CLI's default).
    pub fn example_mesh(self) -> &'static str {
        self.preset().example_mesh
    }

    /// The composition the strategy names on `mesh`, whose axes must be the strategy's
    /// ([`Strategy::axes`]): `fsdp` is its data axis named "fsdp" (the old `--mesh dp=N` reads
    /// as `fsdp=N`), `zero1` and `zero2` set ZeRO's stage on "dp", `tp_sp` sequence parallelism
    /// on "tp". The others are their axes as they are.
    pub fn compose(self, mesh: &Mesh) -> Result<Parallelism, PlanError> {
        let preset = self.preset();
        let mut names: Vec<&str> = mesh.axis_names();
        // The old fsdp mesh named its data axis "dp".
        if self == Strategy::Fsdp && names == ["dp"] {
            let mesh = Mesh::new(&[("fsdp", mesh.devices())])?;
            return Parallelism::new(mesh, preset.zero, preset.sequence_parallel);
        }
        names.sort_unstable();
        let mut want: Vec<&str> = preset.axes.iter().map(|k| k.name()).collect();
        want.sort_unstable();
        if names != want {
            let why = format!(
                "names a mesh of {}, and {} has {}: use e.g. {}, or give {} without {} to compose any axes",
                quoted(&want),
                Setting::Mesh.at(super::mesh_text(mesh)),
                quoted(&names),
                Setting::Mesh.at(self.example_mesh()),
                Setting::Mesh.named(),
                Setting::Strategy.named()
            );
            return Err(Refusal::at(Setting::Strategy, self.name(), why).into());
        }
        Parallelism::new(mesh.clone(), preset.zero, preset.sequence_parallel)
    }

    /// The named strategy that `par` is, if any: the name the page, links and tables show.
    pub fn of(par: &Parallelism) -> Option<Strategy> {
        let mut kinds = par.kinds();
        kinds.sort_unstable();
        Strategy::ALL.into_iter().find(|s| {
            let p = s.preset();
            let mut axes = p.axes.to_vec();
            axes.sort_unstable();
            axes == kinds && p.zero == par.zero && p.sequence_parallel == par.sequence_parallel
        })
    }

    fn preset(self) -> StrategyPreset {
        PRESETS
            .iter()
            .find(|p| p.strategy == self)
            .copied()
            .expect("every strategy has a row of PRESETS")
    }
}

/// A named strategy as a composition: its axes and their options.
#[derive(Clone, Copy)]
struct StrategyPreset {
    strategy: Strategy,
    axes: &'static [AxisKind],
    zero: Zero,
    sequence_parallel: bool,
    /// A mesh it runs on, as `--mesh` takes it.
    example_mesh: &'static str,
}

const fn preset(
    strategy: Strategy,
    axes: &'static [AxisKind],
    zero: Zero,
    sequence_parallel: bool,
    example_mesh: &'static str,
) -> StrategyPreset {
    StrategyPreset {
        strategy,
        axes,
        zero,
        sequence_parallel,
        example_mesh,
    }
}

/// The named strategies, each one composition.
const PRESETS: [StrategyPreset; 11] = [
    preset(Strategy::Dp, &[AxisKind::Dp], Zero::Off, false, "dp=4"),
    preset(Strategy::Zero1, &[AxisKind::Dp], Zero::One, false, "dp=4"),
    preset(Strategy::Zero2, &[AxisKind::Dp], Zero::Two, false, "dp=4"),
    preset(Strategy::Fsdp, &[AxisKind::Fsdp], Zero::Off, false, "fsdp=4"),
    preset(Strategy::Tp, &[AxisKind::Tp], Zero::Off, false, "tp=2"),
    preset(
        Strategy::DpTp,
        &[AxisKind::Dp, AxisKind::Tp],
        Zero::Off,
        false,
        "dp=2,tp=2",
    ),
    preset(Strategy::Cp, &[AxisKind::Cp], Zero::Off, false, "cp=4"),
    preset(
        Strategy::DpCp,
        &[AxisKind::Dp, AxisKind::Cp],
        Zero::Off,
        false,
        "dp=2,cp=2",
    ),
    preset(Strategy::TpSp, &[AxisKind::Tp], Zero::Off, true, "tp=2"),
    preset(Strategy::Pp, &[AxisKind::Pp], Zero::Off, false, "pp=2"),
    preset(
        Strategy::DpPp,
        &[AxisKind::Dp, AxisKind::Pp],
        Zero::Off,
        false,
        "dp=2,pp=2",
    ),
];

fn quoted(names: &[&str]) -> String {
    let q: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
    match q.as_slice() {
        [] => "no axes".into(),
        [one] => format!("axis {one}"),
        more => format!("axes {}", more.join(", ")),
    }
}

/// The order a pipeline runs its microbatches' forward and backward passes in, on each stage
/// (the orders themselves: [`super::pipeline::Table`]). Virtual stages (`--virtual-stages v`)
/// compose with GPipe (MaxText's circular pipeline) and 1F1B (Megatron's interleaved 1F1B).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// GPipe (Huang et al., 2019): every microbatch's forward, then every backward; each
    /// stage holds all M microbatches' activations.
    #[default]
    Gpipe,
    /// 1F1B (PipeDream-flush, Narayanan et al., 2021), as Megatron-LM runs it: stage s warms up
    /// with pp - s - 1 forwards, then alternates one forward and one backward, then cools down;
    /// a stage holds at most pp microbatches' activations. With virtual stages, Megatron's
    /// interleaved 1F1B (microbatches in groups of pp).
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// ZB-H1 (Qi et al., 2024): 1F1B with each backward split into its input gradient (B),
    /// which the stage before waits for, and its weight gradient (W), which nothing waits for:
    /// stage s defers s weight passes to the end, where 1F1B's stage idles. 1F1B's memory,
    /// about a third of its bubble when F, B and W take alike.
    #[serde(rename = "zb_h1")]
    ZbH1,
}

impl Schedule {
    pub const ALL: [Schedule; 3] = [Schedule::Gpipe, Schedule::OneFOneB, Schedule::ZbH1];

    /// The name the CLI (`--schedule`) and the page use.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::Gpipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
            Schedule::ZbH1 => "zb_h1",
        }
    }

    pub fn parse(name: &str) -> Option<Schedule> {
        Schedule::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The fraction of a step every stage idles with one chunk per stage and forward, input
    /// gradient and weight gradient passes alike: (pp - 1) / (M + pp - 1) for GPipe and 1F1B
    /// (the fill and the drain), (pp - 1) / (3M + pp - 1) for ZB-H1 (the drain filled with weight
    /// passes). [`Schedule::bubble`] gives it for any virtual stages and pass times.
    pub fn bubble_fraction(self, stages: usize, microbatches: usize) -> f64 {
        self.bubble(stages, microbatches, 1, super::pipeline::PassTimes::EVEN)
    }
}

/// Dropout keys in shard_map mode, where a body draws masks on its local shapes (a body that
/// splits the sequence or runs a pipeline draws every device's block of the one-device run's
/// masks whatever this says: [`Parallelism::draws_mask_blocks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropoutKey {
    /// The same key on every device (the seed's body): masks repeat across the batch's shards
    /// (and across tensor-parallel heads).
    Same,
    /// `fold_in(key, axis_index(batch axes))`: a different mask on every data-parallel shard.
    FoldIn,
    /// Each device draws its block of the global masks, `jax.random.bits(key, global_shape)`
    /// sliced to the device's block: the one-device run's masks, bit for bit.
    Global,
}

impl DropoutKey {
    pub const ALL: [DropoutKey; 3] = [DropoutKey::Same, DropoutKey::FoldIn, DropoutKey::Global];

    /// The name the CLI (`--dropout-key`) and the page use.
    pub fn name(self) -> &'static str {
        match self {
            DropoutKey::Same => "same",
            DropoutKey::FoldIn => "fold_in",
            DropoutKey::Global => "global",
        }
    }

    pub fn parse(name: &str) -> Option<DropoutKey> {
        DropoutKey::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// How a train step is partitioned: JAX's three ways, or not at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The global program on one device.
    Single,
    /// The global program partitioned from shardings (jax.jit with shardings, Auto axes).
    Auto,
    /// The global program typed with its shardings (Explicit axes, JAX's default since 0.9):
    /// sharding rules op by op, the program's choices written as `out_sharding=` and `reshard`.
    Explicit,
    /// A hand-written per-device body with explicit collectives (jax.shard_map).
    ShardMap,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::Single, Mode::Auto, Mode::Explicit, Mode::ShardMap];

    /// The three ways a step is partitioned over a mesh, as JAX's guide sets them side by side.
    pub const PARTITIONED: [Mode; 3] = [Mode::Auto, Mode::Explicit, Mode::ShardMap];

    /// The name the CLI (`--mode`, `--json` lines), the page and the exported scripts use.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Single => "single",
            Mode::Auto => "auto",
            Mode::Explicit => "explicit",
            Mode::ShardMap => "shard_map",
        }
    }

    pub fn parse(name: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// Refuses `--dropout-key fold_in` where the body has no key to choose
/// ([`Parallelism::draws_mask_blocks`]).
pub(super) fn check_dropout_key(par: &Parallelism, key: DropoutKey) -> Result<(), PlanError> {
    if par.draws_mask_blocks() && key == DropoutKey::FoldIn {
        let why = format!(
            "has nothing to choose on {}: its body draws every device's block of the one-device run's masks (they \
             differ across devices already); use {}",
            Setting::Mesh.at(par.name()),
            Setting::DropoutKey.at(DropoutKey::Same.name())
        );
        return Err(Refusal::at(Setting::DropoutKey, key.name(), why).into());
    }
    Ok(())
}
