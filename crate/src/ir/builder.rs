use super::{
    Checkpoint, CheckpointPolicy, CustomVjp, DType, Instr, IrError, Op, Owner, Program, RngLayout, Role, StageWork,
    ValueId, ValueInfo,
};
use crate::sharding::Mesh;

/// Traces a program: each method appends one instruction and returns its result.
///
/// Model code reads like jax.numpy. Shape errors do not interrupt tracing: the first one is
/// kept and returned by [`Builder::finish`], so a bad configuration gives one clear message.
#[derive(Default)]
pub struct Builder {
    prog: Program,
    error: Option<IrError>,
    /// The regions traced inside [`Builder::checkpoint`], for autodiff.
    checkpoints: Vec<Checkpoint>,
    /// The regions traced by [`Builder::custom_vjp`], for autodiff.
    custom_vjps: Vec<CustomVjp>,
    /// In a pipelined program, whose work the values made now are.
    owner: Owner,
}

impl Builder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Continues tracing into an existing program (autodiff appends the backward pass).
    pub fn from_program(prog: Program) -> Self {
        Self {
            prog,
            ..Self::default()
        }
    }

    /// Traces a per-device program over `mesh` (shard_map's body): collectives available.
    pub fn with_mesh(mesh: Mesh) -> Self {
        let mut b = Self::new();
        b.prog.mesh = Some(mesh);
        b
    }

    pub fn mesh(&self) -> Option<&Mesh> {
        self.prog.mesh.as_ref()
    }

    pub fn program(&self) -> &Program {
        &self.prog
    }

    pub fn info(&self, v: ValueId) -> &ValueInfo {
        self.prog.info(v)
    }

    pub fn shape(&self, v: ValueId) -> Vec<usize> {
        self.prog.shape(v).to_vec()
    }

    fn new_value(&mut self, info: ValueInfo) -> ValueId {
        self.prog.values.push(info);
        if let Some(s) = &mut self.prog.stages {
            s.owners.push(self.owner);
        }
        ValueId(self.prog.values.len() as u32 - 1)
    }

    /// Declares the program pipelined over `axis`: from now on every value records whose
    /// work it is ([`Builder::set_owner`]; everyone's until then).
    pub fn begin_stages(&mut self, axis: &str, stages: usize, microbatches: usize) {
        self.prog.stages = Some(StageWork {
            axis: axis.to_string(),
            stages,
            microbatches,
            owners: vec![Owner::Every; self.prog.values.len()],
            passes: vec![],
        });
    }

    /// Records a pipeline pass's instructions (a program with stages; others ignore it).
    pub fn record_pass(&mut self, pass: super::PassSpan) {
        if let Some(s) = &mut self.prog.stages {
            s.passes.push(pass);
        }
    }

    /// Puts the instructions in `order` (a permutation of their positions; each must come
    /// after what it reads), as a scheduler moves work: the recomputation marks and recorded
    /// passes follow their instructions. The regions the gradient sweeps read go: call it
    /// after the last gradient is traced.
    pub fn reorder(&mut self, order: &[usize]) {
        let n = self.prog.instrs.len();
        debug_assert_eq!(order.len(), n, "a permutation of every instruction");
        let mut at = vec![0usize; n];
        for (new, &old) in order.iter().enumerate() {
            at[old] = new;
        }
        let mut old: Vec<Option<Instr>> = std::mem::take(&mut self.prog.instrs).into_iter().map(Some).collect();
        self.prog.instrs = order.iter().map(|&i| old[i].take().expect("each once")).collect();
        self.prog.recomputed = {
            let mut r: Vec<usize> = self.prog.recomputed.iter().map(|&i| at[i]).collect();
            r.sort_unstable();
            r
        };
        if let Some(s) = &mut self.prog.stages {
            for p in &mut s.passes {
                p.instrs = p.instrs.iter().map(|&i| at[i]).collect();
                p.instrs.sort_unstable();
            }
        }
        self.checkpoints.clear();
        self.custom_vjps.clear();
    }

    /// Values made from now on are `owner`'s work; returns the owner before.
    pub fn set_owner(&mut self, owner: Owner) -> Owner {
        std::mem::replace(&mut self.owner, owner)
    }

    /// Whose work `v` is, in a pipelined program.
    pub fn owner_of(&self, v: ValueId) -> Option<Owner> {
        self.prog.stages.as_ref().map(|s| s.owner(v))
    }

    pub fn input(&mut self, name: &str, shape: &[usize], dtype: DType, role: Role) -> ValueId {
        let v = self.new_value(ValueInfo {
            shape: shape.to_vec(),
            dtype,
            name: Some(name.to_string()),
        });
        self.prog.inputs.push((v, role));
        v
    }

    pub fn set_name(&mut self, v: ValueId, name: &str) {
        self.prog.values[v.index()].name = Some(name.to_string());
    }

    /// Drops `v`'s name (the partitioner moves a name to the value a constraint made).
    pub fn clear_name(&mut self, v: ValueId) {
        self.prog.values[v.index()].name = None;
    }

    pub fn output(&mut self, v: ValueId) -> usize {
        self.prog.outputs.push(v);
        self.prog.outputs.len() - 1
    }

    /// Marks output `output` as the updated value of input `input` (buffer donation).
    pub fn donate(&mut self, output: usize, input: usize) {
        self.prog.donations.push((output, input));
    }

    /// `jax.checkpoint(f, policy=policy)`: traces `f`, and the gradient of what it traced
    /// recomputes the residuals `policy` does not save ([`crate::autodiff::grad`]). `None`
    /// traces `f` plainly.
    pub fn checkpoint<R>(&mut self, policy: Option<CheckpointPolicy>, f: impl FnOnce(&mut Self) -> R) -> R {
        let start = self.prog.instrs.len();
        let r = f(self);
        if let Some(policy) = policy {
            let end = self.prog.instrs.len();
            self.checkpoints.push(Checkpoint {
                instrs: start..end,
                policy,
            });
        }
        r
    }

    /// `jax.custom_vjp`: traces `fwd` on `inputs`, which returns the region's outputs and the
    /// residuals `bwd` reads; the gradient through the region is `bwd` (residuals, the
    /// outputs' cotangents) -> the inputs' cotangents, traced where the backward pass reaches
    /// it ([`crate::autodiff::grad`]), instead of the VJPs of the ops `fwd` traced.
    pub fn custom_vjp(
        &mut self,
        inputs: &[ValueId],
        fwd: impl FnOnce(&mut Self, &[ValueId]) -> (Vec<ValueId>, Vec<ValueId>),
        bwd: impl Fn(&mut Self, &[ValueId], &[Option<ValueId>]) -> Vec<Option<ValueId>> + Send + Sync + 'static,
    ) -> Vec<ValueId> {
        let start = self.prog.instrs.len();
        let (outputs, residuals) = fwd(self, inputs);
        self.custom_vjps.push(CustomVjp {
            instrs: start..self.prog.instrs.len(),
            inputs: inputs.to_vec(),
            outputs: outputs.clone(),
            residuals,
            bwd: std::sync::Arc::new(bwd),
        });
        outputs
    }

    /// The custom-VJP regions traced so far, in order.
    pub fn custom_vjps(&self) -> &[CustomVjp] {
        &self.custom_vjps
    }

    /// The checkpointed regions traced so far, in order.
    pub fn checkpoints(&self) -> &[Checkpoint] {
        &self.checkpoints
    }

    /// Marks instruction `i` as a recomputation (the program view says so).
    pub fn mark_recomputed(&mut self, i: usize) {
        self.prog.recomputed.push(i);
    }

    /// Drops the instructions at and after `from` for which `drop` holds; recomputed marks
    /// follow the instructions they name. Only autodiff calls it, on ops it emitted and whose
    /// results nothing reads.
    pub(crate) fn drop_instrs(&mut self, from: usize, drop: &[bool]) {
        let mut new_index = Vec::with_capacity(self.prog.instrs.len());
        let mut kept = 0;
        for i in 0..self.prog.instrs.len() {
            let gone = i >= from && drop.get(i - from).copied().unwrap_or(false);
            new_index.push((!gone).then_some(kept));
            kept += usize::from(!gone);
        }
        let mut i = 0;
        self.prog.instrs.retain(|_| {
            i += 1;
            new_index[i - 1].is_some()
        });
        self.prog.recomputed = self.prog.recomputed.iter().filter_map(|&r| new_index[r]).collect();
    }

    pub fn error(&self) -> Option<&IrError> {
        self.error.as_ref()
    }

    pub fn finish(self) -> Result<Program, IrError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.prog),
        }
    }

    /// Records that `v` is typed like `primal` (its dim `d` like `primal`'s dim `dims[d]`): a
    /// cotangent, as JAX's transpose rules type it. The first record of a value holds.
    pub fn type_like(&mut self, v: ValueId, primal: ValueId, dims: Vec<usize>) {
        if self.prog.like_primal.iter().all(|r| r.value != v) {
            self.prog.like_primal.push(super::LikePrimal { value: v, primal, dims });
        }
    }

    /// Appends `op` and returns its outputs.
    pub fn emit(&mut self, op: Op, inputs: &[ValueId]) -> Vec<ValueId> {
        let infos: Vec<&ValueInfo> = inputs.iter().map(|v| self.prog.info(*v)).collect();
        let outs = match op.infer(&infos) {
            Ok(outs) => outs,
            Err(e) => {
                // Keep tracing with a stand-in so one bad shape yields one error, not a panic.
                let stand_in = infos.first().map(|i| (*i).clone()).unwrap_or(ValueInfo {
                    shape: vec![],
                    dtype: DType::F32,
                    name: None,
                });
                self.error.get_or_insert(e);
                let n = match &op {
                    Op::Split { sizes, .. } => sizes.len(),
                    Op::LayerNorm | Op::LayerNormGrad | Op::AdamWUpdate { .. } | Op::AttentionGrad { .. } => 3,
                    Op::Attention { .. } | Op::AttentionCombine => 2,
                    Op::MoeRoute { .. } => 5,
                    Op::Psum { .. } => inputs.len().max(1),
                    _ => 1,
                };
                vec![stand_in; n]
            }
        };
        let outputs: Vec<ValueId> = outs.into_iter().map(|info| self.new_value(info)).collect();
        self.prog.instrs.push(Instr {
            op,
            inputs: inputs.to_vec(),
            outputs: outputs.clone(),
        });
        outputs
    }

    pub fn emit1(&mut self, op: Op, inputs: &[ValueId]) -> ValueId {
        self.emit(op, inputs)[0]
    }

    // ---- jax.numpy-like surface ----

    pub fn add(&mut self, a: ValueId, b: ValueId) -> ValueId {
        self.emit1(Op::Add, &[a, b])
    }

    pub fn sub(&mut self, a: ValueId, b: ValueId) -> ValueId {
        self.emit1(Op::Sub, &[a, b])
    }

    pub fn mul(&mut self, a: ValueId, b: ValueId) -> ValueId {
        self.emit1(Op::Mul, &[a, b])
    }

    pub fn scale(&mut self, a: ValueId, alpha: f32) -> ValueId {
        self.emit1(Op::Scale { alpha }, &[a])
    }

    pub fn reshape(&mut self, a: ValueId, shape: &[usize]) -> ValueId {
        self.emit1(Op::Reshape { shape: shape.to_vec() }, &[a])
    }

    pub fn transpose(&mut self, a: ValueId, perm: &[usize]) -> ValueId {
        self.emit1(Op::Transpose { perm: perm.to_vec() }, &[a])
    }

    pub fn broadcast_in_dim(&mut self, a: ValueId, shape: &[usize], dims: &[usize]) -> ValueId {
        self.emit1(
            Op::BroadcastInDim {
                shape: shape.to_vec(),
                dims: dims.to_vec(),
            },
            &[a],
        )
    }

    pub fn split(&mut self, a: ValueId, axis: usize, sizes: &[usize]) -> Vec<ValueId> {
        self.emit(
            Op::Split {
                axis,
                sizes: sizes.to_vec(),
            },
            &[a],
        )
    }

    pub fn concat(&mut self, parts: &[ValueId], axis: usize) -> ValueId {
        self.emit1(Op::Concat { axis }, parts)
    }

    pub fn dot_general(
        &mut self,
        a: ValueId,
        b: ValueId,
        contract: (&[usize], &[usize]),
        batch: (&[usize], &[usize]),
        alpha: f32,
    ) -> ValueId {
        self.emit1(
            Op::DotGeneral {
                lhs_contract: contract.0.to_vec(),
                rhs_contract: contract.1.to_vec(),
                lhs_batch: batch.0.to_vec(),
                rhs_batch: batch.1.to_vec(),
                alpha,
            },
            &[a, b],
        )
    }

    /// `x @ w` contracting x's last axis with w's first (w is [in, out]).
    pub fn matmul(&mut self, x: ValueId, w: ValueId) -> ValueId {
        let last = self.shape(x).len().saturating_sub(1);
        self.dot_general(x, w, (&[last], &[0]), (&[], &[]), 1.0)
    }

    pub fn sum(&mut self, a: ValueId, axes: &[usize]) -> ValueId {
        self.emit1(Op::ReduceSum { axes: axes.to_vec() }, &[a])
    }

    /// Mean over every element: a scalar.
    pub fn mean(&mut self, a: ValueId) -> ValueId {
        let rank = self.shape(a).len();
        let n = self.info(a).numel();
        let s = self.sum(a, &(0..rank).collect::<Vec<_>>());
        self.scale(s, 1.0 / n as f32)
    }

    pub fn gelu(&mut self, x: ValueId) -> ValueId {
        self.emit1(Op::Gelu, &[x])
    }

    pub fn layer_norm(&mut self, x: ValueId, gamma: ValueId, beta: ValueId) -> ValueId {
        self.emit(Op::LayerNorm, &[x, gamma, beta])[0]
    }

    pub fn softmax_causal(&mut self, s: ValueId) -> ValueId {
        self.emit1(Op::SoftmaxCausal, &[s])
    }

    /// Causal attention of q, k, v (..., T, Dh) with dropout at `rate` on the probabilities
    /// (bits drawn from `key` in `layout`, as [`Builder::dropout`] draws them): the output
    /// (..., T, Dh). See [`Op::Attention`].
    pub fn attention(&mut self, qkv: [ValueId; 3], scale: f32, dropout: Option<(ValueId, f32, RngLayout)>) -> ValueId {
        let mut inputs = qkv.to_vec();
        let rate = match dropout {
            Some((key, rate, layout)) if rate > 0.0 => {
                // (..., T, Dh) -> (..., T, T); a bad rank is the op's error to report.
                let mut shape = self.shape(qkv[0]);
                let t = shape.len().checked_sub(2).map_or(0, |i| shape[i]);
                if let Some(last) = shape.last_mut() {
                    *last = t;
                }
                inputs.push(self.random_bits(key, &shape, layout));
                rate
            }
            _ => 0.0,
        };
        self.emit(
            Op::Attention {
                scale,
                rate,
                seq: Default::default(),
            },
            &inputs,
        )[0]
    }

    pub fn cross_entropy(&mut self, logits: ValueId, targets: ValueId) -> ValueId {
        self.emit1(Op::CrossEntropy, &[logits, targets])
    }

    /// `table[ids]` (jnp.take along axis 0).
    pub fn take(&mut self, table: ValueId, ids: ValueId) -> ValueId {
        self.emit1(Op::Gather, &[table, ids])
    }

    pub fn fold_in(&mut self, key: ValueId, data: u32) -> ValueId {
        self.emit1(Op::FoldIn { data }, &[key])
    }

    pub fn random_bits(&mut self, key: ValueId, shape: &[usize], layout: RngLayout) -> ValueId {
        self.emit1(
            Op::RandomBits {
                shape: shape.to_vec(),
                layout,
                rows: Default::default(),
            },
            &[key],
        )
    }

    /// Inverted dropout with a mask drawn from `key` (identity at rate 0).
    pub fn dropout(&mut self, x: ValueId, key: ValueId, rate: f32, layout: RngLayout) -> ValueId {
        if rate == 0.0 {
            return x;
        }
        let shape = self.shape(x);
        let bits = self.random_bits(key, &shape, layout);
        self.emit1(Op::Dropout { rate }, &[x, bits])
    }

    // ---- collectives (jax.lax), inside a program with a mesh ----

    /// Devices per group along `axes`, recording an error (and returning 1) without a mesh
    /// or for an unknown axis.
    fn group(&mut self, op: &str, axes: &[&str]) -> usize {
        let size = match &self.prog.mesh {
            None => Err(format!("{op} needs a mesh: trace the body with Builder::with_mesh")),
            Some(m) => m.axes_size(axes).map_err(|e| e.to_string()),
        };
        match size {
            Ok(g) => g,
            Err(e) => {
                self.error.get_or_insert(IrError::new(op, e));
                1
            }
        }
    }

    fn names(axes: &[&str]) -> Vec<String> {
        axes.iter().map(|a| a.to_string()).collect()
    }

    /// `jax.lax.psum`: the sum over the group along `axes` (an all-reduce).
    pub fn psum(&mut self, x: ValueId, axes: &[&str]) -> ValueId {
        let group = self.group("psum", axes);
        self.emit1(
            Op::Psum {
                axes: Self::names(axes),
                group,
            },
            &[x],
        )
    }

    /// `jax.lax.psum` of several arrays at once: one all-reduce with N operands and N results
    /// (HLO's tuple all-reduce), as the all-reduce combiner makes.
    pub fn psum_many(&mut self, xs: &[ValueId], axes: &[&str]) -> Vec<ValueId> {
        let group = self.group("psum", axes);
        self.emit(
            Op::Psum {
                axes: Self::names(axes),
                group,
            },
            xs,
        )
    }

    /// `jax.lax.pmean`: psum divided by the group size.
    pub fn pmean(&mut self, x: ValueId, axes: &[&str]) -> ValueId {
        let group = self.group("pmean", axes);
        let s = self.psum(x, axes);
        self.scale(s, 1.0 / group as f32)
    }

    /// `jax.lax.all_gather(x, axes, axis=axis, tiled=tiled)`.
    pub fn all_gather(&mut self, x: ValueId, axes: &[&str], axis: usize, tiled: bool) -> ValueId {
        let group = self.group("all_gather", axes);
        self.emit1(
            Op::AllGather {
                axes: Self::names(axes),
                group,
                axis,
                tiled,
                invarying: false,
            },
            &[x],
        )
    }

    /// `jax.lax.all_gather(x, axes, axis=axis, tiled=True, to="invarying")`: the gathered array,
    /// typed invariant along `axes` (the same on every device of the group).
    pub fn all_gather_invarying(&mut self, x: ValueId, axes: &[&str], axis: usize) -> ValueId {
        let group = self.group("all_gather", axes);
        self.emit1(
            Op::AllGather {
                axes: Self::names(axes),
                group,
                axis,
                tiled: true,
                invarying: true,
            },
            &[x],
        )
    }

    /// Each device's block of dimension `dim` split over `axes`: `jax.lax.dynamic_slice_in_dim(x,
    /// axis_index(axes) * n, n, dim)` with n = the dimension over the group's size (what jit's
    /// partitioner inserts as a dynamic-slice; ZeRO's update of one shard).
    pub fn slice_block(&mut self, x: ValueId, axes: &[&str], dim: usize) -> ValueId {
        let parts = self.group("dynamic_slice", axes);
        self.emit1(
            Op::ShardSlice {
                dim,
                axes: Self::names(axes),
                parts,
            },
            &[x],
        )
    }

    /// `jax.lax.psum_scatter(x, axes, scatter_dimension=d, tiled=tiled)` (a reduce-scatter).
    pub fn psum_scatter(&mut self, x: ValueId, axes: &[&str], scatter_dimension: usize, tiled: bool) -> ValueId {
        let group = self.group("psum_scatter", axes);
        self.emit1(
            Op::PsumScatter {
                axes: Self::names(axes),
                group,
                scatter_dimension,
                tiled,
            },
            &[x],
        )
    }

    /// `jax.lax.ppermute(x, axis, perm)` (a collective permute).
    pub fn ppermute(&mut self, x: ValueId, axis: &str, perm: &[(usize, usize)]) -> ValueId {
        self.group("ppermute", &[axis]);
        self.emit1(
            Op::Ppermute {
                axis: axis.to_string(),
                perm: perm.to_vec(),
            },
            &[x],
        )
    }

    /// `jax.lax.all_to_all(x, axes, split_axis, concat_axis, tiled=True)`.
    pub fn all_to_all(&mut self, x: ValueId, axes: &[&str], split_axis: usize, concat_axis: usize) -> ValueId {
        let group = self.group("all_to_all", axes);
        self.emit1(
            Op::AllToAll {
                axes: Self::names(axes),
                group,
                split_axis,
                concat_axis,
            },
            &[x],
        )
    }

    /// `jax.lax.pcast(x, axes, to="varying")`: the identity whose transpose is a psum
    /// (Megatron's `f` operator). JAX refuses it on a value already varying along `axes`.
    pub fn pcast(&mut self, x: ValueId, axes: &[&str]) -> ValueId {
        self.group("pcast", axes);
        self.emit1(
            Op::Pcast {
                axes: Self::names(axes),
            },
            &[x],
        )
    }

    /// `jax.random.fold_in(key, jax.lax.axis_index(axes))`.
    pub fn fold_in_axis_index(&mut self, key: ValueId, axes: &[&str]) -> ValueId {
        self.fold_in_axis_affine(key, axes, 1, 0)
    }

    /// `jax.random.fold_in(key, jax.lax.axis_index(axes) * stride + offset)`, in u32
    /// arithmetic (a negative stride wraps, as `jnp.uint32` does).
    pub fn fold_in_axis_affine(&mut self, key: ValueId, axes: &[&str], stride: u32, offset: u32) -> ValueId {
        self.group("axis_index", axes);
        self.emit1(
            Op::FoldInAxisIndex {
                axes: Self::names(axes),
                stride,
                offset,
            },
            &[key],
        )
    }
}
