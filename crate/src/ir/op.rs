use super::{AttnSeq, DType, IrError, SeqBlock, ValueInfo};

pub use crate::rng::RngLayout;

/// The primitive ops. Shape rules live in [`Op::infer`]; gradient rules in `autodiff`.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    // --- structure (no arithmetic) ---
    Reshape {
        shape: Vec<usize>,
    },
    Transpose {
        perm: Vec<usize>,
    },
    /// Operand dim i becomes output dim `dims[i]`; other output dims repeat.
    BroadcastInDim {
        shape: Vec<usize>,
        dims: Vec<usize>,
    },
    /// Splits `axis` into pieces of `sizes` (several outputs).
    Split {
        axis: usize,
        sizes: Vec<usize>,
    },
    Concat {
        axis: usize,
    },
    /// `jax.sharding.reshard(x, spec)`: the same values, typed (and laid out) as `spec` says on
    /// an explicit-sharding mesh. A global-program op: jit lowers it to the collectives or slice
    /// that move the layout, and no per-device program holds it.
    Reshard {
        spec: crate::sharding::PartitionSpec,
    },

    // --- elementwise; the second operand's shape may be a suffix of the first's (broadcast) ---
    Add,
    Sub,
    Mul,
    Scale {
        alpha: f32,
    },
    /// An f32 array filled with `value` (the loss seed, a missing cotangent).
    Full {
        shape: Vec<usize>,
        value: f32,
    },

    // --- contraction (jax.lax.dot_general); output dims: batch, lhs free, rhs free ---
    DotGeneral {
        lhs_contract: Vec<usize>,
        rhs_contract: Vec<usize>,
        lhs_batch: Vec<usize>,
        rhs_batch: Vec<usize>,
        /// Folded into the product (attention's 1/sqrt(Dh)).
        alpha: f32,
    },
    /// Sum over `axes` (removed from the shape).
    ReduceSum {
        axes: Vec<usize>,
    },

    // --- transformer ops, with their backward as ops of their own (custom VJPs) ---
    Gelu,
    /// (x, dy) -> dx
    GeluGrad,
    /// (x, gamma, beta) -> (y, mean, rstd), over the last axis.
    LayerNorm,
    /// (dy, x, mean, rstd, gamma) -> (dx, dgamma, dbeta)
    LayerNormGrad,
    /// Softmax over the last axis with causal masking (query index = second-to-last axis).
    SoftmaxCausal,
    /// (p, dp) -> ds
    SoftmaxCausalGrad,
    /// Causal scaled dot-product attention with inverted dropout on the probabilities, as
    /// `jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True)` with the dropout a
    /// JAX user applies to the weights: the unfused path's dot_general, softmax_causal, dropout
    /// and dot_general in one op. It also returns each row's log-sum-exp, from which the
    /// backward recomputes the probabilities (FlashAttention-2), so no (T, T) array outlives it.
    /// (q (..., Tq, Dh), k, v (..., Tk, Dh)[, bits (..., Tq, Tk) u32 when rate > 0])
    /// -> (o (..., Tq, Dh), lse (..., Tq)).
    /// `seq` says where the rows sit in the global sequence (the causal mask compares global
    /// positions): both whole on one device; a block of each under context parallelism. A row
    /// that sees no key of the block gets o = 0 and lse = f32::MIN (a stand-in for -inf).
    Attention {
        scale: f32,
        rate: f32,
        seq: AttnSeq,
    },
    /// (q, k, v, o, lse, do[, bits]) -> (dq, dk, dv). With blocks, o and lse are the whole
    /// row's (after every block was combined): each block's share of the gradients is exact.
    AttentionGrad {
        scale: f32,
        rate: f32,
        seq: AttnSeq,
    },
    /// Two partial attentions of the same queries over disjoint keys, merged as the online
    /// softmax merges them: (o1, lse1, o2, lse2) -> (o, lse), lse = logaddexp(lse1, lse2),
    /// o = o1 exp(lse1 - lse) + o2 exp(lse2 - lse). Ring attention's accumulation.
    AttentionCombine,
    /// (logits (..., V), targets (...) u32) -> per-position loss (...).
    CrossEntropy,
    /// (logits, targets, dloss) -> dlogits
    CrossEntropyGrad,
    /// (table (V, C), ids (...) u32) -> (..., C)
    Gather,
    /// (dout (..., C), ids (...)) -> (V, C) with V = `rows`; the transpose of Gather.
    ScatterAdd {
        rows: usize,
    },

    // --- randomness ---
    /// key (2 x u32) -> key: `jax.random.fold_in`.
    FoldIn {
        data: u32,
    },
    /// key -> u32 bits of `shape`, as `jax.random.bits` in `layout`, their rows (dimension
    /// `shape.len() - 2`) those of `rows`' positions: `Whole` as drawn, or, for attention over
    /// queries in a global zig-zag order, the one-device run's rows of those queries (jit
    /// draws each device's block of them).
    RandomBits {
        shape: Vec<usize>,
        layout: RngLayout,
        rows: SeqBlock,
    },
    /// (x, bits) -> x * keep / (1 - rate), keep = uniform(bits) < 1 - rate.
    /// Its own transpose: the backward applies the same mask to dy.
    Dropout {
        rate: f32,
    },

    // --- collectives (per-device programs; jax.lax names; `group` = devices per group) ---
    /// All-reduce: every device gets the sum over its group along `axes`. Variadic, as HLO's
    /// tuple all-reduce: N operands give N outputs, reduced as one collective (the combiner
    /// merges independent psums over the same axes into one).
    Psum {
        axes: Vec<String>,
        group: usize,
    },
    /// Concatenates (tiled) or stacks (untiled) the group's blocks along `axis`.
    AllGather {
        axes: Vec<String>,
        group: usize,
        axis: usize,
        tiled: bool,
        /// JAX's `to="invarying"`: the result is typed invariant along `axes` (every device holds
        /// the same array, so an out_spec may say it is replicated: ZeRO's gathered update);
        /// else `to="varying"`, JAX's default.
        invarying: bool,
    },
    /// Reduce-scatter: psum, then member j keeps chunk j of `scatter_dimension`.
    PsumScatter {
        axes: Vec<String>,
        group: usize,
        scatter_dimension: usize,
        tiled: bool,
    },
    /// Collective permute along `axis`: (source, destination) positions in each group.
    Ppermute {
        axis: String,
        perm: Vec<(usize, usize)>,
    },
    /// Splits `split_axis` into `group` chunks, sends chunk j to member j, concatenates
    /// the received chunks along `concat_axis`.
    AllToAll {
        axes: Vec<String>,
        group: usize,
        split_axis: usize,
        concat_axis: usize,
    },
    /// Identity on values, marking an invariant value as varying along `axes`
    /// (`jax.lax.pcast(x, axes, to="varying")`, once `jax.lax.pvary`): its transpose is a psum,
    /// so gradients reaching a replicated value are summed. The only direction shardlab needs.
    Pcast {
        axes: Vec<String>,
    },
    /// key -> fold_in(key, axis_index(axes) * stride + offset) (u32, wrapping): a different
    /// key on every device along `axes`. Stride 1 and offset 0 is `fold_in(key, axis_index)`;
    /// a pipeline stage folds in its first layer's number (`stride` layers per stage).
    FoldInAxisIndex {
        axes: Vec<String>,
        stride: u32,
        offset: u32,
    },
    /// Dynamic-slice from replicated to sharded (jit's partitioner inserts it): every device
    /// keeps chunk `axes_index(axes)` of `parts` equal chunks of dimension `dim`.
    ShardSlice {
        dim: usize,
        axes: Vec<String>,
        parts: usize,
    },
    /// The rows of dimension `dim` at the global positions of the device's sequence block `seq`
    /// (`dim` holds the whole sequence): context parallelism's slice of a replicated array by
    /// sequence position, `jax.lax.dynamic_slice_in_dim` at `axis_index * L` for a contiguous
    /// block and one per chunk for zig-zag. Any dtype.
    SeqTake {
        dim: usize,
        seq: SeqBlock,
    },
    /// The transpose of SeqTake: its rows placed at their positions of a zero array of `len`
    /// rows along `dim` (`jax.lax.dynamic_update_slice` into zeros).
    SeqPut {
        dim: usize,
        seq: SeqBlock,
        len: usize,
    },
    /// key -> each device's block of `jax.random.bits(key, global)` (a partitionable layout),
    /// the global array split as `spec` says; `shape` is the local block shape.
    RandomBitsBlock {
        global: Vec<usize>,
        spec: crate::sharding::PartitionSpec,
        shape: Vec<usize>,
        layout: RngLayout,
        /// Attention's bits (..., T, T) at a device's query and key blocks (ring attention: a
        /// block that need not be a rectangle of the global array, and moves with the ring
        /// step); whole sides leave those dims to `spec`.
        seq: AttnSeq,
    },

    // --- mixture of experts: routing by index (ir/moe.rs); each index op's transpose is another ---
    /// The router of a mixture-of-experts block on each group's logits (G, S, E) (a group is
    /// a sequence): the softmax over the experts; each token's top `k` logits (ties to the lower
    /// expert), whose softmax among themselves are its gates (the top-k probabilities
    /// renormalised); and a place for each choice among its expert's `capacity` slots, given
    /// in GShard's order (every token's first choice in sequence order, then every second
    /// choice, ...), a choice past the capacity dropped.
    /// -> (probs (G, S, E), gates (G, S, k), places u32 (G, S, k), owners u32 (G, E, C),
    /// load (G, 2, E)). See [`super::moe`] for the encodings.
    MoeRoute {
        k: usize,
        capacity: usize,
    },
    /// (probs, gates, places, dprobs, dgates) -> dlogits: the softmax's and the gates' VJP
    /// (`capacity` decodes the places).
    MoeRouteGrad {
        capacity: usize,
    },
    /// (x (G, S, D), places, owners[, gates]) -> (E, G, C, D): slot c of expert e holds the row
    /// of the token that owns it (times its gate), zeros where no token does. The transpose of
    /// [`Op::MoeCombine`].
    MoeDispatch,
    /// (y (E, G, C, D), places, owners[, gates]) -> (G, S, D): each token's sum over its kept
    /// choices of its slot's row (times the choice's gate). The transpose of [`Op::MoeDispatch`].
    MoeCombine,
    /// (a (G, S, D), b (E, G, C, D), places) -> (G, S, k): a[g, s] . b[e, g, c] for each kept
    /// choice (e, c), 0 for a dropped one: the gates' gradient of a gated dispatch or combine.
    MoeGateGrad,

    // --- optimizers (update in place: outputs are donated inputs) ---
    /// (p, g) -> p - lr * g
    SgdUpdate {
        lr: f32,
    },
    /// (p, g, m, v) -> (p', m', v'); the step count comes from the executor.
    AdamWUpdate {
        lr: f32,
        b1: f32,
        b2: f32,
        eps: f32,
        wd: f32,
    },
}

