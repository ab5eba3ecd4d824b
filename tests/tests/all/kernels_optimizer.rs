//! SGD and AdamW kernels (shaders/optimizer.wgsl) against their CPU twins over several steps,
//! each launch built once and replayed with host-rewritten hyper-parameters.
use shardlab::kernels::optimizer::{
    adamw, adamw_hyper, decay_table, sgd, sgd_hyper, AdamWBuffers, AdamWHyper, Segment, ADAMW_WEIGHT_DECAY,
    UPDATE_BLOCK,
};
use shardlab::reference::optimizer as reference;
use shardlab_tests::{assert_close, gpu_or_skip, rand_vec};

const SIZES: &[usize] = &[1, 3, 17, 65, 1000];

#[test]
fn sgd_kernel_matches_reference_over_three_steps() {
    let ctx = gpu_or_skip!();
    for &n in SIZES {
        let mut p = rand_vec(n, 1);
        let param = ctx.upload("param", &p).unwrap();
        let grad = ctx.zeros("grad", n).unwrap();
        let hyper = ctx.zeros("hyper", 1).unwrap();
        let d = pollster::block_on(sgd(ctx, &param, &grad, &hyper, n)).unwrap();
        for step in 0..3u32 {
            let g = rand_vec(n, 10 + step);
            let lr = 0.1 / (1 + step) as f32;
            ctx.write(&grad, &g);
            ctx.write(&hyper, &sgd_hyper(lr));
            ctx.run(std::slice::from_ref(&d));
            reference::sgd(&mut p, &g, lr);
            let got = ctx.read_blocking::<f32>(&param).unwrap();
            assert_close(&format!("sgd n={n} step {step}"), &got, &p, 1e-6, 1e-6);
        }
    }
}

#[test]
fn adamw_kernel_matches_reference_over_three_steps() {
    let ctx = gpu_or_skip!();
    for &n in SIZES {
        for wd in [0.0, ADAMW_WEIGHT_DECAY] {
            let mut p = rand_vec(n, 2);
            let (mut m, mut v) = (vec![0.0; n], vec![0.0; n]);
            let param = ctx.upload("param", &p).unwrap();
            let grad = ctx.zeros("grad", n).unwrap();
            let gm = ctx.zeros("m", n).unwrap();
            let gv = ctx.zeros("v", n).unwrap();
            let hyper = ctx.zeros("hyper", 8).unwrap();
            let d = pollster::block_on(adamw(
                ctx,
                &AdamWBuffers {
                    param: &param,
                    grad: &grad,
                    m: &gm,
                    v: &gv,
                    hyper: &hyper,
                },
                &[Segment {
                    start: 0,
                    len: n,
                    weight_decay: wd,
                }],
            ))
            .unwrap();
            for step in 1..=3u32 {
                let g = rand_vec(n, 20 + step);
                let h = AdamWHyper::at(1e-2, step).unwrap();
                ctx.write(&grad, &g);
                ctx.write(&hyper, &h.words());
                ctx.run(std::slice::from_ref(&d));
                reference::adamw(&mut p, &g, &mut m, &mut v, &h, wd);
                let what = format!("adamw n={n} wd={wd} step {step}");
                assert_close(
                    &format!("{what} param"),
                    &ctx.read_blocking::<f32>(&param).unwrap(),
                    &p,
                    1e-6,
                    1e-6,
                );
                assert_close(
                    &format!("{what} m"),
                    &ctx.read_blocking::<f32>(&gm).unwrap(),
                    &m,
                    1e-6,
                    1e-6,
                );
                assert_close(
                    &format!("{what} v"),
                    &ctx.read_blocking::<f32>(&gv).unwrap(),
                    &v,
                    1e-6,
                    1e-6,
                );
            }
        }
    }
}

#[test]
fn adamw_first_step_moves_each_weight_by_lr_against_its_gradient_sign() {
    // At step 1 the bias-corrected moments are g and g^2, so the step is lr * g / (|g| + eps).
    let g = [0.5f32, -2.0, 1e-3, -0.25];
    let mut p = [1.0f32, 1.0, -1.0, 0.0];
    let (mut m, mut v) = ([0.0; 4], [0.0; 4]);
    let h = AdamWHyper::at(0.1, 1).unwrap();
    reference::adamw(&mut p, &g, &mut m, &mut v, &h, 0.0);
    assert_close("adamw step 1", &p, &[0.9, 1.1, -1.1, 0.1], 1e-5, 0.0);
    // Decoupled weight decay adds lr * wd * p on top.
    let mut q = [2.0f32];
    let (mut m, mut v) = ([0.0], [0.0]);
    reference::adamw(&mut q, &[0.0], &mut m, &mut v, &h, 0.5);
    assert_close("adamw decay only", &q, &[2.0 - 0.1 * 0.5 * 2.0], 1e-6, 0.0);
}

#[test]
fn adamw_hyper_packs_bias_corrections_and_rejects_step_zero() {
    let w = adamw_hyper(3e-4, 2).unwrap();
    assert_eq!(w[0], 3e-4);
    assert_close(
        "hyper",
        &w[1..],
        &[0.9, 0.999, 1e-8, 0.1, 1e-3, 1.0 - 0.81, 1.0 - 0.998001],
        1e-7,
        1e-6,
    );
    let e = adamw_hyper(1e-3, 0).unwrap_err().to_string();
    assert!(e.contains("steps count from 1"), "{e}");
}

