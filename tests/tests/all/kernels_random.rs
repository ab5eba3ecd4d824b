//! GPU random bits and dropout (shaders/random.wgsl) against the CPU generator, bit for bit.
// `&[0..4]` is the one range of a 1-D block, not a mistaken `Vec` of a range.
#![allow(clippy::single_range_in_vec_init)]
use std::ops::Range;

use shardlab::gpu::{GpuBuffer, GpuContext};
use shardlab::kernels::random::{dropout_backward, dropout_forward, fold_in, random_bits, Draw, KeyMode};
use shardlab::reference::random as reference;
use shardlab::rng::{bernoulli_keep, keep_prob, keep_scale, Block, Key, RngLayout};
use shardlab_tests::{gpu_or_skip, rand_vec};

const LAYOUTS: [RngLayout; 2] = [RngLayout::Original, RngLayout::Partitionable];
const SHAPES: &[&[usize]] = &[&[1], &[3], &[17], &[65], &[1000], &[3, 5], &[2, 8, 3], &[]];

fn key_buffer(ctx: &GpuContext, keys: &[Key]) -> GpuBuffer {
    let words: Vec<u32> = keys.iter().flat_map(|k| k.0).collect();
    ctx.upload("key", &words).unwrap()
}

/// Bit patterns, so that float comparisons are exact (and -0.0 differs from 0.0).
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn run_u32(ctx: &GpuContext, d: shardlab::gpu::Dispatch, out: &GpuBuffer) -> Vec<u32> {
    ctx.run(&[d]);
    ctx.read_blocking::<u32>(out).unwrap()
}

/// Every block of a grid cutting dim d of `shape` into `parts[d]` equal pieces, row-major.
fn grid(shape: &[usize], parts: &[usize]) -> Vec<Block> {
    let mut blocks = vec![Vec::<Range<usize>>::new()];
    for (&n, &p) in shape.iter().zip(parts) {
        let step = n / p;
        blocks = blocks
            .into_iter()
            .flat_map(|b| {
                (0..p).map(move |i| {
                    let mut b = b.clone();
                    b.push(i * step..(i + 1) * step);
                    b
                })
            })
            .collect();
    }
    blocks.iter().map(|r| Block::new(shape, r).unwrap()).collect()
}

#[test]
fn random_bits_kernel_matches_reference_in_both_layouts_on_odd_sizes() {
    let ctx = gpu_or_skip!();
    let k = Key::from_seed(42).fold_in(7);
    let key = key_buffer(ctx, &[k]);
    for layout in LAYOUTS {
        for &shape in SHAPES {
            let block = Block::full(shape);
            let out = ctx.zeros("bits", block.numel()).unwrap();
            let d = pollster::block_on(random_bits(
                ctx,
                &key,
                &out,
                &Draw {
                    layout,
                    blocks: &[block],
                    keys: KeyMode::Shared,
                },
            ))
            .unwrap();
            assert_eq!(
                run_u32(ctx, d, &out),
                reference::random_bits(k, layout, shape),
                "{layout:?} {shape:?}"
            );
        }
    }
}

#[test]
fn random_bits_dispatch_replays_with_a_key_rewritten_by_the_host() {
    let ctx = gpu_or_skip!();
    let key = key_buffer(ctx, &[Key::from_seed(0)]);
    let out = ctx.zeros("bits", 65).unwrap();
    for layout in LAYOUTS {
        let d = pollster::block_on(random_bits(
            ctx,
            &key,
            &out,
            &Draw {
                layout,
                blocks: &[Block::full(&[65])],
                keys: KeyMode::Shared,
            },
        ))
        .unwrap();
        for step in 0..3u32 {
            let k = Key::from_seed(1).fold_in(step);
            ctx.write(&key, &k.0);
            ctx.run(std::slice::from_ref(&d));
            let got = ctx.read_blocking::<u32>(&out).unwrap();
            assert_eq!(got, reference::random_bits(k, layout, &[65]), "{layout:?} step {step}");
        }
    }
}

