//! The fused attention op: its GPU kernels agree with the CPU twin (odd sizes, rows past a
//! workgroup, the largest head dimension, with and without dropout); the twin computes what the
//! unfused ops compute; and a model traced with it trains as the unfused model does, with
//! dropout (the same bits), for one device and every strategy in both modes.
use shardlab::exec::{Backend, Parallel, TrainerOptions};
use shardlab::ir::RngLayout;
use shardlab::kernels::attention::{self as kernel, AttentionShape};
use shardlab::model::{Attention, DataSource, GptConfig, Init, Optimizer};
use shardlab::plan::DropoutKey;
use shardlab::reference::attention::{backward, forward, Saved};
use shardlab::reference::{dropout, matmul, softmax};
use shardlab_tests::{assert_close, gpu_or_skip, rand_vec, Need};

/// (heads, T, Dh): one of everything, odd sizes, more rows than a workgroup (64) and than a
/// tile (16) in both directions, and the largest head dimension.
const SHAPES: &[(usize, usize, usize)] = &[(1, 1, 1), (3, 17, 5), (2, 70, 16), (1, 130, 64), (5, 9, 32)];

fn bits(n: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u32
        })
        .collect()
}

struct Case {
    s: AttentionShape,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_o: Vec<f32>,
    bits: Option<Vec<u32>>,
}

fn case(heads: usize, t: usize, dh: usize, rate: f32) -> Case {
    let n = heads * t * dh;
    let s = AttentionShape {
        heads,
        t,
        dh,
        scale: 1.0 / (dh as f32).sqrt(),
        rate,
    };
    let big = |seed| rand_vec(n, seed).iter().map(|x| 2.0 * x).collect::<Vec<f32>>();
    Case {
        s,
        q: big(1),
        k: big(2),
        v: rand_vec(n, 3),
        d_o: rand_vec(n, 4),
        bits: (rate > 0.0).then(|| bits(heads * t * t, 5)),
    }
}

#[test]
fn the_twin_computes_what_softmax_dropout_and_two_matmuls_compute() {
    for &(heads, t, dh) in SHAPES {
        for rate in [0.0, 0.25] {
            let c = case(heads, t, dh, rate);
            let (o, _) = forward(&c.q, &c.k, &c.v, c.bits.as_deref(), c.s);
            // Unfused: s = scale q k^T, p = softmax_causal(s), p' = dropout(p), o = p' v.
            let scores = matmul::MatmulShape {
                trans_b: true,
                alpha: c.s.scale,
                ..matmul::MatmulShape::new(heads, t, t, dh)
            };
            let mut s = vec![0.0; heads * t * t];
            matmul::matmul(&scores, &c.q, &c.k, None, &mut s);
            let mut p = softmax::causal_forward(&s, heads * t, t);
            if let Some(b) = &c.bits {
                p = dropout::apply(&p, b, rate);
            }
            let mut want = vec![0.0; heads * t * dh];
            matmul::matmul(&matmul::MatmulShape::new(heads, t, dh, t), &p, &c.v, None, &mut want);
            assert_close(&format!("o {heads}x{t}x{dh} rate {rate}"), &o, &want, 1e-5, 1e-5);
        }
    }
}

#[test]
fn the_backward_matches_finite_differences_of_the_forward() {
    // d/dx of sum(o * do), central differences in f64-free f32: a loose, independent check.
    let c = case(2, 5, 3, 0.25);
    let (o, lse) = forward(&c.q, &c.k, &c.v, c.bits.as_deref(), c.s);
    let saved = Saved {
        o: &o,
        lse: &lse,
        d_o: &c.d_o,
        bits: c.bits.as_deref(),
    };
    let grads = backward(&c.q, &c.k, &c.v, &saved, c.s);
    let loss = |q: &[f32], k: &[f32], v: &[f32]| -> f32 {
        let (o, _) = forward(q, k, v, c.bits.as_deref(), c.s);
        o.iter().zip(&c.d_o).map(|(a, b)| a * b).sum()
    };
    let h = 1e-2;
    for (which, grad) in grads.iter().enumerate() {
        for e in 0..c.q.len() {
            let mut inputs = [c.q.clone(), c.k.clone(), c.v.clone()];
            inputs[which][e] += h;
            let up = loss(&inputs[0], &inputs[1], &inputs[2]);
            inputs[which][e] -= 2.0 * h;
            let down = loss(&inputs[0], &inputs[1], &inputs[2]);
            let fd = (up - down) / (2.0 * h);
            assert!(
                (fd - grad[e]).abs() <= 2e-3 + 2e-2 * fd.abs(),
                "input {which} element {e}: finite difference {fd}, backward {}",
                grad[e]
            );
        }
    }
}

