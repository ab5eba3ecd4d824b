//! The per-device-parameter kernels (elementwise broadcast, layernorm, embedding) run D
//! simulated devices in one dispatch: for D = 1..4 on odd local sizes, each device's block of
//! the result equals the single-device CPU reference run on that device's own blocks, and
//! each device's parameter gradients (dgamma, dbeta, dtable) sum over its own rows only.
use pollster::block_on;
use shardlab::gpu::{Dispatch, GpuBuffer, GpuContext, GpuError};
use shardlab::kernels::elementwise::{binary, Binary, BinaryArgs};
use shardlab::kernels::embedding::EmbeddingShape;
use shardlab::kernels::layernorm::LayerNormShape;
use shardlab::kernels::RowStrategy;
use shardlab::kernels::{embedding, layernorm};
use shardlab::reference;
use shardlab_tests::{assert_close, gpu_or_skip, rand_vec};

const DEVICES: [usize; 4] = [1, 2, 3, 4];
const STRATEGIES: [RowStrategy; 2] = [RowStrategy::PerInvocation, RowStrategy::PerWorkgroup];

fn run(ctx: &GpuContext, dispatches: &[Dispatch], out: &GpuBuffer) -> Vec<f32> {
    shardlab_tests::run_dispatches(ctx, dispatches, out)
}

/// Block `d` of a buffer of equal blocks of `len` elements.
fn block<T>(v: &[T], d: usize, len: usize) -> &[T] {
    &v[d * len..(d + 1) * len]
}

/// Ids in [0, v], so that about one in v + 1 is out of range (read as zeros, gradient dropped).
fn ids(n: usize, v: usize, seed: u32) -> Vec<u32> {
    rand_vec(n, seed)
        .iter()
        .map(|x| (((x + 1.0) * 0.5 * (v + 1) as f32) as usize).min(v) as u32)
        .collect()
}

fn invalid(r: Result<impl Sized, GpuError>) -> String {
    match r {
        Err(GpuError::Invalid(msg)) => msg,
        Err(e) => panic!("expected GpuError::Invalid, got {e}"),
        Ok(_) => panic!("expected GpuError::Invalid, got a dispatch"),
    }
}

#[test]
fn binary_devices_broadcasts_each_devices_own_b_block() {
    let ctx = gpu_or_skip!();
    let nl = 5 * 17; // one device's (5, 17) block of `a`
    for devices in DEVICES {
        // Periods: a scalar per device, a bias row per device, and a same-shape operand.
        for nb in [1, 17, nl] {
            let n = devices * nl;
            let a = rand_vec(n, 1);
            let b = rand_vec(devices * nb, 2);
            let ga = ctx.upload("a", &a).unwrap();
            let gb = ctx.upload("b", &b).unwrap();
            let out = ctx.zeros("out", n).unwrap();
            for (op, alpha, beta) in [(Binary::Add, 0.5, -2.0), (Binary::Mul, 3.0, 0.0)] {
                let d = block_on(binary(
                    ctx,
                    &ga,
                    &gb,
                    &out,
                    &BinaryArgs {
                        devices,
                        ..BinaryArgs::new(op, n, nb, alpha, beta)
                    },
                ))
                .unwrap();
                let got = run(ctx, &[d], &out);
                for dev in 0..devices {
                    let (a_d, b_d) = (block(&a, dev, nl), block(&b, dev, nb));
                    let want = match op {
                        Binary::Add => reference::elementwise::add(a_d, b_d, alpha, beta),
                        Binary::Mul => reference::elementwise::mul(a_d, b_d, alpha),
                    };
                    let what = format!("{op:?} devices={devices} nb={nb} device {dev}");
                    assert_close(&what, block(&got, dev, nl), &want, 1e-6, 1e-6);
                }
            }
        }
    }
}

