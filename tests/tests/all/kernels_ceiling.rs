//! The adapter-ceiling kernels `bench` reads every kernel against: they must compute what their
//! CPU twins do, or a driver that skipped work would raise the ceiling.
use shardlab::kernels::ceiling::{copy4, fma_peak};
use shardlab::reference::ceiling as twin;
use shardlab_tests::gpu_or_skip;

#[test]
fn fma_peak_matches_its_cpu_twin_for_every_invocation() {
    let ctx = gpu_or_skip!();
    let (n, iters, m, c) = (128, 7, 0.99f32, 0.01f32);
    let out = ctx.zeros("fma_peak out", 4 * n).unwrap();
    let d = pollster::block_on(fma_peak(ctx, &out, n, iters, m, c)).unwrap();
    ctx.run(&[d]);
    let got = ctx.read_blocking::<f32>(&out).unwrap();
    for i in 0..n {
        let want = twin::fma_peak(i, iters, m, c);
        for (lane, w) in want.iter().enumerate() {
            let g = got[4 * i + lane];
            assert!(
                (g - w).abs() <= 1e-5 * w.abs(),
                "invocation {i} lane {lane}: {g} vs {w}"
            );
        }
    }
    // The chains moved: after 28 rounds of x = 0.99 x + 0.01 no sum is its start.
    assert_ne!(twin::fma_peak(3, iters, m, c), twin::fma_peak(3, 0, m, c));
}

#[test]
fn copy4_copies_every_float() {
    let ctx = gpu_or_skip!();
    let n = 4 * 1000;
    let src: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
    let a = ctx.upload("copy4 src", &src).unwrap();
    let b = ctx.zeros("copy4 dst", n).unwrap();
    let d = pollster::block_on(copy4(ctx, &a, &b, n)).unwrap();
    ctx.run(&[d]);
    let mut want = vec![0f32; n];
    twin::copy4(&src, &mut want);
    assert_eq!(ctx.read_blocking::<f32>(&b).unwrap(), want);
}

#[test]
fn the_ceiling_kernels_refuse_launches_they_cannot_count_or_fit() {
    let ctx = gpu_or_skip!();
    let out = ctx.zeros("small out", 4 * 64).unwrap();
    let err = |r: Result<_, shardlab::gpu::GpuError>| r.err().map(|e| e.to_string()).unwrap_or_default();
    // Not a multiple of 64: the FLOP count would include idle invocations.
    assert!(err(pollster::block_on(fma_peak(ctx, &out, 100, 1, 1.0, 0.0))).contains("multiple of 64"));
    // More invocations than `out` holds.
    assert!(err(pollster::block_on(fma_peak(ctx, &out, 128, 1, 1.0, 0.0))).contains("holds"));
    assert!(err(pollster::block_on(fma_peak(ctx, &out, 0, 1, 1.0, 0.0))).contains("at least 1"));
    let src = ctx.zeros("src", 8).unwrap();
    assert!(err(pollster::block_on(copy4(ctx, &src, &out, 6))).contains("multiple of 4"));
    assert!(err(pollster::block_on(copy4(ctx, &src, &out, 16))).contains("holds"));
}