/// The GPU forward and backward of `c` against the twin's, with every kernel design, the kernels'
/// dropout bits given by `dropout` (they must be `c.bits`).
fn check_kernels(ctx: &shardlab::gpu::GpuContext, c: &Case, devices: usize, dropout: kernel::Dropout<'_>, what: &str) {
    for kernels in kernel::designs(ctx, &c.s) {
        check_design(ctx, c, devices, dropout, &format!("{what}, {kernels:?}"), kernels);
    }
}

fn check_design(
    ctx: &shardlab::gpu::GpuContext,
    c: &Case,
    devices: usize,
    dropout: kernel::Dropout<'_>,
    what: &str,
    kernels: kernel::Kernels,
) {
    let (heads, t, dh) = (c.s.heads, c.s.t, c.s.dh);
    let (want_o, want_lse) = forward(&c.q, &c.k, &c.v, c.bits.as_deref(), c.s);
    let up = |name: &str, x: &[f32]| ctx.upload(name, x).unwrap();
    let (q, k, v, d_o) = (up("q", &c.q), up("k", &c.k), up("v", &c.v), up("do", &c.d_o));
    let n = heads * t * dh;
    let (o, lse) = (ctx.zeros("o", n).unwrap(), ctx.zeros("lse", heads * t).unwrap());
    let whole = vec![kernel::Blocks::whole(t); devices];
    let f = kernel::Forward {
        q: &q,
        k: &k,
        v: &v,
        dropout,
        o: &o,
        lse: &lse,
        blocks: &whole,
        layouts: None,
    };
    let d = pollster::block_on(kernel::forward(ctx, &f, &c.s, kernels)).unwrap();
    let got_o = shardlab_tests::run_dispatches(ctx, &[d], &o);
    let got_lse = ctx.read_blocking::<f32>(&lse).unwrap();
    assert_close(&format!("o {what}"), &got_o, &want_o, 1e-5, 1e-4);
    assert_close(&format!("lse {what}"), &got_lse, &want_lse, 1e-5, 1e-5);

    // The backward from the twin's forward, so each direction is checked alone.
    let saved = Saved {
        o: &want_o,
        lse: &want_lse,
        d_o: &c.d_o,
        bits: c.bits.as_deref(),
    };
    let want = backward(&c.q, &c.k, &c.v, &saved, c.s);
    let (o_in, lse_in) = (up("o", &want_o), up("lse", &want_lse));
    let rows = ctx.zeros("rows", kernel::rows_len(&c.s)).unwrap();
    let outs = ["dq", "dk", "dv"].map(|name| ctx.zeros(name, n).unwrap());
    let b = kernel::Backward {
        q: &q,
        k: &k,
        v: &v,
        o: &o_in,
        lse: &lse_in,
        d_o: &d_o,
        dropout,
        rows: &rows,
        dq: &outs[0],
        dk: &outs[1],
        dv: &outs[2],
        blocks: &whole,
        layouts: None,
    };
    let ds = pollster::block_on(kernel::backward(ctx, &b, &c.s, kernels)).unwrap();
    ctx.run(&ds);
    for (name, (buf, want)) in ["dq", "dk", "dv"].iter().zip(outs.iter().zip(&want)) {
        let got = ctx.read_blocking::<f32>(buf).unwrap();
        assert_close(&format!("{name} {what}"), &got, want, 1e-5, 1e-4);
    }
}

