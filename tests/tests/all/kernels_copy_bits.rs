//! The strided copy moves u32 data (token ids, random bits) bit for bit, including patterns
//! that are denormals or NaNs as f32, which an f32 load/store may flush or canonicalize.
use shardlab::kernels::copy::{strided, Strided};
use shardlab_tests::gpu_or_skip;

#[test]
fn strided_copy_keeps_every_bit_of_u32_data() {
    let ctx = gpu_or_skip!();
    let special = [
        0x0000_0001u32,
        0x007f_ffff,
        0x7fc0_0001,
        0xffff_ffff,
        0x7f80_0000,
        0x8000_0000,
    ];
    // (3, 4) -> transposed (4, 3)
    let src: Vec<u32> = (0..12).map(|i| special[i % special.len()] ^ (i as u32) << 24).collect();
    let a = ctx.upload("bits", &src).unwrap();
    let b = ctx.zeros("bits^T", 12).unwrap();
    let d = pollster::block_on(strided(ctx, &a, &b, &Strided::new(&[4, 3], &[1, 4], &[3, 1]))).unwrap();
    ctx.run(&[d]);
    let got = ctx.read_blocking::<u32>(&b).unwrap();
    for j in 0..4 {
        for i in 0..3 {
            assert_eq!(got[j * 3 + i], src[i * 4 + j], "element ({j}, {i})");
        }
    }
}
