// Matmul through read-only rgba32float storage textures: C = alpha * op(A) @ op(B) (+ bias) (+ C), batched.
// A separate file from matmul.wgsl because some WebGPU implementations lack read-only storage textures: a
// module that fails there must not take the other variants down with it.
//   pack   op(A) (as A^T) and op(B) into their textures in one launch, batch items stacked in y: texel
//          (x, z * Kp + k) = X[4x .. 4x+3, k] of batch item z, zero past the matrix (M, N padded to 16).
//          One plain 2D texture per operand, never an array: lavapipe compiles a shader per texture
//          target it meets. An operand loads by value, or as vec4s where its rows are contiguous, or
//          not at all (copied into its texture instead).
//   tex16  one 16x16 block of C per invocation, no workgroup memory, no barriers. On lavapipe a texel load is
//          inline while a storage-buffer load is a per-lane loop with bounds checks, so this is the fastest
//          there (see shared/notes/lavapipe-kernels.md); on GPUs its 64 accumulators per invocation cost
//          occupancy, and the autotuner decides.
// Entry points ending in `_v4` store C as vec4 (N and stride_c multiples of 4). Composed after
// matmul_out.wgsl: Params, C, the bias and the stores.

struct Pack {
    rows: u32,   // M of A, or N of B
    k: u32,
    rows4: u32,  // texels per k-row
    kp: u32,     // k-rows per batch item
    sr: u32,     // element strides of X[r, k] in the source
    sk: u32,
    stride: u32, // source elements between batch items
    mode: u32,   // 0: not packed here; 1: by value; 2: as vec4s (pack_k4 below)
}

// Both operands' packs: A's on the first `groups_a` workgroups, B's on the rest; z is the batch item.
struct Packs {
    a: Pack,
    b: Pack,
    groups_a: u32,
    items_a: u32, // batch items packed (1 for a broadcast operand)
    items_b: u32,
    pad: u32,
}

@group(0) @binding(0) var<storage, read> src_a: array<f32>;
@group(0) @binding(10) var<storage, read> src_a4: array<vec4<f32>>; // the same buffer, as vec4
@group(0) @binding(11) var<storage, read> src_b: array<f32>;
@group(0) @binding(12) var<storage, read> src_b4: array<vec4<f32>>;
@group(0) @binding(5) var<uniform> pk: Packs;
@group(0) @binding(6) var packed_a: texture_storage_2d<rgba32float, write>;
@group(0) @binding(13) var packed_b: texture_storage_2d<rgba32float, write>;
@group(0) @binding(7) var at: texture_storage_2d<rgba32float, read>; // texel (x, z * Kp + k) = A[4x .. 4x+3, k]
@group(0) @binding(8) var bt: texture_storage_2d<rgba32float, read>; // texel (x, z * Kp + k) = B[k, 4x .. 4x+3]

// ---- pack ----

// Element i of operand b's source (b: B, else A), as f32 or as the vec4 holding 4i .. 4i+3.
fn load(b: bool, i: u32) -> f32 {
    if (b) { return src_b[i]; }
    return src_a[i];
}

fn load4(b: bool, i: u32) -> vec4<f32> {
    if (b) { return src_b4[i]; }
    return src_a4[i];
}

fn put(b: bool, x: u32, y: u32, v: vec4<f32>) {
    if (b) {
        textureStore(packed_b, vec2(x, y), v);
    } else {
        textureStore(packed_a, vec2(x, y), v);
    }
}

fn pack_value(q: Pack, b: bool, base: u32, r: u32, kk: u32) -> f32 {
    if (r >= q.rows || kk >= q.k) { return 0.0; }
    return load(b, base + r * q.sr + kk * q.sk);
}

// Texel `id` of batch item z, from four loads.
fn pack_by_value(q: Pack, b: bool, id: u32, z: u32) {
    if (id >= q.rows4 * q.kp) { return; }
    let kk = id / q.rows4;
    let x = id % q.rows4;
    let r = x * 4u;
    let base = z * q.stride;
    let v = vec4(pack_value(q, b, base, r, kk), pack_value(q, b, base, r + 1u, kk),
                 pack_value(q, b, base, r + 2u, kk), pack_value(q, b, base, r + 3u, kk));
    put(b, x, z * q.kp + kk, v);
}

