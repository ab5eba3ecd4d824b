// Matmul with the A values shared across a subgroup: C = alpha * op(A) @ op(B) (+ bias) (+ C), batched.
// It reads the textures tex16's pack passes write (matmul_tex.wgsl: texel (x, z * Kp + k) = A[4x .. 4x+3, k]
// and B[k, 4x .. 4x+3]) and is composed after matmul_out.wgsl (Params, C, the bias and the stores).
//   sg8, sg16  a workgroup is one subgroup of 8 or 16 invocations and computes a 64-row block of C,
//              8 columns per invocation (64 or 128 columns). Per k each invocation loads the A^T texels
//              of 8 (sg8) or 4 (sg16) of the rows and the two B texels of its columns, and
//              subgroupBroadcast hands every invocation all 64 rows' A values.
//   sg1_8, sg1_16  the same with one A texel and one B texel per invocation per k: a 32x32 (8 lanes) or
//              64x64 (16 lanes) block, 4 columns per invocation, and a quarter (half) of sg's 512
//              accumulators, which lavapipe keeps in memory: fewer of them cost less than the loads saved
//              (AVX2, n = 1024: ~25 against ~21 GFLOP/s in a standalone probe). sg1k_8, sg1k_16 (sg1's
//              launcher picks them) also read k-major textures (A_K_MAJOR, B_K_MAJOR below), which a copy
//              fills where tex16's need a pack.
// Why: lavapipe runs a subgroup as the lanes of one AVX2 (8) or AVX-512 (16) vector. A texel load is
// a loop over the lanes, a broadcast one shuffle, so 3 loads feed 512 multiply-adds here against
// tex16's 8 loads for 256 (n = 1024: 45 -> 54 GFLOP/s with 8 lanes, 97 with 16). The launcher offers
// these only where the subgroup size is fixed at 8 or 16: the entry points assume one subgroup per
// workgroup. No `enable subgroups;` here: naga takes subgroups from the device's feature and rejects
// the directive; the page adds it for the browser's compiler (shaders::for_browser).
// Entry points ending in `_v4` store C as vec4 (N and stride_c multiples of 4).

@group(0) @binding(7) var at: texture_storage_2d<rgba32float, read>; // texel (x, z * Kp + k) = A[4x .. 4x+3, k]
@group(0) @binding(8) var bt: texture_storage_2d<rgba32float, read>; // texel (x, z * Kp + k) = B[k, 4x .. 4x+3]

// `Params::flags` (sg1 only): A (B) is k-major, texel (k4, z * Mp + r) = A[r, 4 k4 .. 4 k4 + 3]
// (B[4 k4 .. 4 k4 + 3, r]), so an operand whose rows hold K side by side (A as stored, B transposed:
// a layer's input and its input gradient's operands) is copied in, not packed by a pass.
const A_K_MAJOR: u32 = 4u;
const B_K_MAJOR: u32 = 8u;

// k-step k of rows r .. r+3 of A (columns of B) from a k-major texture: a component of four texels.
// Four loads where the other layout has one, and still no slower on lavapipe (n = 512: 1.2-1.9 ms
// against 1.0-2.5), where a pack pass costs 0.3-2 ms; four k-steps unrolled per texel ran at half speed.
fn a_k_major(k: u32, r: u32) -> vec4<f32> {
    let x = k / 4u;
    let q = k % 4u;
    return vec4(textureLoad(at, vec2(x, r))[q], textureLoad(at, vec2(x, r + 1u))[q],
                textureLoad(at, vec2(x, r + 2u))[q], textureLoad(at, vec2(x, r + 3u))[q]);
}

fn b_k_major(k: u32, r: u32) -> vec4<f32> {
    let x = k / 4u;
    let q = k % 4u;
    return vec4(textureLoad(bt, vec2(x, r))[q], textureLoad(bt, vec2(x, r + 1u))[q],
                textureLoad(bt, vec2(x, r + 2u))[q], textureLoad(bt, vec2(x, r + 3u))[q]);
}

// m[2t + j][q] = C[row0 + 4t + q, col0 + 4j .. +3]: rows 4t .. 4t+3 of the block, this invocation's
// columns. Indexed with constants only, so the driver never copies it.
var<private> m: array<mat4x4<f32>, 32>;
// sg1: m1[s] = C[row0 + 4s .. +3, col0 + 4 lane .. +3].
var<private> m1: array<mat4x4<f32>, 16>;

