//! A composition: a mesh whose axes each say what they split, and the options that refine an
//! axis. Every strategy is one (the named ones are presets, [`super::Strategy`]); what a
//! composition holds where, and whether the model splits over it, follow from the axes alone,
//! one rule per axis.
use super::axes::{AxisKind, Zero};
use super::rules::{param_dims, resolve, Holder, Logical, STAGE, TOKEN_DIMS};
use super::{Mode, PlanError};
use crate::ir::CpOrder;
use crate::model::{GptConfig, ParamSpec};
use crate::sharding::{Mesh, PartitionSpec};

/// How a step is split over a mesh: the mesh (every axis named by its [`AxisKind`]) and the
/// options that refine its axes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Parallelism {
    pub mesh: Mesh,
    /// ZeRO's stage on "dp" (1: the optimizer state split, 2: the gradients too).
    pub zero: Zero,
    /// Megatron sequence parallelism on "tp": the layer-norm and dropout regions between the
    /// column- and row-parallel matmuls split on the sequence over "tp" (Korthikanti et al.
    /// 2022), each all-reduce a reduce-scatter and an all-gather of the same bytes.
    pub sequence_parallel: bool,
}

fn invalid(what: impl Into<String>, why: impl Into<String>) -> PlanError {
    PlanError::Invalid {
        what: what.into(),
        why: why.into(),
    }
}

impl Parallelism {
    /// A composition of `mesh`'s axes: every axis name must be an [`AxisKind`]'s, and each
    /// option must refine an axis the mesh has.
    pub fn new(mesh: Mesh, zero: Zero, sequence_parallel: bool) -> Result<Self, PlanError> {
        for name in mesh.axis_names() {
            if AxisKind::parse(name).is_none() {
                return Err(invalid(
                    format!("--mesh {}", mesh_text(&mesh)),
                    format!(
                        "mesh axis '{name}' names no parallelism: an axis's name says what it splits, one of {}",
                        AxisKind::glossary()
                    ),
                ));
            }
        }
        let par = Self {
            mesh,
            zero,
            sequence_parallel,
        };
        if zero != Zero::Off && !par.has(AxisKind::Dp) {
            return Err(invalid(
                format!("--zero {}", zero.name()),
                format!(
                    "splits the optimizer state over 'dp', and the mesh {} has no 'dp' axis: add one (e.g. --mesh \
                     dp=4), or use an 'fsdp' axis, which splits the parameters too",
                    par.name()
                ),
            ));
        }
        if sequence_parallel && !par.has(AxisKind::Tp) {
            return Err(invalid(
                "--sequence-parallel",
                format!(
                    "splits tensor parallelism's layer-norm and dropout regions on the sequence over 'tp', and the \
                     mesh {} has no 'tp' axis: add one (e.g. --mesh tp=2)",
                    par.name()
                ),
            ));
        }
        Ok(par)
    }

    /// Plain data parallelism on `dp` devices.
    pub fn dp(devices: usize) -> Result<Self, PlanError> {
        Self::new(Mesh::new(&[("dp", devices)])?, Zero::Off, false)
    }

    /// The mesh as `--mesh` takes it: `dp=2,tp=2,pp=2`.
    pub fn name(&self) -> String {
        mesh_text(&self.mesh)
    }

    pub fn devices(&self) -> usize {
        self.mesh.devices()
    }

    pub fn has(&self, kind: AxisKind) -> bool {
        self.mesh.axis_size(kind.name()).is_ok()
    }

    /// The size of `kind`'s axis, 1 where the mesh has none.
    pub fn size(&self, kind: AxisKind) -> usize {
        self.mesh.axis_size(kind.name()).unwrap_or(1)
    }

    /// The kinds of the mesh's axes, in the mesh's order.
    pub fn kinds(&self) -> Vec<AxisKind> {
        self.mesh.axis_names().into_iter().filter_map(AxisKind::parse).collect()
    }

