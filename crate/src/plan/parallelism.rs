//! A composition: a mesh whose axes each say what they split, and the options that refine an
//! axis. Every strategy is one (the named ones are presets, [`super::Strategy`]); what a
//! composition holds where, and whether the model splits over it, follow from the axes alone,
//! one rule per axis.
use super::axes::{AxisKind, Zero};
use super::rules::{param_dims, resolve, Holder, Logical, STAGE, TOKEN_DIMS};
use super::{Mode, PlanError};
use crate::ir::CpOrder;
use crate::model::{GptConfig, ParamSpec};
use crate::setting::{Refusal, Setting};
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

/// `n`'s divisors, `1, 2, 4`: the sizes that split it.
pub(super) fn divisors(n: usize) -> String {
    (1..=n)
        .filter(|d| n.is_multiple_of(*d))
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Parallelism {
    /// A composition of `mesh`'s axes: every axis name must be an [`AxisKind`]'s, and each
    /// option must refine an axis the mesh has.
    pub fn new(mesh: Mesh, zero: Zero, sequence_parallel: bool) -> Result<Self, PlanError> {
        for name in mesh.axis_names() {
            if AxisKind::parse(name).is_none() {
                let why = format!(
                    "mesh axis '{name}' names no parallelism: an axis's name says what it splits, one of {}",
                    AxisKind::glossary()
                );
                return Err(Refusal::at(Setting::Mesh, mesh_text(&mesh), why).into());
            }
        }
        let par = Self {
            mesh,
            zero,
            sequence_parallel,
        };
        if zero != Zero::Off && !par.has(AxisKind::Dp) {
            let why = format!(
                "splits the optimizer state over 'dp', and {} has no 'dp' axis: add one (e.g. {}), or use an 'fsdp' \
                 axis, which splits the parameters too",
                Setting::Mesh.at(par.name()),
                Setting::MeshAxis("dp".into()).at(4)
            );
            return Err(Refusal::at(Setting::Zero, zero.name(), why).into());
        }
        if sequence_parallel && !par.has(AxisKind::Tp) {
            let why = format!(
                "splits tensor parallelism's layer-norm and dropout regions on the sequence over 'tp', and {} has no \
                 'tp' axis: add one (e.g. {})",
                Setting::Mesh.at(par.name()),
                Setting::MeshAxis("tp".into()).at(2)
            );
            return Err(Refusal::named(Setting::SequenceParallel, why).into());
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
        self.mesh.size_of(kind.name()).is_some()
    }

    /// The size of `kind`'s axis, 1 where the mesh has none.
    pub fn size(&self, kind: AxisKind) -> usize {
        self.mesh.size_of(kind.name()).unwrap_or(1)
    }

    /// The kinds of the mesh's axes, in the mesh's order.
    pub fn kinds(&self) -> Vec<AxisKind> {
        self.mesh.axis_names().into_iter().filter_map(AxisKind::parse).collect()
    }

    /// The present axes among `kinds`, by name, in `kinds`' order.
    fn present(&self, kinds: &[AxisKind]) -> Vec<&'static str> {
        kinds.iter().filter(|k| self.has(**k)).map(|k| k.name()).collect()
    }

    /// The axes that split the batch: "dp", "fsdp" and "ep".
    pub fn batch_axes(&self) -> Vec<&'static str> {
        self.present(&[AxisKind::Dp, AxisKind::Fsdp, AxisKind::Ep])
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
            .map(|a| self.mesh.size_of(a).unwrap_or(1))
            .product()
    }

    /// How many blocks the batch is split into: each device's rows are B / this.
    pub fn batch_split(&self) -> usize {
        self.size(AxisKind::Dp) * self.size(AxisKind::Fsdp) * self.size(AxisKind::Ep)
    }

    /// How many blocks the residual stream's sequence is split into.
    pub fn seq_split(&self) -> usize {
        self.seq_axes()
            .iter()
            .map(|a| self.mesh.size_of(a).unwrap_or(1))
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

    /// [`Self::tokens_spec`] with context parallelism's blocks in `order`: zig-zag's two chunks
    /// are no block of a spec, so every "cp" device gets the whole sequence of tokens (a few
    /// bytes a row) and takes its rows.
    pub fn tokens_spec_in(&self, cfg: &GptConfig, order: CpOrder) -> PartitionSpec {
        let spec = self.tokens_spec(cfg);
        match self.zigzag_parts(order) {
            Some(_) => PartitionSpec::new(vec![spec.dim_axes(0).iter().map(|a| a.to_string()).collect()]),
            None => spec,
        }
    }

    /// The zig-zag blocks of the sequence (the 'cp' axis's size), where `order` is zig-zag
    /// and the mesh has a 'cp' axis.
    pub fn zigzag_parts(&self, order: CpOrder) -> Option<usize> {
        (self.is_cp() && order == CpOrder::Zigzag).then(|| self.size(AxisKind::Cp))
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
        self.check_with_stages(cfg, microbatches, &[])
    }

    /// [`Self::check`], with a pipeline's blocks per stage given (`--stage-layers`; empty:
    /// equal stages, which "pp" must divide). Given counts are the pipeline's own to check
    /// ([`super::check_pipeline_layout`]).
    pub fn check_with_stages(
        &self,
        cfg: &GptConfig,
        microbatches: usize,
        stage_layers: &[usize],
    ) -> Result<(), PlanError> {
        for kind in self.kinds() {
            if kind == AxisKind::Pp && !stage_layers.is_empty() {
                continue;
            }
            self.check_axis(cfg, kind)?;
        }
        super::moe::check_moe(self, cfg)?;
        crate::model::check_microbatches(cfg.batch, microbatches, self.batch_split())?;
        Ok(())
    }

    /// One axis's rule: what it splits must divide by its size. Refused at the axis's size,
    /// naming the model's setting it does not divide and both fixes.
    fn check_axis(&self, cfg: &GptConfig, kind: AxisKind) -> Result<(), PlanError> {
        let n = self.size(kind);
        let axis = kind.name();
        let at_axis = |what: String| Err(Refusal::new(Setting::MeshAxis(axis.into()), what).into());
        let mesh_axis = Setting::MeshAxis(axis.into()).at(n);
        match kind {
            AxisKind::Dp | AxisKind::Fsdp | AxisKind::Ep => {
                if kind == AxisKind::Ep {
                    super::moe::check_ep(cfg, n)?;
                }
                let split = self.batch_split();
                if !cfg.batch.is_multiple_of(split) {
                    let by = match self.batch_axes().as_slice() {
                        [_] => format!("{mesh_axis} does not divide"),
                        all => format!(
                            "mesh axes {} of {split} devices together do not divide",
                            all.join(" x ")
                        ),
                    };
                    return at_axis(format!(
                        "{by} {}: the data axes split the batch; use a batch that is a multiple of {split}, or data \
                         axes whose sizes multiply to one of {}",
                        Setting::Batch.at(cfg.batch),
                        divisors(cfg.batch)
                    ));
                }
            }
            AxisKind::Tp => {
                if !cfg.heads.is_multiple_of(n) {
                    return at_axis(format!(
                        "{mesh_axis} does not divide {}: tensor parallelism splits heads; use tp = one of {}, or a \
                         head count that is a multiple of {n}",
                        Setting::Heads.at(cfg.heads),
                        divisors(cfg.heads)
                    ));
                }
                if !(4 * cfg.d_model).is_multiple_of(n) {
                    return at_axis(format!(
                        "{mesh_axis} does not divide 4 x {}: tensor parallelism splits the MLP's hidden units; use \
                         tp = one of {}",
                        Setting::DModel.at(cfg.d_model),
                        divisors(4 * cfg.d_model)
                    ));
                }
            }
            AxisKind::Cp => {}
            AxisKind::Pp => {
                if n > cfg.layers {
                    return at_axis(format!(
                        "{mesh_axis} is more stages than {}: every stage runs at least one block; use pp = one of {}",
                        Setting::Layers.at(cfg.layers),
                        divisors(cfg.layers)
                    ));
                }
                if !cfg.layers.is_multiple_of(n) {
                    return at_axis(format!(
                        "{mesh_axis} does not split {} into equal stages: use a layer count that is a multiple of \
                         {n}, or pp = one of {}",
                        Setting::Layers.at(cfg.layers),
                        divisors(cfg.layers)
                    ));
                }
            }
        }
        if matches!(kind, AxisKind::Cp | AxisKind::Tp) && self.seq_axes().contains(&axis) {
            let split = self.seq_split();
            if !cfg.seq.is_multiple_of(split) {
                let by = self.seq_axes().join(" x ");
                return at_axis(format!(
                    "{mesh_axis}: {by} of {split} devices together do not divide {}: the residual stream's sequence is \
                     split into {split} blocks; use a sequence that is a multiple of {split}",
                    Setting::Seq.at(cfg.seq)
                ));
            }
        }
        Ok(())
    }

    /// Checks context parallelism's order against the mesh, the mode and the model: the order
    /// is cp's alone; zig-zag cuts the sequence into 2 * cp chunks; a shard_map ring merges its
    /// blocks with the fused op's online softmax.
    pub fn check_cp(&self, cfg: &GptConfig, order: CpOrder, mode: Mode) -> Result<(), PlanError> {
        let contiguous = Setting::CpOrder.at(CpOrder::Contiguous.name());
        if !self.is_cp() {
            if order != CpOrder::Contiguous {
                let why = format!(
                    "orders context parallelism's blocks, and {} has no 'cp' axis: add one (e.g. {})",
                    Setting::Mesh.at(self.name()),
                    Setting::MeshAxis("cp".into()).at(4)
                );
                return Err(Refusal::at(Setting::CpOrder, order.name(), why).into());
            }
            return Ok(());
        }
        let cp = self.size(AxisKind::Cp);
        if order == CpOrder::Zigzag {
            if matches!(mode, Mode::Auto | Mode::Explicit) && cfg.attention == crate::model::Attention::Unfused {
                let why = format!(
                    "reorders the queries, and unfused attention's causal mask compares row and column indices, not \
                     positions: use {}, or {contiguous}",
                    Setting::Attention.at("fused")
                );
                return Err(Refusal::at(Setting::Attention, "unfused", why).into());
            }
            if self.sequence_parallel {
                let why = format!(
                    "gives each 'cp' device two chunks of the sequence, and sequence parallelism would split those \
                     two chunks' rows again over 'tp', which no block of a spec describes: use {contiguous} with {}, \
                     or tensor parallelism without it",
                    Setting::SequenceParallel.named()
                );
                return Err(Refusal::at(Setting::CpOrder, order.name(), why).into());
            }
            if !cfg.seq.is_multiple_of(2 * cp) {
                let why = format!(
                    "does not split into 2 x cp = {} zig-zag chunks: use a sequence that is a multiple of {}, or \
                     {contiguous}",
                    2 * cp,
                    2 * cp
                );
                return Err(Refusal::at(Setting::Seq, cfg.seq, why).into());
            }
        }
        if mode == Mode::ShardMap && cfg.attention == crate::model::Attention::Unfused {
            let why = format!(
                "cannot run ring attention: a 'cp' axis merges the blocks of keys with the fused op's online \
                 softmax; use {}",
                Setting::Attention.at("fused")
            );
            return Err(Refusal::at(Setting::Attention, "unfused", why).into());
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
