//! Attention on blocks of the sequence (context parallelism): a device's queries against the
//! keys of one ring step, merged step by step with attention_combine, give the whole causal
//! attention of its rows; each step's backward from the merged o and lse sums to the whole
//! backward; the GPU kernels agree with the CPU twin on blocks (contiguous and zig-zag, a
//! different block on every device, with dropout bits drawn at the rows' global positions).
use shardlab::ir::{CpOrder, Runs, SeqBlock};
use shardlab::kernels::attention::{self as kernel, AttentionShape, Blocks};
use shardlab::reference::attention::{backward, backward_blocks, combine, forward, forward_blocks, Saved};
use shardlab_tests::{assert_close, gpu_or_skip, rand_vec};

/// Rows `pos` of every head of a (heads, T, w) array.
fn rows(x: &[f32], heads: usize, t: usize, w: usize, pos: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(heads * pos.len() * w);
    for h in 0..heads {
        for &p in pos {
            out.extend_from_slice(&x[(h * t + p) * w..(h * t + p + 1) * w]);
        }
    }
    out
}

/// Bits (heads, T, T) at rows `q` and columns `k`.
fn bits_at(bits: &[u32], heads: usize, t: usize, q: &[usize], k: &[usize]) -> Vec<u32> {
    let mut out = vec![];
    for h in 0..heads {
        for &i in q {
            for &j in k {
                out.push(bits[(h * t + i) * t + j]);
            }
        }
    }
    out
}

fn part(cp: usize, shift: usize, order: CpOrder) -> SeqBlock {
    SeqBlock::Part {
        axes: vec!["cp".into()],
        parts: cp,
        shift,
        order,
    }
}

fn positions(r: &Runs, len: usize) -> Vec<usize> {
    (0..len).map(|i| r.pos(i)).collect()
}

/// Device `r`'s blocks at ring step `s`: its queries, and the keys of the device s before it.
fn blocks(cp: usize, order: CpOrder, r: usize, s: usize, local: usize) -> Blocks {
    Blocks {
        tk: local,
        q: part(cp, 0, order).runs(r, local).unwrap(),
        kv: part(cp, s, order).runs(r, local).unwrap(),
    }
}

struct Whole {
    s: AttentionShape,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_o: Vec<f32>,
    bits: Option<Vec<u32>>,
}

fn whole(heads: usize, t: usize, dh: usize, rate: f32) -> Whole {
    let n = heads * t * dh;
    let big = |seed| rand_vec(n, seed).iter().map(|x| 2.0 * x).collect::<Vec<f32>>();
    Whole {
        s: AttentionShape {
            heads,
            t,
            dh,
            scale: 1.0 / (dh as f32).sqrt(),
            rate,
        },
        q: big(11),
        k: big(12),
        v: rand_vec(n, 13),
        d_o: rand_vec(n, 14),
        bits: (rate > 0.0).then(|| {
            shardlab::rng::random_bits(
                shardlab::rng::Key([7, 9]),
                shardlab::rng::RngLayout::Partitionable,
                &[heads, t, t],
            )
        }),
    }
}

