// Matmul on storage buffers: C = alpha * op(A) @ op(B) (+ bias) (+ C), batched.
// op(A)[i, k] = a[stride_a * z + i * a_si + k * a_sk] and op(B)[k, j] = b[stride_b * z + k * b_sk + j * b_sj]:
// the element strides cover A and A^T (and B, B^T) alike; a batch stride of 0 broadcasts one matrix.
// Variants (kernels/matmul times them per adapter and shape class and keeps the fastest):
//   naive   one output per invocation, A and B read in place: the baseline, any shape
//   tiled   64x64 tile per workgroup staged in workgroup memory, 4x4 outputs per invocation: the classic GPU kernel
//   block8  8x8 outputs per invocation from operands that `pack` copied into zero-padded (K, M) and (K, N)
//           vec4 rows: no bounds checks in the inner loop, no workgroup memory (fast where loads are costly)
//   block16 the same with 16x16 outputs: 256 multiply-adds per 8 vec4 loads where block8 does 64 per 4
//           (SwiftShader gathers every load lane by lane and spills either's accumulators)
// Entry points ending in `_v4` store C as vec4 (N and stride_c multiples of 4).
// Binding numbers are unique in the file (each entry point binds a subset; pipelines use auto layout).

struct Params {
    m: u32,
    n: u32,
    k: u32,
    flags: u32,    // 1: add the old C (accumulate), 2: add the bias (bias[j] of C's item)
    a_si: u32,     // element strides of op(A)[i, k]
    a_sk: u32,
    b_sk: u32,     // element strides of op(B)[k, j]
    b_sj: u32,
    stride_a: u32, // elements between batch items (0: broadcast)
    stride_b: u32,
    stride_c: u32,
    alpha: f32,
    mp4: u32,      // packed operands (block8, block16): vec4s per k-row of A^T (M padded / 4) and of B (N padded / 4)
    np4: u32,
    kp: u32,       // packed k-rows per batch item (K padded)
    stride_bias: u32, // elements between batch items' biases (0: one bias for all)
}