fn f32s(shape: Vec<usize>) -> ValueInfo {
    ValueInfo {
        shape,
        dtype: DType::F32,
        name: None,
    }
}

fn u32s(shape: Vec<usize>) -> ValueInfo {
    ValueInfo {
        shape,
        dtype: DType::U32,
        name: None,
    }
}

fn axes_text(axes: &[String]) -> String {
    match axes {
        [one] => format!("'{one}'"),
        many => format!(
            "({})",
            many.iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join(",")
        ),
    }
}

/// The row shape (..., Tq) of attention of q (..., Tq, Dh) over k and v of one shape
/// (..., Tk, Dh), checking the dropout bits (..., Tq, Tk) where there are some, and that a
/// zig-zag block splits into its two chunks.
fn attention_rows(
    name: &'static str,
    qkv: &[&ValueInfo],
    bits: Option<&ValueInfo>,
    seq: &AttnSeq,
) -> Result<Vec<usize>, IrError> {
    let (q, k) = (&qkv[0].shape, &qkv[1].shape);
    let n = q.len();
    let fits = n >= 2
        && k.len() == n
        && q[..n - 2] == k[..n - 2]
        && q[n - 1] == k[n - 1]
        && qkv[2].shape == *k
        && qkv.iter().all(|v| v.dtype == DType::F32);
    if !fits {
        return Err(IrError::new(
            name,
            "q (..., Tq, Dh), k and v (..., Tk, Dh) must be f32 with the same leading dims and Dh",
        ));
    }
    for (side, len) in [(&seq.q, q[n - 2]), (&seq.kv, k[n - 2])] {
        if let super::SeqBlock::Part {
            order: super::CpOrder::Zigzag,
            ..
        } = side
        {
            if len % 2 != 0 {
                return Err(IrError::new(
                    name,
                    format!("a zig-zag block of {len} rows does not split into two chunks"),
                ));
            }
        }
    }
    let rows = q[..n - 1].to_vec();
    if let Some(b) = bits {
        let mut want = rows.clone();
        want.push(k[n - 2]);
        if b.shape != want || b.dtype != DType::U32 {
            return Err(IrError::new(name, format!("dropout bits must be u32{want:?}")));
        }
    }
    Ok(rows)
}