// On lavapipe every storage-buffer load is a per-lane loop with bounds checks, and a transposing
// pack's scalar loads are strided, so pack_k4 loads whole vec4s: a quarter of the loads, the same
// values. (Where a texel's four values are already contiguous the scalar loads cost no more: the
// texture stores dominate there, about 13 ns a texel on lavapipe.)

// X[r, kk .. kk+3] as one vec4 (zero past the rows).
fn row4(q: Pack, b: bool, base: u32, r: u32, kk: u32) -> vec4<f32> {
    if (r >= q.rows) { return vec4(0.0); }
    return load4(b, (base + r * q.sr + kk) / 4u);
}

// pack_k4: a row's values X[r, kk .. kk+3] lie side by side in the source (sk = 1; sr, the batch
// stride and the binding's offset multiples of 4; K = Kp a multiple of 4): each invocation loads a
// 4x4 block as four vec4s and stores it transposed as four texels. Neighbouring invocations take
// neighbouring k, so their loads are contiguous.
fn pack_k4(q: Pack, b: bool, id: u32, z: u32) {
    let kq = q.kp / 4u;
    if (id >= q.rows4 * kq) { return; }
    let kk = (id % kq) * 4u;
    let x = id / kq;
    let r = x * 4u;
    let base = z * q.stride;
    let x0 = row4(q, b, base, r, kk);
    let x1 = row4(q, b, base, r + 1u, kk);
    let x2 = row4(q, b, base, r + 2u, kk);
    let x3 = row4(q, b, base, r + 3u, kk);
    let y = z * q.kp + kk;
    put(b, x, y, vec4(x0.x, x1.x, x2.x, x3.x));
    put(b, x, y + 1u, vec4(x0.y, x1.y, x2.y, x3.y));
    put(b, x, y + 2u, vec4(x0.z, x1.z, x2.z, x3.z));
    put(b, x, y + 3u, vec4(x0.w, x1.w, x2.w, x3.w));
}

// One launch for both operands, so a matmul pays one pack pass at most.
@compute @workgroup_size(64)
fn pack(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = wid.x + wid.y * nwg.x;
    let b = w >= pk.groups_a;
    var q = pk.a;
    var items = pk.items_a;
    var first = 0u;
    if (b) {
        q = pk.b;
        items = pk.items_b;
        first = pk.groups_a;
    }
    if (wid.z >= items) { return; }
    let id = (w - first) * 64u + lid.x;
    if (q.mode == 1u) {
        pack_by_value(q, b, id, wid.z);
    } else if (q.mode == 2u) {
        pack_k4(q, b, id, wid.z);
    }
}

// ---- tex16 ----

// m[4 i + j][r] = C[row0 + 4 i + r, col0 + 4 j .. +3]; indexed with constants only, so it stays in registers.
var<private> m: array<mat4x4<f32>, 16>;


fn kstep(r4: u32, c4: u32, ka: u32, kb: u32) {
    let a0 = textureLoad(at, vec2(r4, ka));
    let a1 = textureLoad(at, vec2(r4 + 1u, ka));
    let a2 = textureLoad(at, vec2(r4 + 2u, ka));
    let a3 = textureLoad(at, vec2(r4 + 3u, ka));
    let b0 = textureLoad(bt, vec2(c4, kb));
    let b1 = textureLoad(bt, vec2(c4 + 1u, kb));
    let b2 = textureLoad(bt, vec2(c4 + 2u, kb));
    let b3 = textureLoad(bt, vec2(c4 + 3u, kb));
    m[0] += outer(a0, b0); m[1] += outer(a0, b1); m[2] += outer(a0, b2); m[3] += outer(a0, b3);
    m[4] += outer(a1, b0); m[5] += outer(a1, b1); m[6] += outer(a1, b2); m[7] += outer(a1, b3);
    m[8] += outer(a2, b0); m[9] += outer(a2, b1); m[10] += outer(a2, b2); m[11] += outer(a2, b3);
    m[12] += outer(a3, b0); m[13] += outer(a3, b1); m[14] += outer(a3, b2); m[15] += outer(a3, b3);
}