#[test]
fn gpu_kernels_match_the_twin() {
    let ctx = gpu_or_skip!();
    for &(heads, t, dh) in SHAPES {
        for rate in [0.0, 0.1] {
            let c = case(heads, t, dh, rate);
            let bits = c.bits.as_ref().map(|b| ctx.upload("bits", b).unwrap());
            let dropout = bits.as_ref().map_or(kernel::Dropout::None, kernel::Dropout::Bits);
            check_kernels(ctx, &c, 1, dropout, &format!("{heads}x{t}x{dh} rate {rate}"));
        }
    }
}

/// Heads-major (items * heads, T, Dh) rows `x` placed as `which` of `parts` in (items, T,
/// parts, heads, Dh) rows: the projections' layout around the op.
fn to_rows(x: &[f32], [items, heads, t, dh]: [usize; 4], (parts, which): (usize, usize), out: &mut [f32]) {
    for b in 0..items {
        for h in 0..heads {
            for i in 0..t {
                for d in 0..dh {
                    let src = ((b * heads + h) * t + i) * dh + d;
                    out[(((b * t + i) * parts + which) * heads + h) * dh + d] = x[src];
                }
            }
        }
    }
}

/// The lowering hands q, k, v as they lie in the qkv projection's (B, T, 3, H, Dh) rows, do in
/// (B, T, H, Dh) rows, and takes o in those rows and dq, dk, dv in the (B, T, 3, H, Dh) columns
/// of the qkv gradient, all three in one buffer (views.rs): every design must compute what it
/// computes on heads-major arrays.
#[test]
fn every_design_reads_and_writes_the_rows_around_the_op_where_they_lie() {
    let ctx = gpu_or_skip!();
    let (items, heads, t, dh) = (3, 2, 17, 8);
    for rate in [0.0, 0.1] {
        let c = case(items * heads, t, dh, rate);
        let n = items * heads * t * dh;
        let c3 = 3 * heads * dh;
        let mut qkv = vec![0.0; 3 * n];
        for (w, x) in [&c.q, &c.k, &c.v].into_iter().enumerate() {
            to_rows(x, [items, heads, t, dh], (3, w), &mut qkv);
        }
        let mut do_rows = vec![0.0; n];
        to_rows(&c.d_o, [items, heads, t, dh], (1, 0), &mut do_rows);
        let (want_o, want_lse) = forward(&c.q, &c.k, &c.v, c.bits.as_deref(), c.s);
        let mut o_rows = vec![0.0; n];
        to_rows(&want_o, [items, heads, t, dh], (1, 0), &mut o_rows);
        let in_qkv = |w: usize| kernel::Layout {
            batch: t * c3,
            head: dh,
            row: c3,
            offset: w * heads * dh,
        };
        let rows = kernel::Layout {
            batch: t * heads * dh,
            head: dh,
            row: heads * dh,
            offset: 0,
        };
        let layouts = kernel::Layouts {
            item_heads: heads,
            q: in_qkv(0),
            k: in_qkv(1),
            v: in_qkv(2),
            o: rows,
            d_o: rows,
            dq: in_qkv(0),
            dk: in_qkv(1),
            dv: in_qkv(2),
        };
        let up = |name: &str, x: &[f32]| ctx.upload(name, x).unwrap();
        let (qkv, d_o, o_in) = (up("qkv", &qkv), up("do", &do_rows), up("o", &o_rows));
        let lse_in = up("lse", &want_lse);
        let bits = c.bits.as_ref().map(|b| ctx.upload("bits", b).unwrap());
        let dropout = bits.as_ref().map_or(kernel::Dropout::None, kernel::Dropout::Bits);
        let whole = [kernel::Blocks::whole(t)];
        let saved = Saved {
            o: &want_o,
            lse: &want_lse,
            d_o: &c.d_o,
            bits: c.bits.as_deref(),
        };
        let want = backward(&c.q, &c.k, &c.v, &saved, c.s);
        let mut want_columns = vec![0.0; 3 * n];
        for (w, x) in want.iter().enumerate() {
            to_rows(x, [items, heads, t, dh], (3, w), &mut want_columns);
        }
        for kernels in kernel::designs(ctx, &c.s) {
            let what = format!("rate {rate}, {kernels:?}");
            let (o, lse) = (ctx.zeros("o", n).unwrap(), ctx.zeros("lse", items * heads * t).unwrap());
            let f = kernel::Forward {
                q: &qkv,
                k: &qkv,
                v: &qkv,
                dropout,
                o: &o,
                lse: &lse,
                blocks: &whole,
                layouts: Some(&layouts),
            };
            let d = pollster::block_on(kernel::forward(ctx, &f, &c.s, kernels)).unwrap();
            let got_o = shardlab_tests::run_dispatches(ctx, &[d], &o);
            assert_close(&format!("o {what}"), &got_o, &o_rows, 1e-5, 1e-4);
            let got_lse = ctx.read_blocking::<f32>(&lse).unwrap();
            assert_close(&format!("lse {what}"), &got_lse, &want_lse, 1e-5, 1e-5);

            let scratch = ctx.zeros("rows", kernel::rows_len(&c.s)).unwrap();
            let grads = ctx.zeros("dqkv", 3 * n).unwrap();
            let b = kernel::Backward {
                q: &qkv,
                k: &qkv,
                v: &qkv,
                o: &o_in,
                lse: &lse_in,
                d_o: &d_o,
                dropout,
                rows: &scratch,
                dq: &grads,
                dk: &grads,
                dv: &grads,
                blocks: &whole,
                layouts: Some(&layouts),
            };
            ctx.run(&pollster::block_on(kernel::backward(ctx, &b, &c.s, kernels)).unwrap());
            let got = ctx.read_blocking::<f32>(&grads).unwrap();
            assert_close(&format!("dq, dk, dv {what}"), &got, &want_columns, 1e-5, 1e-4);
        }
    }
}