fn is_suffix(small: &[usize], big: &[usize]) -> bool {
    small.len() <= big.len() && big[big.len() - small.len()..] == *small
}

impl Op {
    /// Whether output `k` carries a gradient: not a router's places, owners and load (index
    /// arrays and counts, piecewise constant: JAX's gradient of them is zero).
    pub fn carries_gradient(&self, k: usize) -> bool {
        !matches!(self, Op::MoeRoute { .. }) || k < 2
    }

    /// The printed name, in jaxpr/HLO spelling.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::BroadcastInDim { .. } => "broadcast_in_dim",
            Op::Split { .. } => "split",
            Op::Concat { .. } => "concatenate",
            Op::Reshard { .. } => "reshard",
            Op::Add => "add",
            Op::Sub => "sub",
            Op::Mul => "mul",
            Op::Scale { .. } => "scale",
            Op::Full { .. } => "full",
            Op::DotGeneral { .. } => "dot_general",
            Op::ReduceSum { .. } => "reduce_sum",
            Op::Gelu => "gelu",
            Op::GeluGrad => "gelu_grad",
            Op::LayerNorm => "layer_norm",
            Op::LayerNormGrad => "layer_norm_grad",
            Op::SoftmaxCausal => "softmax_causal",
            Op::SoftmaxCausalGrad => "softmax_causal_grad",
            Op::Attention { .. } => "dot_product_attention",
            Op::AttentionGrad { .. } => "dot_product_attention_grad",
            Op::AttentionCombine => "attention_combine",
            Op::CrossEntropy => "cross_entropy",
            Op::CrossEntropyGrad => "cross_entropy_grad",
            Op::Gather => "gather",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::FoldIn { .. } => "random_fold_in",
            Op::RandomBits { .. } => "random_bits",
            Op::Dropout { .. } => "dropout",
            Op::Psum { .. } => "psum",
            Op::AllGather { .. } => "all_gather",
            Op::PsumScatter { .. } => "psum_scatter",
            Op::Ppermute { .. } => "ppermute",
            Op::AllToAll { .. } => "all_to_all",
            Op::FoldInAxisIndex { .. } => "random_fold_in",
            Op::ShardSlice { .. } | Op::SeqTake { .. } => "dynamic_slice",
            Op::SeqPut { .. } => "dynamic_update_slice",
            Op::RandomBitsBlock { .. } => "random_bits",
            Op::Pcast { .. } => "pcast",
            Op::MoeRoute { .. } => "moe_route",
            Op::MoeRouteGrad { .. } => "moe_route_grad",
            Op::MoeDispatch => "moe_dispatch",
            Op::MoeCombine => "moe_combine",
            Op::MoeGateGrad => "moe_gate_grad",
            Op::SgdUpdate { .. } => "sgd_update",
            Op::AdamWUpdate { .. } => "adamw_update",
        }
    }

    /// Whether the op moves data between devices (psum, all_gather, psum_scatter, ppermute,
    /// all_to_all); axis_index folds and pcast move nothing.
    pub fn is_collective(&self) -> bool {
        matches!(
            self,
            Op::Psum { .. } | Op::AllGather { .. } | Op::PsumScatter { .. } | Op::Ppermute { .. } | Op::AllToAll { .. }
        )
    }

    /// Attributes as printed after the operands (`contracting=([2],[0])`).
    pub fn attrs(&self) -> String {
        match self {
            Op::Reshape { shape } => format!("shape={shape:?}"),
            Op::Transpose { perm } => format!("permutation={perm:?}"),
            Op::BroadcastInDim { shape, dims } => format!("shape={shape:?} broadcast_dimensions={dims:?}"),
            Op::Split { axis, sizes } => format!("axis={axis} sizes={sizes:?}"),
            Op::Concat { axis } => format!("dimension={axis}"),
            Op::Reshard { spec } => format!("out_sharding={}", spec.p_text()),
            Op::Scale { alpha } => format!("alpha={alpha}"),
            Op::Full { shape, value } => format!("shape={shape:?} value={value}"),
            Op::DotGeneral {
                lhs_contract,
                rhs_contract,
                lhs_batch,
                rhs_batch,
                alpha,
            } => {
                let mut s = format!("contracting=({lhs_contract:?},{rhs_contract:?})");
                if !lhs_batch.is_empty() {
                    s += &format!(" batch=({lhs_batch:?},{rhs_batch:?})");
                }
                if *alpha != 1.0 {
                    s += &format!(" alpha={alpha}");
                }
                s
            }
            Op::ReduceSum { axes } => format!("axes={axes:?}"),
            Op::ScatterAdd { rows } => format!("rows={rows}"),
            Op::FoldIn { data } => format!("data={data}"),
            Op::RandomBits { shape, layout, rows } => {
                let s = format!("shape={shape:?} layout={layout:?}").to_lowercase();
                match rows {
                    SeqBlock::Whole => s,
                    rows => format!("{s} rows={}", rows.text()),
                }
            }
            Op::Dropout { rate } => format!("rate={rate}"),
            Op::Attention { scale, rate, seq } | Op::AttentionGrad { scale, rate, seq } => {
                let mut s = format!("is_causal=true scale={scale}");
                if *rate > 0.0 {
                    s += &format!(" dropout_rate={rate}");
                }
                if !seq.is_whole() {
                    s += &format!(" q={} kv={}", seq.q.text(), seq.kv.text());
                }
                s
            }
            Op::Psum { axes, .. } => format!("axes={}", axes_text(axes)),
            Op::Pcast { axes } => format!("axes={} to=varying", axes_text(axes)),
            Op::AllGather {
                axes,
                axis,
                tiled,
                invarying,
                ..
            } => {
                let to = if *invarying { " to=invarying" } else { "" };
                format!("axes={} axis={axis} tiled={tiled}{to}", axes_text(axes))
            }
            Op::PsumScatter {
                axes,
                scatter_dimension,
                tiled,
                ..
            } => format!(
                "axes={} scatter_dimension={scatter_dimension} tiled={tiled}",
                axes_text(axes)
            ),
            Op::Ppermute { axis, perm } => format!("axis='{axis}' perm={perm:?}"),
            Op::AllToAll {
                axes,
                split_axis,
                concat_axis,
                ..
            } => format!(
                "axes={} split_axis={split_axis} concat_axis={concat_axis}",
                axes_text(axes)
            ),
            Op::FoldInAxisIndex {
                axes,
                stride: 1,
                offset: 0,
            } => format!("data=axis_index({})", axes_text(axes)),
            Op::FoldInAxisIndex { axes, stride, offset } => {
                format!("data=axis_index({})*{}+{offset}", axes_text(axes), *stride as i32)
            }
            Op::ShardSlice { dim, axes, parts } => {
                format!("dimension={dim} index=axis_index({}) of {parts}", axes_text(axes))
            }
            Op::SeqTake { dim, seq } => format!("dimension={dim} rows={}", seq.text()),
            Op::SeqPut { dim, seq, len } => format!("dimension={dim} rows={} of {len}", seq.text()),
            Op::RandomBitsBlock {
                global,
                spec,
                layout,
                seq,
                ..
            } => {
                let mut s = format!(
                    "global_shape={global:?} block={spec} layout={}",
                    format!("{layout:?}").to_lowercase()
                );
                if !seq.is_whole() {
                    s += &format!(" rows={} cols={}", seq.q.text(), seq.kv.text());
                }
                s
            }
            Op::MoeRoute { k, capacity } => format!("top_k={k} capacity={capacity}"),
            Op::MoeRouteGrad { capacity } => format!("capacity={capacity}"),
            Op::SgdUpdate { lr } => format!("lr={lr}"),
            Op::AdamWUpdate { lr, wd, .. } => format!("lr={lr} wd={wd}"),
            _ => String::new(),
        }
    }

    /// Output types from input types, or an error saying what does not fit.
    pub fn infer(&self, ins: &[&ValueInfo]) -> Result<Vec<ValueInfo>, IrError> {
        let name = self.name();
        let err = |m: String| Err(IrError::new(name, m));
        let want = |n: usize| -> Result<(), IrError> {
            if ins.len() != n {
                return Err(IrError::new(name, format!("takes {n} operands, got {}", ins.len())));
            }
            Ok(())
        };
        let s = |i: usize| ins[i].shape.clone();
        match self {
            Op::Reshape { shape } => {
                want(1)?;
                if super::numel(shape) != ins[0].numel() {
                    return err(format!("cannot reshape {:?} to {:?}", ins[0].shape, shape));
                }
                Ok(vec![ValueInfo {
                    shape: shape.clone(),
                    dtype: ins[0].dtype,
                    name: None,
                }])
            }
            Op::Transpose { perm } => {
                want(1)?;
                let mut sorted = perm.clone();
                sorted.sort();
                if sorted != (0..ins[0].shape.len()).collect::<Vec<_>>() {
                    return err(format!("{perm:?} is not a permutation of rank {}", ins[0].shape.len()));
                }
                let shape = perm.iter().map(|&p| ins[0].shape[p]).collect();
                Ok(vec![ValueInfo {
                    shape,
                    dtype: ins[0].dtype,
                    name: None,
                }])
            }
            Op::BroadcastInDim { shape, dims } => {
                want(1)?;
                if dims.len() != ins[0].shape.len() || dims.windows(2).any(|w| w[0] >= w[1]) {
                    return err(format!("dims {dims:?} do not map operand rank {}", ins[0].shape.len()));
                }
                for (i, &d) in dims.iter().enumerate() {
                    if d >= shape.len() || (ins[0].shape[i] != shape[d] && ins[0].shape[i] != 1) {
                        return err(format!("operand {:?} does not broadcast to {shape:?}", ins[0].shape));
                    }
                }
                Ok(vec![ValueInfo {
                    shape: shape.clone(),
                    dtype: ins[0].dtype,
                    name: None,
                }])
            }
            Op::Split { axis, sizes } => {
                want(1)?;
                if *axis >= ins[0].shape.len() || sizes.iter().sum::<usize>() != ins[0].shape[*axis] {
                    return err(format!(
                        "sizes {sizes:?} do not split axis {axis} of {:?}",
                        ins[0].shape
                    ));
                }
                Ok(sizes
                    .iter()
                    .map(|&n| {
                        let mut sh = s(0);
                        sh[*axis] = n;
                        ValueInfo {
                            shape: sh,
                            dtype: ins[0].dtype,
                            name: None,
                        }
                    })
                    .collect())
            }
            Op::Concat { axis } => {
                if ins.is_empty() {
                    return err("needs at least one operand".into());
                }
                let mut shape = s(0);
                if *axis >= shape.len() {
                    return err(format!("axis {axis} out of range for {shape:?}"));
                }
                shape[*axis] = 0;
                for v in ins {
                    let mut a = v.shape.clone();
                    let mut b = ins[0].shape.clone();
                    a[*axis] = 0;
                    b[*axis] = 0;
                    if a != b {
                        return err(format!("{:?} and {:?} differ off axis {axis}", v.shape, ins[0].shape));
                    }
                    shape[*axis] += v.shape[*axis];
                }
                Ok(vec![ValueInfo {
                    shape,
                    dtype: ins[0].dtype,
                    name: None,
                }])
            }
            Op::Add | Op::Sub | Op::Mul => {
                want(2)?;
                if !is_suffix(&ins[1].shape, &ins[0].shape) {
                    return err(format!(
                        "shapes {:?} and {:?} do not broadcast",
                        ins[0].shape, ins[1].shape
                    ));
                }
                Ok(vec![f32s(s(0))])
            }
            Op::Full { shape, .. } => {
                want(0)?;
                Ok(vec![f32s(shape.clone())])
            }
            Op::Scale { .. } | Op::Gelu => {
                want(1)?;
                Ok(vec![f32s(s(0))])
            }
            Op::GeluGrad => {
                want(2)?;
                if ins[0].shape != ins[1].shape {
                    return err("x and dy shapes differ".into());
                }
                Ok(vec![f32s(s(0))])
            }
            Op::DotGeneral {
                lhs_contract,
                rhs_contract,
                lhs_batch,
                rhs_batch,
                ..
            } => {
                want(2)?;
                let (l, r) = (&ins[0].shape, &ins[1].shape);
                if lhs_contract.len() != rhs_contract.len() || lhs_batch.len() != rhs_batch.len() {
                    return err("contracting and batch dimension lists must pair up".into());
                }
                for (&a, &b) in lhs_contract
                    .iter()
                    .zip(rhs_contract)
                    .chain(lhs_batch.iter().zip(rhs_batch))
                {
                    if a >= l.len() || b >= r.len() || l[a] != r[b] {
                        return err(format!("dimension {a} of {l:?} does not match dimension {b} of {r:?}"));
                    }
                }
                let mut shape: Vec<usize> = lhs_batch.iter().map(|&d| l[d]).collect();
                shape.extend(
                    (0..l.len())
                        .filter(|d| !lhs_contract.contains(d) && !lhs_batch.contains(d))
                        .map(|d| l[d]),
                );
                shape.extend(
                    (0..r.len())
                        .filter(|d| !rhs_contract.contains(d) && !rhs_batch.contains(d))
                        .map(|d| r[d]),
                );
                Ok(vec![f32s(shape)])
            }
            Op::ReduceSum { axes } => {
                want(1)?;
                if axes.iter().any(|&a| a >= ins[0].shape.len()) {
                    return err(format!("axes {axes:?} out of range for {:?}", ins[0].shape));
                }
                let shape = (0..ins[0].shape.len())
                    .filter(|d| !axes.contains(d))
                    .map(|d| ins[0].shape[d])
                    .collect();
                Ok(vec![f32s(shape)])
            }
            Op::LayerNorm => {
                want(3)?;
                let c = *ins[0].shape.last().unwrap_or(&0);
                if ins[1].shape != [c] || ins[2].shape != [c] {
                    return err(format!("gamma/beta must be [{c}]"));
                }
                let rows = ins[0].shape[..ins[0].shape.len() - 1].to_vec();
                Ok(vec![f32s(s(0)), f32s(rows.clone()), f32s(rows)])
            }
            Op::LayerNormGrad => {
                want(5)?;
                Ok(vec![f32s(s(1)), f32s(s(4)), f32s(s(4))])
            }
            Op::SoftmaxCausal => {
                want(1)?;
                let r = ins[0].shape.len();
                if r < 2 || ins[0].shape[r - 1] != ins[0].shape[r - 2] {
                    return err(format!("needs a [..., T, T] operand, got {:?}", ins[0].shape));
                }
                Ok(vec![f32s(s(0))])
            }
            Op::SoftmaxCausalGrad => {
                want(2)?;
                Ok(vec![f32s(s(0))])
            }
            Op::Attention { rate, seq, .. } => {
                want(if *rate > 0.0 { 4 } else { 3 })?;
                let rows = attention_rows(name, &ins[..3], ins.get(3).copied(), seq)?;
                Ok(vec![f32s(s(0)), f32s(rows)])
            }
            Op::AttentionGrad { rate, seq, .. } => {
                want(if *rate > 0.0 { 7 } else { 6 })?;
                let rows = attention_rows(name, &ins[..3], ins.get(6).copied(), seq)?;
                if ins[3].shape != ins[0].shape || ins[5].shape != ins[0].shape || ins[4].shape != rows {
                    return err(format!("o and do must be {:?} and lse {rows:?}", ins[0].shape));
                }
                Ok(vec![f32s(s(0)), f32s(s(1)), f32s(s(2))])
            }
            Op::AttentionCombine => {
                want(4)?;
                let o = &ins[0].shape;
                let rows = &o[..o.len().saturating_sub(1)];
                let fits = !o.is_empty()
                    && ins[2].shape == *o
                    && ins[1].shape == rows
                    && ins[3].shape == rows
                    && ins.iter().all(|v| v.dtype == DType::F32);
                if !fits {
                    return err(format!("takes (o, lse, o, lse) of f32{o:?} and f32{rows:?}"));
                }
                Ok(vec![f32s(s(0)), f32s(s(1))])
            }
            Op::CrossEntropy => {
                want(2)?;
                let l = &ins[0].shape;
                if ins[1].dtype != DType::U32 || ins[1].shape[..] != l[..l.len() - 1] {
                    return err(format!("targets must be u32{:?}", &l[..l.len() - 1]));
                }
                Ok(vec![f32s(ins[1].shape.clone())])
            }
            Op::CrossEntropyGrad => {
                want(3)?;
                Ok(vec![f32s(s(0))])
            }
            Op::Gather => {
                want(2)?;
                if ins[0].shape.len() != 2 || ins[1].dtype != DType::U32 {
                    return err("takes a (V, C) table and u32 ids".into());
                }
                let mut shape = s(1);
                shape.push(ins[0].shape[1]);
                Ok(vec![f32s(shape)])
            }
            Op::ScatterAdd { rows } => {
                want(2)?;
                Ok(vec![f32s(vec![*rows, *ins[0].shape.last().unwrap_or(&0)])])
            }
            Op::FoldIn { .. } => {
                want(1)?;
                Ok(vec![u32s(vec![2])])
            }
            Op::RandomBits { shape, .. } => {
                want(1)?;
                if ins[0].dtype != DType::U32 || ins[0].shape != [2] {
                    return err("takes a key: u32[2]".into());
                }
                Ok(vec![u32s(shape.clone())])
            }
            Op::Dropout { rate } => {
                want(2)?;
                if !(0.0..1.0).contains(rate) {
                    return err(format!("rate {rate} must be in [0, 1)"));
                }
                if ins[1].shape != ins[0].shape || ins[1].dtype != DType::U32 {
                    return err("bits must be u32 of the operand's shape".into());
                }
                Ok(vec![f32s(s(0))])
            }
            Op::Psum { .. } => {
                if ins.is_empty() {
                    return err("needs at least one operand".into());
                }
                Ok(ins
                    .iter()
                    .map(|v| ValueInfo {
                        shape: v.shape.clone(),
                        dtype: v.dtype,
                        name: None,
                    })
                    .collect())
            }
            Op::Ppermute { .. } | Op::Pcast { .. } | Op::Reshard { .. } => {
                want(1)?;
                Ok(vec![ValueInfo {
                    shape: s(0),
                    dtype: ins[0].dtype,
                    name: None,
                }])
            }
            Op::AllGather { group, axis, tiled, .. } => {
                want(1)?;
                let mut shape = s(0);
                if *axis > shape.len() || (*tiled && *axis == shape.len()) {
                    return err(format!("axis {axis} out of range for {shape:?}"));
                }
                if *tiled {
                    shape[*axis] *= group;
                } else {
                    shape.insert(*axis, *group);
                }
                Ok(vec![ValueInfo {
                    shape,
                    dtype: ins[0].dtype,
                    name: None,
                }])
            }
            Op::PsumScatter {
                group,
                scatter_dimension: d,
                tiled,
                ..
            } => {
                want(1)?;
                let mut shape = s(0);
                if *d >= shape.len() {
                    return err(format!("scatter_dimension {d} out of range for {shape:?}"));
                }
                if *tiled {
                    if shape[*d] % group != 0 {
                        return err(format!(
                            "dimension {d} of size {} is not divisible by the group of {group}",
                            shape[*d]
                        ));
                    }
                    shape[*d] /= group;
                } else {
                    if shape[*d] != *group {
                        return err(format!("untiled: dimension {d} must equal the group size {group}"));
                    }
                    shape.remove(*d);
                }
                Ok(vec![f32s(shape)])
            }
            Op::AllToAll {
                group,
                split_axis,
                concat_axis,
                ..
            } => {
                want(1)?;
                let mut shape = s(0);
                if *split_axis >= shape.len() || *concat_axis >= shape.len() || shape[*split_axis] % group != 0 {
                    return err(format!("cannot split axis {split_axis} of {shape:?} into {group}"));
                }
                shape[*split_axis] /= group;
                shape[*concat_axis] *= group;
                // Moves data: token ids stay u32 (jit reshards integer arrays with it too).
                Ok(vec![ValueInfo {
                    shape,
                    dtype: ins[0].dtype,
                    name: None,
                }])
            }
            Op::FoldInAxisIndex { .. } => {
                want(1)?;
                Ok(vec![u32s(vec![2])])
            }
            Op::ShardSlice { dim, parts, .. } => {
                want(1)?;
                let mut shape = s(0);
                if *dim >= shape.len() || *parts == 0 || shape[*dim] % parts != 0 {
                    return err(format!(
                        "cannot cut dimension {dim} of {shape:?} into {parts} equal chunks"
                    ));
                }
                shape[*dim] /= parts;
                Ok(vec![ValueInfo {
                    shape,
                    dtype: ins[0].dtype,
                    name: None,
                }])
            }
            Op::SeqTake { dim, seq } => {
                want(1)?;
                let mut shape = s(0);
                let parts = match seq {
                    SeqBlock::Whole | SeqBlock::Zigzag { .. } => 1,
                    SeqBlock::Part { parts, .. } => *parts,
                };
                let chunks = match seq {
                    SeqBlock::Part {
                        order: super::CpOrder::Zigzag,
                        ..
                    } => 2 * parts,
                    _ => parts,
                };
                if *dim >= shape.len() || parts == 0 || shape[*dim] % chunks != 0 {
                    return err(format!(
                        "cannot cut dimension {dim} of {shape:?} into {chunks} equal chunks"
                    ));
                }
                shape[*dim] /= parts;
                Ok(vec![ValueInfo {
                    shape,
                    dtype: ins[0].dtype,
                    name: None,
                }])
            }
            Op::SeqPut { dim, seq, len } => {
                want(1)?;
                let mut shape = s(0);
                if *dim >= shape.len() || seq.global_len(shape[*dim]) != *len {
                    return err(format!("{shape:?} is not a block of {len} rows of dimension {dim}"));
                }
                shape[*dim] = *len;
                Ok(vec![ValueInfo {
                    shape,
                    dtype: ins[0].dtype,
                    name: None,
                }])
            }
            Op::RandomBitsBlock { shape, global, .. } => {
                want(1)?;
                if ins[0].dtype != DType::U32 || ins[0].shape != [2] {
                    return err("takes a key: u32[2]".into());
                }
                if shape.len() != global.len() || shape.iter().zip(global).any(|(l, g)| *l == 0 || g % l != 0) {
                    return err(format!("block {shape:?} does not tile the global shape {global:?}"));
                }
                Ok(vec![u32s(shape.clone())])
            }
            Op::MoeRoute { .. } | Op::MoeRouteGrad { .. } | Op::MoeDispatch | Op::MoeCombine | Op::MoeGateGrad => {
                super::moe::infer(self, ins)
            }
            Op::SgdUpdate { .. } => {
                want(2)?;
                Ok(vec![f32s(s(0))])
            }
            Op::AdamWUpdate { .. } => {
                want(4)?;
                Ok(vec![f32s(s(0)), f32s(s(0)), f32s(s(0))])
            }
        }
    }
}