#[test]
fn optimizer_launches_reject_aliased_and_short_buffers() {
    let ctx = gpu_or_skip!();
    let a = ctx.zeros("a", 8).unwrap();
    let b = ctx.zeros("b", 8).unwrap();
    let h = ctx.zeros("h", 8).unwrap();
    let e = pollster::block_on(sgd(ctx, &a, &a, &h, 8)).err().unwrap().to_string();
    assert!(e.contains("bound twice"), "{e}");
    let e = pollster::block_on(adamw(
        ctx,
        &AdamWBuffers {
            param: &a,
            grad: &b,
            m: &h,
            v: &h,
            hyper: &h,
        },
        &[Segment {
            start: 0,
            len: 8,
            weight_decay: 0.0,
        }],
    ))
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("bound twice"), "{e}");
    let e = pollster::block_on(sgd(ctx, &a, &b, &h, 9)).err().unwrap().to_string();
    assert!(e.contains("`a` holds 8 elements, needs 9"), "{e}");
}

/// Segments of several shapes packed on block boundaries, weight decay on and off.
fn packed_segments() -> Vec<Segment> {
    let mut start = 0;
    [
        (1, 0.0),
        (300, ADAMW_WEIGHT_DECAY),
        (256, 0.0),
        (17, 0.0),
        (1000, ADAMW_WEIGHT_DECAY),
    ]
    .into_iter()
    .map(|(len, weight_decay)| {
        let s = Segment {
            start,
            len,
            weight_decay,
        };
        start = (start + len).next_multiple_of(UPDATE_BLOCK);
        s
    })
    .collect()
}

#[test]
fn packed_adamw_updates_every_segment_as_its_own_launch_does() {
    let ctx = gpu_or_skip!();
    let segments = packed_segments();
    let (_, n) = decay_table(&segments).unwrap();
    let mut p = rand_vec(n, 3);
    // The gaps between segments hold zeros, as an arena's do.
    let in_gap = |i: usize| !segments.iter().any(|s| (s.start..s.start + s.len).contains(&i));
    let zero_gaps = |x: &mut Vec<f32>| (0..n).filter(|&i| in_gap(i)).for_each(|i| x[i] = 0.0);
    zero_gaps(&mut p);
    let arena = |name: &str, data: &[f32]| ctx.upload(name, data).unwrap();
    let zeros = vec![0.0f32; n];
    let (param, grad, m, v) = (
        arena("param", &p),
        arena("grad", &zeros),
        arena("m", &zeros),
        arena("v", &zeros),
    );
    let hyper = ctx.zeros("hyper", 8).unwrap();
    let b = AdamWBuffers {
        param: &param,
        grad: &grad,
        m: &m,
        v: &v,
        hyper: &hyper,
    };
    let packed = pollster::block_on(adamw(ctx, &b, &segments)).unwrap();
    // Each segment alone, on its own buffers, as the executor ran them before packing.
    let alone: Vec<_> = segments
        .iter()
        .map(|s| {
            let r = s.start..s.start + s.len;
            let bufs = [&p[r.clone()], &zeros[..s.len], &zeros[..s.len], &zeros[..s.len]].map(|d| arena("one", d));
            let one = Segment { start: 0, ..*s };
            let b = AdamWBuffers {
                param: &bufs[0],
                grad: &bufs[1],
                m: &bufs[2],
                v: &bufs[3],
                hyper: &hyper,
            };
            let d = pollster::block_on(adamw(ctx, &b, &[one])).unwrap();
            (bufs, d)
        })
        .collect();
    let (mut rm, mut rv) = (zeros.clone(), zeros.clone());
    for step in 1..=3u32 {
        let mut g = rand_vec(n, 40 + step);
        zero_gaps(&mut g);
        let h = AdamWHyper::at(1e-2, step).unwrap();
        ctx.write(&hyper, &h.words());
        ctx.write(&grad, &g);
        for (s, (bufs, _)) in segments.iter().zip(&alone) {
            ctx.write(&bufs[1], &g[s.start..s.start + s.len]);
        }
        ctx.run(std::slice::from_ref(&packed));
        let ds: Vec<_> = alone.iter().map(|(_, d)| d).collect();
        for d in ds {
            ctx.run(std::slice::from_ref(d));
        }
        for s in &segments {
            let r = s.start..s.start + s.len;
            shardlab::reference::optimizer::adamw(
                &mut p[r.clone()],
                &g[r.clone()],
                &mut rm[r.clone()],
                &mut rv[r],
                &h,
                s.weight_decay,
            );
        }
        let got = [&param, &m, &v].map(|b| ctx.read_blocking::<f32>(b).unwrap());
        for (what, got, want) in [("param", &got[0], &p), ("m", &got[1], &rm), ("v", &got[2], &rv)] {
            assert_close(&format!("packed {what} step {step}"), got, want, 1e-6, 1e-6);
            assert!(
                (0..n).filter(|&i| in_gap(i)).all(|i| got[i] == 0.0),
                "{what}: a gap moved"
            );
        }
        for (s, (bufs, _)) in segments.iter().zip(&alone) {
            for (k, packed) in [(0, &got[0]), (2, &got[1]), (3, &got[2])] {
                let one = ctx.read_blocking::<f32>(&bufs[k]).unwrap();
                let same = one
                    .iter()
                    .zip(&packed[s.start..])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "step {step}: segment at {} differs bitwise from its own launch",
                    s.start
                );
            }
        }
    }
}

#[test]
fn packed_update_refuses_segments_off_a_block_or_overlapping() {
    let seg = |start, len| Segment {
        start,
        len,
        weight_decay: 0.0,
    };
    let (table, n) = decay_table(&[seg(0, 300), seg(512, 10)]).unwrap();
    assert_eq!((table.len(), n), (3, 522));
    for bad in [vec![seg(64, 8)], vec![seg(0, 300), seg(256, 8)], vec![seg(0, 0)]] {
        let e = decay_table(&bad).unwrap_err().to_string();
        assert!(e.contains("block"), "{e}");
    }
}