/// A layout the subgroup kernels cannot load as vec4s is refused with the fix.
#[test]
fn a_layout_off_whole_vec4s_is_refused_by_the_subgroup_kernels() {
    let ctx = gpu_or_skip!();
    let c = case(2, 8, 8, 0.0);
    let Some(&sg) = kernel::designs(ctx, &c.s)
        .iter()
        .find(|k| matches!(k, kernel::Kernels::Subgroup { .. }))
    else {
        return eprintln!("skipped: the adapter runs no subgroup kernels");
    };
    let n = 2 * 8 * 8;
    let buf = ctx.zeros("x", n + 2).unwrap();
    let mut layouts = kernel::Layouts::heads_major(&c.s, 8);
    layouts.q.offset = 2;
    let f = kernel::Forward {
        q: &buf,
        k: &buf,
        v: &buf,
        dropout: kernel::Dropout::None,
        o: &ctx.zeros("o", n).unwrap(),
        lse: &ctx.zeros("lse", 16).unwrap(),
        blocks: &[kernel::Blocks::whole(8)],
        layouts: Some(&layouts),
    };
    let e = pollster::block_on(kernel::forward(ctx, &f, &c.s, sg))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("multiples of 4") && e.contains("heads-major"), "{e}");
}

/// lavapipe runs a subgroup as the lanes of one CPU vector, where the subgroup kernels beat the
/// tiled ones and the composition: it must run them (8 lanes with its default 256-bit vectors,
/// 16 with `LP_NATIVE_VECTOR_WIDTH=512`), or the checks above would pass without them.
#[test]
fn lavapipe_runs_attention_on_the_subgroup_kernels() {
    let ctx = gpu_or_skip!();
    if !ctx.summary.name.contains("llvmpipe") {
        return shardlab_tests::adapter_lacks(Need::Llvmpipe, &ctx.summary.identity());
    }
    let lanes = shardlab_tests::lavapipe_lanes();
    let c = case(8, 64, 32, 0.1);
    let whole = [kernel::Blocks::whole(64)];
    // lavapipe binds 32 storage buffers a stage: the two-pass backward, and the four-pass one
    // is among the designs checked above.
    let want = kernel::Kernels::Subgroup {
        lanes,
        passes: kernel::Passes::Two,
    };
    assert_eq!(kernel::lowering(ctx, &c.s, &whole), kernel::Lowering::Fused(want));
    let four = kernel::Kernels::Subgroup {
        lanes,
        passes: kernel::Passes::Four,
    };
    assert!(kernel::designs(ctx, &c.s).contains(&four));
    // A head dimension the vec4 rows cannot hold goes through the tuned matmuls.
    let odd = AttentionShape { dh: 6, ..c.s };
    assert_eq!(kernel::lowering(ctx, &odd, &whole), kernel::Lowering::Composed);
}

