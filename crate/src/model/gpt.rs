use super::moe::{moe_mlp, MoeSplit};
use super::ring::{ring_attention, Ring, RingDropout};
use super::{Attention, GptConfig};
use crate::ir::{AttnSeq, Builder, CheckpointPolicy, CpOrder, Op, RngLayout, SeqBlock, ValueId};
use crate::sharding::PartitionSpec;

/// The values a forward pass reads: parameters in `param_specs` order, tokens, targets,
/// and the step's key (needed only with dropout).
pub struct Activations<'a> {
    pub params: &'a [ValueId],
    pub tokens: ValueId,  // (B, T) u32
    pub targets: ValueId, // (B, T) u32
    pub key: ValueId,     // u32[2]
    pub rng_layout: RngLayout,
    /// How this program's shapes relate to the model's (one device: `Local::of(cfg)`).
    pub local: Local,
}

/// The sizes one device sees (the MLP width follows its local w_fc), and the tensor-parallel axis if the model is split Megatron
/// style: heads and the MLP's hidden units divided over `tp`, with a psum after the
/// row-parallel projections and a pcast to varying (psum in the backward) before the column-parallel ones.
#[derive(Clone, Debug, PartialEq)]
pub struct Local {
    pub batch: usize,
    pub heads: usize,
    pub tp: Option<String>,
    /// The sequence rows of the residual stream this device holds (all of them unless the
    /// sequence is split).
    pub seq: usize,
    /// The sequence rows attention sees: the residual stream's, but under sequence parallelism,
    /// whose regions are gathered over "tp" before attention, those of the whole "tp" group.
    pub attention_seq: usize,
    /// Sequence parallelism (Korthikanti et al.): the residual stream split on the sequence over
    /// `tp`; an all_gather (reduce-scatter in the backward) replaces the pcast before the
    /// column-parallel matmuls and a psum_scatter (all-gather in the backward) the psum after
    /// the row-parallel ones.
    pub sp: bool,
    /// Where the sequence is split: this device's block of it (the rows of wpe it reads).
    pub rows: Option<SeqBlock>,
    /// Context parallelism: the sequence split over a ring, attention as ring attention.
    pub ring: Option<Ring>,
    /// Dropout masks as this device's block of the one-device run's (bit for bit), where the
    /// body splits the tokens; None draws each mask on the local shape (the seed's body).
    pub masks: Option<MaskBlocks>,
    /// Pipeline parallelism: the blocks traced are a stage's run of the model's, block `l` of
    /// the program being the model's block `first + l` (its dropout keys are that block's).
    pub stage: Option<Stage>,
    /// How a mixture-of-experts MLP is split (None: whole, as on one device).
    pub moe: Option<MoeSplit>,
    /// A global program's zig-zag order (automatic mode's context parallelism): the sequence
    /// runs in zig-zag order of this many blocks ([`reorder`]), so jit's contiguous block r of
    /// it is zig-zag's chunks r and 2 x parts - 1 - r. Tokens, targets, wpe's rows and the
    /// dropout bits are reordered, keys and values put back, and attention told where its
    /// queries sit; the loss is the one-device run's.
    pub zigzag: Option<usize>,
}

/// A pipeline stage's run of blocks: where it starts in the model.
#[derive(Clone, Debug, PartialEq)]
pub struct Stage {
    /// The model's number of the run's first block.
    pub first: usize,
}

/// The mesh axes that split the batch, the sequence of the residual stream and the heads: a
/// device's block of each dropout site's global mask.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MaskBlocks {
    pub batch: Vec<String>,
    pub seq: Vec<String>,
    pub heads: Option<String>,
    /// A residual-stream block no spec describes (zig-zag's two chunks): its rows are taken
    /// from the bits of the whole sequence, as a JAX user slices `jax.random.bits` of the
    /// global shape.
    pub rows: Option<SeqBlock>,
}

