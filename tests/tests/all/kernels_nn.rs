//! The transformer's non-matmul kernels on the GPU agree with their CPU reference twins, for
//! both row strategies, on odd sizes (1, 3, 17, 65, rows longer than a workgroup) and on the
//! tiny MODEL.md configuration (B=2, T=8, C=32, H=4, V=64).
use pollster::block_on;
use shardlab::gpu::{Dispatch, GpuBuffer, GpuContext, GpuError};
use shardlab::kernels::copy::Strided;
use shardlab::kernels::embedding::EmbeddingShape;
use shardlab::kernels::layernorm::LayerNormShape;
use shardlab::kernels::RowStrategy;
use shardlab::kernels::{copy, crossentropy, embedding, gelu, layernorm, reduce, softmax};
use shardlab::reference;
use shardlab_tests::{assert_close, gpu_or_skip, rand_vec};

/// A strided copy of `shape` with these offsets and strides.
fn plan(
    shape: &[usize],
    src_offset: usize,
    src_strides: &[usize],
    dst_offset: usize,
    dst_strides: &[usize],
    accumulate: bool,
) -> Strided {
    Strided {
        shape: shape.to_vec(),
        src_offset,
        src_strides: src_strides.to_vec(),
        dst_offset,
        dst_strides: dst_strides.to_vec(),
        accumulate,
    }
}

const STRATEGIES: [RowStrategy; 2] = [RowStrategy::PerInvocation, RowStrategy::PerWorkgroup];

/// (rows, C) of row-wise kernels: odd sizes, a row longer than a 256-wide workgroup, and
/// the tiny config's B*T x C; (200, 70): more rows than one chunk of the two-stage dgamma,
/// dbeta (and a short last chunk).
// (200, 64): two-stage column sums four columns at a time (C a multiple of 4). The per-row vec4
// kernels keep rows of up to 256 columns in private memory: (5, 256) is the longest cached row,
// (3, 264) is read from storage again.
const ROWS: &[(usize, usize)] = &[
    (1, 1),
    (3, 17),
    (17, 65),
    (65, 3),
    (2, 300),
    (16, 32),
    (200, 70),
    (200, 64),
    (5, 256),
    (3, 264),
];

fn run(ctx: &GpuContext, dispatches: &[Dispatch], out: &GpuBuffer) -> Vec<f32> {
    shardlab_tests::run_dispatches(ctx, dispatches, out)
}

fn ids(n: usize, v: usize, seed: u32) -> Vec<u32> {
    rand_vec(n, seed)
        .iter()
        .map(|x| (((x + 1.0) * 0.5 * v as f32) as usize).min(v - 1) as u32)
        .collect()
}

#[test]
fn layernorm_forward_matches_reference() {
    let ctx = gpu_or_skip!();
    for &(rows, c) in ROWS {
        let x: Vec<f32> = rand_vec(rows * c, 1).iter().map(|v| 3.0 * v + 1.0).collect();
        let gamma = rand_vec(c, 2);
        let beta = rand_vec(c, 3);
        let (want, want_mean, want_rstd) =
            reference::layernorm::forward(&x, &gamma, &beta, LayerNormShape::new(rows, c));
        let gx = ctx.upload("x", &x).unwrap();
        let gg = ctx.upload("gamma", &gamma).unwrap();
        let gb = ctx.upload("beta", &beta).unwrap();
        let out = ctx.zeros("out", rows * c).unwrap();
        let mean = ctx.zeros("mean", rows).unwrap();
        let rstd = ctx.zeros("rstd", rows).unwrap();
        for s in STRATEGIES {
            let what = format!("layernorm {s:?} ({rows}, {c})");
            let d = block_on(layernorm::forward(
                ctx,
                &layernorm::ForwardBuffers {
                    x: &gx,
                    gamma: &gg,
                    beta: &gb,
                    out: &out,
                    mean: &mean,
                    rstd: &rstd,
                    residual: None,
                },
                LayerNormShape::new(rows, c),
                Some(s),
            ))
            .unwrap();
            assert_close(&what, &run(ctx, &[d], &out), &want, 1e-5, 1e-4);
            assert_close(
                &format!("{what} mean"),
                &ctx.read_blocking(&mean).unwrap(),
                &want_mean,
                1e-6,
                1e-5,
            );
            assert_close(
                &format!("{what} rstd"),
                &ctx.read_blocking(&rstd).unwrap(),
                &want_rstd,
                1e-6,
                1e-4,
            );
        }
    }
}