/// The subgroup kernels launch their entry points without the Threefry code (`_nodrop`) where
/// the rate is 0, and the ones that draw or read bits where it is not: on lavapipe the unused
/// dropout code behind a uniform branch cost the forward half its time. A launch on the wrong
/// one still computes the right numbers, so only this test sees it.
#[test]
fn subgroup_launches_without_dropout_run_the_entry_points_without_the_threefry_code() {
    let ctx = gpu_or_skip!();
    let Some(lanes) = ctx.subgroup_lanes() else {
        return shardlab_tests::adapter_lacks(Need::Subgroups, &ctx.summary.identity());
    };
    let pipeline_of = |d: &shardlab::gpu::Dispatch| match &d.work {
        shardlab::gpu::Work::Compute { pipeline, .. } => pipeline.clone(),
        shardlab::gpu::Work::CopyToTexture(_) => panic!("{}: a copy, not a kernel", d.label),
    };
    for passes in [kernel::Passes::Four, kernel::Passes::Two] {
        let kernels = kernel::Kernels::Subgroup { lanes, passes };
        for rate in [0.0, 0.1] {
            let c = case(2, 16, 8, rate);
            let n = 2 * 16 * 8;
            let up = |name: &str, x: &[f32]| ctx.upload(name, x).unwrap();
            let (q, k, v, d_o) = (up("q", &c.q), up("k", &c.k), up("v", &c.v), up("do", &c.d_o));
            let bits = c.bits.as_ref().map(|b| ctx.upload("bits", b).unwrap());
            let dropout = bits.as_ref().map_or(kernel::Dropout::None, kernel::Dropout::Bits);
            let (o, lse) = (ctx.zeros("o", n).unwrap(), ctx.zeros("lse", 32).unwrap());
            let whole = [kernel::Blocks::whole(16)];
            let f = kernel::Forward {
                q: &q,
                k: &k,
                v: &v,
                dropout,
                o: &o,
                lse: &lse,
                blocks: &whole,
                layouts: None,
            };
            let rows = ctx.zeros("rows", kernel::rows_len(&c.s)).unwrap();
            let grads = ["dq", "dk", "dv"].map(|name| ctx.zeros(name, n).unwrap());
            let b = kernel::Backward {
                q: &q,
                k: &k,
                v: &v,
                o: &o,
                lse: &lse,
                d_o: &d_o,
                dropout,
                rows: &rows,
                dq: &grads[0],
                dk: &grads[1],
                dv: &grads[2],
                blocks: &whole,
                layouts: None,
            };
            let mut launched = vec![pollster::block_on(kernel::forward(ctx, &f, &c.s, kernels)).unwrap()];
            launched.extend(pollster::block_on(kernel::backward(ctx, &b, &c.s, kernels)).unwrap());
            let entries: &[&str] = match passes {
                kernel::Passes::Two => &["forward", "backward_dq_delta", "backward_dkdv"],
                // The four-pass backward's first kernel is attention.wgsl's row_delta.
                kernel::Passes::Four => &["forward", "", "backward_dq", "backward_dk", "backward_dv"],
            };
            assert_eq!(launched.len(), entries.len(), "{passes:?}");
            let nodrop = if rate > 0.0 { "" } else { "_nodrop" };
            for (d, entry) in launched.iter().zip(entries).filter(|(_, e)| !e.is_empty()) {
                let name = format!("{entry}_sg{lanes}{nodrop}");
                let want = pollster::block_on(ctx.pipeline("attention_sg", &name)).unwrap();
                assert!(
                    std::sync::Arc::ptr_eq(&pipeline_of(d), &want),
                    "{}: rate {rate} with {passes:?} should run attention_sg::{name}",
                    d.label
                );
            }
        }
    }
}