impl Local {
    /// The whole model on one device.
    pub fn of(cfg: &GptConfig) -> Self {
        Self {
            batch: cfg.batch,
            heads: cfg.heads,
            tp: None,
            seq: cfg.seq,
            attention_seq: cfg.seq,
            sp: false,
            rows: None,
            ring: None,
            masks: None,
            stage: None,
            moe: None,
            zigzag: None,
        }
    }
}

/// Dimension `dim` of `x` (the whole sequence) put in zig-zag order of `parts` blocks, or
/// (`back`) returned from it: its 2 x parts chunks split and concatenated in
/// [`CpOrder::chunk_order`], as MaxText's `reorder_sequence` does to the tokens under jit.
pub fn reorder(b: &mut Builder, x: ValueId, dim: usize, parts: usize, back: bool) -> ValueId {
    let order = CpOrder::Zigzag.chunk_order(parts);
    let n = b.shape(x).get(dim).copied().unwrap_or(0);
    let chunks = b.split(x, dim, &vec![n / order.len(); order.len()]);
    let picked: Vec<ValueId> = if back {
        (0..order.len())
            .map(|c| chunks[order.iter().position(|&o| o == c).unwrap_or(c)])
            .collect()
    } else {
        order.iter().map(|&c| chunks[c]).collect()
    };
    b.concat(&picked, dim)
}

/// The names of the tokens and targets in a global zig-zag order: what jit splits over "cp"
/// (the order is the program's, so its inputs arrive whole on the sequence).
pub const ZIGZAG_INPUTS: [&str; 2] = ["tokens.zigzag", "targets.zigzag"];

/// `x` in the program's order: reordered along `dim` under a global zig-zag, else as it is.
fn in_order(b: &mut Builder, a: &Activations, x: ValueId, dim: usize) -> ValueId {
    match a.local.zigzag {
        Some(parts) => reorder(b, x, dim, parts, false),
        None => x,
    }
}

/// The tokens or targets (`which` of [`ZIGZAG_INPUTS`]) in the program's order, named.
fn data_in_order(b: &mut Builder, a: &Activations, x: ValueId, which: usize) -> ValueId {
    let y = in_order(b, a, x, 1);
    if y != x {
        b.set_name(y, ZIGZAG_INPUTS[which]);
    }
    y
}

/// Column-parallel input: under tensor parallelism the replicated activation becomes varying;
/// under sequence parallelism the device's rows are gathered into the whole sequence.
fn col_in(b: &mut Builder, a: &Activations, x: ValueId) -> ValueId {
    match &a.local.tp {
        Some(tp) if a.local.sp => b.all_gather(x, &[tp], 1, true),
        Some(tp) => b.pcast(x, &[tp]),
        None => x,
    }
}

/// The column-parallel `x @ w + bias`. Under sequence parallelism the device's rows of `x` are
/// gathered into the whole sequence, and, as Megatron-LM's sequence parallelism does
/// (Korthikanti et al. 2022, section 4.2.2), the gather and the matmul are traced under
/// `jax.checkpoint` (nothing saveable): the backward pass holds the device's rows alone and
/// gathers them again for the weight's gradient. Where the block is checkpointed already
/// (remat) its recompute gathers them anyway, and no region of its own is needed.
fn col_linear(b: &mut Builder, cfg: &GptConfig, a: &Activations, x: ValueId, w: ValueId, bias: ValueId) -> ValueId {
    if a.local.sp && cfg.remat.policy().is_none() {
        b.checkpoint(Some(CheckpointPolicy::NothingSaveable), |b| {
            let h = col_in(b, a, x);
            linear(b, h, w, bias)
        })
    } else {
        let h = col_in(b, a, x);
        linear(b, h, w, bias)
    }
}