/// The residual add fused in front of the layer norm (fuse.rs's AddLayerNorm): the kernel writes
/// the sum bit for bit as the add kernel makes it and normalizes it as the layer norm alone
/// would, in both row strategies (the row one reading vec4s where C allows), on one device and
/// on two with their own gamma and beta.
#[test]
fn layernorm_with_the_residual_add_fused_in_front_matches_the_add_then_the_reference() {
    let ctx = gpu_or_skip!();
    for &(rows, c) in ROWS {
        for devices in [1, 2] {
            if rows % devices != 0 {
                continue;
            }
            let s = LayerNormShape {
                devices,
                ..LayerNormShape::new(rows, c)
            };
            let a: Vec<f32> = rand_vec(rows * c, 11).iter().map(|v| 3.0 * v + 1.0).collect();
            let b = rand_vec(rows * c, 12);
            let gamma = rand_vec(devices * c, 13);
            let beta = rand_vec(devices * c, 14);
            let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            let (want, want_mean, want_rstd) = reference::layernorm::forward(&sum, &gamma, &beta, s);
            let up = |name: &str, v: &[f32]| ctx.upload(name, v).unwrap();
            let (ga, gb, gg, gbeta) = (up("a", &a), up("b", &b), up("gamma", &gamma), up("beta", &beta));
            let out = ctx.zeros("out", rows * c).unwrap();
            let got_sum = ctx.zeros("sum", rows * c).unwrap();
            let mean = ctx.zeros("mean", rows).unwrap();
            let rstd = ctx.zeros("rstd", rows).unwrap();
            for strategy in STRATEGIES {
                let what = format!("layernorm + residual {strategy:?} ({rows}, {c}) on {devices}");
                let d = block_on(layernorm::forward(
                    ctx,
                    &layernorm::ForwardBuffers {
                        x: &ga,
                        gamma: &gg,
                        beta: &gbeta,
                        out: &out,
                        mean: &mean,
                        rstd: &rstd,
                        residual: Some(layernorm::Residual {
                            res: &gb,
                            sum: &got_sum,
                        }),
                    },
                    s,
                    Some(strategy),
                ))
                .unwrap();
                assert_close(&what, &run(ctx, &[d], &out), &want, 1e-5, 1e-4);
                assert_eq!(ctx.read_blocking::<f32>(&got_sum).unwrap(), sum, "{what}: the sum");
                let got_mean = ctx.read_blocking(&mean).unwrap();
                assert_close(&format!("{what} mean"), &got_mean, &want_mean, 1e-6, 1e-5);
                let got_rstd = ctx.read_blocking(&rstd).unwrap();
                assert_close(&format!("{what} rstd"), &got_rstd, &want_rstd, 1e-6, 1e-4);
            }
        }
    }
}

#[test]
fn layernorm_backward_matches_reference() {
    let ctx = gpu_or_skip!();
    for &(rows, c) in ROWS {
        let x: Vec<f32> = rand_vec(rows * c, 4).iter().map(|v| 2.0 * v - 0.5).collect();
        let gamma = rand_vec(c, 5);
        let dout = rand_vec(rows * c, 6);
        let (_, mean, rstd) = reference::layernorm::forward(&x, &gamma, &vec![0.0; c], LayerNormShape::new(rows, c));
        let (want_dx, want_dg, want_db) =
            reference::layernorm::backward(&dout, &x, &mean, &rstd, &gamma, LayerNormShape::new(rows, c));
        let gdout = ctx.upload("dout", &dout).unwrap();
        let gx = ctx.upload("x", &x).unwrap();
        let gmean = ctx.upload("mean", &mean).unwrap();
        let grstd = ctx.upload("rstd", &rstd).unwrap();
        let gg = ctx.upload("gamma", &gamma).unwrap();
        let dx = ctx.zeros("dx", rows * c).unwrap();
        let dg = ctx.upload("dgamma", &vec![7.0f32; c]).unwrap(); // overwritten, not accumulated
        let db = ctx.upload("dbeta", &vec![7.0f32; c]).unwrap();
        for s in STRATEGIES {
            let what = format!("layernorm backward {s:?} ({rows}, {c})");
            let ds = block_on(layernorm::backward(
                ctx,
                &layernorm::BackwardBuffers {
                    dout: &gdout,
                    x: &gx,
                    mean: &gmean,
                    rstd: &grstd,
                    gamma: &gg,
                    dx: &dx,
                    dgamma: &dg,
                    dbeta: &db,
                },
                LayerNormShape::new(rows, c),
                Some(s),
            ))
            .unwrap();
            assert_close(&format!("{what} dx"), &run(ctx, &ds, &dx), &want_dx, 1e-4, 1e-3);
            assert_close(
                &format!("{what} dgamma"),
                &ctx.read_blocking(&dg).unwrap(),
                &want_dg,
                1e-4,
                1e-4,
            );
            assert_close(
                &format!("{what} dbeta"),
                &ctx.read_blocking(&db).unwrap(),
                &want_db,
                1e-4,
                1e-4,
            );
        }
    }
}

