//! What every shard_map body composes, one rule per mesh axis: the device's local view of the
//! model (batch over the data axes, heads over "tp", the sequence over "cp" and, with sequence
//! parallelism, "tp"), FSDP's gathers, the dropout keys and masks, and each parameter's
//! gradient reduction and update (ZeRO's blocks over "dp"). The flat body and the pipeline's
//! stages both build from it, so any mesh composes without a body per combination.
use super::axes::AxisKind;
use super::{DropoutKey, Parallelism};
use crate::ir::{Builder, CpOrder, Op, SeqBlock, ValueId};
use crate::model::{update, GptConfig, Local, MaskBlocks, MoeSplit, Optimizer, Ring};
use crate::sharding::PartitionSpec;

/// A composition's body pieces for one model.
pub(super) struct Compose<'a> {
    pub cfg: &'a GptConfig,
    pub par: &'a Parallelism,
    pub dropout_key: DropoutKey,
    pub cp_order: CpOrder,
}

impl Compose<'_> {
    /// Zig-zag's two chunks are no block of a spec: every "cp" device gets the whole sequence
    /// of tokens (a few bytes a row) and takes its rows.
    pub fn zigzag(&self) -> bool {
        self.par.zigzag_parts(self.cp_order).is_some()
    }

    /// The tokens' and targets' in_spec.
    pub fn tokens_spec(&self) -> PartitionSpec {
        self.par.tokens_spec_in(self.cfg, self.cp_order)
    }

    /// Under zig-zag, this device's rows of the whole-sequence `tokens` and `targets` (see
    /// [`Self::zigzag`]); else the two as they arrive.
    pub fn take_rows(&self, b: &mut Builder, local: &Local, tokens: ValueId, targets: ValueId) -> (ValueId, ValueId) {
        let (true, Some(rows)) = (self.zigzag(), &local.rows) else {
            return (tokens, targets);
        };
        let mut take = |x| {
            b.emit1(
                Op::SeqTake {
                    dim: 1,
                    seq: rows.clone(),
                },
                &[x],
            )
        };
        (take(tokens), take(targets))
    }

    /// This device's rows of the residual stream's sequence, where it is split.
    pub fn rows(&self) -> Option<SeqBlock> {
        let axes = self.par.seq_axes();
        (!axes.is_empty()).then(|| SeqBlock::Part {
            axes: axes.iter().map(|a| a.to_string()).collect(),
            parts: self.par.seq_split(),
            shift: 0,
            order: self.cp_order,
        })
    }

    /// Whether the body draws every device's block of the one-device run's masks.
    fn draws_mask_blocks(&self) -> bool {
        self.par.draws_mask_blocks() || self.dropout_key == DropoutKey::Global
    }

    /// The masks' blocks: over the batch, the sequence and the heads, as the mesh splits them
    /// (None where nothing is split: the local shape is the global one).
    pub fn masks(&self) -> Option<MaskBlocks> {
        let strings = |axes: Vec<&str>| axes.into_iter().map(String::from).collect::<Vec<_>>();
        let m = MaskBlocks {
            batch: strings(self.par.batch_axes()),
            seq: strings(self.par.seq_axes()),
            heads: self.par.is_megatron().then(|| "tp".to_string()),
            rows: self.rows().filter(|_| self.zigzag()),
        };
        let splits = !m.batch.is_empty() || !m.seq.is_empty() || m.heads.is_some();
        (self.draws_mask_blocks() && splits).then_some(m)
    }

    /// One device's view of the model, for a microbatch of `microbatches`.
    pub fn local(&self, microbatches: usize) -> Local {
        let (cfg, par) = (self.cfg, self.par);
        let tp = par.size(AxisKind::Tp);
        let cp = par.size(AxisKind::Cp);
        Local {
            batch: cfg.batch / par.batch_split() / microbatches,
            heads: cfg.heads / tp,
            tp: par.is_megatron().then(|| "tp".to_string()),
            seq: cfg.seq / par.seq_split(),
            attention_seq: cfg.seq / cp,
            sp: par.sequence_parallel,
            rows: self.rows(),
            ring: par.is_cp().then(|| Ring {
                axis: "cp".into(),
                size: cp,
                order: self.cp_order,
            }),
            masks: self.masks(),
            stage: None,
            moe: self.cfg.moe.map(|_| MoeSplit {
                token_axes: self.par.token_axes().into_iter().map(String::from).collect(),
                ep: par.has(AxisKind::Ep).then(|| AxisKind::Ep.name().to_string()),
            }),
            // The device takes its zig-zag rows itself (`rows`): no global order.
            zigzag: None,
        }
    }

    /// The step's key as the dropout key option says: folded in with the batch axes' index
    /// under `fold_in`.
    pub fn key(&self, b: &mut Builder, key: ValueId) -> ValueId {
        let batch = self.par.batch_axes();
        if self.dropout_key == DropoutKey::FoldIn && !batch.is_empty() {
            b.fold_in_axis_index(key, &batch)
        } else {
            key
        }
    }
}

