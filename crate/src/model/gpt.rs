use super::{Attention, GptConfig};
use crate::ir::{Builder, RngLayout, ValueId};

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
}

impl Local {
    /// The whole model on one device.
    pub fn of(cfg: &GptConfig) -> Self {
        Self {
            batch: cfg.batch,
            heads: cfg.heads,
            tp: None,
        }
    }
}

/// Column-parallel input: under tensor parallelism the replicated activation becomes varying.
fn col_in(b: &mut Builder, a: &Activations, x: ValueId) -> ValueId {
    match &a.local.tp {
        Some(tp) => b.pcast(x, &[tp]),
        None => x,
    }
}

/// Row-parallel output: partial sums over the tensor-parallel group are added up.
fn row_out(b: &mut Builder, a: &Activations, y: ValueId) -> ValueId {
    match &a.local.tp {
        Some(tp) => b.psum(y, &[tp]),
        None => y,
    }
}

/// Dropout site `site` of block `l` gets its own key: fold_in(step key, 3l + site).
fn site_key(b: &mut Builder, a: &Activations, l: usize, site: u32) -> ValueId {
    b.fold_in(a.key, 3 * l as u32 + site)
}

fn dropout(b: &mut Builder, cfg: &GptConfig, a: &Activations, x: ValueId, l: usize, site: u32) -> ValueId {
    if cfg.dropout == 0.0 {
        return x;
    }
    let key = site_key(b, a, l, site);
    b.dropout(x, key, cfg.dropout, a.rng_layout)
}

/// `x @ w + bias`
fn linear(b: &mut Builder, x: ValueId, w: ValueId, bias: ValueId) -> ValueId {
    let y = b.matmul(x, w);
    b.add(y, bias)
}

/// Traces docs/MODEL.md's forward pass and mean cross-entropy; returns the scalar loss.
pub fn forward_loss(b: &mut Builder, cfg: &GptConfig, a: &Activations) -> ValueId {
    let logits = forward_logits(b, cfg, a);
    let losses = b.cross_entropy(logits, a.targets); // (B, T)
    let loss = b.mean(losses);
    b.set_name(loss, "loss");
    loss
}

/// Traces docs/MODEL.md's forward pass up to the logits, (B, T, V).
pub fn forward_logits(b: &mut Builder, cfg: &GptConfig, a: &Activations) -> ValueId {
    let p = a.params;

    let tok = b.take(p[0], a.tokens); // (B, T, C)
    let mut x = b.add(tok, p[1]); // + wpe (T, C)
    b.set_name(x, "x0");

    for l in 0..cfg.layers {
        x = b.checkpoint(cfg.remat.policy(), |b| block(b, cfg, a, l, x));
    }

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
/// its residual add; returns the new residual stream.
fn block(b: &mut Builder, cfg: &GptConfig, a: &Activations, l: usize, x: ValueId) -> ValueId {
    let (bsz, t, d, h) = (a.local.batch, cfg.seq, cfg.d_model, a.local.heads);
    let dh = cfg.head_dim();
    let p = a.params;
    let w = &p[2 + 12 * l..2 + 12 * (l + 1)];
    let (ln1_g, ln1_b, w_qkv, b_qkv, w_proj, b_proj) = (w[0], w[1], w[2], w[3], w[4], w[5]);
    let (ln2_g, ln2_b, w_fc, b_fc, w_out, b_out) = (w[6], w[7], w[8], w[9], w[10], w[11]);

    // attention
    let hn = b.layer_norm(x, ln1_g, ln1_b);
    let hn = col_in(b, a, hn);
    let w_qkv = b.reshape(w_qkv, &[d, 3 * h * dh]); // columns: (3, H, Dh)
    let b_qkv = b.reshape(b_qkv, &[3 * h * dh]);
    let qkv = linear(b, hn, w_qkv, b_qkv); // (B, T, 3C)
    b.set_name(qkv, &format!("h{l}.qkv"));
    let qkv = b.reshape(qkv, &[bsz, t, 3, h, dh]);
    let qkv = b.transpose(qkv, &[2, 0, 3, 1, 4]); // (3, B, H, T, Dh)
    let parts = b.split(qkv, 0, &[1, 1, 1]);
    let [q, k, v] = [0, 1, 2].map(|i| b.reshape(parts[i], &[bsz, h, t, dh])); // (B, H, T, Dh)
    let scale = 1.0 / (dh as f32).sqrt();
    let y = match cfg.attention {
        Attention::Fused => {
            // The probabilities' dropout site, with the unfused path's key and bits.
            let dropout = (cfg.dropout > 0.0).then(|| (site_key(b, a, l, 0), cfg.dropout, a.rng_layout));
            let y = b.attention([q, k, v], scale, dropout);
            b.set_name(y, &format!("h{l}.att"));
            y
        }
        Attention::Unfused => {
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
    let y = row_out(b, a, y);
    let y = b.add(y, b_proj);
    let y = dropout(b, cfg, a, y, l, 1);
    let x = b.add(x, y);
    b.set_name(x, &format!("h{l}.x_att"));

    // MLP
    let hn = b.layer_norm(x, ln2_g, ln2_b);
    let hn = col_in(b, a, hn);
    let f = linear(b, hn, w_fc, b_fc); // (B, T, 4C)
    let f = b.gelu(f);
    let f = b.matmul(f, w_out);
    let f = row_out(b, a, f);
    let f = b.add(f, b_out);
    let f = dropout(b, cfg, a, f, l, 2);
    let x = b.add(x, f);
    b.set_name(x, &format!("h{l}.x_mlp"));
    x
}