#[test]
fn gelu_forward_and_backward_match_reference_including_far_tails() {
    let ctx = gpu_or_skip!();
    for n in [1, 3, 17, 65, 4096, 70_001] {
        // Up to |x| = 40: tanh must saturate, not turn into NaN.
        let x: Vec<f32> = rand_vec(n, 7).iter().map(|v| 40.0 * v * v * v).collect();
        let dout = rand_vec(n, 8);
        let gx = ctx.upload("x", &x).unwrap();
        let gd = ctx.upload("dout", &dout).unwrap();
        let out = ctx.zeros("out", n).unwrap();
        let d = block_on(gelu::forward(ctx, &gx, &out, n)).unwrap();
        assert_close(
            &format!("gelu n={n}"),
            &run(ctx, &[d], &out),
            &reference::gelu::forward(&x),
            1e-6,
            1e-5,
        );
        let d = block_on(gelu::backward(ctx, &gx, &gd, &out, n)).unwrap();
        let want = reference::gelu::backward(&x, &dout);
        // In the left tail 1 + tanh cancels: drivers' tanh differ by an ulp there, ~1e-6 absolute.
        assert_close(
            &format!("gelu backward n={n}"),
            &run(ctx, &[d], &out),
            &want,
            5e-6,
            1e-5,
        );
    }
}

#[test]
fn causal_softmax_matches_reference_and_masks_the_future() {
    let ctx = gpu_or_skip!();
    // (B*H, T): odd lengths, a row longer than a workgroup, the tiny config (B*H = 8, T = 8).
    for &(bh, t) in &[(1, 1), (1, 3), (2, 17), (1, 65), (1, 300), (8, 8)] {
        let rows = bh * t;
        let s: Vec<f32> = rand_vec(rows * t, 9).iter().map(|v| 8.0 * v).collect();
        let dp = rand_vec(rows * t, 10);
        let want_p = reference::softmax::causal_forward(&s, rows, t);
        let want_ds = reference::softmax::causal_backward(&want_p, &dp, rows, t);
        let gs = ctx.upload("s", &s).unwrap();
        let gdp = ctx.upload("dp", &dp).unwrap();
        // Stale values where the mask is must be overwritten with 0.
        let p = ctx.upload("p", &vec![9.0f32; rows * t]).unwrap();
        let ds = ctx.upload("ds", &vec![9.0f32; rows * t]).unwrap();
        for strat in STRATEGIES {
            let what = format!("softmax {strat:?} ({rows}, {t})");
            let d = block_on(softmax::causal_forward(ctx, &gs, &p, rows, t, Some(strat))).unwrap();
            let got_p = run(ctx, &[d], &p);
            assert_close(&what, &got_p, &want_p, 1e-6, 1e-5);
            for r in 0..rows {
                let i = r % t;
                assert!(
                    got_p[r * t + i + 1..(r + 1) * t].iter().all(|&v| v == 0.0),
                    "{what}: row {r} not masked"
                );
                let sum: f32 = got_p[r * t..r * t + i + 1].iter().sum();
                assert!((sum - 1.0).abs() < 1e-5, "{what}: row {r} sums to {sum}");
            }
            let d = block_on(softmax::causal_backward(ctx, &p, &gdp, &ds, rows, t, Some(strat))).unwrap();
            assert_close(&format!("{what} backward"), &run(ctx, &[d], &ds), &want_ds, 1e-6, 1e-4);
        }
    }
}

#[test]
fn crossentropy_matches_reference() {
    let ctx = gpu_or_skip!();
    for &(rows, v) in ROWS.iter().chain(&[(3, 1000)]) {
        let logits: Vec<f32> = rand_vec(rows * v, 11).iter().map(|x| 4.0 * x).collect();
        let targets = ids(rows, v, 12);
        let dlosses = rand_vec(rows, 13);
        let want = reference::crossentropy::forward(&logits, &targets, rows, v);
        let want_d = reference::crossentropy::backward(&logits, &targets, &dlosses, rows, v);
        let gl = ctx.upload("logits", &logits).unwrap();
        let gt = ctx.upload("targets", &targets).unwrap();
        let gdl = ctx.upload("dlosses", &dlosses).unwrap();
        let losses = ctx.zeros("losses", rows).unwrap();
        let dlogits = ctx.zeros("dlogits", rows * v).unwrap();
        for s in STRATEGIES {
            let what = format!("crossentropy {s:?} ({rows}, {v})");
            let d = block_on(crossentropy::forward(ctx, &gl, &gt, &losses, rows, v, Some(s))).unwrap();
            assert_close(&what, &run(ctx, &[d], &losses), &want, 1e-5, 1e-5);
            let d = block_on(crossentropy::backward(
                ctx,
                &crossentropy::BackwardBuffers {
                    logits: &gl,
                    targets: &gt,
                    dlosses: &gdl,
                    dlogits: &dlogits,
                },
                rows,
                v,
                Some(s),
            ))
            .unwrap();
            assert_close(
                &format!("{what} backward"),
                &run(ctx, &[d], &dlogits),
                &want_d,
                1e-6,
                1e-4,
            );
        }
    }
}