// `pack`: packed[z, k, r4] = vec4(X[4 r4 + q, k] for q in 0..4), zero past rows or k.
struct Pack {
    rows: u32,   // M of A, or N of B
    k: u32,
    rows4: u32,  // vec4s per packed k-row
    kp: u32,     // packed k-rows per batch item
    sr: u32,     // element strides of X[r, k] in the source
    sk: u32,
    stride: u32, // source elements between batch items
    pad: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;      // (batch, M, K) or (batch, K, M); also pack's source
@group(0) @binding(1) var<storage, read> b: array<f32>;      // (batch, K, N) or (batch, N, K)
@group(0) @binding(2) var<storage, read> bias: array<f32>;   // (N), or one per batch item
@group(0) @binding(3) var<storage, read_write> c: array<f32>; // (batch, M, N)
@group(0) @binding(4) var<uniform> p: Params;
@group(0) @binding(5) var<uniform> pk: Pack;
@group(0) @binding(6) var<storage, read_write> packed: array<vec4<f32>>; // pack's output
@group(0) @binding(7) var<storage, read> pa: array<vec4<f32>>;  // (items, Kp, Mp/4): A^T packed
@group(0) @binding(8) var<storage, read> pb: array<vec4<f32>>;  // (items, Kp, Np/4): B packed
@group(0) @binding(9) var<storage, read_write> c4: array<vec4<f32>>; // C as vec4 (the `_v4` entry points)
@group(0) @binding(10) var<storage, read> src4: array<vec4<f32>>; // pack_k4's source, as vec4

// ---- epilogue: alpha, bias, accumulate, bounds ----

// Where the bias of the batch item holding C element `idx` starts.
fn bias_base(idx: u32) -> u32 {
    if (p.stride_bias == 0u) { return 0u; }
    return idx / p.stride_c * p.stride_bias;
}

fn finish(x: f32, col: u32, idx: u32) -> f32 {
    var y = p.alpha * x;
    if ((p.flags & 2u) != 0u) { y += bias[bias_base(idx) + col]; }
    if ((p.flags & 1u) != 0u) { y += c[idx]; }
    return y;
}

// C[z, row, col .. col+3] from v, skipping what lies outside (M, N).
fn store4(cb: u32, row: u32, col: u32, v: vec4<f32>) {
    if (row >= p.m) { return; }
    let i = cb + row * p.n + col;
    if (col < p.n) { c[i] = finish(v.x, col, i); }
    if (col + 1u < p.n) { c[i + 1u] = finish(v.y, col + 1u, i + 1u); }
    if (col + 2u < p.n) { c[i + 2u] = finish(v.z, col + 2u, i + 2u); }
    if (col + 3u < p.n) { c[i + 3u] = finish(v.w, col + 3u, i + 3u); }
}

// As store4, as one vec4 store: N, stride_c and col are multiples of 4.
fn store4_v4(cb: u32, row: u32, col: u32, v: vec4<f32>) {
    if (row >= p.m || col >= p.n) { return; }
    let i = (cb + row * p.n + col) / 4u;
    var y = p.alpha * v;
    if ((p.flags & 2u) != 0u) {
        let bb = bias_base(cb) + col;
        y += vec4(bias[bb], bias[bb + 1u], bias[bb + 2u], bias[bb + 3u]);
    }
    if ((p.flags & 1u) != 0u) { y += c4[i]; }
    c4[i] = y;
}

// Rows r .. r+3, columns cl .. cl+3 of C from m (store4 per row).
fn rows4(cb: u32, r: u32, cl: u32, m: mat4x4<f32>) {
    store4(cb, r, cl, m[0]); store4(cb, r + 1u, cl, m[1]); store4(cb, r + 2u, cl, m[2]); store4(cb, r + 3u, cl, m[3]);
}

fn rows4_v4(cb: u32, r: u32, cl: u32, m: mat4x4<f32>) {
    store4_v4(cb, r, cl, m[0]); store4_v4(cb, r + 1u, cl, m[1]);
    store4_v4(cb, r + 2u, cl, m[2]); store4_v4(cb, r + 3u, cl, m[3]);
}

// ---- naive ----

@compute @workgroup_size(16, 16)
fn naive(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let i = gid.y;
    let z = gid.z;
    if (i >= p.m || j >= p.n) { return; }
    var ia = z * p.stride_a + i * p.a_si;
    var ib = z * p.stride_b + j * p.b_sj;
    var acc = 0.0;
    for (var kk = 0u; kk < p.k; kk++) {
        acc += a[ia] * b[ib];
        ia += p.a_sk;
        ib += p.b_sk;
    }
    let idx = z * p.stride_c + i * p.n + j;
    c[idx] = finish(acc, j, idx);
}

// ---- tiled: 64x64 per workgroup of 16x16, K in steps of 16 through workgroup memory ----

var<workgroup> tile_a: array<vec4<f32>, 256>; // [kk * 16 + r4] = A[row0 + 4 r4 .. +3, k0 + kk]
var<workgroup> tile_b: array<vec4<f32>, 256>; // [kk * 16 + c4] = B[k0 + kk, col0 + 4 c4 .. +3]

fn load_a(base: u32, i: u32, kk: u32) -> f32 {
    if (i < p.m && kk < p.k) { return a[base + i * p.a_si + kk * p.a_sk]; }
    return 0.0;
}

fn load_b(base: u32, kk: u32, j: u32) -> f32 {
    if (kk < p.k && j < p.n) { return b[base + kk * p.b_sk + j * p.b_sj]; }
    return 0.0;
}

@compute @workgroup_size(16, 16)
fn tiled(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = lid.y * 16u + lid.x;
    let row0 = wid.y * 64u;
    let col0 = wid.x * 64u;
    let z = wid.z;
    let abase = z * p.stride_a;
    let bbase = z * p.stride_b;
    let lk = t / 16u;        // this invocation loads k-row lk of both tiles,
    let l4 = (t % 16u) * 4u; // rows (of A) or columns (of B) l4 .. l4+3
    var acc0 = vec4(0.0);
    var acc1 = vec4(0.0);
    var acc2 = vec4(0.0);
    var acc3 = vec4(0.0);
    for (var k0 = 0u; k0 < p.k; k0 += 16u) {
        let ka = k0 + lk;
        let r = row0 + l4;
        tile_a[t] = vec4(load_a(abase, r, ka), load_a(abase, r + 1u, ka), load_a(abase, r + 2u, ka),
                         load_a(abase, r + 3u, ka));
        let cl = col0 + l4;
        tile_b[t] = vec4(load_b(bbase, ka, cl), load_b(bbase, ka, cl + 1u), load_b(bbase, ka, cl + 2u),
                         load_b(bbase, ka, cl + 3u));
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk++) {
            let av = tile_a[kk * 16u + lid.y];
            let bv = tile_b[kk * 16u + lid.x];
            acc0 += av.x * bv;
            acc1 += av.y * bv;
            acc2 += av.z * bv;
            acc3 += av.w * bv;
        }
        workgroupBarrier();
    }
    let row = row0 + lid.y * 4u;
    let col = col0 + lid.x * 4u;
    let cb = z * p.stride_c;
    store4(cb, row, col, acc0);
    store4(cb, row + 1u, col, acc1);
    store4(cb, row + 2u, col, acc2);
    store4(cb, row + 3u, col, acc3);
}

