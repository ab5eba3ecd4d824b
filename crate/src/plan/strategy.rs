//! The strategies both modes offer, and what they share: each parameter's layout and the
//! checks that the model splits evenly over the mesh.
use super::PlanError;
use crate::ir::CpOrder;
use crate::model::{Attention, GptConfig, ParamSpec};
use crate::sharding::{Mesh, PartitionSpec};

/// How the train step is split over the mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Params replicated, batch split over "dp", pmean of the gradients.
    Dp,
    /// Params and optimizer state split over "dp": all_gather before use, psum_scatter of grads.
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

    /// The mesh axes the strategy needs.
    pub fn axes(self) -> &'static [&'static str] {
        match self {
            Strategy::Dp | Strategy::Fsdp | Strategy::Zero1 | Strategy::Zero2 => &["dp"],
            Strategy::Tp | Strategy::TpSp => &["tp"],
            Strategy::DpTp => &["dp", "tp"],
            Strategy::Cp => &["cp"],
            Strategy::DpCp => &["dp", "cp"],
            Strategy::Pp => &["pp"],
            Strategy::DpPp => &["dp", "pp"],
        }
    }

    /// A mesh the strategy runs on, as `--mesh` takes it (the CLI's default).
    pub fn example_mesh(self) -> &'static str {
        match self {
            Strategy::Dp | Strategy::Fsdp | Strategy::Zero1 | Strategy::Zero2 => "dp=4",
            Strategy::Tp | Strategy::TpSp => "tp=2",
            Strategy::DpTp => "dp=2,tp=2",
            Strategy::Cp => "cp=4",
            Strategy::DpCp => "dp=2,cp=2",
            Strategy::Pp => "pp=2",
            Strategy::DpPp => "dp=2,pp=2",
        }
    }

    /// Whether the strategy is pipeline parallelism (the one that takes `--schedule`).
    pub fn is_pipeline(self) -> bool {
        matches!(self, Strategy::Pp | Strategy::DpPp)
    }

    /// Megatron's layouts: heads and the MLP's hidden units split over "tp".
    pub fn is_megatron(self) -> bool {
        matches!(self, Strategy::Tp | Strategy::DpTp | Strategy::TpSp)
    }

    /// The mesh axis the sequence of the residual stream is split over: "cp" under context
    /// parallelism, "tp" under sequence parallelism.
    pub fn seq_axis(self) -> Option<&'static str> {
        match self {
            Strategy::Cp | Strategy::DpCp => Some("cp"),
            Strategy::TpSp => Some("tp"),
            _ => None,
        }
    }

    /// Whether every dropout mask of the strategy's shard_map body is the device's block of the
    /// one-device run's (the sequence split, a pipeline's stages): masks differ across devices
    /// already, and `--dropout-key` has nothing to choose.
    pub fn draws_mask_blocks(self) -> bool {
        self.seq_axis().is_some() || self.is_pipeline()
    }

    /// Whether the strategy is context parallelism (the one that takes `--cp-order`).
    pub fn is_cp(self) -> bool {
        matches!(self, Strategy::Cp | Strategy::DpCp)
    }

    /// The axes that split the tokens (the batch over "dp", the sequence over "cp" or, for
    /// sequence parallelism, "tp"): the loss is the mean over them, and the gradient of a
    /// parameter not split over one of them is summed over it.
    pub fn token_axes(self) -> Vec<&'static str> {
        let mut axes: Vec<&'static str> = self.axes().iter().copied().filter(|a| *a == "dp").collect();
        axes.extend(self.seq_axis());
        axes
    }

    /// The in_spec of the tokens and targets (B, T): the batch over "dp", the sequence over
    /// the strategy's sequence axis.
    pub fn tokens_spec(self) -> PartitionSpec {
        let dp = self.axes().contains(&"dp").then_some("dp");
        p(&[dp, self.seq_axis()])
    }
}