#[test]
fn crossentropy_is_stable_for_huge_logits_and_ignores_out_of_range_targets() {
    let ctx = gpu_or_skip!();
    let rows = 4;
    // exp(1000) overflows f32: only a max-shifted logsumexp stays finite.
    let rows5 = [
        1000.0f32,
        999.0,
        -1000.0,
        0.0,
        998.0, //
        -5e4,
        -5e4 + 1.0,
        -5e4 + 2.0,
        -5e4,
        -5e4, //
        1.0,
        2.0,
        3.0,
        4.0,
        5.0, //
        1.0,
        2.0,
        3.0,
        4.0,
        5.0,
    ];
    let targets = [1u32, 2, 5, u32::MAX]; // the last two are out of range: ignored
    let dlosses = [1.0f32, 0.5, 1.0, 1.0];
    // Rows of 5, and their first 4 columns: the kernels that read rows four columns at a time.
    for v in [5, 4] {
        let logits: Vec<f32> = rows5.chunks(5).flat_map(|r| r[..v].to_vec()).collect();
        huge_logits_and_ignored_targets(ctx, &logits, &targets, &dlosses, rows, v);
    }
}

fn huge_logits_and_ignored_targets(
    ctx: &shardlab::gpu::GpuContext,
    logits: &[f32],
    targets: &[u32],
    dlosses: &[f32],
    rows: usize,
    v: usize,
) {
    let want = reference::crossentropy::forward(logits, targets, rows, v);
    let want_d = reference::crossentropy::backward(logits, targets, dlosses, rows, v);
    assert!(want.iter().all(|l| l.is_finite()) && want[2] == 0.0 && want[3] == 0.0);
    let gl = ctx.upload("logits", logits).unwrap();
    let gt = ctx.upload("targets", targets).unwrap();
    let gdl = ctx.upload("dlosses", dlosses).unwrap();
    let losses = ctx.upload("losses", &[7.0f32; 4]).unwrap();
    let dlogits = ctx.upload("dlogits", &vec![7.0f32; rows * v]).unwrap();
    for s in STRATEGIES {
        let d = block_on(crossentropy::forward(ctx, &gl, &gt, &losses, rows, v, Some(s))).unwrap();
        assert_close(
            &format!("huge logits {s:?}, V {v}"),
            &run(ctx, &[d], &losses),
            &want,
            1e-4,
            1e-6,
        );
        let d = block_on(crossentropy::backward(
            ctx,
            &crossentropy::BackwardBuffers {
                logits: &gl,
                targets: &gt,
                dlosses: &gdl,
                dlogits: &dlogits,
            },
            rows,
            v,
            Some(s),
        ))
        .unwrap();
        assert_close(
            &format!("huge logits backward {s:?}, V {v}"),
            &run(ctx, &[d], &dlogits),
            &want_d,
            1e-6,
            1e-5,
        );
    }
}

#[test]
fn embedding_forward_and_backward_match_reference_exactly() {
    let ctx = gpu_or_skip!();
    // (N, V, C); (40, 100, 64) gives each backward invocation several rows of dtable.
    for &(n, v, c) in &[
        (1, 1, 1),
        (3, 5, 17),
        (17, 3, 65),
        (65, 17, 3),
        (40, 100, 64),
        (16, 64, 32),
    ] {
        let table = rand_vec(v * c, 14);
        let id = ids(n, v, 15);
        let dout = rand_vec(n * c, 16);
        let gtable = ctx.upload("table", &table).unwrap();
        let gids = ctx.upload("ids", &id).unwrap();
        let gdout = ctx.upload("dout", &dout).unwrap();
        let out = ctx.zeros("out", n * c).unwrap();
        let dtable = ctx.upload("dtable", &vec![7.0f32; v * c]).unwrap(); // overwritten
        let d = block_on(embedding::forward(
            ctx,
            &gtable,
            &gids,
            &out,
            EmbeddingShape::new(n, v, c),
        ))
        .unwrap();
        let want = reference::embedding::forward(&table, &id, EmbeddingShape::new(n, v, c));
        assert_eq!(run(ctx, &[d], &out), want, "embedding ({n}, {v}, {c})");
        // Same summation order as the reference (ids in order, no atomics): bitwise equal.
        let d = block_on(embedding::backward(
            ctx,
            &gdout,
            &gids,
            &dtable,
            EmbeddingShape::new(n, v, c),
        ))
        .unwrap();
        let want = reference::embedding::backward(&dout, &id, EmbeddingShape::new(n, v, c));
        assert_eq!(run(ctx, &[d], &dtable), want, "embedding backward ({n}, {v}, {c})");
    }
}