/// `bench kernels` times every fused design this adapter runs and marks the one the executor
/// picks (none where it composes the op through the matmuls).
#[test]
fn bench_kernels_times_every_attention_design_and_marks_the_executors() {
    let ctx = gpu_or_skip!();
    let c = case(2, 24, 8, 0.0);
    let rows = pollster::block_on(shardlab::bench::kernels::attention_designs(ctx, 2, 24, 8)).unwrap();
    assert_eq!(rows.len(), kernel::designs(ctx, &c.s).len());
    if ctx.summary.name.contains("llvmpipe") {
        let subgroup = format!("subgroup {}", shardlab_tests::lavapipe_lanes());
        assert!(
            rows.iter().any(|r| r.design == subgroup),
            "{subgroup} missing: {rows:?}"
        );
    }
    assert!(
        rows.iter().all(|r| r.forward_ms > 0.0 && r.backward_ms > 0.0),
        "{rows:?}"
    );
    let chosen = rows.iter().filter(|r| r.chosen).count();
    match kernel::lowering(ctx, &c.s, &[kernel::Blocks::whole(24)]) {
        kernel::Lowering::Fused(_) => assert_eq!(chosen, 1, "{rows:?}"),
        kernel::Lowering::Composed => assert_eq!(chosen, 0, "{rows:?}"),
    }
}

/// The 16-lane subgroup kernels, checked in a child process of this test binary with 512-bit
/// vectors (lavapipe fixes its vector width when it loads, once per process). Runs where
/// lavapipe and AVX-512 are both here; elsewhere there is no 16-lane lavapipe to check.
#[test]
fn the_16_lane_subgroup_kernels_match_the_twin_with_512_bit_vectors_in_a_child_process() {
    shardlab_tests::check_with_16_lanes(
        &["attention_fused::", "attention_blocks::gpu_kernels"],
        &[
            "lavapipe_runs_attention_on_the_subgroup_kernels",
            "gpu_kernels_match_the_twin",
            "subgroup_launches_without_dropout_run_the_entry_points_without_the_threefry_code",
            "gpu_kernels_drawing_their_bits_from_the_key_make_jaxs_bits",
            "gpu_kernels_on_blocks_match_the_twin",
            "fused_attention_trains_as_unfused_with_dropout_in_every_mode_on_the_gpu_either_way_it_is_lowered",
        ],
    );
}

/// Dropout bits the kernels draw from the key are JAX's bits of each device's block: the
/// global (B, H, T, T) bits cut on the batch (as data parallelism cuts them) or on the heads
/// (as tensor parallelism does, a block not contiguous in the global array), both layouts.
#[test]
fn gpu_kernels_drawing_their_bits_from_the_key_make_jaxs_bits() {
    use shardlab::kernels::random::{Draw, KeyMode};
    use shardlab::rng::{random_bits_block, Block, Key};
    let ctx = gpu_or_skip!();
    let (batch, h, t, dh, devices) = (2, 4, 19, 8, 2);
    let key = Key([0x1234_5678, 0x9abc_def0]);
    for layout in [RngLayout::Original, RngLayout::Partitionable] {
        for cut in [0, 1] {
            let global = [batch, h, t, t];
            let blocks: Vec<Block> = (0..devices)
                .map(|d| {
                    let mut ranges: Vec<_> = global.iter().map(|&n| 0..n).collect();
                    let part = global[cut] / devices;
                    ranges[cut] = d * part..(d + 1) * part;
                    Block::new(&global, &ranges).unwrap()
                })
                .collect();
            let mut c = case(batch * h, t, dh, 0.1);
            c.bits = Some(blocks.iter().flat_map(|b| random_bits_block(key, layout, b)).collect());
            let keys = ctx.upload("keys", &[key.0, key.0].concat()).unwrap();
            // The kernels take each device's block of the leading dims (B, H); a row's bits
            // sit at its positions in the sequence.
            let lead: Vec<Block> = blocks
                .iter()
                .map(|b| {
                    let ranges: Vec<_> = (0..2).map(|d| b.start()[d]..b.start()[d] + b.size()[d]).collect();
                    Block::new(&global[..2], &ranges).unwrap()
                })
                .collect();
            let draw = Draw {
                layout,
                blocks: &lead,
                keys: KeyMode::PerDevice,
            };
            let dropout = kernel::Dropout::Drawn {
                key: &keys,
                draw,
                seq: t,
            };
            check_kernels(ctx, &c, devices, dropout, &format!("{layout:?}, cut on dim {cut}"));
        }
    }
}