// Where workgroup `tile` of batch item z works, for blocks of `rt` texel rows (4 rt rows of C) and `ct`
// texel columns: (first texel column of its rows in A^T, of its columns in B, first texel row of the
// item's A^T, of its B), or x = mp4 when it lies past C. sg's blocks are 16 x 2 lanes texels, sg1's
// lanes x lanes. The same for every invocation of the subgroup, so the loops that use it stay in
// uniform control flow.
fn sg_tile(tile: u32, z: u32, rt: u32, ct: u32) -> vec4<u32> {
    let nbc = (p.np4 + ct - 1u) / ct;
    if (tile >= (p.mp4 + rt - 1u) / rt * nbc) { return vec4(p.mp4, 0u, 0u, 0u); }
    let ka = select(z, 0u, p.stride_a == 0u) * p.kp;
    let kb = select(z, 0u, p.stride_b == 0u) * p.kp;
    return vec4(tile / nbc * rt, tile % nbc * ct, ka, kb);
}

// One k-step of sg1_8 (sg1_16): invocation s holds A rows 4s .. 4s+3 in `a`, its 4 columns' B in `b`.
fn kstep1_8(a: vec4<f32>, b: vec4<f32>) {
    m1[0] += outer(subgroupBroadcast(a, 0u), b);
    m1[1] += outer(subgroupBroadcast(a, 1u), b);
    m1[2] += outer(subgroupBroadcast(a, 2u), b);
    m1[3] += outer(subgroupBroadcast(a, 3u), b);
    m1[4] += outer(subgroupBroadcast(a, 4u), b);
    m1[5] += outer(subgroupBroadcast(a, 5u), b);
    m1[6] += outer(subgroupBroadcast(a, 6u), b);
    m1[7] += outer(subgroupBroadcast(a, 7u), b);
}

fn kstep1_16(a: vec4<f32>, b: vec4<f32>) {
    m1[0] += outer(subgroupBroadcast(a, 0u), b);
    m1[1] += outer(subgroupBroadcast(a, 1u), b);
    m1[2] += outer(subgroupBroadcast(a, 2u), b);
    m1[3] += outer(subgroupBroadcast(a, 3u), b);
    m1[4] += outer(subgroupBroadcast(a, 4u), b);
    m1[5] += outer(subgroupBroadcast(a, 5u), b);
    m1[6] += outer(subgroupBroadcast(a, 6u), b);
    m1[7] += outer(subgroupBroadcast(a, 7u), b);
    m1[8] += outer(subgroupBroadcast(a, 8u), b);
    m1[9] += outer(subgroupBroadcast(a, 9u), b);
    m1[10] += outer(subgroupBroadcast(a, 10u), b);
    m1[11] += outer(subgroupBroadcast(a, 11u), b);
    m1[12] += outer(subgroupBroadcast(a, 12u), b);
    m1[13] += outer(subgroupBroadcast(a, 13u), b);
    m1[14] += outer(subgroupBroadcast(a, 14u), b);
    m1[15] += outer(subgroupBroadcast(a, 15u), b);
}

// One k-step of sg16: invocation s holds A rows 4s .. 4s+3 in `a`.
fn kstep16(a: vec4<f32>, b0: vec4<f32>, b1: vec4<f32>) {
    var v = subgroupBroadcast(a, 0u); m[0] += outer(v, b0); m[1] += outer(v, b1);
    v = subgroupBroadcast(a, 1u); m[2] += outer(v, b0); m[3] += outer(v, b1);
    v = subgroupBroadcast(a, 2u); m[4] += outer(v, b0); m[5] += outer(v, b1);
    v = subgroupBroadcast(a, 3u); m[6] += outer(v, b0); m[7] += outer(v, b1);
    v = subgroupBroadcast(a, 4u); m[8] += outer(v, b0); m[9] += outer(v, b1);
    v = subgroupBroadcast(a, 5u); m[10] += outer(v, b0); m[11] += outer(v, b1);
    v = subgroupBroadcast(a, 6u); m[12] += outer(v, b0); m[13] += outer(v, b1);
    v = subgroupBroadcast(a, 7u); m[14] += outer(v, b0); m[15] += outer(v, b1);
    v = subgroupBroadcast(a, 8u); m[16] += outer(v, b0); m[17] += outer(v, b1);
    v = subgroupBroadcast(a, 9u); m[18] += outer(v, b0); m[19] += outer(v, b1);
    v = subgroupBroadcast(a, 10u); m[20] += outer(v, b0); m[21] += outer(v, b1);
    v = subgroupBroadcast(a, 11u); m[22] += outer(v, b0); m[23] += outer(v, b1);
    v = subgroupBroadcast(a, 12u); m[24] += outer(v, b0); m[25] += outer(v, b1);
    v = subgroupBroadcast(a, 13u); m[26] += outer(v, b0); m[27] += outer(v, b1);
    v = subgroupBroadcast(a, 14u); m[28] += outer(v, b0); m[29] += outer(v, b1);
    v = subgroupBroadcast(a, 15u); m[30] += outer(v, b0); m[31] += outer(v, b1);
}