/// The lookup and the scatter-add of a table of V rows and C columns, with `id` holding ids past
/// V: the rows of out-of-range ids read zeros, their (huge) gradients are dropped, the table is
/// untouched, and rows of a larger (reused) table past V are never read. `out` and `dtable` start
/// as 7s, so a row the kernels skip shows.
fn check_ids_out_of_range(ctx: &GpuContext, v: usize, c: usize, id: &[u32], seed: u32) {
    let n = id.len();
    let s = EmbeddingShape::new(n, v, c);
    let outside: Vec<usize> = (0..n).filter(|&i| id[i] as usize >= v).collect();
    let table = rand_vec(v * c, seed);
    let mut dout = rand_vec(n * c, seed + 1);
    for &i in &outside {
        dout[i * c..(i + 1) * c].fill(1e6);
    }
    let mut padded = table.clone();
    padded.extend(vec![5.0f32; 2 * c]);
    let gtable = ctx.upload("table", &table).unwrap();
    let gpadded = ctx.upload("padded table", &padded).unwrap();
    let gids = ctx.upload("ids", id).unwrap();
    let gdout = ctx.upload("dout", &dout).unwrap();
    let want = reference::embedding::forward(&table, id, s);
    for (what, t) in [("table", &gtable), ("padded table", &gpadded)] {
        let out = ctx.upload("out", &vec![7.0f32; n * c]).unwrap(); // overwritten
        let d = block_on(embedding::forward(ctx, t, &gids, &out, s)).unwrap();
        let got = run(ctx, &[d], &out);
        assert_eq!(got, want, "forward from the {what}, C = {c}");
        assert!(outside
            .iter()
            .all(|&i| got[i * c..(i + 1) * c].iter().all(|&x| x == 0.0)));
    }
    let dtable = ctx.upload("dtable", &vec![7.0f32; v * c]).unwrap(); // overwritten
    let d = block_on(embedding::backward(ctx, &gdout, &gids, &dtable, s)).unwrap();
    let got = run(ctx, &[d], &dtable);
    assert_eq!(got, reference::embedding::backward(&dout, id, s), "backward, C = {c}");
    assert!(
        got.iter().all(|x| x.abs() < 10.0),
        "an out-of-range id leaked into dtable: {got:?}"
    );
    assert_eq!(ctx.read_blocking::<f32>(&gtable).unwrap(), table, "table untouched");
}

#[test]
fn embedding_ids_out_of_range_read_zeros_and_write_nothing() {
    let ctx = gpu_or_skip!();
    check_ids_out_of_range(ctx, 4, 3, &[1, 4, u32::MAX, 3, 1000, 0], 17);
}

/// The kernels that take four columns (and, backward, four ids) at a time, where C and N are
/// multiples of 4, treat out-of-range ids as the one-column kernels do.
#[test]
fn embedding_by_fours_reads_zeros_and_drops_gradients_for_ids_out_of_range() {
    let ctx = gpu_or_skip!();
    check_ids_out_of_range(ctx, 5, 8, &[1, 5, u32::MAX, 3, 1000, 0, 4, 1], 20);
}

#[test]
fn sum_axis_matches_reference() {
    let ctx = gpu_or_skip!();
    // (outer, n, inner), ending with the tiny config's bias gradients: b_fc (B*T, 4C), b_qkv.
    for &(outer, n, inner) in &[
        (1, 1, 1),
        (3, 17, 1),
        (1, 65, 3),
        (17, 3, 65),
        (1, 16, 128),
        (1, 16, 96),
        // Several chunks in one pass: the small config's bias gradient, a short last chunk,
        // a single column, and more outputs than one workgroup of either variant.
        (1, 512, 128),
        (2, 130, 3),
        (1, 1000, 1),
        (3, 65, 300),
        // Four outputs per invocation (inner a multiple of 4) over several outer items.
        (2, 130, 8),
        // Two stages (n past 16 chunks), by value and four outputs at a time.
        (2, 1100, 3),
        (2, 1030, 8),
    ] {
        let x = rand_vec(outer * n * inner, 19);
        let gx = ctx.upload("x", &x).unwrap();
        let want = reference::reduce::sum_axis(&x, outer, n, inner);
        for s in STRATEGIES {
            let out = ctx.upload("out", &vec![7.0f32; outer * inner]).unwrap();
            let ds = block_on(reduce::sum_axis(ctx, &gx, &out, (outer, n, inner), Some(s))).unwrap();
            assert_eq!(
                ds.len(),
                if n > reduce::ONE_PASS_ROWS { 2 } else { 1 },
                "stages of n = {n}"
            );
            assert_close(
                &format!("sum_axis {s:?} ({outer}, {n}, {inner})"),
                &run(ctx, &ds, &out),
                &want,
                1e-5,
                1e-5,
            );
        }
    }
}

