// Matmul for GPUs: C = alpha * op(A) @ op(B) (+ bias) (+ C), batched, composed after matmul_out.wgsl
// (Params, C, the bias and the stores). It reads the operands block8's passes pack (matmul.wgsl's `pack`
// and `pack_k4`: A^T as (items, Kp, Mp/4) and B as (items, Kp, Np/4) vec4 rows, zero-padded), padded
// here to whole workgroup tiles and whole K steps, so no load is bounds-checked.
//   gpu64   a 64x64 tile of C per workgroup of 256 invocations, each a 4x4 register block; K in steps
//           of 16, each step's A and B tiles staged in workgroup memory from one vec4 load per
//           invocation: 8 multiply-adds per value read from workgroup memory.
//   gpu128  a 128x128 tile per workgroup of 256, each invocation an 8x8 block (four 4x4 blocks 64 rows
//           and 64 columns apart, so neighbouring invocations read neighbouring vec4s); K in steps of
//           8: 16 multiply-adds per value read from workgroup memory.
// Both double-buffer along K: the next step's vec4s are loaded into registers while this step's tiles
// are multiplied, then stored to the other buffer, one barrier per step. On a GPU that keeps the
// loads in flight behind the arithmetic; on CPU adapters (a workgroup per thread, every access a loop
// over the lanes) the texture and subgroup variants stay faster, and the autotuner times these on
// GPUs only (kernels/matmul/variants.rs).
// Entry points ending in `_v4` store C as vec4 (N and stride_c multiples of 4).

@group(0) @binding(7) var<storage, read> pa: array<vec4<f32>>; // (items, Kp, Mp/4): A^T packed
@group(0) @binding(8) var<storage, read> pb: array<vec4<f32>>; // (items, Kp, Np/4): B packed

// Two buffers of one K step each: [buf * 256 + kk * (tile / 4) + x] = A^T[k0 + kk, 4x .. 4x+3] (B alike).
var<workgroup> sa: array<vec4<f32>, 512>;
var<workgroup> sb: array<vec4<f32>, 512>;

// acc[2 i + j][r] = C[row0 + 4 ty + 64 i + r, col0 + 4 tx + 64 j .. +3] (gpu64 uses acc[0] alone).
// Indexed with constants only, so it stays in registers.
var<private> acc: array<mat4x4<f32>, 4>;

// Where tile `tile` of batch item z lies for `size`-square tiles: (first row, first column, A's first
// vec4, B's first vec4), or x = M when the workgroup lies past C (the grid rounds up).
fn tile_at(tile: u32, z: u32, size: u32) -> vec4<u32> {
    let per_row = p.np4 * 4u / size;
    if (tile >= p.mp4 * 4u / size * per_row) { return vec4(p.m, 0u, 0u, 0u); }
    let row0 = tile / per_row * size;
    let col0 = tile % per_row * size;
    let ia = select(z, 0u, p.stride_a == 0u) * p.kp * p.mp4 + row0 / 4u;
    let ib = select(z, 0u, p.stride_b == 0u) * p.kp * p.np4 + col0 / 4u;
    return vec4(row0, col0, ia, ib);
}

// ---- gpu64 ----

// The 4x4 block of invocation (tx, ty) over the 16 k-rows of buffer `buf`.
fn gpu64_step(buf: u32, tx: u32, ty: u32) {
    let base = buf * 256u;
    for (var kk = 0u; kk < 16u; kk += 4u) {
        let i = base + kk * 16u;
        acc[0] += outer(sa[i + ty], sb[i + tx]);
        acc[0] += outer(sa[i + 16u + ty], sb[i + 16u + tx]);
        acc[0] += outer(sa[i + 32u + ty], sb[i + 32u + tx]);
        acc[0] += outer(sa[i + 48u + ty], sb[i + 48u + tx]);
    }
}

// Accumulates the tile of workgroup `tile`; returns (row, col) of this invocation's block, or row = M.
fn gpu64_body(tile: u32, z: u32, t: u32) -> vec2<u32> {
    let at = tile_at(tile, z, 64u);
    if (at.x >= p.m) { return vec2(p.m, 0u); } // uniform: the whole workgroup leaves
    let tx = t % 16u;
    let ty = t / 16u;
    // Invocation t loads k-row t / 16, vec4 t % 16 of each tile.
    var ia = at.z + ty * p.mp4 + tx;
    var ib = at.w + ty * p.np4 + tx;
    sa[t] = pa[ia];
    sb[t] = pb[ib];
    workgroupBarrier();
    let steps = p.kp / 16u;
    for (var s = 0u; s < steps; s++) {
        let buf = s & 1u;
        let more = s + 1u < steps;
        var na = vec4(0.0);
        var nb = vec4(0.0);
        if (more) {
            ia += 16u * p.mp4;
            ib += 16u * p.np4;
            na = pa[ia];
            nb = pb[ib];
        }
        gpu64_step(buf, tx, ty);
        if (more) {
            sa[(1u - buf) * 256u + t] = na;
            sb[(1u - buf) * 256u + t] = nb;
        }
        workgroupBarrier();
    }
    return vec2(at.x + 4u * ty, at.y + 4u * tx);
}

