//! Every backward of the CPU reference agrees with central finite differences of its forward.
//! The reference is f32, so differences use a step of 1e-2 and the scalar loss
//! L = Σ w * out is accumulated in f64; tolerances are set well below the size of any wrong
//! term (a dropped or mis-scaled term moves a gradient by O(0.1) or more here).
use shardlab::reference::embedding::EmbeddingShape;
use shardlab::reference::layernorm::LayerNormShape;
use shardlab::reference::{copy, crossentropy, embedding, gelu, layernorm, reduce, softmax};
use shardlab_tests::{assert_close, rand_vec};

const H: f32 = 1e-2;

/// Σ w_i * out_i in f64.
fn dot(w: &[f32], out: &[f32]) -> f64 {
    assert_eq!(w.len(), out.len());
    w.iter().zip(out).map(|(&a, &b)| a as f64 * b as f64).sum()
}

/// dL/dx_i by central differences, dividing by the step actually taken in f32.
fn numeric_grad(x: &[f32], loss: impl Fn(&[f32]) -> f64) -> Vec<f32> {
    (0..x.len())
        .map(|i| {
            let mut xp = x.to_vec();
            let mut xm = x.to_vec();
            xp[i] += H;
            xm[i] -= H;
            ((loss(&xp) - loss(&xm)) / (xp[i] as f64 - xm[i] as f64)) as f32
        })
        .collect()
}

#[test]
fn layernorm_backward_matches_finite_differences() {
    let (rows, c) = (3, 7);
    let x: Vec<f32> = rand_vec(rows * c, 1).iter().map(|v| 2.0 * v + 0.5).collect();
    let gamma: Vec<f32> = rand_vec(c, 2).iter().map(|v| 1.0 + 0.5 * v).collect();
    let beta = rand_vec(c, 3);
    let w = rand_vec(rows * c, 4);
    let (_, mean, rstd) = layernorm::forward(&x, &gamma, &beta, LayerNormShape::new(rows, c));
    let (dx, dgamma, dbeta) = layernorm::backward(&w, &x, &mean, &rstd, &gamma, LayerNormShape::new(rows, c));

    let num_dx = numeric_grad(&x, |x| {
        dot(
            &w,
            &layernorm::forward(x, &gamma, &beta, LayerNormShape::new(rows, c)).0,
        )
    });
    let num_dgamma = numeric_grad(&gamma, |g| {
        dot(&w, &layernorm::forward(&x, g, &beta, LayerNormShape::new(rows, c)).0)
    });
    let num_dbeta = numeric_grad(&beta, |b| {
        dot(&w, &layernorm::forward(&x, &gamma, b, LayerNormShape::new(rows, c)).0)
    });
    assert_close("layernorm dx", &dx, &num_dx, 2e-3, 1e-2);
    assert_close("layernorm dgamma", &dgamma, &num_dgamma, 2e-3, 1e-2);
    assert_close("layernorm dbeta", &dbeta, &num_dbeta, 2e-3, 1e-2);
}

#[test]
fn gelu_backward_matches_finite_differences() {
    // Spans the tails (|x| up to 5) and the curved middle.
    let x: Vec<f32> = rand_vec(40, 5).iter().map(|v| 5.0 * v).collect();
    let w = rand_vec(40, 6);
    let dx = gelu::backward(&x, &w);
    let num = numeric_grad(&x, |x| dot(&w, &gelu::forward(x)));
    assert_close("gelu dx", &dx, &num, 2e-3, 1e-2);
}

#[test]
fn causal_softmax_backward_matches_finite_differences() {
    // rows = B*H*T with B*H = 2, T = 4: every query position twice.
    let (rows, t) = (8, 4);
    let s: Vec<f32> = rand_vec(rows * t, 7).iter().map(|v| 3.0 * v).collect();
    let w = rand_vec(rows * t, 8);
    let p = softmax::causal_forward(&s, rows, t);
    let ds = softmax::causal_backward(&p, &w, rows, t);
    let num = numeric_grad(&s, |s| dot(&w, &softmax::causal_forward(s, rows, t)));
    assert_close("softmax ds", &ds, &num, 2e-3, 1e-2);
    // Masked scores do not influence anything, and get exactly zero gradient.
    for r in 0..rows {
        for j in (r % t + 1)..t {
            assert_eq!(p[r * t + j], 0.0, "p masked at row {r} col {j}");
            assert_eq!(ds[r * t + j], 0.0, "ds masked at row {r} col {j}");
            assert_eq!(num[r * t + j], 0.0, "numeric ds masked at row {r} col {j}");
        }
    }
}

#[test]
fn crossentropy_backward_matches_finite_differences() {
    let (rows, v) = (4, 7);
    let logits: Vec<f32> = rand_vec(rows * v, 9).iter().map(|x| 3.0 * x).collect();
    // The last target is out of range: an ignored position, gradient 0.
    let targets = [3u32, 0, 6, 7];
    let dlosses = [0.5f32, -1.0, 2.0, 1.5];
    let dlogits = crossentropy::backward(&logits, &targets, &dlosses, rows, v);
    let num = numeric_grad(&logits, |l| dot(&dlosses, &crossentropy::forward(l, &targets, rows, v)));
    assert_close("crossentropy dlogits", &dlogits, &num, 2e-3, 1e-2);
    assert!(
        dlogits[3 * v..].iter().all(|&g| g == 0.0),
        "ignored target has zero gradient"
    );
}