#[test]
fn one_launch_makes_every_devices_block_in_both_layouts() {
    let ctx = gpu_or_skip!();
    let k = Key::from_seed(9);
    let key = key_buffer(ctx, &[k]);
    for (shape, parts) in [
        (vec![4usize, 6, 10], vec![2usize, 1, 2]),
        (vec![6, 5, 4, 3], vec![3, 1, 2, 1]),
        (vec![2, 3, 4, 5, 6], vec![1, 3, 1, 5, 1]),
        (vec![17], vec![1]),
    ] {
        let blocks = grid(&shape, &parts);
        let n_block = blocks[0].numel();
        let out = ctx.zeros("bits", blocks.len() * n_block).unwrap();
        for layout in LAYOUTS {
            let d = pollster::block_on(random_bits(
                ctx,
                &key,
                &out,
                &Draw {
                    layout,
                    blocks: &blocks,
                    keys: KeyMode::Shared,
                },
            ))
            .unwrap();
            let got = run_u32(ctx, d, &out);
            let global = reference::random_bits(k, layout, &shape);
            for (dev, b) in blocks.iter().enumerate() {
                let sliced: Vec<u32> = b.global_indices().map(|g| global[g as usize]).collect();
                assert_eq!(
                    got[dev * n_block..(dev + 1) * n_block],
                    sliced,
                    "{layout:?} {shape:?} device {dev}"
                );
                assert_eq!(sliced, reference::random_bits_block(k, layout, b));
            }
        }
    }
}

#[test]
fn replicated_original_layout_gives_every_device_the_whole_global_array() {
    let ctx = gpu_or_skip!();
    let k = Key::from_seed(4);
    let key = key_buffer(ctx, &[k]);
    let shape = [3, 7];
    let blocks = vec![Block::full(&shape); 4];
    let out = ctx.zeros("bits", 4 * 21).unwrap();
    let d = pollster::block_on(random_bits(
        ctx,
        &key,
        &out,
        &Draw {
            layout: RngLayout::Original,
            blocks: &blocks,
            keys: KeyMode::Shared,
        },
    ))
    .unwrap();
    let got = run_u32(ctx, d, &out);
    let global = reference::random_bits(k, RngLayout::Original, &shape);
    for dev in 0..4 {
        assert_eq!(got[dev * 21..(dev + 1) * 21], global[..], "device {dev}");
    }
}

#[test]
fn shared_key_local_draws_repeat_across_devices_and_folded_keys_do_not() {
    // shard_map: each device draws its local shape. The same key on every device gives the
    // same mask on every shard; fold_in(key, axis_index) gives each its own.
    let ctx = gpu_or_skip!();
    let k = Key::from_seed(1);
    let local = [2, 9];
    let blocks = vec![Block::full(&local); 3];
    let out = ctx.zeros("bits", 3 * 18).unwrap();
    let layout = RngLayout::Partitionable;
    let shared = key_buffer(ctx, &[k]);
    let d = pollster::block_on(random_bits(
        ctx,
        &shared,
        &out,
        &Draw {
            layout,
            blocks: &blocks,
            keys: KeyMode::Shared,
        },
    ))
    .unwrap();
    let got = run_u32(ctx, d, &out);
    assert!(got[..18] == got[18..36] && got[18..36] == got[36..]);
    let folded: Vec<Key> = (0..3).map(|i| k.fold_in(i)).collect();
    let per_device = key_buffer(ctx, &folded);
    let d = pollster::block_on(random_bits(
        ctx,
        &per_device,
        &out,
        &Draw {
            layout,
            blocks: &blocks,
            keys: KeyMode::PerDevice,
        },
    ))
    .unwrap();
    let got = run_u32(ctx, d, &out);
    for (dev, kd) in folded.iter().enumerate() {
        assert_eq!(
            got[dev * 18..(dev + 1) * 18],
            reference::random_bits(*kd, layout, &local)[..]
        );
    }
    assert_ne!(got[..18], got[18..36]);
}