/// Runs one strided copy on the GPU and the reference from the same dst contents; returns the
/// dispatch label, which names the entry point (and so the rank after merging axes).
fn check_copy(ctx: &GpuContext, what: &str, src_len: usize, dst_len: usize, c: &Strided) -> String {
    let src = rand_vec(src_len, 20);
    let dst0 = rand_vec(dst_len, 21); // elements outside the copied region must survive
    let gsrc = ctx.upload("src", &src).unwrap();
    let gdst = ctx.upload("dst", &dst0).unwrap();
    let d = block_on(copy::strided(ctx, &gsrc, &gdst, c)).unwrap();
    let mut want = dst0.clone();
    reference::copy::strided(&src, &mut want, c);
    let label = d.label.clone();
    assert_eq!(run(ctx, &[d], &gdst), want, "{what}");
    label
}

/// Row-major strides of `shape`.
fn contiguous(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * shape[a + 1];
    }
    s
}

/// A copy whose last axis is contiguous on both sides, with every other stride, the offsets and
/// that axis a multiple of 4, moves vec4s (`copy4_*`); anything else, and every accumulate,
/// moves elements. Both write exactly the reference's result and leave the rest of dst alone.
#[test]
fn strided_copy_moves_vec4s_where_rows_are_contiguous_and_elements_elsewhere() {
    let ctx = gpu_or_skip!();
    // (what, src len, dst len, copy, the entry it must take)
    let cases = [
        (
            "slice cols 4..12 of (6, 16)",
            96,
            48,
            plan(&[6, 8], 4, &[16, 1], 0, &[8, 1], false),
            "copy4_2",
        ),
        (
            "slice cols 2..10 of (6, 16)",
            96,
            48,
            plan(&[6, 8], 2, &[16, 1], 0, &[8, 1], false),
            "copy_2",
        ),
        (
            "into cols 8..16 of (6, 24)",
            48,
            144,
            plan(&[6, 8], 0, &[8, 1], 8, &[24, 1], false),
            "copy4_2",
        ),
        (
            "broadcast a row of 12",
            12,
            60,
            plan(&[5, 12], 0, &[0, 1], 0, &[12, 1], false),
            "copy4_2",
        ),
        (
            "heads (2, 8, 4, 8) -> (2, 4, 8, 8)",
            512,
            512,
            plan(&[2, 8, 4, 8], 0, &[256, 32, 8, 1], 0, &[256, 8, 64, 1], false),
            "copy4_4",
        ),
        (
            "rows of 6",
            36,
            36,
            plan(&[6, 6], 0, &[6, 1], 0, &[1, 6], false),
            "copy_2",
        ),
        (
            "accumulate cols 4..12",
            96,
            48,
            plan(&[6, 8], 4, &[16, 1], 0, &[8, 1], true),
            "accumulate_2",
        ),
    ];
    for (what, src_len, dst_len, c, entry) in cases {
        let label = check_copy(ctx, what, src_len, dst_len, &c);
        assert!(label.starts_with(&format!("{entry} ")), "{what}: {label}");
    }
}