// ---- pack: an operand into zero-padded vec4 k-rows (for block8 and block16) ----

fn pack_value(base: u32, r: u32, kk: u32) -> f32 {
    if (r >= pk.rows || kk >= pk.k) { return 0.0; }
    return a[base + r * pk.sr + kk * pk.sk];
}

@compute @workgroup_size(64)
fn pack(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.x + gid.y * nwg.x * 64u;
    let per_item = pk.rows4 * pk.kp;
    if (id >= per_item) { return; }
    let kk = id / pk.rows4;
    let r = (id % pk.rows4) * 4u;
    let base = gid.z * pk.stride;
    packed[gid.z * per_item + id] = vec4(pack_value(base, r, kk), pack_value(base, r + 1u, kk),
                                          pack_value(base, r + 2u, kk), pack_value(base, r + 3u, kk));
}

// X[r, kk .. kk+3] as one vec4 (zero past the rows).
fn row4(base: u32, r: u32, kk: u32) -> vec4<f32> {
    if (r >= pk.rows) { return vec4(0.0); }
    return src4[(base + r * pk.sr + kk) / 4u];
}

// pack_k4: `pack` where a row's values X[r, kk .. kk+3] lie side by side in the source (sk = 1; sr,
// the batch stride and the binding's offset multiples of 4; K = Kp a multiple of 4): a 4x4 block
// per invocation from four vec4 loads, stored transposed, instead of sixteen strided scalar loads.
@compute @workgroup_size(64)
fn pack_k4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.x + gid.y * nwg.x * 64u;
    let kq = pk.kp / 4u;
    if (id >= pk.rows4 * kq) { return; }
    let kk = (id % kq) * 4u;
    let x = id / kq;
    let r = x * 4u;
    let base = gid.z * pk.stride;
    let x0 = row4(base, r, kk);
    let x1 = row4(base, r + 1u, kk);
    let x2 = row4(base, r + 2u, kk);
    let x3 = row4(base, r + 3u, kk);
    let out = gid.z * pk.rows4 * pk.kp + kk * pk.rows4 + x;
    packed[out] = vec4(x0.x, x1.x, x2.x, x3.x);
    packed[out + pk.rows4] = vec4(x0.y, x1.y, x2.y, x3.y);
    packed[out + 2u * pk.rows4] = vec4(x0.z, x1.z, x2.z, x3.z);
    packed[out + 3u * pk.rows4] = vec4(x0.w, x1.w, x2.w, x3.w);
}

// ---- block8: one 8x8 block of C per invocation; adjacent invocations take adjacent column blocks ----