#[test]
fn dropout_kernels_match_reference_in_both_layouts_on_odd_sizes() {
    let ctx = gpu_or_skip!();
    let k = Key::from_seed(123);
    let key = key_buffer(ctx, &[k]);
    for layout in LAYOUTS {
        for &shape in SHAPES {
            let block = Block::full(shape);
            let n = block.numel();
            let x = rand_vec(n, 5);
            let gx = ctx.upload("x", &x).unwrap();
            let out = ctx.zeros("out", n).unwrap();
            for rate in [0.0f32, 0.1, 0.5, 0.9, 1.0] {
                let what = format!("{layout:?} {shape:?} rate {rate}");
                let blocks = std::slice::from_ref(&block);
                let d = pollster::block_on(dropout_forward(
                    ctx,
                    &gx,
                    &key,
                    &out,
                    &Draw {
                        layout,
                        blocks,
                        keys: KeyMode::Shared,
                    },
                    rate,
                ))
                .unwrap();
                ctx.run(&[d]);
                let y = ctx.read_blocking::<f32>(&out).unwrap();
                let want = reference::dropout_forward(&x, k, layout, &block, rate).unwrap();
                assert_eq!(bits(&y), bits(&want), "dropout forward {what}");
                if rate == 0.0 {
                    assert_eq!(y, x, "{what}: rate 0 is the identity");
                }
                let d = pollster::block_on(dropout_backward(
                    ctx,
                    &gx,
                    &key,
                    &out,
                    &Draw {
                        layout,
                        blocks,
                        keys: KeyMode::Shared,
                    },
                    rate,
                ))
                .unwrap();
                ctx.run(&[d]);
                let dx = ctx.read_blocking::<f32>(&out).unwrap();
                let want = reference::dropout_backward(&x, k, layout, &block, rate).unwrap();
                assert_eq!(bits(&dx), bits(&want), "dropout backward {what}");
            }
        }
    }
}

#[test]
fn dropout_backward_of_ones_is_the_bernoulli_mask_over_keep_prob() {
    let ctx = gpu_or_skip!();
    let k = Key::from_seed(77).fold_in(2);
    let key = key_buffer(ctx, &[k]);
    let shape = [5, 13];
    let ones = ctx.upload("ones", &[1.0f32; 65]).unwrap();
    let dx = ctx.zeros("dx", 65).unwrap();
    for layout in LAYOUTS {
        for rate in [0.1f32, 0.5] {
            let keep = keep_prob(rate).unwrap();
            let blocks = [Block::full(&shape)];
            let d = pollster::block_on(dropout_backward(
                ctx,
                &ones,
                &key,
                &dx,
                &Draw {
                    layout,
                    blocks: &blocks,
                    keys: KeyMode::Shared,
                },
                rate,
            ))
            .unwrap();
            ctx.run(&[d]);
            let got = ctx.read_blocking::<f32>(&dx).unwrap();
            let mask = bernoulli_keep(k, layout, &shape, keep);
            let want: Vec<f32> = mask.iter().map(|&m| if m { keep_scale(keep) } else { 0.0 }).collect();
            assert_eq!(bits(&got), bits(&want), "{layout:?} rate {rate}");
            let kept = mask.iter().filter(|&&m| m).count();
            assert!(kept > 0 && kept < 65, "{layout:?} rate {rate}: {kept} of 65 kept");
        }
    }
}

#[test]
fn sharded_dropout_blocks_match_the_global_dropout() {
    let ctx = gpu_or_skip!();
    let k = Key::from_seed(8);
    let key = key_buffer(ctx, &[k]);
    let shape = [4, 3, 6];
    let blocks = grid(&shape, &[2, 1, 2]);
    let n_block = blocks[0].numel();
    let x_global = rand_vec(72, 3);
    for layout in LAYOUTS {
        let y_global = reference::dropout_forward(&x_global, k, layout, &Block::full(&shape), 0.3).unwrap();
        let x_local: Vec<f32> = blocks
            .iter()
            .flat_map(|b| b.global_indices().map(|g| x_global[g as usize]))
            .collect();
        let gx = ctx.upload("x", &x_local).unwrap();
        let out = ctx.zeros("out", x_local.len()).unwrap();
        let d = pollster::block_on(dropout_forward(
            ctx,
            &gx,
            &key,
            &out,
            &Draw {
                layout,
                blocks: &blocks,
                keys: KeyMode::Shared,
            },
            0.3,
        ))
        .unwrap();
        ctx.run(&[d]);
        let y = ctx.read_blocking::<f32>(&out).unwrap();
        let want: Vec<f32> = blocks
            .iter()
            .flat_map(|b| b.global_indices().map(|g| y_global[g as usize]))
            .collect();
        assert_eq!(y.len(), blocks.len() * n_block);
        assert_eq!(bits(&y), bits(&want), "{layout:?} sharded dropout");
    }
}