#[test]
fn ring_steps_merged_with_combine_are_the_whole_attention_of_each_devices_rows() {
    for order in CpOrder::ALL {
        for (cp, t) in [(2, 8), (4, 16), (4, 24)] {
            for rate in [0.0, 0.25] {
                let w = whole(3, t, 4, rate);
                let (heads, dh, local) = (3, 4, t / cp);
                let (want_o, want_lse) = forward(&w.q, &w.k, &w.v, w.bits.as_deref(), w.s);
                let saved = Saved {
                    o: &want_o,
                    lse: &want_lse,
                    d_o: &w.d_o,
                    bits: w.bits.as_deref(),
                };
                let want_grads = backward(&w.q, &w.k, &w.v, &saved, w.s);
                let s = AttentionShape { t: local, ..w.s };
                let mut dk_whole = vec![vec![0.0f32; heads * t * dh]; 2];
                for r in 0..cp {
                    let qp = positions(&blocks(cp, order, r, 0, local).q, local);
                    let q = rows(&w.q, heads, t, dh, &qp);
                    let mut acc: Option<(Vec<f32>, Vec<f32>)> = None;
                    for step in 0..cp {
                        let b = blocks(cp, order, r, step, local);
                        let kp = positions(&b.kv, local);
                        let (k, v) = (rows(&w.k, heads, t, dh, &kp), rows(&w.v, heads, t, dh, &kp));
                        let bits = w.bits.as_ref().map(|x| bits_at(x, heads, t, &qp, &kp));
                        let (o, lse) = forward_blocks(&q, &k, &v, bits.as_deref(), s, &b);
                        acc = Some(match acc {
                            None => (o, lse),
                            Some((o0, l0)) => combine(&o0, &l0, &o, &lse, dh),
                        });
                    }
                    let (o, lse) = acc.unwrap();
                    let what = format!("{order:?} cp {cp} T {t} rate {rate} device {r}");
                    assert_close(&format!("o {what}"), &o, &rows(&want_o, heads, t, dh, &qp), 1e-5, 1e-5);
                    assert_close(
                        &format!("lse {what}"),
                        &lse,
                        &rows(&want_lse, heads, t, 1, &qp),
                        1e-5,
                        1e-5,
                    );

                    // The backward of every step, from the merged o and lse.
                    let (o_r, do_r) = (rows(&want_o, heads, t, dh, &qp), rows(&w.d_o, heads, t, dh, &qp));
                    let lse_r = rows(&want_lse, heads, t, 1, &qp);
                    let mut dq = vec![0.0f32; heads * local * dh];
                    for step in 0..cp {
                        let b = blocks(cp, order, r, step, local);
                        let kp = positions(&b.kv, local);
                        let (k, v) = (rows(&w.k, heads, t, dh, &kp), rows(&w.v, heads, t, dh, &kp));
                        let bits = w.bits.as_ref().map(|x| bits_at(x, heads, t, &qp, &kp));
                        let saved = Saved {
                            o: &o_r,
                            lse: &lse_r,
                            d_o: &do_r,
                            bits: bits.as_deref(),
                        };
                        let [gq, gk, gv] = backward_blocks(&q, &k, &v, &saved, s, &b);
                        dq.iter_mut().zip(&gq).for_each(|(a, b)| *a += b);
                        for (acc, g) in dk_whole.iter_mut().zip([gk, gv]) {
                            for h in 0..heads {
                                for (j, &p) in kp.iter().enumerate() {
                                    for d in 0..dh {
                                        acc[(h * t + p) * dh + d] += g[(h * local + j) * dh + d];
                                    }
                                }
                            }
                        }
                    }
                    assert_close(
                        &format!("dq {what}"),
                        &dq,
                        &rows(&want_grads[0], heads, t, dh, &qp),
                        1e-5,
                        1e-4,
                    );
                }
                let what = format!("{order:?} cp {cp} T {t} rate {rate}");
                assert_close(&format!("dk {what}"), &dk_whole[0], &want_grads[1], 1e-5, 1e-4);
                assert_close(&format!("dv {what}"), &dk_whole[1], &want_grads[2], 1e-5, 1e-4);
            }
        }
    }
}

#[test]
fn a_row_that_sees_no_key_of_a_block_gets_no_weight_when_combined() {
    // Device 0 at step 1 holds the last block: its queries see none of those keys.
    let w = whole(1, 8, 2, 0.0);
    let b = blocks(2, CpOrder::Contiguous, 0, 1, 4);
    let s = AttentionShape { t: 4, ..w.s };
    let (o, lse) = forward_blocks(&w.q[..8], &w.k[8..], &w.v[8..], None, s, &b);
    assert!(o.iter().all(|&x| x == 0.0));
    assert!(lse.iter().all(|&x| x == shardlab::reference::attention::NO_KEYS));
    let (o2, lse2) = (rand_vec(8, 5), vec![0.5f32; 4]);
    let (m, l) = combine(&o, &lse, &o2, &lse2, 2);
    assert_eq!((m, l), (o2, lse2));
}

