use shardlab::kernels::elementwise::{binary, scale, Binary, BinaryArgs};
use shardlab::reference::elementwise as reference;
use shardlab_tests::{assert_close, gpu_or_skip, rand_vec};

/// (n, period of b): odd ones, and ones whose period is a multiple of 4 (the vec4 kernels).
const SIZES: &[(usize, usize)] = &[
    (1, 1),
    (3, 3),
    (17, 1),
    (65, 13),
    (1000, 10),
    (70_001, 70_001),
    (1024, 256),
    (96, 4),
    (70_004, 70_004),
];

#[test]
fn elementwise_kernels_match_reference_on_odd_sizes() {
    let ctx = gpu_or_skip!();
    for &(n, nb) in SIZES {
        let a = rand_vec(n, 1);
        let b = rand_vec(nb, 2);
        let ga = ctx.upload("a", &a).unwrap();
        let gb = ctx.upload("b", &b).unwrap();
        let out = ctx.zeros("out", n).unwrap();
        let run = |d| {
            ctx.run(&[d]);
            ctx.read_blocking::<f32>(&out).unwrap()
        };
        let d = pollster::block_on(binary(
            ctx,
            &ga,
            &gb,
            &out,
            &BinaryArgs::new(Binary::Add, n, nb, 0.5, -2.0),
        ))
        .unwrap();
        assert_close(
            &format!("add n={n}"),
            &run(d),
            &reference::add(&a, &b, 0.5, -2.0),
            1e-6,
            1e-6,
        );
        let d = pollster::block_on(binary(
            ctx,
            &ga,
            &gb,
            &out,
            &BinaryArgs::new(Binary::Mul, n, nb, 3.0, 0.0),
        ))
        .unwrap();
        assert_close(&format!("mul n={n}"), &run(d), &reference::mul(&a, &b, 3.0), 1e-6, 1e-6);
        let d = pollster::block_on(scale(ctx, &ga, &out, n, -1.5, 0.25)).unwrap();
        assert_close(
            &format!("scale n={n}"),
            &run(d),
            &reference::scale(&a, -1.5, 0.25),
            1e-6,
            1e-6,
        );
    }
}