@compute @workgroup_size(256)
fn gpu64(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let rc = gpu64_body(wid.x + wid.y * nwg.x, wid.z, t);
    if (rc.x >= p.m) { return; }
    store_block(wid.z * p.stride_c, rc.x, rc.y, acc[0]);
}

@compute @workgroup_size(256)
fn gpu64_v4(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let rc = gpu64_body(wid.x + wid.y * nwg.x, wid.z, t);
    if (rc.x >= p.m) { return; }
    store_block_v4(wid.z * p.stride_c, rc.x, rc.y, acc[0]);
}

// ---- gpu128 ----

fn gpu128_k(i: u32, tx: u32, ty: u32) {
    let a0 = sa[i + ty];
    let a1 = sa[i + 16u + ty];
    let b0 = sb[i + tx];
    let b1 = sb[i + 16u + tx];
    acc[0] += outer(a0, b0);
    acc[1] += outer(a0, b1);
    acc[2] += outer(a1, b0);
    acc[3] += outer(a1, b1);
}

// The 8x8 block of invocation (tx, ty) over the 8 k-rows of buffer `buf`.
fn gpu128_step(buf: u32, tx: u32, ty: u32) {
    let base = buf * 256u;
    for (var kk = 0u; kk < 8u; kk += 4u) {
        let i = base + kk * 32u;
        gpu128_k(i, tx, ty);
        gpu128_k(i + 32u, tx, ty);
        gpu128_k(i + 64u, tx, ty);
        gpu128_k(i + 96u, tx, ty);
    }
}

fn gpu128_body(tile: u32, z: u32, t: u32) -> vec2<u32> {
    let at = tile_at(tile, z, 128u);
    if (at.x >= p.m) { return vec2(p.m, 0u); }
    // Invocation t loads k-row t / 32, vec4 t % 32 of each tile.
    var ia = at.z + (t / 32u) * p.mp4 + t % 32u;
    var ib = at.w + (t / 32u) * p.np4 + t % 32u;
    sa[t] = pa[ia];
    sb[t] = pb[ib];
    workgroupBarrier();
    let tx = t % 16u;
    let ty = t / 16u;
    let steps = p.kp / 8u;
    for (var s = 0u; s < steps; s++) {
        let buf = s & 1u;
        let more = s + 1u < steps;
        var na = vec4(0.0);
        var nb = vec4(0.0);
        if (more) {
            ia += 8u * p.mp4;
            ib += 8u * p.np4;
            na = pa[ia];
            nb = pb[ib];
        }
        gpu128_step(buf, tx, ty);
        if (more) {
            sa[(1u - buf) * 256u + t] = na;
            sb[(1u - buf) * 256u + t] = nb;
        }
        workgroupBarrier();
    }
    return vec2(at.x + 4u * ty, at.y + 4u * tx);
}

@compute @workgroup_size(256)
fn gpu128(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let rc = gpu128_body(wid.x + wid.y * nwg.x, wid.z, t);
    if (rc.x >= p.m) { return; }
    let cb = wid.z * p.stride_c;
    store_block(cb, rc.x, rc.y, acc[0]);
    store_block(cb, rc.x, rc.y + 64u, acc[1]);
    store_block(cb, rc.x + 64u, rc.y, acc[2]);
    store_block(cb, rc.x + 64u, rc.y + 64u, acc[3]);
}

@compute @workgroup_size(256)
fn gpu128_v4(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let rc = gpu128_body(wid.x + wid.y * nwg.x, wid.z, t);
    if (rc.x >= p.m) { return; }
    let cb = wid.z * p.stride_c;
    store_block_v4(cb, rc.x, rc.y, acc[0]);
    store_block_v4(cb, rc.x, rc.y + 64u, acc[1]);
    store_block_v4(cb, rc.x + 64u, rc.y, acc[2]);
    store_block_v4(cb, rc.x + 64u, rc.y + 64u, acc[3]);
}