impl Strategy {
    /// Whether each device holds only its block of the optimizer state (ZeRO-1, 2 and 3).
    pub fn shards_optimizer_state(self) -> bool {
        matches!(self, Strategy::Zero1 | Strategy::Zero2 | Strategy::Fsdp)
    }

    /// Whether each device holds only its block of the gradients (ZeRO-2 and 3).
    pub fn shards_gradients(self) -> bool {
        matches!(self, Strategy::Zero2 | Strategy::Fsdp)
    }

    /// Whether each device holds only its block of the parameters (ZeRO-3, FSDP).
    pub fn shards_params(self) -> bool {
        self == Strategy::Fsdp
    }
}

/// The order a pipeline runs its microbatches' forward and backward passes in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// GPipe (Huang et al., 2019): every microbatch's forward, then every backward; each
    /// stage holds all M microbatches' activations.
    #[default]
    Gpipe,
    /// 1F1B (PipeDream-flush, Narayanan et al., 2021): after a warm-up, one forward then one
    /// backward. Run in lockstep by one program for all devices, each backward recomputes its
    /// stage's forward from the saved input, so a stage holds the inputs of the microbatches in
    /// flight (at most 2pp - 1) and one microbatch's activations, however large M is.
    #[serde(rename = "1f1b")]
    OneFOneB,
}

impl Schedule {
    pub const ALL: [Schedule; 2] = [Schedule::Gpipe, Schedule::OneFOneB];

    /// The name the CLI (`--schedule`) and the page use.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::Gpipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
        }
    }

    pub fn parse(name: &str) -> Option<Schedule> {
        Schedule::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The fraction of a step every stage idles: (pp - 1) / (M + pp - 1) for GPipe and 1F1B
    /// alike (the fill and the drain, pp - 1 ticks each of forwards and backwards).
    pub fn bubble_fraction(self, stages: usize, microbatches: usize) -> f64 {
        let (p, m) = (stages as f64, microbatches as f64);
        if stages <= 1 {
            0.0
        } else {
            (p - 1.0) / (m + p - 1.0)
        }
    }
}

/// Dropout keys in shard_map mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropoutKey {
    /// The same key on every device (the seed's body): masks repeat across "dp" shards.
    Same,
    /// `fold_in(key, axis_index("dp"))`: a different mask on every data-parallel shard.
    FoldIn,
}

impl DropoutKey {
    pub const ALL: [DropoutKey; 2] = [DropoutKey::Same, DropoutKey::FoldIn];

    /// The name the CLI (`--dropout-key`) and the page use.
    pub fn name(self) -> &'static str {
        match self {
            DropoutKey::Same => "same",
            DropoutKey::FoldIn => "fold_in",
        }
    }

    pub fn parse(name: &str) -> Option<DropoutKey> {
        DropoutKey::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// How a train step is partitioned: JAX's two ways, or not at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The global program on one device.
    Single,
    /// The global program partitioned from shardings (jax.jit with shardings).
    Auto,
    /// A hand-written per-device body with explicit collectives (jax.shard_map).
    ShardMap,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Single, Mode::Auto, Mode::ShardMap];

    /// The name the CLI (`--mode`, `--json` lines), the page and the exported scripts use.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Single => "single",
            Mode::Auto => "auto",
            Mode::ShardMap => "shard_map",
        }
    }

    pub fn parse(name: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == name)
    }
}

pub(super) fn p(entries: &[Option<&str>]) -> PartitionSpec {
    PartitionSpec::from_axes(entries)
}