/// Every device's block at ring step `step` on the GPU against the twin, one launch for all
/// devices, with bits given or drawn at the rows' global positions.
#[test]
fn gpu_kernels_on_blocks_match_the_twin() {
    use shardlab::kernels::random::{Draw, KeyMode};
    use shardlab::rng::{Block, Key, RngLayout};
    let ctx = gpu_or_skip!();
    let (cp, t, heads, dh) = (4, 40, 2, 8);
    let local = t / cp;
    let key = Key([0x1357_9bdf, 0x2468_ace0]);
    for order in CpOrder::ALL {
        for step in 0..cp {
            for rate in [0.0, 0.2] {
                let w = whole(heads, t, dh, rate);
                let s = AttentionShape {
                    heads: cp * heads,
                    t: local,
                    ..w.s
                };
                let bl: Vec<Blocks> = (0..cp).map(|r| blocks(cp, order, r, step, local)).collect();
                let (mut q, mut k, mut v, mut d_o, mut bits) = (vec![], vec![], vec![], vec![], vec![]);
                for b in &bl {
                    let (qp, kp) = (positions(&b.q, local), positions(&b.kv, local));
                    q.extend(rows(&w.q, heads, t, dh, &qp));
                    k.extend(rows(&w.k, heads, t, dh, &kp));
                    v.extend(rows(&w.v, heads, t, dh, &kp));
                    d_o.extend(rows(&w.d_o, heads, t, dh, &qp));
                    let global = shardlab::rng::random_bits(key, RngLayout::Partitionable, &[heads, t, t]);
                    bits.extend(bits_at(&global, heads, t, &qp, &kp));
                }
                // The twin, device by device.
                let per = heads * local * dh;
                let (mut want_o, mut want_lse, mut want_d) = (vec![], vec![], vec![vec![], vec![], vec![]]);
                for (r, b) in bl.iter().enumerate() {
                    let one = AttentionShape { heads, ..s };
                    let bits_r =
                        (rate > 0.0).then(|| &bits[r * heads * local * local..(r + 1) * heads * local * local]);
                    let at = |x: &[f32]| x[r * per..(r + 1) * per].to_vec();
                    let (o, lse) = forward_blocks(&at(&q), &at(&k), &at(&v), bits_r, one, b);
                    let saved = Saved {
                        o: &o,
                        lse: &lse,
                        d_o: &at(&d_o),
                        bits: bits_r,
                    };
                    let g = backward_blocks(&at(&q), &at(&k), &at(&v), &saved, one, b);
                    want_o.extend(o);
                    want_lse.extend(lse);
                    for (acc, x) in want_d.iter_mut().zip(g) {
                        acc.extend(x);
                    }
                }
                let up = |name: &str, x: &[f32]| ctx.upload(name, x).unwrap();
                let (gq, gk, gv, gdo) = (up("q", &q), up("k", &k), up("v", &v), up("do", &d_o));
                let gbits = ctx.upload("bits", &bits).unwrap();
                let keys = ctx.upload("keys", &vec![key.0; cp].concat()).unwrap();
                // The drawn bits: each device's block of the leading dim (heads) is all of it.
                let lead = vec![Block::full(&[heads]); cp];
                let draw = Draw {
                    layout: RngLayout::Partitionable,
                    blocks: &lead,
                    keys: KeyMode::PerDevice,
                };
                for (how, dropout) in [
                    ("given", kernel::Dropout::Bits(&gbits)),
                    (
                        "drawn",
                        kernel::Dropout::Drawn {
                            key: &keys,
                            draw,
                            seq: t,
                        },
                    ),
                ] {
                    let dropout = if rate > 0.0 { dropout } else { kernel::Dropout::None };
                    // Every fused design this adapter runs (the subgroup kernels on CPU adapters).
                    for kernels in kernel::designs(ctx, &s) {
                        let what = format!("{order:?} step {step} rate {rate} bits {how} {kernels:?}");
                        let n = cp * per;
                        let (o, lse) = (
                            ctx.zeros("o", n).unwrap(),
                            ctx.zeros("lse", cp * heads * local).unwrap(),
                        );
                        let f = kernel::Forward {
                            q: &gq,
                            k: &gk,
                            v: &gv,
                            dropout,
                            o: &o,
                            lse: &lse,
                            blocks: &bl,
                            layouts: None,
                        };
                        let d = pollster::block_on(kernel::forward(ctx, &f, &s, kernels)).unwrap();
                        let got_o = shardlab_tests::run_dispatches(ctx, &[d], &o);
                        let got_lse = ctx.read_blocking::<f32>(&lse).unwrap();
                        assert_close(&format!("o {what}"), &got_o, &want_o, 1e-5, 1e-4);
                        assert_close(&format!("lse {what}"), &got_lse, &want_lse, 1e-5, 1e-5);
                        let (o_in, lse_in) = (up("o", &want_o), up("lse", &want_lse));
                        let rows_buf = ctx.zeros("rows", kernel::rows_len(&s)).unwrap();
                        let outs = ["dq", "dk", "dv"].map(|name| ctx.zeros(name, n).unwrap());
                        let b = kernel::Backward {
                            q: &gq,
                            k: &gk,
                            v: &gv,
                            o: &o_in,
                            lse: &lse_in,
                            d_o: &gdo,
                            dropout,
                            rows: &rows_buf,
                            dq: &outs[0],
                            dk: &outs[1],
                            dv: &outs[2],
                            blocks: &bl,
                            layouts: None,
                        };
                        let ds = pollster::block_on(kernel::backward(ctx, &b, &s, kernels)).unwrap();
                        ctx.run(&ds);
                        for (name, (buf, want)) in ["dq", "dk", "dv"].iter().zip(outs.iter().zip(&want_d)) {
                            let got = ctx.read_blocking::<f32>(buf).unwrap();
                            assert_close(&format!("{name} {what}"), &got, want, 1e-5, 1e-4);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn gpu_combine_matches_the_twin() {
    let ctx = gpu_or_skip!();
    let (heads, t, dh) = (3, 70, 5);
    let (o_a, o_b) = (rand_vec(heads * t * dh, 1), rand_vec(heads * t * dh, 2));
    let no = shardlab::reference::attention::NO_KEYS;
    // Some rows saw nothing on one side, some on neither.
    let lse_a: Vec<f32> = rand_vec(heads * t, 3)
        .iter()
        .enumerate()
        .map(|(i, &x)| if i % 5 == 0 { no } else { 3.0 * x })
        .collect();
    let lse_b: Vec<f32> = rand_vec(heads * t, 4)
        .iter()
        .enumerate()
        .map(|(i, &x)| if i % 10 == 0 || i % 7 == 0 { no } else { 3.0 * x })
        .collect();
    let (want_o, want_lse) = combine(&o_a, &lse_a, &o_b, &lse_b, dh);
    let up = |name: &str, x: &[f32]| ctx.upload(name, x).unwrap();
    let (o, lse) = (
        ctx.zeros("o", o_a.len()).unwrap(),
        ctx.zeros("lse", lse_a.len()).unwrap(),
    );
    let b = kernel::Combine {
        o_a: &up("o_a", &o_a),
        lse_a: &up("lse_a", &lse_a),
        o_b: &up("o_b", &o_b),
        lse_b: &up("lse_b", &lse_b),
        o: &o,
        lse: &lse,
    };
    let s = AttentionShape {
        heads,
        t,
        dh,
        scale: 1.0,
        rate: 0.0,
    };
    let d = pollster::block_on(kernel::combine(ctx, &b, &s)).unwrap();
    let got_o = shardlab_tests::run_dispatches(ctx, &[d], &o);
    let got_lse = ctx.read_blocking::<f32>(&lse).unwrap();
    assert_close("combined o", &got_o, &want_o, 1e-6, 1e-5);
    assert_close("combined lse", &got_lse, &want_lse, 1e-6, 1e-6);
}

/// The rows of a sequence block, taken and put back, on the GPU as on the twin: a different
/// block on every device, contiguous and zig-zag, f32 and u32.
#[test]
fn gpu_seq_rows_match_the_twin() {
    use shardlab::kernels::seq::{self, Direction, SeqShape};
    let ctx = gpu_or_skip!();
    let (cp, outer, n, inner) = (4, 3, 16, 5);
    for order in CpOrder::ALL {
        let len = n / cp;
        let runs: Vec<Runs> = (0..cp).map(|r| part(cp, 0, order).runs(r, len).unwrap()).collect();
        let s = SeqShape { outer, n, len, inner };
        let whole = rand_vec(cp * outer * n * inner, 9);
        let want: Vec<f32> = (0..cp)
            .flat_map(|d| {
                let x = &whole[d * outer * n * inner..(d + 1) * outer * n * inner];
                shardlab::reference::seq::take(x, &s, &runs[d])
            })
            .collect();
        let src = ctx.upload("whole", &whole).unwrap();
        let dst = ctx.zeros("block", want.len()).unwrap();
        let d = pollster::block_on(seq::rows(ctx, &src, &dst, &s, &runs, Direction::Take)).unwrap();
        assert_eq!(shardlab_tests::run_dispatches(ctx, &[d], &dst), want, "take {order:?}");
        let back: Vec<f32> = (0..cp)
            .flat_map(|d| {
                shardlab::reference::seq::put(
                    &want[d * outer * len * inner..(d + 1) * outer * len * inner],
                    &s,
                    &runs[d],
                )
            })
            .collect();
        let out = ctx.zeros("put", back.len()).unwrap();
        let d = pollster::block_on(seq::rows(ctx, &dst, &out, &s, &runs, Direction::Put)).unwrap();
        assert_eq!(shardlab_tests::run_dispatches(ctx, &[d], &out), back, "put {order:?}");
        // Every row is some device's: put back and summed over the devices, the whole array.
        let ids: Vec<u32> = (0..(outer * n * inner) as u32).collect();
        let taken: Vec<u32> = (0..cp)
            .flat_map(|d| shardlab::reference::seq::take(&ids, &s, &runs[d]))
            .collect();
        let mut covered = vec![0u32; ids.len()];
        for d in 0..cp {
            let put = shardlab::reference::seq::put(
                &taken[d * outer * len * inner..(d + 1) * outer * len * inner],
                &s,
                &runs[d],
            );
            for (c, p) in covered.iter_mut().zip(put) {
                *c += p;
            }
        }
        assert_eq!(covered, ids, "{order:?}: the blocks cover the sequence once");
    }
}