#[test]
fn binary_devices_rejects_uneven_splits_and_short_buffers() {
    let ctx = gpu_or_skip!();
    let a = ctx.zeros("a", 12).unwrap();
    let b = ctx.zeros("b", 6).unwrap();
    let out = ctx.zeros("out", 12).unwrap();
    let bin = |n, nb, devices| {
        block_on(binary(
            ctx,
            &a,
            &b,
            &out,
            &BinaryArgs {
                devices,
                ..BinaryArgs::new(Binary::Add, n, nb, 1.0, 1.0)
            },
        ))
    };
    assert!(invalid(bin(12, 3, 5)).contains("do not split evenly over 5 devices"));
    assert!(invalid(bin(12, 3, 0)).contains("over 0 devices"));
    // 12 over 3 devices is 4 per device: a period of 3 does not divide it.
    assert!(invalid(bin(12, 3, 3)).contains("does not divide the 4 elements"));
    // b must hold one block of nb per device: 3 x 4 > 6.
    assert!(invalid(bin(12, 4, 3)).contains("`b`"));
    assert!(invalid(bin(24, 6, 2)).contains("`a`"));
    assert!(bin(12, 3, 2).is_ok());
}

#[test]
fn layernorm_devices_normalizes_with_each_devices_gamma_and_beta() {
    let ctx = gpu_or_skip!();
    // Rows per device and C: odd, and a row longer than a 256-wide workgroup.
    for (r, c) in [(5, 17), (3, 300)] {
        for devices in DEVICES {
            let rows = devices * r;
            let x: Vec<f32> = rand_vec(rows * c, 1).iter().map(|v| 3.0 * v + 1.0).collect();
            let gamma = rand_vec(devices * c, 2);
            let beta = rand_vec(devices * c, 3);
            let gx = ctx.upload("x", &x).unwrap();
            let gg = ctx.upload("gamma", &gamma).unwrap();
            let gb = ctx.upload("beta", &beta).unwrap();
            let out = ctx.zeros("out", rows * c).unwrap();
            let mean = ctx.zeros("mean", rows).unwrap();
            let rstd = ctx.zeros("rstd", rows).unwrap();
            for s in STRATEGIES {
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
                    LayerNormShape { rows, c, devices },
                    Some(s),
                ))
                .unwrap();
                let got = run(ctx, &[d], &out);
                let got_mean = ctx.read_blocking::<f32>(&mean).unwrap();
                let got_rstd = ctx.read_blocking::<f32>(&rstd).unwrap();
                for dev in 0..devices {
                    let (want, want_mean, want_rstd) = reference::layernorm::forward(
                        block(&x, dev, r * c),
                        block(&gamma, dev, c),
                        block(&beta, dev, c),
                        LayerNormShape::new(r, c),
                    );
                    let what = format!("layernorm {s:?} ({r}, {c}) devices={devices} device {dev}");
                    assert_close(&what, block(&got, dev, r * c), &want, 1e-5, 1e-4);
                    assert_close(
                        &format!("{what} mean"),
                        block(&got_mean, dev, r),
                        &want_mean,
                        1e-6,
                        1e-5,
                    );
                    assert_close(
                        &format!("{what} rstd"),
                        block(&got_rstd, dev, r),
                        &want_rstd,
                        1e-6,
                        1e-4,
                    );
                }
            }
        }
    }
}