// acc[2 i + j][r] = C[row0 + 4 i + r, col0 + 4 j .. +3]; indexed with constants only, so it stays in registers.
var<private> acc: array<mat4x4<f32>, 4>;

fn outer(x: vec4<f32>, y: vec4<f32>) -> mat4x4<f32> {
    return mat4x4(y * x.x, y * x.y, y * x.z, y * x.w);
}

fn block8_k(ia: u32, ib: u32) {
    let a0 = pa[ia];
    let a1 = pa[ia + 1u];
    let b0 = pb[ib];
    let b1 = pb[ib + 1u];
    acc[0] += outer(a0, b0);
    acc[1] += outer(a0, b1);
    acc[2] += outer(a1, b0);
    acc[3] += outer(a1, b1);
}

// Accumulates the block of invocation `id` of batch item z; returns (row0, col0), or row0 = M when idle.
fn block8_body(id: u32, z: u32) -> vec2<u32> {
    let nbc = p.np4 / 2u;
    if (id >= (p.mp4 / 2u) * nbc) { return vec2(p.m, 0u); }
    let r4 = id / nbc * 2u;
    let c4 = id % nbc * 2u;
    var ia = select(z, 0u, p.stride_a == 0u) * p.kp * p.mp4 + r4;
    var ib = select(z, 0u, p.stride_b == 0u) * p.kp * p.np4 + c4;
    // kp is a multiple of 4: unrolled by hand (a loop bound by naga would not be unrolled by the driver).
    for (var kk = 0u; kk < p.kp; kk += 4u) {
        block8_k(ia, ib);
        block8_k(ia + p.mp4, ib + p.np4);
        block8_k(ia + 2u * p.mp4, ib + 2u * p.np4);
        block8_k(ia + 3u * p.mp4, ib + 3u * p.np4);
        ia += 4u * p.mp4;
        ib += 4u * p.np4;
    }
    return vec2(r4 * 4u, c4 * 4u);
}

@compute @workgroup_size(64)
fn block8(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let rc = block8_body(gid.x + gid.y * nwg.x * 64u, gid.z);
    if (rc.x >= p.m) { return; }
    let cb = gid.z * p.stride_c;
    let r = rc.x;
    let cl = rc.y;
    rows4(cb, r, cl, acc[0]); rows4(cb, r, cl + 4u, acc[1]);
    rows4(cb, r + 4u, cl, acc[2]); rows4(cb, r + 4u, cl + 4u, acc[3]);
}

@compute @workgroup_size(64)
fn block8_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let rc = block8_body(gid.x + gid.y * nwg.x * 64u, gid.z);
    if (rc.x >= p.m) { return; }
    let cb = gid.z * p.stride_c;
    let r = rc.x;
    let cl = rc.y;
    rows4_v4(cb, r, cl, acc[0]); rows4_v4(cb, r, cl + 4u, acc[1]);
    rows4_v4(cb, r + 4u, cl, acc[2]); rows4_v4(cb, r + 4u, cl + 4u, acc[3]);
}

// ---- block16: one 16x16 block of C per invocation, block8's layout and order ----

// acc16[4 i + j][r] = C[row0 + 4 i + r, col0 + 4 j .. +3]; indexed with constants only.
var<private> acc16: array<mat4x4<f32>, 16>;

fn block16_k(ia: u32, ib: u32) {
    let a0 = pa[ia];
    let a1 = pa[ia + 1u];
    let a2 = pa[ia + 2u];
    let a3 = pa[ia + 3u];
    let b0 = pb[ib];
    let b1 = pb[ib + 1u];
    let b2 = pb[ib + 2u];
    let b3 = pb[ib + 3u];
    acc16[0] += outer(a0, b0); acc16[1] += outer(a0, b1); acc16[2] += outer(a0, b2); acc16[3] += outer(a0, b3);
    acc16[4] += outer(a1, b0); acc16[5] += outer(a1, b1); acc16[6] += outer(a1, b2); acc16[7] += outer(a1, b3);
    acc16[8] += outer(a2, b0); acc16[9] += outer(a2, b1); acc16[10] += outer(a2, b2); acc16[11] += outer(a2, b3);
    acc16[12] += outer(a3, b0); acc16[13] += outer(a3, b1); acc16[14] += outer(a3, b2); acc16[15] += outer(a3, b3);
}

