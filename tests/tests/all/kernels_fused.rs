//! The fused elementwise kernels compute exactly what the two unfused kernels they replace
//! compute, on one device and on several (each device's own bias block).
use shardlab::kernels::elementwise::{binary, Binary, BinaryArgs};
use shardlab::kernels::fused::{bias_gelu, bias_residual, dropout_residual, FusedShape};
use shardlab::kernels::{dropout, gelu};
use shardlab::reference::fused as reference;
use shardlab_tests::{assert_close, gpu_or_skip, rand_vec};

/// (n over all devices, bias period per device, devices); n and the period multiples of 4 take
/// the vec4 kernels.
const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (17, 17, 1),
    (1000, 10, 1),
    (4 * 96, 24, 4),
    (70_001, 1, 1),
    (4096, 128, 1),
    (2 * 520, 4, 2),
];

fn bits(n: usize, seed: u32) -> Vec<u32> {
    rand_vec(n, seed)
        .iter()
        .map(|v| v.to_bits().wrapping_mul(2654435761))
        .collect()
}

#[test]
fn bias_gelu_writes_the_same_sum_and_gelu_as_add_then_gelu() {
    let ctx = gpu_or_skip!();
    for &(n, nb, devices) in SHAPES {
        let s = FusedShape { n, nb, devices };
        let (a, bias) = (rand_vec(n, 1), rand_vec(devices * nb, 2));
        let ga = ctx.upload("a", &a).unwrap();
        let gb = ctx.upload("bias", &bias).unwrap();
        let (pre, out) = (ctx.zeros("pre", n).unwrap(), ctx.zeros("out", n).unwrap());
        ctx.run(&[pollster::block_on(bias_gelu(ctx, &ga, &gb, &pre, &out, s)).unwrap()]);
        let (got_pre, got) = (
            ctx.read_blocking::<f32>(&pre).unwrap(),
            ctx.read_blocking::<f32>(&out).unwrap(),
        );
        // The unfused chain on the GPU: add, then gelu.
        let (sum, act) = (ctx.zeros("sum", n).unwrap(), ctx.zeros("act", n).unwrap());
        let args = BinaryArgs {
            devices,
            ..BinaryArgs::new(Binary::Add, n, nb, 1.0, 1.0)
        };
        let add = pollster::block_on(binary(ctx, &ga, &gb, &sum, &args)).unwrap();
        let g = pollster::block_on(gelu::forward(ctx, &sum, &act, n)).unwrap();
        ctx.run(&[add, g]);
        let what = format!("bias_gelu n={n} nb={nb} devices={devices}");
        assert_eq!(got_pre, ctx.read_blocking::<f32>(&sum).unwrap(), "{what}: sum");
        assert_close(&what, &got, &ctx.read_blocking::<f32>(&act).unwrap(), 1e-7, 1e-6);
        let (want_pre, want) = reference::bias_gelu(&a, &bias, s);
        assert_close(&format!("{what} vs reference sum"), &got_pre, &want_pre, 0.0, 0.0);
        assert_close(&format!("{what} vs reference"), &got, &want, 1e-6, 1e-5);
    }
}

#[test]
fn bias_residual_adds_the_bias_then_the_residual_exactly_as_two_adds() {
    let ctx = gpu_or_skip!();
    for &(n, nb, devices) in SHAPES {
        let s = FusedShape { n, nb, devices };
        let (a, bias, r) = (rand_vec(n, 3), rand_vec(devices * nb, 4), rand_vec(n, 5));
        let ga = ctx.upload("a", &a).unwrap();
        let gb = ctx.upload("bias", &bias).unwrap();
        let gr = ctx.upload("residual", &r).unwrap();
        let out = ctx.zeros("out", n).unwrap();
        ctx.run(&[pollster::block_on(bias_residual(ctx, &ga, &gb, &gr, &out, s)).unwrap()]);
        let got = ctx.read_blocking::<f32>(&out).unwrap();
        let (sum, want_gpu) = (ctx.zeros("sum", n).unwrap(), ctx.zeros("want", n).unwrap());
        let bias_add = BinaryArgs {
            devices,
            ..BinaryArgs::new(Binary::Add, n, nb, 1.0, 1.0)
        };
        let residual_add = BinaryArgs {
            devices,
            ..BinaryArgs::new(Binary::Add, n, n / devices, 1.0, 1.0)
        };
        let d1 = pollster::block_on(binary(ctx, &ga, &gb, &sum, &bias_add)).unwrap();
        let d2 = pollster::block_on(binary(ctx, &gr, &sum, &want_gpu, &residual_add)).unwrap();
        ctx.run(&[d1, d2]);
        let what = format!("bias_residual n={n} nb={nb} devices={devices}");
        assert_eq!(got, ctx.read_blocking::<f32>(&want_gpu).unwrap(), "{what}");
        assert_close(&what, &got, &reference::bias_residual(&a, &bias, &r, s), 0.0, 0.0);
    }
}

#[test]
fn dropout_residual_drops_then_adds_the_residual_exactly_as_two_kernels() {
    let ctx = gpu_or_skip!();
    for &(n, _, _) in SHAPES {
        let (x, b, r) = (rand_vec(n, 6), bits(n, 7), rand_vec(n, 8));
        let gx = ctx.upload("x", &x).unwrap();
        let gbits = ctx.upload("bits", &b).unwrap();
        let gr = ctx.upload("residual", &r).unwrap();
        let out = ctx.zeros("out", n).unwrap();
        let rate = 0.1;
        ctx.run(&[pollster::block_on(dropout_residual(ctx, &gx, &gbits, &gr, &out, n, rate)).unwrap()]);
        let got = ctx.read_blocking::<f32>(&out).unwrap();
        let (dropped, want_gpu) = (ctx.zeros("dropped", n).unwrap(), ctx.zeros("want", n).unwrap());
        let d1 = pollster::block_on(dropout::apply(ctx, &gx, &gbits, &dropped, n, rate)).unwrap();
        let add = BinaryArgs::new(Binary::Add, n, n, 1.0, 1.0);
        let d2 = pollster::block_on(binary(ctx, &gr, &dropped, &want_gpu, &add)).unwrap();
        ctx.run(&[d1, d2]);
        let what = format!("dropout_residual n={n}");
        assert_eq!(got, ctx.read_blocking::<f32>(&want_gpu).unwrap(), "{what}");
        assert_close(&what, &got, &reference::dropout_residual(&x, &b, &r, rate), 0.0, 0.0);
        assert!(
            got.iter().zip(&r).any(|(g, r)| g == r) || n < 50,
            "{what}: some elements dropped"
        );
    }
}

#[test]
fn fused_kernels_reject_a_bias_period_that_does_not_divide_a_block() {
    let ctx = gpu_or_skip!();
    let a = ctx.zeros("a", 12).unwrap();
    let (b, out) = (ctx.zeros("bias", 10).unwrap(), ctx.zeros("out", 12).unwrap());
    let s = FusedShape {
        n: 12,
        nb: 5,
        devices: 2,
    };
    let err = pollster::block_on(bias_residual(ctx, &a, &b, &a, &out, s))
        .err()
        .expect("period 5 of 6");
    assert!(err.to_string().contains("does not divide"), "{err}");
}