// One k-step of sg8: invocation s holds A rows 8s .. 8s+3 in `a0` and 8s+4 .. 8s+7 in `a1`.
fn kstep8(a0: vec4<f32>, a1: vec4<f32>, b0: vec4<f32>, b1: vec4<f32>) {
    var v = subgroupBroadcast(a0, 0u); m[0] += outer(v, b0); m[1] += outer(v, b1);
    v = subgroupBroadcast(a1, 0u); m[2] += outer(v, b0); m[3] += outer(v, b1);
    v = subgroupBroadcast(a0, 1u); m[4] += outer(v, b0); m[5] += outer(v, b1);
    v = subgroupBroadcast(a1, 1u); m[6] += outer(v, b0); m[7] += outer(v, b1);
    v = subgroupBroadcast(a0, 2u); m[8] += outer(v, b0); m[9] += outer(v, b1);
    v = subgroupBroadcast(a1, 2u); m[10] += outer(v, b0); m[11] += outer(v, b1);
    v = subgroupBroadcast(a0, 3u); m[12] += outer(v, b0); m[13] += outer(v, b1);
    v = subgroupBroadcast(a1, 3u); m[14] += outer(v, b0); m[15] += outer(v, b1);
    v = subgroupBroadcast(a0, 4u); m[16] += outer(v, b0); m[17] += outer(v, b1);
    v = subgroupBroadcast(a1, 4u); m[18] += outer(v, b0); m[19] += outer(v, b1);
    v = subgroupBroadcast(a0, 5u); m[20] += outer(v, b0); m[21] += outer(v, b1);
    v = subgroupBroadcast(a1, 5u); m[22] += outer(v, b0); m[23] += outer(v, b1);
    v = subgroupBroadcast(a0, 6u); m[24] += outer(v, b0); m[25] += outer(v, b1);
    v = subgroupBroadcast(a1, 6u); m[26] += outer(v, b0); m[27] += outer(v, b1);
    v = subgroupBroadcast(a0, 7u); m[28] += outer(v, b0); m[29] += outer(v, b1);
    v = subgroupBroadcast(a1, 7u); m[30] += outer(v, b0); m[31] += outer(v, b1);
}

// Accumulates workgroup `tile` of batch item z into m; returns (row0, col0), or row0 >= M when idle.
// The loop runs in uniform control flow: `tile` is the same for the whole subgroup.
fn sg16_body(tile: u32, z: u32, lane: u32) -> vec2<u32> {
    let o = sg_tile(tile, z, 16u, 32u);
    if (o.x >= p.mp4) { return vec2(p.m, 0u); }
    let bx = o.y + 2u * lane;
    for (var kk = 0u; kk < p.kp; kk++) {
        let a = textureLoad(at, vec2(o.x + lane, o.z + kk));
        kstep16(a, textureLoad(bt, vec2(bx, o.w + kk)), textureLoad(bt, vec2(bx + 1u, o.w + kk)));
    }
    return vec2(o.x * 4u, bx * 4u);
}