/// Row-parallel output: partial sums over the tensor-parallel group are added up, or, under
/// sequence parallelism, added up and scattered so each device keeps its rows.
fn row_out(b: &mut Builder, a: &Activations, y: ValueId) -> ValueId {
    match &a.local.tp {
        Some(tp) if a.local.sp => b.psum_scatter(y, &[tp], 1, true),
        Some(tp) => b.psum(y, &[tp]),
        None => y,
    }
}

/// This device's block of the bits of the global array that `local` is a block of, split as
/// `spec` says: what `jax.random.bits(key, global)` holds there.
fn block_bits(b: &mut Builder, key: ValueId, local: &[usize], spec: PartitionSpec, layout: RngLayout) -> ValueId {
    let global = global_shape(b, local, &spec);
    b.emit1(
        Op::RandomBitsBlock {
            global,
            spec,
            shape: local.to_vec(),
            layout,
            seq: Default::default(),
        },
        &[key],
    )
}

/// The shape of the global array whose block, split as `spec` says, has shape `local`.
fn global_shape(b: &Builder, local: &[usize], spec: &PartitionSpec) -> Vec<usize> {
    local
        .iter()
        .enumerate()
        .map(|(d, &n)| n * b.mesh().and_then(|m| m.axes_size(&spec.dim_axes(d)).ok()).unwrap_or(1))
        .collect()
}

/// The spec of a device's block of a mask over (batch, sequence, ...) or, `heads`, over
/// (batch, heads, T, T).
fn mask_spec(m: &MaskBlocks, rank: usize, heads: bool) -> PartitionSpec {
    let second = if heads {
        m.heads.iter().cloned().collect()
    } else {
        m.seq.clone()
    };
    let mut entries = vec![m.batch.clone(), second];
    entries.resize(rank, vec![]);
    PartitionSpec::new(entries)
}

/// Dropout site `site` of block `l` gets its own key: fold_in(step key, 3l + site). On a
/// pipeline stage, `l` counts from the stage's first block.
fn site_key(b: &mut Builder, a: &Activations, l: usize, site: u32) -> ValueId {
    let first = a.local.stage.as_ref().map_or(0, |s| s.first);
    b.fold_in(a.key, 3 * (first + l) as u32 + site)
}

fn dropout(b: &mut Builder, cfg: &GptConfig, a: &Activations, x: ValueId, l: usize, site: u32) -> ValueId {
    if cfg.dropout == 0.0 {
        return x;
    }
    let key = site_key(b, a, l, site);
    match &a.local.masks {
        // The residual stream's bits of the one-device run's rows, in the program's order:
        // drawn whole and reordered, as shard_map's zig-zag body takes its rows of them (a
        // block at zig-zag rows is drawn only inside attention's kernels, for its own bits).
        // Unfused attention, whose probabilities are site 0, is refused with zig-zag.
        None if a.local.zigzag.is_some() => {
            let shape = b.shape(x);
            let bits = b.random_bits(key, &shape, a.rng_layout);
            let bits = in_order(b, a, bits, 1);
            b.emit1(Op::Dropout { rate: cfg.dropout }, &[x, bits])
        }
        None => b.dropout(x, key, cfg.dropout, a.rng_layout),
        Some(m) => {
            let shape = b.shape(x);
            let bits = match (&m.rows, site) {
                (Some(rows), 1 | 2) => {
                    // The whole sequence's bits of the device's batch block, then its rows.
                    let mut whole = shape.clone();
                    whole[1] = cfg.seq;
                    let spec = PartitionSpec::new(vec![m.batch.clone()]);
                    let all = block_bits(b, key, &whole, spec, a.rng_layout);
                    b.emit1(
                        Op::SeqTake {
                            dim: 1,
                            seq: rows.clone(),
                        },
                        &[all],
                    )
                }
                _ => block_bits(b, key, &shape, mask_spec(m, shape.len(), site == 0), a.rng_layout),
            };
            b.emit1(Op::Dropout { rate: cfg.dropout }, &[x, bits])
        }
    }
}

