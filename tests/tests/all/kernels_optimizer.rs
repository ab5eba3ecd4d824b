//! SGD and AdamW kernels (shaders/optimizer.wgsl) against their CPU twins over several steps,
//! each launch built once and replayed with host-rewritten hyper-parameters.
use shardlab::kernels::optimizer::{adamw, adamw_hyper, sgd, sgd_hyper, AdamWBuffers, AdamWHyper, ADAMW_WEIGHT_DECAY};
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
                n,
                wd,
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
        8,
        0.0,
    ))
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("bound twice"), "{e}");
    let e = pollster::block_on(sgd(ctx, &a, &b, &h, 9)).err().unwrap().to_string();
    assert!(e.contains("`a` holds 8 elements, needs 9"), "{e}");
}