/// (view shape, spec) of a parameter under `strategy`. Under tensor parallelism w_qkv and
/// b_qkv are split per head, so their columns are viewed as (3, H, Dh) (a row-major view:
/// the same data) and split along H.
pub(super) fn param_layout(
    cfg: &GptConfig,
    strategy: Strategy,
    mesh: &Mesh,
    ps: &ParamSpec,
) -> (Vec<usize>, PartitionSpec) {
    let leaf = ps.name.rsplit('.').next().unwrap_or(&ps.name);
    let (d, h, dh) = (cfg.d_model, cfg.heads, cfg.head_dim());
    if strategy.is_megatron() {
        let s = Some("tp");
        match leaf {
            "w_qkv" => return (vec![d, 3, h, dh], p(&[None, None, s, None])),
            "b_qkv" => return (vec![3, h, dh], p(&[None, s, None])),
            "w_proj" | "w_out" => return (ps.shape.clone(), p(&[s, None])),
            "w_fc" => return (ps.shape.clone(), p(&[None, s])),
            "b_fc" => return (ps.shape.clone(), p(&[s])),
            _ => {}
        }
    }
    if strategy.shards_params() {
        let dp = mesh.axis_size("dp").unwrap_or(1);
        if ps.shape[0].is_multiple_of(dp) {
            let mut spec = vec![Some("dp")];
            spec.extend(std::iter::repeat_n(None, ps.shape.len() - 1));
            return (ps.shape.clone(), p(&spec));
        }
    }
    (ps.shape.clone(), PartitionSpec::replicated())
}

/// (view shape, spec) of a parameter's optimizer state (and, where the strategy splits them,
/// its gradient) under `strategy`: ZeRO splits it over "dp" as FSDP splits the parameter
/// (dimension 0, where "dp" divides it; the rest stay whole on every device).
pub(super) fn state_layout(
    cfg: &GptConfig,
    strategy: Strategy,
    mesh: &Mesh,
    ps: &ParamSpec,
) -> (Vec<usize>, PartitionSpec) {
    if strategy.shards_optimizer_state() {
        param_layout(cfg, Strategy::Fsdp, mesh, ps)
    } else {
        param_layout(cfg, strategy, mesh, ps)
    }
}

/// Checks the mesh has the strategy's axes, the model splits evenly over them and the
/// microbatches split every device's rows evenly.
pub(super) fn check(cfg: &GptConfig, strategy: Strategy, mesh: &Mesh, microbatches: usize) -> Result<(), PlanError> {
    for axis in strategy.axes() {
        mesh.axis_size(axis).map_err(|_| PlanError::Invalid {
            what: format!("--strategy {}", strategy.name()),
            why: format!(
                "needs a mesh axis '{axis}': use e.g. --mesh {}",
                strategy.example_mesh()
            ),
        })?;
    }
    let size = |a: &str| mesh.axis_size(a).unwrap_or(1);
    if strategy.axes().contains(&"dp") && !cfg.batch.is_multiple_of(size("dp")) {
        return Err(PlanError::Invalid {
            what: format!("--batch {}", cfg.batch),
            why: format!(
                "is not divisible by mesh axis 'dp' of size {}: use a batch that is a multiple of it",
                size("dp")
            ),
        });
    }
    let shards = if strategy.axes().contains(&"dp") { size("dp") } else { 1 };
    crate::model::check_microbatches(cfg.batch, microbatches, shards)?;
    if let Some(axis) = strategy.seq_axis() {
        let n = size(axis);
        if !cfg.seq.is_multiple_of(n) {
            return Err(PlanError::Invalid {
                what: format!("--seq {}", cfg.seq),
                why: format!(
                    "is not divisible by mesh axis '{axis}' of size {n}: --strategy {} splits the sequence into {n} \
                     blocks; use a sequence that is a multiple of it",
                    strategy.name()
                ),
            });
        }
    }
    if strategy.axes().contains(&"tp") {
        let tp = size("tp");
        if !cfg.heads.is_multiple_of(tp) {
            return Err(PlanError::Invalid {
                what: format!("--heads {}", cfg.heads),
                why: format!("is not divisible by mesh axis 'tp' of size {tp}: tensor parallelism splits heads"),
            });
        }
        if !(4 * cfg.d_model).is_multiple_of(tp) {
            return Err(PlanError::Invalid {
                what: format!("--d-model {}", cfg.d_model),
                why: format!("4*d_model is not divisible by 'tp' of size {tp}"),
            });
        }
    }
    Ok(())
}