/// The dimension of `spec` that `axis` splits.
pub(super) fn dim_of(spec: &PartitionSpec, axis: &str) -> Option<usize> {
    (0..spec.len()).find(|&d| spec.dim_axes(d).contains(&axis))
}

/// FSDP: a parameter split over "fsdp" all-gathered before use (its transpose reduce-scatters
/// the gradient); others as they are.
pub(super) fn gather(b: &mut Builder, v: ValueId, spec: &PartitionSpec) -> ValueId {
    match dim_of(spec, "fsdp") {
        Some(d) => b.all_gather(v, &["fsdp"], d, true),
        None => v,
    }
}

/// FSDP by hand: the gradient of a gathered parameter reduce-scattered back to its block (what
/// the all_gather's transpose does where autodiff runs through it).
pub(super) fn scatter_gathered(b: &mut Builder, g: ValueId, spec: &PartitionSpec) -> ValueId {
    match dim_of(spec, "fsdp") {
        Some(d) => b.psum_scatter(g, &["fsdp"], d, true),
        None => g,
    }
}

/// Where one parameter lives and how its gradient is reduced: its spec, its optimizer state's
/// (and gradient's) spec, and the token axes the step's loss is split over.
pub(super) struct ParamPlan {
    pub spec: PartitionSpec,
    pub state: PartitionSpec,
    /// Whether the optimizer's weight decay applies to it.
    pub decays: bool,
}

impl ParamPlan {
    /// ZeRO: the dimension of the state that "dp" splits, where the parameter itself is whole
    /// over "dp": the update runs on this device's block of it.
    pub fn block_dim(&self) -> Option<usize> {
        (!self.spec.uses_axis("dp"))
            .then(|| dim_of(&self.state, "dp"))
            .flatten()
    }

    /// ZeRO-2: the dimension the gradient is reduce-scattered on as each microbatch's is made.
    pub fn scatter_dim(&self, zero: super::Zero) -> Option<usize> {
        self.block_dim().filter(|_| zero.shards_gradients())
    }

    /// The axes the gradient is summed over after the last microbatch: the token axes (and
    /// `extra`, a pipeline's "pp" for a parameter every stage holds) it is not split over, but
    /// "dp" where ZeRO-2 reduce-scattered it already.
    pub fn sum_axes<'a>(&self, token_axes: &[&'a str], extra: &[&'a str], zero: super::Zero) -> Vec<&'a str> {
        let scattered = self.scatter_dim(zero).is_some();
        token_axes
            .iter()
            .chain(extra)
            .copied()
            .filter(|a| !(self.spec.uses_axis(a) || scattered && *a == "dp"))
            .collect()
    }

    /// The optimizer's update of `param` from its summed gradient `grad`: on this device's
    /// block under ZeRO (the updated blocks all-gathered again), else on what the device holds.
    pub fn update(
        &self,
        b: &mut Builder,
        opt: Optimizer,
        param: ValueId,
        grad: ValueId,
        state: &[ValueId],
        zero: super::Zero,
    ) -> Vec<ValueId> {
        let Some(dim) = self.block_dim() else {
            return update(b, opt, self.decays, param, grad, state);
        };
        let g = if self.scatter_dim(zero).is_some() {
            grad
        } else {
            b.slice_block(grad, &["dp"], dim)
        };
        let block = b.slice_block(param, &["dp"], dim);
        let mut o = update(b, opt, self.decays, block, g, state);
        o[0] = b.all_gather_invarying(o[0], &["dp"], dim);
        o
    }
}

/// The optimizer's update of every parameter from its summed gradient, as the step's outputs
/// after `outs` (the loss): each parameter's new value, named `NAME'`, then its state, each
/// donating the input it replaces.
pub(super) fn updates(
    b: &mut Builder,
    opt: Optimizer,
    zero: super::Zero,
    plans: &[ParamPlan],
    names: &[&str],
    (params, grads, state): (&[ValueId], &[ValueId], &[ValueId]),
    mut outs: Vec<ValueId>,
) -> Vec<ValueId> {
    let n = plans.len();
    let slots = opt.slots();
    for (i, plan) in plans.iter().enumerate() {
        let o = plan.update(b, opt, params[i], grads[i], &state[slots * i..slots * (i + 1)], zero);
        b.set_name(o[0], &format!("{}'", names[i]));
        for (slot, v) in o.into_iter().enumerate() {
            b.donate(outs.len(), crate::model::state_input(n, opt, i, slot));
            outs.push(v);
        }
    }
    outs
}