#[test]
fn strided_copy_transposes_slices_concatenates_and_broadcasts() {
    let ctx = gpu_or_skip!();
    // transpose (17, 65) -> (65, 17)
    check_copy(
        ctx,
        "transpose",
        17 * 65,
        17 * 65,
        &plan(&[17, 65], 0, &[65, 1], 0, &[1, 17], false),
    );
    // slice rows 1..4, cols 2..6 of (5, 7) into (3, 4)
    check_copy(ctx, "slice", 35, 12, &plan(&[3, 4], 7 + 2, &[7, 1], 0, &[4, 1], false));
    // concat: a (3, 4) into columns 0..4 and b (3, 5) into columns 4..9 of (3, 9)
    check_copy(
        ctx,
        "concat left",
        12,
        27,
        &plan(&[3, 4], 0, &[4, 1], 0, &[9, 1], false),
    );
    check_copy(
        ctx,
        "concat right",
        15,
        27,
        &plan(&[3, 5], 0, &[5, 1], 4, &[9, 1], false),
    );
    // broadcast a bias (1, 5) over (4, 5), and a scalar over (3,)
    check_copy(
        ctx,
        "broadcast row",
        5,
        20,
        &plan(&[4, 5], 0, &[0, 1], 0, &[5, 1], false),
    );
    check_copy(ctx, "broadcast scalar", 3, 3, &plan(&[3], 2, &[0], 0, &[1], false));
    // accumulate a transpose into existing values
    check_copy(ctx, "accumulate", 12, 12, &plan(&[3, 4], 0, &[4, 1], 0, &[1, 3], true));
    // rank 0: one element, offsets only
    let label = check_copy(ctx, "rank 0", 5, 4, &plan(&[], 3, &[], 2, &[], false));
    assert!(label.starts_with("copy_1 "), "{label}");
    // axes contiguous in both src and dst merge (launcher collapses to rank 1 and rank 2)
    let label = check_copy(
        ctx,
        "contiguous block",
        40,
        40,
        &plan(&[2, 3, 5], 5, &[15, 5, 1], 3, &[15, 5, 1], false),
    );
    assert!(label.starts_with("copy_1 "), "{label}");
    let label = check_copy(
        ctx,
        "leading slice",
        120,
        60,
        &plan(&[2, 6, 5], 30, &[30, 5, 1], 0, &[30, 5, 1], false),
    );
    assert!(label.starts_with("copy_1 "), "{label}");
    // a unit axis's stride is irrelevant, whatever it is
    let label = check_copy(
        ctx,
        "unit axis",
        12,
        12,
        &plan(&[3, 1, 4], 0, &[4, 999, 1], 0, &[1, 999, 3], false),
    );
    assert!(label.starts_with("copy_2 "), "{label}");
    let label = check_copy(
        ctx,
        "accumulate contiguous",
        12,
        12,
        &plan(&[12], 0, &[1], 0, &[1], true),
    );
    assert!(label.starts_with("accumulate_1 "), "{label}");
    // empty shape: nothing written
    check_copy(
        ctx,
        "empty",
        4,
        4,
        &plan(&[2, 0, 3], 0, &[0, 3, 1], 0, &[3, 3, 1], false),
    );
}

#[test]
fn strided_copy_splits_qkv_heads_and_permutes_rank_6() {
    let ctx = gpu_or_skip!();
    // Tiny config: qkv (B, T, 3, H, Dh) = (2, 8, 3, 4, 8) -> (3, B, H, T, Dh).
    let (b, t, h, dh) = (2, 8, 4, 8);
    let src_shape = [b, t, 3, h, dh];
    let src_strides = contiguous(&src_shape);
    let dst_full = contiguous(&[3, b, h, t, dh]);
    // dst strides indexed by the source axes (b, t, which, h, dh).
    let dst_strides = [dst_full[1], dst_full[3], dst_full[0], dst_full[2], dst_full[4]];
    let n = b * t * 3 * h * dh;
    let label = check_copy(
        ctx,
        "qkv split",
        n,
        n,
        &plan(&src_shape, 0, &src_strides, 0, &dst_strides, false),
    );
    // Dh = 8 is contiguous on both sides: four elements per invocation (`copy4_*`).
    assert!(label.starts_with("copy4_5 "), "{label}");
    // Heads out of (B, T, H, Dh) into (B, H, T, Dh), and the same for one sequence (B = 1).
    for (bb, rank) in [(b, 4), (1, 3)] {
        let n = bb * t * h * dh;
        let label = check_copy(
            ctx,
            "heads",
            n,
            n,
            &plan(
                &[bb, t, h, dh],
                0,
                &contiguous(&[bb, t, h, dh]),
                0,
                &[h * t * dh, dh, t * dh, 1],
                false,
            ),
        );
        assert!(label.starts_with(&format!("copy4_{rank} ")), "{label}");
    }
    // Rank 6 with odd extents, no two axes mergeable: permutation (5, 2, 0, 4, 1, 3) of the source.
    let shape = [2, 2, 3, 2, 5, 3];
    let perm = [5, 2, 0, 4, 1, 3];
    let dst_shape: Vec<usize> = perm.iter().map(|&a| shape[a]).collect();
    let dc = contiguous(&dst_shape);
    let mut dst_strides = [0; 6];
    for (k, &a) in perm.iter().enumerate() {
        dst_strides[a] = dc[k];
    }
    let n: usize = shape.iter().product();
    let label = check_copy(
        ctx,
        "rank 6",
        n,
        n,
        &plan(&shape, 0, &contiguous(&shape), 0, &dst_strides, false),
    );
    assert!(label.starts_with("copy_6 "), "{label}");
}

