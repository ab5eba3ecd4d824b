//! Ring attention (Liu et al., 2023) as a JAX user writes it in a shard_map body: each device
//! keeps its block of the queries, the key and value blocks travel around the `cp` ring with
//! `ppermute`, and an online softmax merges the blocks (`attention_combine`), the fused op's
//! own arithmetic. A `custom_vjp` gives its backward: the key and value blocks go round the
//! ring again, with the dK and dV accumulators travelling beside them, so a device holds only
//! its own blocks between forward and backward (autodiff of the unrolled ring would hold every
//! block it received).
//!
//! Forward, per attention: 2 (cp - 1) collective permutes (K and V, cp - 1 steps). Backward:
//! 4 (cp - 1) (K, V, dK, dV) and 2 more that bring dK and dV home.
use crate::ir::{AttnSeq, Builder, CpOrder, Op, RngLayout, SeqBlock, ValueId};
use crate::sharding::PartitionSpec;

/// The ring: its mesh axis and size, and the order of the sequence's blocks on it.
#[derive(Clone, Debug, PartialEq)]
pub struct Ring {
    pub axis: String,
    pub size: usize,
    pub order: CpOrder,
}

/// Dropout on the probabilities inside the ring: the bits of each block are the global
/// (B, H, T, T) array's at the device's batch block (`batch`: its spec over (B, H)) and at the
/// block's query and key positions, bit for bit the one-device run's.
#[derive(Clone, Debug, PartialEq)]
pub struct RingDropout {
    pub rate: f32,
    pub layout: RngLayout,
    pub global: Vec<usize>,
    pub batch: PartitionSpec,
}

impl Ring {
    /// Each device sends its block to the next one: at step s a device holds the block of the
    /// device s places before it.
    pub fn perm(&self) -> Vec<(usize, usize)> {
        (0..self.size).map(|i| (i, (i + 1) % self.size)).collect()
    }

    fn send(&self, b: &mut Builder, x: ValueId) -> ValueId {
        b.ppermute(x, &self.axis, &self.perm())
    }

    /// The queries' block and the keys' block at ring step `step`.
    pub fn seq(&self, step: usize) -> AttnSeq {
        let part = |shift| SeqBlock::Part {
            axes: vec![self.axis.clone()],
            parts: self.size,
            shift,
            order: self.order,
        };
        AttnSeq {
            q: part(0),
            kv: part(step),
        }
    }
}

/// The dropout bits of ring step `step`, drawn from `key` (the site's key).
fn step_bits(b: &mut Builder, ring: &Ring, d: &RingDropout, key: ValueId, q: ValueId, step: usize) -> ValueId {
    let mut shape = b.shape(q);
    let n = shape.len();
    shape[n - 1] = shape[n - 2];
    let mut entries: Vec<Vec<String>> = d.batch.entries().to_vec();
    entries.resize(n, vec![]);
    b.emit1(
        Op::RandomBitsBlock {
            global: d.global.clone(),
            spec: PartitionSpec::new(entries),
            shape,
            layout: d.layout,
            seq: ring.seq(step),
        },
        &[key],
    )
}

/// Causal attention of this device's q (..., Tl, Dh) over every device's k and v, each
/// device holding its block of the sequence: the output (..., Tl, Dh).
pub fn ring_attention(
    b: &mut Builder,
    ring: &Ring,
    qkv: [ValueId; 3],
    scale: f32,
    dropout: Option<(ValueId, RingDropout)>,
) -> ValueId {
    let mut inputs = qkv.to_vec();
    let dropping = dropout.map(|(key, d)| {
        inputs.push(key);
        d
    });
    let rate = dropping.as_ref().map_or(0.0, |d| d.rate);
    let (fwd_ring, fwd_drop) = (ring.clone(), dropping.clone());
    let bwd_ring = ring.clone();
    let outs = b.custom_vjp(
        &inputs,
        move |b, x| {
            let (ring, dropping) = (&fwd_ring, &fwd_drop);
            let (q, k, v) = (x[0], x[1], x[2]);
            let block = |b: &mut Builder, k: ValueId, v: ValueId, step: usize| {
                let mut ins = vec![q, k, v];
                if let Some(d) = dropping {
                    ins.push(step_bits(b, ring, d, x[3], q, step));
                }
                let op = Op::Attention {
                    scale,
                    rate,
                    seq: ring.seq(step),
                };
                let r = b.emit(op, &ins);
                (r[0], r[1])
            };
            let (mut o, mut lse) = block(b, k, v, 0);
            let (mut kk, mut vv) = (k, v);
            for step in 1..ring.size {
                kk = ring.send(b, kk);
                vv = ring.send(b, vv);
                let (o_s, lse_s) = block(b, kk, vv, step);
                let merged = b.emit(Op::AttentionCombine, &[o, lse, o_s, lse_s]);
                (o, lse) = (merged[0], merged[1]);
            }
            let mut residuals = vec![q, k, v, o, lse];
            residuals.extend(x.get(3));
            (vec![o], residuals)
        },
        move |b, res, cts| {
            let ring = &bwd_ring;
            let (q, k, v, o, lse) = (res[0], res[1], res[2], res[3], res[4]);
            let Some(d_o) = cts[0] else {
                return vec![None; res.len() - 2];
            };
            let (mut kk, mut vv) = (k, v);
            let (mut dq, mut dk, mut dv): (Option<ValueId>, Option<ValueId>, Option<ValueId>) = (None, None, None);
            for step in 0..ring.size {
                if step > 0 {
                    kk = ring.send(b, kk);
                    vv = ring.send(b, vv);
                    dk = dk.map(|x| ring.send(b, x));
                    dv = dv.map(|x| ring.send(b, x));
                }
                let mut ins = vec![q, kk, vv, o, lse, d_o];
                if let Some(d) = &dropping {
                    ins.push(step_bits(b, ring, d, res[5], q, step));
                }
                let op = Op::AttentionGrad {
                    scale,
                    rate,
                    seq: ring.seq(step),
                };
                let g = b.emit(op, &ins);
                let add = |b: &mut Builder, acc: Option<ValueId>, x: ValueId| Some(acc.map_or(x, |a| b.add(a, x)));
                dq = add(b, dq, g[0]);
                dk = add(b, dk, g[1]);
                dv = add(b, dv, g[2]);
            }
            // After the last step each accumulator belongs to the next device: one more hop.
            if ring.size > 1 {
                dk = dk.map(|x| ring.send(b, x));
                dv = dv.map(|x| ring.send(b, x));
            }
            let mut grads = vec![dq, dk, dv];
            if res.len() > 5 {
                grads.push(None);
            }
            grads
        },
    );
    outs[0]
}