fn sg8_body(tile: u32, z: u32, lane: u32) -> vec2<u32> {
    let o = sg_tile(tile, z, 16u, 16u);
    if (o.x >= p.mp4) { return vec2(p.m, 0u); }
    let ax = o.x + 2u * lane;
    let bx = o.y + 2u * lane;
    for (var kk = 0u; kk < p.kp; kk++) {
        let a0 = textureLoad(at, vec2(ax, o.z + kk));
        let a1 = textureLoad(at, vec2(ax + 1u, o.z + kk));
        kstep8(a0, a1, textureLoad(bt, vec2(bx, o.w + kk)), textureLoad(bt, vec2(bx + 1u, o.w + kk)));
    }
    return vec2(o.x * 4u, bx * 4u);
}

// The block in m to C. Unrolled: m is indexed with constants only.
fn store_all(cb: u32, r: u32, c: u32) {
    store_block(cb, r + 0u, c, m[0]); store_block(cb, r + 0u, c + 4u, m[1]);
    store_block(cb, r + 4u, c, m[2]); store_block(cb, r + 4u, c + 4u, m[3]);
    store_block(cb, r + 8u, c, m[4]); store_block(cb, r + 8u, c + 4u, m[5]);
    store_block(cb, r + 12u, c, m[6]); store_block(cb, r + 12u, c + 4u, m[7]);
    store_block(cb, r + 16u, c, m[8]); store_block(cb, r + 16u, c + 4u, m[9]);
    store_block(cb, r + 20u, c, m[10]); store_block(cb, r + 20u, c + 4u, m[11]);
    store_block(cb, r + 24u, c, m[12]); store_block(cb, r + 24u, c + 4u, m[13]);
    store_block(cb, r + 28u, c, m[14]); store_block(cb, r + 28u, c + 4u, m[15]);
    store_block(cb, r + 32u, c, m[16]); store_block(cb, r + 32u, c + 4u, m[17]);
    store_block(cb, r + 36u, c, m[18]); store_block(cb, r + 36u, c + 4u, m[19]);
    store_block(cb, r + 40u, c, m[20]); store_block(cb, r + 40u, c + 4u, m[21]);
    store_block(cb, r + 44u, c, m[22]); store_block(cb, r + 44u, c + 4u, m[23]);
    store_block(cb, r + 48u, c, m[24]); store_block(cb, r + 48u, c + 4u, m[25]);
    store_block(cb, r + 52u, c, m[26]); store_block(cb, r + 52u, c + 4u, m[27]);
    store_block(cb, r + 56u, c, m[28]); store_block(cb, r + 56u, c + 4u, m[29]);
    store_block(cb, r + 60u, c, m[30]); store_block(cb, r + 60u, c + 4u, m[31]);
}

fn store_all_v4(cb: u32, r: u32, c: u32) {
    store_block_v4(cb, r + 0u, c, m[0]); store_block_v4(cb, r + 0u, c + 4u, m[1]);
    store_block_v4(cb, r + 4u, c, m[2]); store_block_v4(cb, r + 4u, c + 4u, m[3]);
    store_block_v4(cb, r + 8u, c, m[4]); store_block_v4(cb, r + 8u, c + 4u, m[5]);
    store_block_v4(cb, r + 12u, c, m[6]); store_block_v4(cb, r + 12u, c + 4u, m[7]);
    store_block_v4(cb, r + 16u, c, m[8]); store_block_v4(cb, r + 16u, c + 4u, m[9]);
    store_block_v4(cb, r + 20u, c, m[10]); store_block_v4(cb, r + 20u, c + 4u, m[11]);
    store_block_v4(cb, r + 24u, c, m[12]); store_block_v4(cb, r + 24u, c + 4u, m[13]);
    store_block_v4(cb, r + 28u, c, m[14]); store_block_v4(cb, r + 28u, c + 4u, m[15]);
    store_block_v4(cb, r + 32u, c, m[16]); store_block_v4(cb, r + 32u, c + 4u, m[17]);
    store_block_v4(cb, r + 36u, c, m[18]); store_block_v4(cb, r + 36u, c + 4u, m[19]);
    store_block_v4(cb, r + 40u, c, m[20]); store_block_v4(cb, r + 40u, c + 4u, m[21]);
    store_block_v4(cb, r + 44u, c, m[22]); store_block_v4(cb, r + 44u, c + 4u, m[23]);
    store_block_v4(cb, r + 48u, c, m[24]); store_block_v4(cb, r + 48u, c + 4u, m[25]);
    store_block_v4(cb, r + 52u, c, m[26]); store_block_v4(cb, r + 52u, c + 4u, m[27]);
    store_block_v4(cb, r + 56u, c, m[28]); store_block_v4(cb, r + 56u, c + 4u, m[29]);
    store_block_v4(cb, r + 60u, c, m[30]); store_block_v4(cb, r + 60u, c + 4u, m[31]);
}

