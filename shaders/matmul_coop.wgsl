// Matmul on cooperative matrices (wgpu's EXPERIMENTAL_COOPERATIVE_MATRIX: 8x8 f32 tiles that a
// subgroup loads, multiplies and stores together; Apple GPUs' simdgroup matrices, Vulkan drivers that
// offer 8x8x8 f32): C = alpha * op(A) @ op(B) (+ bias) (+ C), batched, composed after matmul_out.wgsl.
// It reads block8's packed operands (matmul.wgsl's `pack`: A^T as (items, Kp, Mp) and B as (items, Kp,
// Np) floats, zero-padded, here to multiples of 32 rows and 8 k-rows), so no load is bounds-checked.
//   coop8  a 32x32 block of C per workgroup of 64 invocations: four 16x16 regions of 2x2 tiles, each
//          region one subgroup's (a subgroup of 8 lanes takes one, of 32 two, of 64 all four); per 8
//          k-rows it loads two A and two B tiles and makes four multiply-adds. The regions go through
//          workgroup memory to the shared epilogue (alpha, bias, the old C, bounds).
// The subgroups of a workgroup are taken to be its invocations in order of local_invocation_index,
// subgroup_size at a time, as every GPU driver forms them. Its `enable wgpu_cooperative_matrix;` is put
// in front of the prelude by crate/src/shaders.rs (WGSL wants it before every declaration).

@group(0) @binding(7) var<storage, read> pa: array<f32>; // (items, Kp, Mp): A^T packed, column-major A tiles
@group(0) @binding(8) var<storage, read> pb: array<f32>; // (items, Kp, Np): B packed, row-major B tiles

// The workgroup's 32x32 block, row-major: region q at rows 16 (q / 2), columns 16 (q % 2).
var<workgroup> block: array<f32, 1024>;

// Region q (16x16) of the block at (row0, col0), over all of K, into `block`.
fn coop_region(q: u32, row0: u32, col0: u32, ia: u32, ib: u32) {
    let mp = p.mp4 * 4u;
    let np = p.np4 * 4u;
    let r = row0 + 16u * (q / 2u);
    let c = col0 + 16u * (q % 2u);
    var c00 = coop_mat8x8<f32, C>();
    var c01 = coop_mat8x8<f32, C>();
    var c10 = coop_mat8x8<f32, C>();
    var c11 = coop_mat8x8<f32, C>();
    for (var k = 0u; k < p.kp; k += 8u) {
        // A[r .. r+8, k .. k+8] lies column-major in A^T's rows (stride Mp); B's tiles row-major.
        let a0 = coopLoad<coop_mat8x8<f32, A>>(&pa[ia + k * mp + r], mp);
        let a1 = coopLoad<coop_mat8x8<f32, A>>(&pa[ia + k * mp + r + 8u], mp);
        let b0 = coopLoadT<coop_mat8x8<f32, B>>(&pb[ib + k * np + c], np);
        let b1 = coopLoadT<coop_mat8x8<f32, B>>(&pb[ib + k * np + c + 8u], np);
        c00 = coopMultiplyAdd(a0, b0, c00);
        c01 = coopMultiplyAdd(a0, b1, c01);
        c10 = coopMultiplyAdd(a1, b0, c10);
        c11 = coopMultiplyAdd(a1, b1, c11);
    }
    let at = 512u * (q / 2u) + 16u * (q % 2u);
    coopStoreT(c00, &block[at], 32u);
    coopStoreT(c01, &block[at + 8u], 32u);
    coopStoreT(c10, &block[at + 256u], 32u);
    coopStoreT(c11, &block[at + 264u], 32u);
}

@compute @workgroup_size(64)
fn coop8(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
    @builtin(subgroup_size) lanes: u32,
) {
    let tile = wid.x + wid.y * nwg.x;
    let per_row = p.np4 / 8u;
    if (tile >= p.mp4 / 8u * per_row) { return; } // uniform: the whole workgroup leaves
    let z = wid.z;
    let row0 = tile / per_row * 32u;
    let col0 = tile % per_row * 32u;
    let ia = select(z, 0u, p.stride_a == 0u) * p.kp * p.mp4 * 4u;
    let ib = select(z, 0u, p.stride_b == 0u) * p.kp * p.np4 * 4u;
    let groups = max(64u / lanes, 1u);
    let sg = t / lanes;
    // Every subgroup makes the same number of turns, so the barrier below is reached by all.
    for (var turn = 0u; turn * groups < 4u; turn++) {
        let q = sg + turn * groups;
        if (q < 4u) { coop_region(q, row0, col0, ia, ib); }
    }
    workgroupBarrier();
    let cb = z * p.stride_c;
    for (var e = t; e < 1024u; e += 64u) {
        let row = row0 + e / 32u;
        let col = col0 + e % 32u;
        if (row < p.m && col < p.n) {
            let i = cb + row * p.n + col;
            c[i] = finish(block[e], col, i);
        }
    }
}