// Accumulates the block of invocation `id` of batch item z; returns (row0, col0), or row0 = M when idle.
// Adjacent invocations take adjacent column blocks, so they share the A texels.
fn tex16_body(id: u32, z: u32) -> vec2<u32> {
    let nbc = p.np4 / 4u;
    if (id >= (p.mp4 / 4u) * nbc) { return vec2(p.m, 0u); }
    let r4 = id / nbc * 4u;
    let c4 = id % nbc * 4u;
    let ka = select(z, 0u, p.stride_a == 0u) * p.kp; // first texel row of this item's A^T and B
    let kb = select(z, 0u, p.stride_b == 0u) * p.kp;
    // One k-step per iteration: on lavapipe (LLVM 15) a body of two k-steps keeps twice the texels live
    // beside the 64 accumulators and runs about half as fast.
    for (var kk = 0u; kk < p.kp; kk++) {
        kstep(r4, c4, ka + kk, kb + kk);
    }
    return vec2(r4 * 4u, c4 * 4u);
}

@compute @workgroup_size(64)
fn tex16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let rc = tex16_body(gid.x + gid.y * nwg.x * 64u, gid.z);
    if (rc.x >= p.m) { return; }
    let cb = gid.z * p.stride_c;
    // Unrolled: m is indexed with constants only.
    store_block(cb, rc.x, rc.y, m[0]); store_block(cb, rc.x, rc.y + 4u, m[1]);
    store_block(cb, rc.x, rc.y + 8u, m[2]); store_block(cb, rc.x, rc.y + 12u, m[3]);
    store_block(cb, rc.x + 4u, rc.y, m[4]); store_block(cb, rc.x + 4u, rc.y + 4u, m[5]);
    store_block(cb, rc.x + 4u, rc.y + 8u, m[6]); store_block(cb, rc.x + 4u, rc.y + 12u, m[7]);
    store_block(cb, rc.x + 8u, rc.y, m[8]); store_block(cb, rc.x + 8u, rc.y + 4u, m[9]);
    store_block(cb, rc.x + 8u, rc.y + 8u, m[10]); store_block(cb, rc.x + 8u, rc.y + 12u, m[11]);
    store_block(cb, rc.x + 12u, rc.y, m[12]); store_block(cb, rc.x + 12u, rc.y + 4u, m[13]);
    store_block(cb, rc.x + 12u, rc.y + 8u, m[14]); store_block(cb, rc.x + 12u, rc.y + 12u, m[15]);
}

@compute @workgroup_size(64)
fn tex16_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let rc = tex16_body(gid.x + gid.y * nwg.x * 64u, gid.z);
    if (rc.x >= p.m) { return; }
    let cb = gid.z * p.stride_c;
    // Unrolled: m is indexed with constants only.
    store_block_v4(cb, rc.x, rc.y, m[0]); store_block_v4(cb, rc.x, rc.y + 4u, m[1]);
    store_block_v4(cb, rc.x, rc.y + 8u, m[2]); store_block_v4(cb, rc.x, rc.y + 12u, m[3]);
    store_block_v4(cb, rc.x + 4u, rc.y, m[4]); store_block_v4(cb, rc.x + 4u, rc.y + 4u, m[5]);
    store_block_v4(cb, rc.x + 4u, rc.y + 8u, m[6]); store_block_v4(cb, rc.x + 4u, rc.y + 12u, m[7]);
    store_block_v4(cb, rc.x + 8u, rc.y, m[8]); store_block_v4(cb, rc.x + 8u, rc.y + 4u, m[9]);
    store_block_v4(cb, rc.x + 8u, rc.y + 8u, m[10]); store_block_v4(cb, rc.x + 8u, rc.y + 12u, m[11]);
    store_block_v4(cb, rc.x + 12u, rc.y, m[12]); store_block_v4(cb, rc.x + 12u, rc.y + 4u, m[13]);
    store_block_v4(cb, rc.x + 12u, rc.y + 8u, m[14]); store_block_v4(cb, rc.x + 12u, rc.y + 12u, m[15]);
}