#[test]
fn random_launches_reject_bad_requests_with_errors() {
    let ctx = gpu_or_skip!();
    let key = key_buffer(ctx, &[Key::from_seed(0)]);
    let small = ctx.zeros("small", 4).unwrap();
    let x = ctx.zeros("x", 8).unwrap();
    let full = [Block::full(&[8])];
    let layout = RngLayout::Partitionable;
    let err = |r: Result<shardlab::gpu::Dispatch, shardlab::gpu::GpuError>| r.err().expect("an error").to_string();
    let e = err(pollster::block_on(random_bits(
        ctx,
        &key,
        &small,
        &Draw {
            layout,
            blocks: &full,
            keys: KeyMode::Shared,
        },
    )));
    assert!(e.contains("`small` holds 4"), "{e}");
    let two = [Block::new(&[8], &[0..4]).unwrap(), Block::new(&[8], &[4..8]).unwrap()];
    let e = err(pollster::block_on(random_bits(
        ctx,
        &key,
        &x,
        &Draw {
            layout,
            blocks: &two,
            keys: KeyMode::PerDevice,
        },
    )));
    assert!(e.contains("`key` holds 2 elements, the launch needs 4"), "{e}");
    let e = err(pollster::block_on(dropout_forward(
        ctx,
        &x,
        &key,
        &x,
        &Draw {
            layout,
            blocks: &full,
            keys: KeyMode::Shared,
        },
        0.1,
    )));
    assert!(e.contains("same buffer"), "{e}");
    let e = err(pollster::block_on(dropout_forward(
        ctx,
        &x,
        &key,
        &small,
        &Draw {
            layout,
            blocks: &full,
            keys: KeyMode::Shared,
        },
        1.5,
    )));
    assert!(e.contains("rate"), "{e}");
    let uneven = [Block::new(&[8], &[0..4]).unwrap(), Block::new(&[8], &[4..7]).unwrap()];
    let e = err(pollster::block_on(random_bits(
        ctx,
        &key,
        &x,
        &Draw {
            layout,
            blocks: &uneven,
            keys: KeyMode::Shared,
        },
    )));
    assert!(e.contains("equal blocks"), "{e}");
    let e = err(pollster::block_on(random_bits(
        ctx,
        &key,
        &x,
        &Draw {
            layout,
            blocks: &[],
            keys: KeyMode::Shared,
        },
    )));
    assert!(e.contains("no blocks"), "{e}");
}

#[test]
fn fold_in_kernel_matches_reference_for_shared_and_per_device_keys() {
    let ctx = gpu_or_skip!();
    let k = Key::from_seed(5);
    let data = [0u32, 1, 7, 0xFFFF_FFFF];
    let out = ctx.zeros("folded", 8).unwrap();
    let shared = key_buffer(ctx, &[k]);
    let d = pollster::block_on(fold_in(ctx, &shared, &out, &data, KeyMode::Shared)).unwrap();
    let want: Vec<u32> = data.iter().flat_map(|&x| k.fold_in(x).0).collect();
    assert_eq!(run_u32(ctx, d, &out), want);
    let keys: Vec<Key> = (0..4).map(|i| Key::from_seed(100 + i)).collect();
    let per_device = key_buffer(ctx, &keys);
    let d = pollster::block_on(fold_in(ctx, &per_device, &out, &data, KeyMode::PerDevice)).unwrap();
    let want: Vec<u32> = keys.iter().zip(data).flat_map(|(kd, x)| kd.fold_in(x).0).collect();
    assert_eq!(run_u32(ctx, d, &out), want);
}