#[test]
fn a_head_dimension_past_the_kernels_limit_is_refused_with_the_fix() {
    let ctx = gpu_or_skip!();
    let c = case(1, 2, kernel::MAX_HEAD_DIM + 1, 0.0);
    let bufs: Vec<_> = ["q", "k", "v", "o"]
        .iter()
        .map(|n| ctx.zeros(n, c.q.len()).unwrap())
        .collect();
    let lse = ctx.zeros("lse", 2).unwrap();
    let f = kernel::Forward {
        q: &bufs[0],
        k: &bufs[1],
        v: &bufs[2],
        dropout: kernel::Dropout::None,
        o: &bufs[3],
        lse: &lse,
        blocks: &[kernel::Blocks::whole(2)],
        layouts: None,
    };
    let e = pollster::block_on(kernel::forward(ctx, &f, &c.s, kernel::Kernels::Tiled))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("--attention unfused") && e.contains("65"), "{e}");
}

fn options(attention: Attention, parallel: Parallel, rng_layout: RngLayout) -> TrainerOptions {
    let config = GptConfig {
        layers: 1,
        d_model: 32,
        heads: 4,
        seq: 8,
        batch: 4,
        vocab: 32,
        tied: false,
        dropout: 0.1,
        attention,
        remat: Default::default(),
        precision: Default::default(),
        moe: None,
    };
    TrainerOptions {
        init: Init::Random { seed: 3 },
        data: DataSource::Copy,
        seed: 3,
        rng_layout,
        ..shardlab_tests::formula_options(config, Optimizer::Sgd { lr: 0.1 }, parallel)
    }
}

fn fused_trains_as_unfused(backend: Backend) {
    for (what, parallel) in shardlab_tests::every_mode(DropoutKey::Same) {
        // Ring attention is the fused op's online softmax: context parallelism has no unfused
        // path to compare (it is refused at --attention unfused, and held to one device in
        // context_parallel.rs instead).
        if parallel.parallelism().is_some_and(|p| p.is_cp()) {
            continue;
        }
        for layout in RngLayout::ALL {
            let run = |a| shardlab_tests::train_steps(&backend, options(a, parallel.clone(), layout), 3);
            let (fused, fused_params) = run(Attention::Fused);
            let (unfused, unfused_params) = run(Attention::Unfused);
            let what = format!("{what}, {layout:?} bits");
            for (k, (a, b)) in fused.iter().zip(&unfused).enumerate() {
                assert!((a - b).abs() <= 1e-5, "{what}: loss {k}: fused {a} vs unfused {b}");
            }
            for (i, (p, q)) in fused_params.iter().zip(&unfused_params).enumerate() {
                let worst = p.iter().zip(q).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                assert!(worst <= 1e-5, "{what}: param {i} differs by {worst}");
            }
        }
    }
}

#[test]
fn fused_attention_trains_as_unfused_with_dropout_in_every_mode_on_the_reference_executor() {
    fused_trains_as_unfused(Backend::Reference);
}

#[test]
fn fused_attention_trains_as_unfused_with_dropout_in_every_mode_on_the_gpu_either_way_it_is_lowered() {
    if shardlab_tests::gpu().is_none() {
        eprintln!("skipped: no GPU adapter");
        return;
    }
    // Each design of fused kernels, and the composition through the tuned matmuls.
    let probe = shardlab::gpu::GpuContext::new_blocking().unwrap();
    let shape = AttentionShape {
        heads: 4,
        t: 8,
        dh: 8,
        scale: 1.0,
        rate: 0.1,
    };
    let mut lowerings: Vec<_> = kernel::designs(&probe, &shape)
        .into_iter()
        .map(kernel::Lowering::Fused)
        .collect();
    lowerings.push(kernel::Lowering::Composed);
    for lowering in lowerings {
        let ctx = shardlab::gpu::GpuContext::new_blocking().unwrap();
        shardlab::kernels::Tuning::with(&ctx, |t| t.attention = Some(lowering)).unwrap();
        fused_trains_as_unfused(Backend::Gpu(std::sync::Arc::new(ctx)));
    }
}