#[test]
fn layernorm_devices_backward_sums_dgamma_dbeta_per_device() {
    let ctx = gpu_or_skip!();
    // (130, 5): each device's columns sum three chunks (the last short) in one dispatch with dx;
    // (130, 8) the same four columns at a time; (1100, _) past the fused rows, in two more
    // stages.
    for (r, c) in [(5, 17), (3, 300), (130, 5), (130, 8), (1100, 5), (1100, 8)] {
        for devices in DEVICES {
            let rows = devices * r;
            let x: Vec<f32> = rand_vec(rows * c, 4).iter().map(|v| 2.0 * v - 0.5).collect();
            let gamma = rand_vec(devices * c, 5);
            let dout = rand_vec(rows * c, 6);
            // The forward's mean and rstd do not depend on gamma and beta: one reference call.
            let (_, mean, rstd) =
                reference::layernorm::forward(&x, &vec![1.0; c], &vec![0.0; c], LayerNormShape::new(rows, c));
            let gdout = ctx.upload("dout", &dout).unwrap();
            let gx = ctx.upload("x", &x).unwrap();
            let gmean = ctx.upload("mean", &mean).unwrap();
            let grstd = ctx.upload("rstd", &rstd).unwrap();
            let gg = ctx.upload("gamma", &gamma).unwrap();
            let dx = ctx.zeros("dx", rows * c).unwrap();
            let dg = ctx.upload("dgamma", &vec![7.0f32; devices * c]).unwrap(); // overwritten
            let db = ctx.upload("dbeta", &vec![7.0f32; devices * c]).unwrap();
            for s in STRATEGIES {
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
                    LayerNormShape { rows, c, devices },
                    Some(s),
                ))
                .unwrap();
                // One dispatch, or past the fused rows dx then dgamma/dbeta in two stages.
                let want = if r > layernorm::FUSED_ROWS { 3 } else { 1 };
                assert_eq!(ds.len(), want, "dispatch count must not grow with devices");
                let got_dx = run(ctx, &ds, &dx);
                let got_dg = ctx.read_blocking::<f32>(&dg).unwrap();
                let got_db = ctx.read_blocking::<f32>(&db).unwrap();
                for dev in 0..devices {
                    let (want_dx, want_dg, want_db) = reference::layernorm::backward(
                        block(&dout, dev, r * c),
                        block(&x, dev, r * c),
                        block(&mean, dev, r),
                        block(&rstd, dev, r),
                        block(&gamma, dev, c),
                        LayerNormShape::new(r, c),
                    );
                    let what = format!("layernorm backward {s:?} ({r}, {c}) devices={devices} device {dev}");
                    assert_close(&format!("{what} dx"), block(&got_dx, dev, r * c), &want_dx, 1e-4, 1e-3);
                    assert_close(&format!("{what} dgamma"), block(&got_dg, dev, c), &want_dg, 1e-4, 1e-4);
                    assert_close(&format!("{what} dbeta"), block(&got_db, dev, c), &want_db, 1e-4, 1e-4);
                }
            }
        }
    }
}

#[test]
fn layernorm_devices_rejects_uneven_rows_and_short_parameter_buffers() {
    let ctx = gpu_or_skip!();
    let (rows, c) = (6, 3);
    let x = ctx.zeros("x", rows * c).unwrap();
    let out = ctx.zeros("out", rows * c).unwrap();
    let mean = ctx.zeros("mean", rows).unwrap();
    let rstd = ctx.zeros("rstd", rows).unwrap();
    let gamma = ctx.zeros("gamma", 2 * c).unwrap(); // enough for 2 devices only
    let beta = ctx.zeros("beta", 3 * c).unwrap();
    let fwd = |devices| {
        block_on(layernorm::forward(
            ctx,
            &layernorm::ForwardBuffers {
                x: &x,
                gamma: &gamma,
                beta: &beta,
                out: &out,
                mean: &mean,
                rstd: &rstd,
                residual: None,
            },
            LayerNormShape { rows, c, devices },
            None,
        ))
    };
    assert!(invalid(fwd(4)).contains("6 rows do not split evenly over 4 devices"));
    assert!(invalid(fwd(0)).contains("devices must be at least 1"));
    assert!(invalid(fwd(3)).contains("`gamma`"));
    assert!(fwd(2).is_ok());
    let dx = ctx.zeros("dx", rows * c).unwrap();
    let (dg, db) = (ctx.zeros("dgamma", 3 * c).unwrap(), ctx.zeros("dbeta", c).unwrap()); // dbeta: 1 device
    let bwd = |devices| {
        block_on(layernorm::backward(
            ctx,
            &layernorm::BackwardBuffers {
                dout: &out,
                x: &x,
                mean: &mean,
                rstd: &rstd,
                gamma: &beta,
                dx: &dx,
                dgamma: &dg,
                dbeta: &db,
            },
            LayerNormShape { rows, c, devices },
            None,
        ))
    };
    assert!(invalid(bwd(4)).contains("do not split evenly"));
    assert!(invalid(bwd(3)).contains("`dbeta`"));
    assert!(bwd(1).is_ok());
}