// One workgroup per 64-row block, folded into y past 65535 (grid_1d); z is the batch item.
fn tile_of(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.x + wg.y * nwg.x;
}

@compute @workgroup_size(16)
fn sg16(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32) {
    let rc = sg16_body(tile_of(wg, nwg), wg.z, lane);
    if (rc.x < p.m) { store_all(wg.z * p.stride_c, rc.x, rc.y); }
}

@compute @workgroup_size(16)
fn sg16_v4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(subgroup_invocation_id) lane: u32) {
    let rc = sg16_body(tile_of(wg, nwg), wg.z, lane);
    if (rc.x < p.m) { store_all_v4(wg.z * p.stride_c, rc.x, rc.y); }
}

@compute @workgroup_size(8)
fn sg8(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(subgroup_invocation_id) lane: u32) {
    let rc = sg8_body(tile_of(wg, nwg), wg.z, lane);
    if (rc.x < p.m) { store_all(wg.z * p.stride_c, rc.x, rc.y); }
}

@compute @workgroup_size(8)
fn sg8_v4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(subgroup_invocation_id) lane: u32) {
    let rc = sg8_body(tile_of(wg, nwg), wg.z, lane);
    if (rc.x < p.m) { store_all_v4(wg.z * p.stride_c, rc.x, rc.y); }
}

// Accumulates sg1's block `tile` of batch item z into m1; returns (row0, this invocation's col0), or
// row0 >= M when idle. Uniform control flow as in sg16_body.
fn sg1_body(tile: u32, z: u32, lane: u32, lanes: u32) -> vec2<u32> {
    let o = sg_tile(tile, z, lanes, lanes);
    if (o.x >= p.mp4) { return vec2(p.m, 0u); }
    let bx = o.y + lane;
    for (var kk = 0u; kk < p.kp; kk++) {
        let a = textureLoad(at, vec2(o.x + lane, o.z + kk));
        let b = textureLoad(bt, vec2(bx, o.w + kk));
        if (lanes == 8u) { kstep1_8(a, b); } else { kstep1_16(a, b); }
    }
    return vec2(o.x * 4u, bx * 4u);
}

// sg1_body where `Params::flags` marks A, B or both k-major (K is a multiple of 64 then): a uniform
// branch per operand and k-step. Entry points of its own: in sg1's, this loop beside the other cost
// that one 10% at n = 1024.
fn sg1k_body(tile: u32, z: u32, lane: u32, lanes: u32) -> vec2<u32> {
    let o = sg_tile(tile, z, lanes, lanes);
    if (o.x >= p.mp4) { return vec2(p.m, 0u); }
    let bx = o.y + lane;
    let ra = select(z, 0u, p.stride_a == 0u) * p.mp4 * 4u + (o.x + lane) * 4u;
    let rb = select(z, 0u, p.stride_b == 0u) * p.np4 * 4u + bx * 4u;
    let a_k = (p.flags & A_K_MAJOR) != 0u;
    let b_k = (p.flags & B_K_MAJOR) != 0u;
    for (var kk = 0u; kk < p.kp; kk++) {
        var a: vec4<f32>;
        var b: vec4<f32>;
        if (a_k) { a = a_k_major(kk, ra); } else { a = textureLoad(at, vec2(o.x + lane, o.z + kk)); }
        if (b_k) { b = b_k_major(kk, rb); } else { b = textureLoad(bt, vec2(bx, o.w + kk)); }
        if (lanes == 8u) { kstep1_8(a, b); } else { kstep1_16(a, b); }
    }
    return vec2(o.x * 4u, bx * 4u);
}