/// Refuses `--dropout-key fold_in` where the body has no key to choose
/// ([`Strategy::draws_mask_blocks`]).
pub(super) fn check_dropout_key(strategy: Strategy, key: DropoutKey) -> Result<(), PlanError> {
    if strategy.draws_mask_blocks() && key == DropoutKey::FoldIn {
        return Err(PlanError::Invalid {
            what: "--dropout-key fold_in".into(),
            why: format!(
                "has nothing to choose under --strategy {}: its body draws every device's block of the one-device \
                 run's masks (they differ across devices already); use --dropout-key same",
                strategy.name()
            ),
        });
    }
    Ok(())
}

/// Checks the context-parallel choices against the strategy, the mode and the model: the
/// order is cp's alone; zig-zag cuts the sequence into 2 * cp chunks and is the ring's order
/// (jit splits a dim into contiguous blocks only); the ring is the fused op's online softmax.
pub(super) fn check_cp(
    cfg: &GptConfig,
    strategy: Strategy,
    mesh: &Mesh,
    order: CpOrder,
    mode: Mode,
) -> Result<(), PlanError> {
    let invalid = |what: String, why: String| Err(PlanError::Invalid { what, why });
    if !strategy.is_cp() {
        if order != CpOrder::Contiguous {
            return invalid(
                format!("--cp-order {}", order.name()),
                format!(
                    "orders context parallelism's blocks, and --strategy {} has none: use --strategy cp or dp_cp",
                    strategy.name()
                ),
            );
        }
        return Ok(());
    }
    let cp = mesh.axis_size("cp").unwrap_or(1);
    if order == CpOrder::Zigzag {
        if mode == Mode::Auto {
            return invalid(
                "--cp-order zigzag".into(),
                "is ring attention's order in shard_map mode; jit splits the sequence into contiguous blocks (a \
                 PartitionSpec cannot interleave them): use --mode shard_map, or --cp-order contiguous"
                    .into(),
            );
        }
        if !cfg.seq.is_multiple_of(2 * cp) {
            return invalid(
                format!("--seq {}", cfg.seq),
                format!(
                    "does not split into 2 x cp = {} zig-zag chunks: use a sequence that is a multiple of {}, or \
                     --cp-order contiguous",
                    2 * cp,
                    2 * cp
                ),
            );
        }
    }
    if mode == Mode::ShardMap && cfg.attention == Attention::Unfused {
        return invalid(
            "--attention unfused".into(),
            format!(
                "cannot run ring attention: --strategy {} merges the blocks of keys with the fused op's online \
                 softmax; use --attention fused",
                strategy.name()
            ),
        );
    }
    Ok(())
}

/// Sequence parallelism's shardings in automatic mode, as `with_sharding_constraint`s on the
/// step's named values (what MaxText's logical axis rules do): the residual stream split on the
/// sequence over "tp", each layer norm's output whole before the column-parallel matmul (the
/// partitioner all-gathers it), and each row-parallel matmul's output split on the sequence
/// (the partitioner reduce-scatters its partial sums). Without them propagation would split the
/// sequence through the matmuls and gather the weights instead. (They pin forward values only:
/// the backward is what propagation makes of the cotangents.)
pub fn sequence_parallel_constraints(cfg: &GptConfig) -> Vec<(String, PartitionSpec)> {
    let seq = p(&[None, Some("tp"), None]);
    let whole = PartitionSpec::replicated();
    // Attention between the two matmuls, as Megatron runs it: the whole sequence, the heads
    // split over "tp" (the column-parallel weights' own split).
    let heads = p(&[None, Some("tp"), None, None]);
    let mut out = vec![("x0".to_string(), seq.clone())];
    for l in 0..cfg.layers {
        for (name, spec) in [
            ("ln1", &whole),
            ("att", &heads),
            ("proj", &seq),
            ("x_att", &seq),
            ("ln2", &whole),
            ("mlp", &seq),
            ("x_mlp", &seq),
        ] {
            out.push((format!("h{l}.{name}"), spec.clone()));
        }
    }
    out
}