#[test]
fn embedding_devices_look_up_and_scatter_into_each_devices_own_table() {
    let ctx = gpu_or_skip!();
    // (ids per device, V, C); the second gives each backward invocation several rows of a block;
    // the third runs the backward four columns and four ids at a time (C and N / D multiples of 4).
    for (nl, v, c) in [(9, 7, 17), (40, 100, 5), (12, 9, 8)] {
        for devices in DEVICES {
            let n = devices * nl;
            let table = rand_vec(devices * v * c, 14);
            let id = ids(n, v, 15);
            let dout = rand_vec(n * c, 16);
            let gtable = ctx.upload("table", &table).unwrap();
            let gids = ctx.upload("ids", &id).unwrap();
            let gdout = ctx.upload("dout", &dout).unwrap();
            let out = ctx.zeros("out", n * c).unwrap();
            let dtable = ctx.upload("dtable", &vec![7.0f32; devices * v * c]).unwrap(); // overwritten
            let d = block_on(embedding::forward(
                ctx,
                &gtable,
                &gids,
                &out,
                EmbeddingShape { n, v, c, devices },
            ))
            .unwrap();
            let got = run(ctx, &[d], &out);
            let d = block_on(embedding::backward(
                ctx,
                &gdout,
                &gids,
                &dtable,
                EmbeddingShape { n, v, c, devices },
            ))
            .unwrap();
            let got_dtable = run(ctx, &[d], &dtable);
            for dev in 0..devices {
                let id_d = block(&id, dev, nl);
                let what = format!("embedding ({nl}, {v}, {c}) devices={devices} device {dev}");
                let want =
                    reference::embedding::forward(block(&table, dev, v * c), id_d, EmbeddingShape::new(nl, v, c));
                assert_eq!(block(&got, dev, nl * c), &want[..], "{what}");
                // Same summation order as the reference (ids in order, no atomics): bitwise equal.
                let want =
                    reference::embedding::backward(block(&dout, dev, nl * c), id_d, EmbeddingShape::new(nl, v, c));
                assert_eq!(block(&got_dtable, dev, v * c), &want[..], "{what} dtable");
            }
        }
    }
}

#[test]
fn embedding_devices_rejects_uneven_ids_and_short_tables() {
    let ctx = gpu_or_skip!();
    let (n, v, c) = (6, 4, 3);
    let table = ctx.zeros("table", 2 * v * c).unwrap(); // enough for 2 devices only
    let gids = ctx.upload("ids", &[0u32; 6]).unwrap();
    let out = ctx.zeros("out", n * c).unwrap();
    let fwd = |devices| {
        block_on(embedding::forward(
            ctx,
            &table,
            &gids,
            &out,
            EmbeddingShape { n, v, c, devices },
        ))
    };
    assert!(invalid(fwd(4)).contains("6 ids do not split evenly over 4 devices"));
    assert!(invalid(fwd(0)).contains("devices must be at least 1"));
    assert!(invalid(fwd(3)).contains("`table`"));
    assert!(fwd(2).is_ok());
    let bwd = |devices| {
        block_on(embedding::backward(
            ctx,
            &out,
            &gids,
            &table,
            EmbeddingShape { n, v, c, devices },
        ))
    };
    assert!(invalid(bwd(4)).contains("do not split evenly"));
    assert!(invalid(bwd(3)).contains("`dtable`"));
    assert!(bwd(2).is_ok());
}
