//! The mesh axes shardlab composes, each named for what it splits (MaxText's mesh axes, in the
//! names the Megatron and scaling papers use), and the options that refine one axis.

/// What a mesh axis splits. A mesh is any set of these, each at most once, in any order and
/// any sizes that divide the model: its axis names are these names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AxisKind {
    /// Data parallelism: the batch; parameters replicated, gradients all-reduced (with
    /// [`Zero`], the optimizer state and gradients split too).
    Dp,
    /// Fully-sharded data parallelism (ZeRO-3): the batch, and every parameter with its
    /// optimizer state; each parameter all-gathered before use, its gradient reduce-scattered.
    Fsdp,
    /// Megatron tensor parallelism: attention heads and the MLP's hidden units; an all-reduce
    /// after each row-parallel matmul (with sequence parallelism, a reduce-scatter and an
    /// all-gather).
    Tp,
    /// Context parallelism: the sequence; attention is ring attention (K and V travel the ring).
    Cp,
    /// Pipeline parallelism: the blocks, in contiguous stages; activations passed stage to stage.
    Pp,
    /// Expert parallelism: a mixture of experts' experts, and with the data axes the batch;
    /// two all-to-alls a block move the tokens' slots to their experts and back.
    Ep,
}

impl AxisKind {
    /// In the order a mesh's help lists them.
    pub const ALL: [AxisKind; 6] = [
        AxisKind::Dp,
        AxisKind::Fsdp,
        AxisKind::Tp,
        AxisKind::Cp,
        AxisKind::Pp,
        AxisKind::Ep,
    ];

    /// The axis name, in `--mesh`, specs, programs and exported scripts.
    pub fn name(self) -> &'static str {
        match self {
            AxisKind::Dp => "dp",
            AxisKind::Fsdp => "fsdp",
            AxisKind::Tp => "tp",
            AxisKind::Cp => "cp",
            AxisKind::Pp => "pp",
            AxisKind::Ep => "ep",
        }
    }

    pub fn parse(name: &str) -> Option<AxisKind> {
        AxisKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// What the axis splits, in a sentence's words.
    pub fn splits(self) -> &'static str {
        match self {
            AxisKind::Dp => "the batch",
            AxisKind::Fsdp => "the batch, and the parameters with their optimizer state",
            AxisKind::Tp => "attention heads and the MLP's hidden units",
            AxisKind::Cp => "the sequence",
            AxisKind::Pp => "the blocks into stages",
            AxisKind::Ep => "the experts of a mixture of experts, and the batch",
        }
    }

    /// Every axis name with what it splits: the list a refusal of an unknown axis gives.
    pub fn glossary() -> String {
        AxisKind::ALL
            .iter()
            .map(|k| format!("{} ({})", k.name(), k.splits()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// ZeRO's stage on the data-parallel axis (Rajbhandari et al. 2020); stage 3 is the `fsdp`
/// axis itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum Zero {
    /// Everything replicated over "dp".
    #[default]
    #[serde(rename = "0")]
    Off,
    /// The optimizer state split over "dp": each device updates its block of every parameter
    /// from the all-reduced gradient, then the blocks are all-gathered.
    #[serde(rename = "1")]
    One,
    /// ZeRO-1 with the gradients split too: each reduce-scattered as it is made.
    #[serde(rename = "2")]
    Two,
}

impl Zero {
    pub const ALL: [Zero; 3] = [Zero::Off, Zero::One, Zero::Two];

    /// The stage's number, as `--zero` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Zero::Off => "0",
            Zero::One => "1",
            Zero::Two => "2",
        }
    }

    pub fn parse(name: &str) -> Option<Zero> {
        Zero::ALL.into_iter().find(|z| z.name() == name)
    }

    /// Whether each "dp" device holds only its block of the optimizer state.
    pub fn shards_state(self) -> bool {
        self >= Zero::One
    }

    /// Whether each "dp" device holds only its block of the gradients.
    pub fn shards_gradients(self) -> bool {
        self >= Zero::Two
    }
}