/// Fused attention of queries in a global zig-zag order: keys and values put back in order
/// (jit gathers them whole, as it does for contiguous blocks), the op told where the queries
/// sit, and the dropout bits drawn at the queries' rows (each device its block of them).
fn zigzag_attention(
    b: &mut Builder,
    cfg: &GptConfig,
    a: &Activations,
    l: usize,
    qkv: [ValueId; 3],
    scale: f32,
) -> ValueId {
    let parts = a.local.zigzag.unwrap_or(1);
    let [q, k, v] = qkv;
    let [k, v] = [k, v].map(|x| reorder(b, x, 2, parts, true));
    let mut inputs = vec![q, k, v];
    if cfg.dropout > 0.0 {
        let key = site_key(b, a, l, 0);
        let mut shape = b.shape(q);
        let n = shape.len();
        shape[n - 1] = shape[n - 2];
        let bits = Op::RandomBits {
            shape,
            layout: a.rng_layout,
            rows: SeqBlock::Zigzag { parts },
        };
        inputs.push(b.emit1(bits, &[key]));
    }
    let op = Op::Attention {
        scale,
        rate: cfg.dropout,
        seq: AttnSeq {
            q: SeqBlock::Zigzag { parts },
            kv: SeqBlock::Whole,
        },
    };
    b.emit(op, &inputs)[0]
}

/// `x @ w + bias`
fn linear(b: &mut Builder, x: ValueId, w: ValueId, bias: ValueId) -> ValueId {
    let y = b.matmul(x, w);
    b.add(y, bias)
}

/// Traces docs/MODEL.md's forward pass and mean cross-entropy, plus the mixture of experts'
/// load-balancing losses; returns the scalar loss.
pub fn forward_loss(b: &mut Builder, cfg: &GptConfig, a: &Activations) -> ValueId {
    let (logits, aux) = forward(b, cfg, a);
    let targets = data_in_order(b, a, a.targets, 1);
    let losses = b.cross_entropy(logits, targets); // (B, T)
    let mut loss = b.mean(losses);
    if let Some(aux) = aux {
        loss = b.add(loss, aux);
    }
    b.set_name(loss, "loss");
    loss
}

/// Traces docs/MODEL.md's forward pass up to the logits, (B, T, V), in the tokens' order.
pub fn forward_logits(b: &mut Builder, cfg: &GptConfig, a: &Activations) -> ValueId {
    let logits = forward(b, cfg, a).0;
    match a.local.zigzag {
        Some(parts) => reorder(b, logits, 1, parts, true),
        None => logits,
    }
}

/// The logits and, with a mixture of experts, the sum of its blocks' load-balancing losses.
fn forward(b: &mut Builder, cfg: &GptConfig, a: &Activations) -> (ValueId, Option<ValueId>) {
    let mut x = embed(b, a);
    let mut total: Option<ValueId> = None;
    for l in 0..cfg.layers {
        let (y, aux) = b.checkpoint(cfg.remat.policy(), |b| block_parts(b, cfg, a, l, x));
        x = y;
        total = match (total, aux) {
            (Some(t), Some(aux)) => Some(b.add(t, aux)),
            (t, aux) => t.or(aux),
        };
    }
    (head(b, cfg, a, x), total)
}

/// The residual stream's start: token and position embeddings, (B, T, C).
pub fn embed(b: &mut Builder, a: &Activations) -> ValueId {
    let p = a.params;
    let tokens = data_in_order(b, a, a.tokens, 0);
    let tok = b.take(p[0], tokens); // (B, T, C)
    b.set_name(tok, "tok_emb");
    // Where the sequence is split, the device's rows of wpe (its positions); in zig-zag
    // order, the positions of the reordered tokens.
    let wpe = match &a.local.rows {
        Some(rows) => b.emit1(
            Op::SeqTake {
                dim: 0,
                seq: rows.clone(),
            },
            &[p[1]],
        ),
        None => in_order(b, a, p[1], 0),
    };
    let x = b.add(tok, wpe); // + wpe (T, C)
    b.set_name(x, "x0");
    x
}