// sg1's block in m1 to C (the first `lanes` entries); unrolled: m1 is indexed with constants only.
fn store1(cb: u32, r: u32, c: u32, lanes: u32) {
    store_block(cb, r + 0u, c, m1[0]);
    store_block(cb, r + 4u, c, m1[1]);
    store_block(cb, r + 8u, c, m1[2]);
    store_block(cb, r + 12u, c, m1[3]);
    store_block(cb, r + 16u, c, m1[4]);
    store_block(cb, r + 20u, c, m1[5]);
    store_block(cb, r + 24u, c, m1[6]);
    store_block(cb, r + 28u, c, m1[7]);
    if (lanes == 8u) { return; }
    store_block(cb, r + 32u, c, m1[8]);
    store_block(cb, r + 36u, c, m1[9]);
    store_block(cb, r + 40u, c, m1[10]);
    store_block(cb, r + 44u, c, m1[11]);
    store_block(cb, r + 48u, c, m1[12]);
    store_block(cb, r + 52u, c, m1[13]);
    store_block(cb, r + 56u, c, m1[14]);
    store_block(cb, r + 60u, c, m1[15]);
}

fn store1_v4(cb: u32, r: u32, c: u32, lanes: u32) {
    store_block_v4(cb, r + 0u, c, m1[0]);
    store_block_v4(cb, r + 4u, c, m1[1]);
    store_block_v4(cb, r + 8u, c, m1[2]);
    store_block_v4(cb, r + 12u, c, m1[3]);
    store_block_v4(cb, r + 16u, c, m1[4]);
    store_block_v4(cb, r + 20u, c, m1[5]);
    store_block_v4(cb, r + 24u, c, m1[6]);
    store_block_v4(cb, r + 28u, c, m1[7]);
    if (lanes == 8u) { return; }
    store_block_v4(cb, r + 32u, c, m1[8]);
    store_block_v4(cb, r + 36u, c, m1[9]);
    store_block_v4(cb, r + 40u, c, m1[10]);
    store_block_v4(cb, r + 44u, c, m1[11]);
    store_block_v4(cb, r + 48u, c, m1[12]);
    store_block_v4(cb, r + 52u, c, m1[13]);
    store_block_v4(cb, r + 56u, c, m1[14]);
    store_block_v4(cb, r + 60u, c, m1[15]);
}

@compute @workgroup_size(8)
fn sg1_8(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32) {
    let rc = sg1_body(tile_of(wg, nwg), wg.z, lane, 8u);
    if (rc.x < p.m) { store1(wg.z * p.stride_c, rc.x, rc.y, 8u); }
}

@compute @workgroup_size(8)
fn sg1_8_v4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32) {
    let rc = sg1_body(tile_of(wg, nwg), wg.z, lane, 8u);
    if (rc.x < p.m) { store1_v4(wg.z * p.stride_c, rc.x, rc.y, 8u); }
}

@compute @workgroup_size(16)
fn sg1_16(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32) {
    let rc = sg1_body(tile_of(wg, nwg), wg.z, lane, 16u);
    if (rc.x < p.m) { store1(wg.z * p.stride_c, rc.x, rc.y, 16u); }
}

@compute @workgroup_size(16)
fn sg1_16_v4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32) {
    let rc = sg1_body(tile_of(wg, nwg), wg.z, lane, 16u);
    if (rc.x < p.m) { store1_v4(wg.z * p.stride_c, rc.x, rc.y, 16u); }
}

@compute @workgroup_size(8)
fn sg1k_8(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32) {
    let rc = sg1k_body(tile_of(wg, nwg), wg.z, lane, 8u);
    if (rc.x < p.m) { store1(wg.z * p.stride_c, rc.x, rc.y, 8u); }
}

@compute @workgroup_size(8)
fn sg1k_8_v4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32) {
    let rc = sg1k_body(tile_of(wg, nwg), wg.z, lane, 8u);
    if (rc.x < p.m) { store1_v4(wg.z * p.stride_c, rc.x, rc.y, 8u); }
}

@compute @workgroup_size(16)
fn sg1k_16(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32) {
    let rc = sg1k_body(tile_of(wg, nwg), wg.z, lane, 16u);
    if (rc.x < p.m) { store1(wg.z * p.stride_c, rc.x, rc.y, 16u); }
}

@compute @workgroup_size(16)
fn sg1k_16_v4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32) {
    let rc = sg1k_body(tile_of(wg, nwg), wg.z, lane, 16u);
    if (rc.x < p.m) { store1_v4(wg.z * p.stride_c, rc.x, rc.y, 16u); }
}