// Accumulates the block of invocation `id` of batch item z; returns (row0, col0), or row0 = M when idle.
fn block16_body(id: u32, z: u32) -> vec2<u32> {
    let nbc = p.np4 / 4u;
    if (id >= (p.mp4 / 4u) * nbc) { return vec2(p.m, 0u); }
    let r4 = id / nbc * 4u;
    let c4 = id % nbc * 4u;
    var ia = select(z, 0u, p.stride_a == 0u) * p.kp * p.mp4 + r4;
    var ib = select(z, 0u, p.stride_b == 0u) * p.kp * p.np4 + c4;
    // kp is a multiple of 4: two k-steps a turn.
    for (var kk = 0u; kk < p.kp; kk += 2u) {
        block16_k(ia, ib);
        block16_k(ia + p.mp4, ib + p.np4);
        ia += 2u * p.mp4;
        ib += 2u * p.np4;
    }
    return vec2(r4 * 4u, c4 * 4u);
}

@compute @workgroup_size(64)
fn block16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let rc = block16_body(gid.x + gid.y * nwg.x * 64u, gid.z);
    if (rc.x >= p.m) { return; }
    let cb = gid.z * p.stride_c;
    let r = rc.x;
    let cl = rc.y;
    rows4(cb, r, cl, acc16[0]); rows4(cb, r, cl + 4u, acc16[1]);
    rows4(cb, r, cl + 8u, acc16[2]); rows4(cb, r, cl + 12u, acc16[3]);
    rows4(cb, r + 4u, cl, acc16[4]); rows4(cb, r + 4u, cl + 4u, acc16[5]);
    rows4(cb, r + 4u, cl + 8u, acc16[6]); rows4(cb, r + 4u, cl + 12u, acc16[7]);
    rows4(cb, r + 8u, cl, acc16[8]); rows4(cb, r + 8u, cl + 4u, acc16[9]);
    rows4(cb, r + 8u, cl + 8u, acc16[10]); rows4(cb, r + 8u, cl + 12u, acc16[11]);
    rows4(cb, r + 12u, cl, acc16[12]); rows4(cb, r + 12u, cl + 4u, acc16[13]);
    rows4(cb, r + 12u, cl + 8u, acc16[14]); rows4(cb, r + 12u, cl + 12u, acc16[15]);
}

@compute @workgroup_size(64)
fn block16_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let rc = block16_body(gid.x + gid.y * nwg.x * 64u, gid.z);
    if (rc.x >= p.m) { return; }
    let cb = gid.z * p.stride_c;
    let r = rc.x;
    let cl = rc.y;
    rows4_v4(cb, r, cl, acc16[0]); rows4_v4(cb, r, cl + 4u, acc16[1]);
    rows4_v4(cb, r, cl + 8u, acc16[2]); rows4_v4(cb, r, cl + 12u, acc16[3]);
    rows4_v4(cb, r + 4u, cl, acc16[4]); rows4_v4(cb, r + 4u, cl + 4u, acc16[5]);
    rows4_v4(cb, r + 4u, cl + 8u, acc16[6]); rows4_v4(cb, r + 4u, cl + 12u, acc16[7]);
    rows4_v4(cb, r + 8u, cl, acc16[8]); rows4_v4(cb, r + 8u, cl + 4u, acc16[9]);
    rows4_v4(cb, r + 8u, cl + 8u, acc16[10]); rows4_v4(cb, r + 8u, cl + 12u, acc16[11]);
    rows4_v4(cb, r + 12u, cl, acc16[12]); rows4_v4(cb, r + 12u, cl + 4u, acc16[13]);
    rows4_v4(cb, r + 12u, cl + 8u, acc16[14]); rows4_v4(cb, r + 12u, cl + 12u, acc16[15]);
}