/// The final layer norm and the head on the residual stream: the logits, (B, T, V). Its
/// parameters follow `cfg.layers` blocks' in `a.params`.
pub fn head(b: &mut Builder, cfg: &GptConfig, a: &Activations, x: ValueId) -> ValueId {
    let p = a.params;
    let nf = 2 + 12 * cfg.layers;
    let xf = b.layer_norm(x, p[nf], p[nf + 1]);
    let logits = if cfg.tied {
        b.dot_general(xf, p[0], (&[2], &[1]), (&[], &[]), 1.0) // x @ wte^T
    } else {
        b.matmul(xf, p[nf + 2])
    }; // (B, T, V)
    b.set_name(logits, "logits");
    logits
}

/// Block `l` of docs/MODEL.md on the residual stream `x`: attention, then the MLP, each with
/// its residual add; returns the new residual stream. (A mixture of experts' load-balancing
/// loss is [`forward_loss`]'s to add: a pipeline refuses one.)
pub fn block(b: &mut Builder, cfg: &GptConfig, a: &Activations, l: usize, x: ValueId) -> ValueId {
    block_parts(b, cfg, a, l, x).0
}

/// [`block`], with the load-balancing loss of its mixture of experts (None for a dense MLP).
fn block_parts(b: &mut Builder, cfg: &GptConfig, a: &Activations, l: usize, x: ValueId) -> (ValueId, Option<ValueId>) {
    // Attention sees the whole sequence, except under context parallelism (its block, and the
    // ring brings the others) and in sequence parallelism's own regions (gathered before).
    let t = a.local.attention_seq;
    let (bsz, d, h) = (a.local.batch, cfg.d_model, a.local.heads);
    let dh = cfg.head_dim();
    let p = a.params;
    let w = &p[2 + 12 * l..2 + 12 * (l + 1)];
    let (ln1_g, ln1_b, w_qkv, b_qkv, w_proj, b_proj) = (w[0], w[1], w[2], w[3], w[4], w[5]);
    let (ln2_g, ln2_b, w_fc, b_fc, w_out, b_out) = (w[6], w[7], w[8], w[9], w[10], w[11]);

    // attention
    let hn = b.layer_norm(x, ln1_g, ln1_b);
    b.set_name(hn, &format!("h{l}.ln1"));
    let w_qkv = b.reshape(w_qkv, &[d, 3 * h * dh]); // columns: (3, H, Dh)
    let b_qkv = b.reshape(b_qkv, &[3 * h * dh]);
    let qkv = col_linear(b, cfg, a, hn, w_qkv, b_qkv); // (B, T, 3C)
    b.set_name(qkv, &format!("h{l}.qkv"));
    let qkv = b.reshape(qkv, &[bsz, t, 3, h, dh]);
    b.set_name(qkv, &format!("h{l}.heads"));
    let qkv = b.transpose(qkv, &[2, 0, 3, 1, 4]); // (3, B, H, T, Dh)
    let parts = b.split(qkv, 0, &[1, 1, 1]);
    let [q, k, v] = [0, 1, 2].map(|i| b.reshape(parts[i], &[bsz, h, t, dh])); // (B, H, T, Dh)
    for (x, n) in [(q, "q"), (k, "k"), (v, "v")] {
        b.set_name(x, &format!("h{l}.{n}"));
    }
    let scale = 1.0 / (dh as f32).sqrt();
    let y = match (cfg.attention, &a.local.ring) {
        (Attention::Fused, Some(ring)) => {
            let dropout = (cfg.dropout > 0.0).then(|| {
                let m = a.local.masks.clone().unwrap_or_default();
                let spec = mask_spec(&m, 2, true);
                // The (B, H) of the array this device's block is of, from the local shape: a
                // microbatch's where the step accumulates (B / k rows, its key folded in).
                let mut global = global_shape(b, &[bsz, h], &spec);
                global.extend([cfg.seq, cfg.seq]);
                let d = RingDropout {
                    rate: cfg.dropout,
                    layout: a.rng_layout,
                    global,
                    batch: spec,
                };
                (site_key(b, a, l, 0), d)
            });
            let y = ring_attention(b, ring, [q, k, v], scale, dropout);
            b.set_name(y, &format!("h{l}.att"));
            y
        }
        (Attention::Fused, None) if a.local.zigzag.is_some() => {
            let y = zigzag_attention(b, cfg, a, l, [q, k, v], scale);
            b.set_name(y, &format!("h{l}.att"));
            y
        }
        (Attention::Fused, None) => {
            // The probabilities' dropout site, with the unfused path's key and bits.
            let y = match (&a.local.masks, cfg.dropout > 0.0) {
                (Some(m), true) => {
                    let key = site_key(b, a, l, 0);
                    let mut shape = b.shape(q);
                    let n = shape.len();
                    shape[n - 1] = shape[n - 2];
                    let bits = block_bits(b, key, &shape, mask_spec(m, n, true), a.rng_layout);
                    let op = Op::Attention {
                        scale,
                        rate: cfg.dropout,
                        seq: Default::default(),
                    };
                    b.emit(op, &[q, k, v, bits])[0]
                }
                _ => {
                    let dropout = (cfg.dropout > 0.0).then(|| (site_key(b, a, l, 0), cfg.dropout, a.rng_layout));
                    b.attention([q, k, v], scale, dropout)
                }
            };
            b.set_name(y, &format!("h{l}.att"));
            y
        }
        (Attention::Unfused, _) => {
            let s = b.dot_general(q, k, (&[3], &[3]), (&[0, 1], &[0, 1]), scale); // (B, H, T, T)
            let att = b.softmax_causal(s);
            b.set_name(att, &format!("h{l}.att"));
            let att = dropout(b, cfg, a, att, l, 0);
            b.dot_general(att, v, (&[3], &[2]), (&[0, 1], &[0, 1]), 1.0) // (B, H, T, Dh)
        }
    };
    let y = b.transpose(y, &[0, 2, 1, 3]); // (B, T, H, Dh)
    let y = b.reshape(y, &[bsz, t, h * dh]);
    let y = b.matmul(y, w_proj);
    b.set_name(y, &format!("h{l}.proj"));
    let y = row_out(b, a, y);
    let y = b.add(y, b_proj);
    let y = dropout(b, cfg, a, y, l, 1);
    let x = b.add(x, y);
    b.set_name(x, &format!("h{l}.x_att"));

    // MLP (with a mixture of experts, w_fc, b_fc and w_out are the router and the experts'
    // two weights)
    let ln2 = b.layer_norm(x, ln2_g, ln2_b);
    b.set_name(ln2, &format!("h{l}.ln2"));
    let (f, aux) = match &cfg.moe {
        None => {
            let f = col_linear(b, cfg, a, ln2, w_fc, b_fc); // (B, T, 4C)
            let f = b.gelu(f);
            (b.matmul(f, w_out), None)
        }
        Some(moe) => {
            // w_router, w_fc (E, d, F) and w_out (E, F, d) in the dense MLP's places.
            let hn = col_in(b, a, ln2);
            let (f, aux) = moe_mlp(b, moe, a, l, ln2, hn, [w[8], w[9], w[10]]);
            (f, Some(aux))
        }
    };
    b.set_name(f, &format!("h{l}.mlp"));
    let f = row_out(b, a, f);
    let f = b.add(f, b_out);
    let f = dropout(b, cfg, a, f, l, 2);
    let x = b.add(x, f);
    b.set_name(x, &format!("h{l}.x_mlp"));
    (x, aux)
}