#[test]
fn launchers_reject_bad_shapes_with_errors_not_panics() {
    let ctx = gpu_or_skip!();
    let a = ctx.zeros("a", 12).unwrap();
    let b = ctx.zeros("b", 12).unwrap();
    let small = ctx.zeros("small", 3).unwrap();
    let msg = |r: Result<Dispatch, GpuError>| match r {
        Err(e) => e.to_string(),
        Ok(_) => panic!("expected an error"),
    };
    let e = msg(block_on(copy::strided(
        ctx,
        &a,
        &b,
        &plan(&[1; 7], 0, &[1; 7], 0, &[1; 7], false),
    )));
    assert!(e.contains("rank 7"), "{e}");
    let e = msg(block_on(copy::strided(
        ctx,
        &a,
        &b,
        &plan(&[3, 4], 0, &[4], 0, &[4, 1], false),
    )));
    assert!(e.contains("one stride per axis"), "{e}");
    let e = msg(block_on(copy::strided(
        ctx,
        &a,
        &b,
        &plan(&[3, 4], 1, &[4, 1], 0, &[4, 1], false),
    )));
    assert!(e.contains("`src`") && e.contains("needs 13"), "{e}");
    let e = msg(block_on(copy::strided(
        ctx,
        &a,
        &b,
        &plan(&[3, 4], 0, &[4, 1], 0, &[0, 1], true),
    )));
    assert!(e.contains("dst stride 0"), "{e}");
    let e = msg(block_on(copy::strided(
        ctx,
        &a,
        &a,
        &plan(&[3, 4], 0, &[4, 1], 0, &[4, 1], false),
    )));
    assert!(e.contains("bound twice"), "{e}");
    let e = msg(block_on(gelu::forward(ctx, &a, &small, 12)));
    assert!(e.contains("`out`") && e.contains("needs 12"), "{e}");
    let e = msg(block_on(softmax::causal_forward(ctx, &a, &b, 4, 0, None)));
    assert!(e.contains("T must be at least 1"), "{e}");
    let e = msg(block_on(crossentropy::forward(ctx, &a, &small, &b, 4, 3, None)));
    assert!(e.contains("`targets`") || e.contains("`logits`"), "{e}");
    let e = msg(block_on(layernorm::forward(
        ctx,
        &layernorm::ForwardBuffers {
            x: &a,
            gamma: &small,
            beta: &small,
            out: &b,
            mean: &small,
            rstd: &small,
            residual: None,
        },
        LayerNormShape::new(4, 3),
        None,
    )));
    assert!(e.contains("`mean`") && e.contains("needs 4"), "{e}");
    let e = msg(block_on(embedding::backward(
        ctx,
        &a,
        &small,
        &b,
        EmbeddingShape::new(3, 5, 4),
    )));
    assert!(e.contains("`dtable`"), "{e}");
    assert!(ctx.check().is_ok(), "no GPU error was raised by the rejected launches");
}

#[test]
fn default_launchers_pick_a_strategy_and_match_reference_on_the_tiny_config() {
    let ctx = gpu_or_skip!();
    // B*T = 16 rows of C = 32 through layernorm, then logits (16, 64) through crossentropy.
    let (rows, c, v) = (16, 32, 64);
    let x = rand_vec(rows * c, 22);
    let gamma = rand_vec(c, 23);
    let beta = rand_vec(c, 24);
    let gx = ctx.upload("x", &x).unwrap();
    let gg = ctx.upload("g", &gamma).unwrap();
    let gb = ctx.upload("b", &beta).unwrap();
    let out = ctx.zeros("out", rows * c).unwrap();
    let mean = ctx.zeros("mean", rows).unwrap();
    let rstd = ctx.zeros("rstd", rows).unwrap();
    let d = block_on(layernorm::forward(
        ctx,
        &layernorm::ForwardBuffers {
            x: &gx,
            gamma: &gg,
            beta: &gb,
            out: &out,
            mean: &mean,
            rstd: &rstd,
            residual: None,
        },
        LayerNormShape::new(rows, c),
        None,
    ))
    .unwrap();
    let want = reference::layernorm::forward(&x, &gamma, &beta, LayerNormShape::new(rows, c)).0;
    assert_close("layernorm default", &run(ctx, &[d], &out), &want, 1e-5, 1e-4);
    let logits = rand_vec(rows * v, 25);
    let targets = ids(rows, v, 26);
    let gl = ctx.upload("logits", &logits).unwrap();
    let gt = ctx.upload("targets", &targets).unwrap();
    let losses = ctx.zeros("losses", rows).unwrap();
    let d = block_on(crossentropy::forward(ctx, &gl, &gt, &losses, rows, v, None)).unwrap();
    let want = reference::crossentropy::forward(&logits, &targets, rows, v);
    assert_close("crossentropy default", &run(ctx, &[d], &losses), &want, 1e-5, 1e-5);
    // Short rows never get a mostly idle 256-wide workgroup; long rows do on GPUs.
    assert_eq!(RowStrategy::for_adapter(ctx, c), RowStrategy::PerInvocation);
    let long = if ctx.summary.is_cpu() {
        RowStrategy::PerInvocation
    } else {
        RowStrategy::PerWorkgroup
    };
    assert_eq!(RowStrategy::for_adapter(ctx, 1024), long);
}