#[test]
fn crossentropy_forward_is_logsumexp_minus_target_logit() {
    // Independent of the implementation: ln(Σ e^x) - x_t in f64, including huge logits where a
    // naive exp overflows f32.
    let (rows, v) = (2, 5);
    let logits = [1.0f32, 2.0, 3.0, 4.0, 5.0, 1000.0, 999.0, -1000.0, 0.0, 998.0];
    let targets = [4u32, 1];
    let got = crossentropy::forward(&logits, &targets, rows, v);
    let want: Vec<f32> = (0..rows)
        .map(|r| {
            let row: Vec<f64> = logits[r * v..(r + 1) * v].iter().map(|&x| x as f64).collect();
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            (m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln() - row[targets[r] as usize]) as f32
        })
        .collect();
    // f32 spacing at 1000 is 6e-5, so the huge row can only agree to a few of those.
    assert_close("crossentropy losses", &got, &want, 2e-4, 1e-6);
}

#[test]
fn embedding_backward_matches_finite_differences() {
    let (n, v, c) = (6, 4, 3);
    // Repeated ids accumulate; id 9 >= V reads zeros and contributes no gradient.
    let ids = [2u32, 0, 2, 9, 3, 2];
    let table = rand_vec(v * c, 10);
    let w = rand_vec(n * c, 11);
    let dtable = embedding::backward(&w, &ids, EmbeddingShape::new(n, v, c));
    let num = numeric_grad(&table, |t| {
        dot(&w, &embedding::forward(t, &ids, EmbeddingShape::new(n, v, c)))
    });
    assert_close("embedding dtable", &dtable, &num, 1e-3, 1e-3);
    assert!(
        dtable[c..2 * c].iter().all(|&g| g == 0.0),
        "unused row 1 has zero gradient"
    );
}

#[test]
fn strided_copy_of_a_transpose_has_the_inverse_transpose_as_adjoint() {
    // y (4, 3) = x (3, 4)^T; the adjoint maps dy back with the strides swapped.
    let (r, c) = (3, 4);
    let x = rand_vec(r * c, 12);
    let w = rand_vec(r * c, 13);
    let transpose = |x: &[f32]| {
        let mut y = vec![0.0; r * c];
        copy::strided(
            x,
            &mut y,
            &copy::Strided {
                shape: vec![r, c],
                src_offset: 0,
                src_strides: vec![c, 1],
                dst_offset: 0,
                dst_strides: vec![1, r],
                accumulate: false,
            },
        );
        y
    };
    let mut dx = vec![0.0; r * c];
    copy::strided(
        &w,
        &mut dx,
        &copy::Strided {
            shape: vec![c, r],
            src_offset: 0,
            src_strides: vec![r, 1],
            dst_offset: 0,
            dst_strides: vec![1, c],
            accumulate: false,
        },
    );
    let num = numeric_grad(&x, |x| dot(&w, &transpose(x)));
    assert_close("transpose adjoint", &dx, &num, 1e-4, 1e-4);
    // And the transpose itself is what it says.
    let y = transpose(&x);
    for i in 0..r {
        for j in 0..c {
            assert_eq!(y[j * r + i], x[i * c + j]);
        }
    }
}

#[test]
fn sum_axis_has_a_broadcast_as_adjoint() {
    // out (2, 3) = Σ_n x (2, 5, 3); dx = dout broadcast over n (a stride-0 strided copy).
    let (outer, n, inner) = (2, 5, 3);
    let x = rand_vec(outer * n * inner, 14);
    let w = rand_vec(outer * inner, 15);
    let mut dx = vec![0.0; outer * n * inner];
    copy::strided(
        &w,
        &mut dx,
        &copy::Strided {
            shape: vec![outer, n, inner],
            src_offset: 0,
            src_strides: vec![inner, 0, 1],
            dst_offset: 0,
            dst_strides: vec![n * inner, inner, 1],
            accumulate: false,
        },
    );
    let num = numeric_grad(&x, |x| dot(&w, &reduce::sum_axis(x, outer, n, inner)));
    assert_close("sum_axis adjoint", &dx, &num, 1e-4, 1e-4);
}

#[test]
fn layernorm_forward_normalises_each_row() {
    // With gamma 1 and beta 0 every row has mean 0 and (biased) variance var / (var + eps).
    let (rows, c) = (3, 9);
    let x: Vec<f32> = rand_vec(rows * c, 16).iter().map(|v| 4.0 * v + 2.0).collect();
    let (out, mean, rstd) = layernorm::forward(&x, &[1.0; 9], &[0.0; 9], LayerNormShape::new(rows, c));
    for r in 0..rows {
        let row = &out[r * c..(r + 1) * c];
        let m: f32 = row.iter().sum::<f32>() / c as f32;
        let var: f32 = row.iter().map(|v| v * v).sum::<f32>() / c as f32;
        let xr = &x[r * c..(r + 1) * c];
        let xm = xr.iter().map(|&v| v as f64).sum::<f64>() / c as f64;
        let xv = xr.iter().map(|&v| (v as f64 - xm).powi(2)).sum::<f64>() / c as f64;
        assert!(m.abs() < 1e-5, "row {r} mean {m}");
        assert!((var as f64 - xv / (xv + 1e-5)).abs() < 1e-5, "row {r} variance {var}");
        assert!((mean[r] as f64 - xm).abs() < 1e-5, "row {r} saved mean");
        assert!(
            (rstd[r] as f64 - 1.0 / (xv + 1e-5).sqrt()).abs() < 1e-5,
            "row {r} saved rstd"
        );
    }
}