    /// The present axes among `kinds`, by name, in `kinds`' order.
    fn present(&self, kinds: &[AxisKind]) -> Vec<&'static str> {
        kinds.iter().filter(|k| self.has(**k)).map(|k| k.name()).collect()
    }

    /// The axes that split the batch: "dp" and "fsdp".
    pub fn batch_axes(&self) -> Vec<&'static str> {
        self.present(&[AxisKind::Dp, AxisKind::Fsdp])
    }

    /// The axes that split the residual stream's sequence: "cp", and "tp" under sequence
    /// parallelism.
    pub fn seq_axes(&self) -> Vec<&'static str> {
        let mut axes = self.present(&[AxisKind::Cp]);
        if self.sequence_parallel {
            axes.extend(self.present(&[AxisKind::Tp]));
        }
        axes
    }

    /// The axes that split the tokens: the loss is the mean over them, and the gradient of a
    /// parameter not split over one of them is summed over it.
    pub fn token_axes(&self) -> Vec<&'static str> {
        let mut axes = self.batch_axes();
        axes.extend(self.seq_axes());
        axes
    }

    /// How many blocks the tokens are split into: the product of [`Self::token_axes`]' sizes.
    pub fn token_split(&self) -> usize {
        self.token_axes()
            .iter()
            .map(|a| self.mesh.axis_size(a).unwrap_or(1))
            .product()
    }

    /// How many blocks the batch is split into: each device's rows are B / this.
    pub fn batch_split(&self) -> usize {
        self.size(AxisKind::Dp) * self.size(AxisKind::Fsdp)
    }

    /// How many blocks the residual stream's sequence is split into.
    pub fn seq_split(&self) -> usize {
        self.seq_axes()
            .iter()
            .map(|a| self.mesh.axis_size(a).unwrap_or(1))
            .product()
    }

    /// Whether every dropout mask of the shard_map body is the device's block of the one-device
    /// run's: where the sequence is split or a pipeline runs, masks differ across devices
    /// already, and `--dropout-key` has nothing to choose.
    pub fn draws_mask_blocks(&self) -> bool {
        !self.seq_axes().is_empty() || self.is_pipeline()
    }

    /// Whether a pipeline runs the blocks ("pp").
    pub fn is_pipeline(&self) -> bool {
        self.has(AxisKind::Pp)
    }

    /// Whether attention is ring attention over "cp".
    pub fn is_cp(&self) -> bool {
        self.has(AxisKind::Cp)
    }

    /// Whether heads and MLP columns are split Megatron style ("tp").
    pub fn is_megatron(&self) -> bool {
        self.has(AxisKind::Tp)
    }

    /// The spec of an array of `shape` whose dimensions are `logical`, held as `holder`.
    pub fn spec(&self, shape: &[usize], logical: &[Option<Logical>], holder: Holder) -> PartitionSpec {
        resolve(&self.mesh, shape, logical, holder, self.zero, self.sequence_parallel)
    }

    /// The tokens' and targets' spec, (B, T): the batch over the data axes, the sequence over
    /// the sequence axes.
    pub fn tokens_spec(&self, cfg: &GptConfig) -> PartitionSpec {
        self.spec(&[cfg.batch, cfg.seq], &TOKEN_DIMS, Holder::Param)
    }

    /// (view shape, spec) of a parameter in `mode`: its logical dimensions through the rules.
    /// Under tensor parallelism w_qkv and b_qkv are viewed per head.
    pub fn param_layout(&self, cfg: &GptConfig, ps: &ParamSpec, mode: Mode) -> (Vec<usize>, PartitionSpec) {
        self.layout(cfg, ps, mode, Holder::Param)
    }

    /// (view shape, spec) of a parameter's optimizer state (and, where ZeRO-2 or FSDP split
    /// them, its gradient): the parameter's, but split over "dp" too under ZeRO.
    pub fn state_layout(&self, cfg: &GptConfig, ps: &ParamSpec, mode: Mode) -> (Vec<usize>, PartitionSpec) {
        self.layout(cfg, ps, mode, Holder::State)
    }

    /// (global shape, spec) of the stages' copies of a block parameter stacked on a leading
    /// stage axis (MaxText's layout): that axis split over "pp", the rest as the parameter's.
    pub fn stacked_layout(&self, cfg: &GptConfig, ps: &ParamSpec, holder: Holder) -> (Vec<usize>, PartitionSpec) {
        let (shape, logical) = self.dims(cfg, ps, Mode::ShardMap);
        let stacked_shape: Vec<usize> = std::iter::once(self.size(AxisKind::Pp)).chain(shape).collect();
        let stacked_logical: Vec<Option<Logical>> = std::iter::once(STAGE).chain(logical).collect();
        let spec = self.spec(&stacked_shape, &stacked_logical, holder);
        (stacked_shape, spec)
    }

    fn layout(&self, cfg: &GptConfig, ps: &ParamSpec, mode: Mode, holder: Holder) -> (Vec<usize>, PartitionSpec) {
        let (shape, logical) = self.dims(cfg, ps, mode);
        let spec = self.spec(&shape, &logical, holder);
        (shape, spec)
    }

    fn dims(&self, cfg: &GptConfig, ps: &ParamSpec, mode: Mode) -> (Vec<usize>, Vec<Option<Logical>>) {
        // jit keeps w_qkv's stored shape (the partitioner reshards where the model views it per
        // head); a shard_map body holds the per-head view it splits.
        let per_head = self.is_megatron() && mode == Mode::ShardMap;
        param_dims(cfg, ps, per_head, mode == Mode::Auto)
    }

    /// Checks that the model splits evenly over every axis, one rule per axis kind, and that
    /// the microbatches split every device's rows.
    pub fn check(&self, cfg: &GptConfig, microbatches: usize) -> Result<(), PlanError> {
        for kind in self.kinds() {
            self.check_axis(cfg, kind)?;
        }
        crate::model::check_microbatches(cfg.batch, microbatches, self.batch_split())?;
        Ok(())
    }

    fn check_axis(&self, cfg: &GptConfig, kind: AxisKind) -> Result<(), PlanError> {
        let n = self.size(kind);
        let axis = kind.name();
        match kind {
            AxisKind::Dp | AxisKind::Fsdp => {
                let split = self.batch_split();
                if !cfg.batch.is_multiple_of(split) {
                    let by = match self.batch_axes().as_slice() {
                        [one] => format!("mesh axis '{one}' of size {split}"),
                        all => format!("mesh axes {} of sizes {split} together", all.join(" x ")),
                    };
                    return Err(invalid(
                        format!("--batch {}", cfg.batch),
                        format!("is not divisible by {by}: use a batch that is a multiple of {split}"),
                    ));
                }
            }
            AxisKind::Tp => {
                if !cfg.heads.is_multiple_of(n) {
                    return Err(invalid(
                        format!("--heads {}", cfg.heads),
                        format!("is not divisible by mesh axis 'tp' of size {n}: tensor parallelism splits heads"),
                    ));
                }
                if !(4 * cfg.d_model).is_multiple_of(n) {
                    return Err(invalid(
                        format!("--d-model {}", cfg.d_model),
                        format!("4*d_model is not divisible by 'tp' of size {n}: tensor parallelism splits the MLP's hidden units"),
                    ));
                }
            }
            AxisKind::Cp => {}
            AxisKind::Pp => {
                let divisors: Vec<String> = (1..=cfg.layers)
                    .filter(|d| cfg.layers.is_multiple_of(*d))
                    .map(|d| d.to_string())
                    .collect();
                if n > cfg.layers {
                    return Err(invalid(
                        format!("--mesh {}", self.name()),
                        format!(
                            "has pp={n}, more stages than --layers {}: every stage runs at least one block; use pp = one of {}",
                            cfg.layers,
                            divisors.join(", ")
                        ),
                    ));
                }
                if !cfg.layers.is_multiple_of(n) {
                    return Err(invalid(
                        format!("--layers {}", cfg.layers),
                        format!(
                            "does not split into pp = {n} equal stages: use a layer count that is a multiple of {n}, or \
                             pp = one of {}",
                            divisors.join(", ")
                        ),
                    ));
                }
            }
        }
        if matches!(kind, AxisKind::Cp | AxisKind::Tp) && self.seq_axes().contains(&axis) {
            let split = self.seq_split();
            if !cfg.seq.is_multiple_of(split) {
                let by = self.seq_axes().join(" x ");
                return Err(invalid(
                    format!("--seq {}", cfg.seq),
                    format!(
                        "is not divisible by {by} of size {split}: the residual stream's sequence is split into {split} \
                         blocks; use a sequence that is a multiple of it"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks context parallelism's order against the mesh, the mode and the model: the order
    /// is cp's alone; zig-zag cuts the sequence into 2 * cp chunks; a shard_map ring merges its
    /// blocks with the fused op's online softmax.
    pub fn check_cp(&self, cfg: &GptConfig, order: CpOrder, mode: Mode) -> Result<(), PlanError> {
        if !self.is_cp() {
            if order != CpOrder::Contiguous {
                return Err(invalid(
                    format!("--cp-order {}", order.name()),
                    format!(
                        "orders context parallelism's blocks, and the mesh {} has no 'cp' axis: add one (e.g. --mesh cp=4)",
                        self.name()
                    ),
                ));
            }
            return Ok(());
        }
        let cp = self.size(AxisKind::Cp);
        if order == CpOrder::Zigzag {
            if mode == Mode::Auto {
                return Err(invalid(
                    "--cp-order zigzag",
                    "is ring attention's order in shard_map mode; jit splits the sequence into contiguous blocks (a \
                     PartitionSpec cannot interleave them): use --mode shard_map, or --cp-order contiguous",
                ));
            }
            if self.sequence_parallel {
                return Err(invalid(
                    "--cp-order zigzag",
                    "gives each 'cp' device two chunks of the sequence, and sequence parallelism would split those \
                     two chunks' rows again over 'tp', which no block of a spec describes: use --cp-order contiguous \
                     with sequence parallelism, or tensor parallelism without it",
                ));
            }
            if !cfg.seq.is_multiple_of(2 * cp) {
                return Err(invalid(
                    format!("--seq {}", cfg.seq),
                    format!(
                        "does not split into 2 x cp = {} zig-zag chunks: use a sequence that is a multiple of {}, or \
                         --cp-order contiguous",
                        2 * cp,
                        2 * cp
                    ),
                ));
            }
        }
        if mode == Mode::ShardMap && cfg.attention == crate::model::Attention::Unfused {
            return Err(invalid(
                "--attention unfused",
                "cannot run ring attention: a 'cp' axis merges the blocks of keys with the fused op's online softmax; \
                 use --attention fused",
            ));
        }
        Ok(())
    }
}

/// `dp=2,tp=2`, as `--mesh` takes it.
pub fn mesh_text(mesh: &Mesh) -> String {
    mesh.axes()
        .iter()
        .map(|(n, s)| format!("{n}={s}"))
        .collect::<Vec<_>>()
        .join(",")
}
