// Fused causal attention, FlashAttention-2's arithmetic: q, k, v, o, do, dq, dk, dv viewed
// (heads, T, Dh) with heads = every device's B*H; lse (heads, T); the backward's rows
// (lse, delta) (heads, T, 2).
//
// A workgroup holds WG rows of one head (queries in forward/dq, keys in dk/dv) and walks the
// other side in tiles of TILE rows staged in workgroup memory, so each row it needs is read
// from storage once per workgroup, not once per lane. Causality bounds every walk: query i
// sees keys j <= i.
// - forward: an online softmax (running max m, sum l, weighted sum of v rescaled whenever m
//   grows); o = acc / l, lse = m + log(l). No (T, T) array is written.
// - backward: p = exp(s - lse) recomputed; dp = keep * do.v; ds = scale * p * (dp - delta)
//   with delta = do.o (the softmax's row sum of p * dp); dq = ds k, dk = ds q, dv = p keep do.
//   One kernel per output, so no kernel binds more than WebGPU's 8 storage buffers.
// Dropout: keep = uniform(bits) < 1 - rate with jax.random's construction (dropout.wgsl);
// kept probabilities are scaled by 1/keep rounded to f32. The bits either arrive in `words`
// (heads, T, T), made by a random_bits launch, or are drawn in place from the key in `words`
// with the counters of the prelude (threefry.wgsl): head h is local head h mod heads_per_dev
// of device h / heads_per_dev, whose (B, H, T, T) block of the global bits starts at
// offsets[4d..4d+4] (canonical rank 4). Both give the same bits, so no (T, T) array is held.
// Grid: (ceil(T / WG), heads) workgroups, heads past 65535 folded into z.

const WG: u32 = 64u;
const TILE: u32 = 16u;
// Head dimensions up to MAX_DH (the launcher refuses more): private rows and tiles are sized by it.
const MAX_DH: u32 = 64u;
// f32::MIN written so it parses as a finite f32 (Tint refuses -3.4028235e38, which is past it before rounding).
const LOWEST: f32 = -3.4028234e38;

struct Params {
    heads: u32,
    t: u32,
    dh: u32,
    dropout: u32,       // 0 none, 1 bits in `words`, 2 bits drawn from the key in `words`
    scale: f32,         // on the scores: 1/sqrt(Dh)
    keep: f32,          // 1 - rate
    keep_scale: f32,    // rng::keep_scale(keep)
    heads_per_dev: u32, // B*H of one device
    n_global: u32,      // the draw (random.wgsl's Params): elements of the global bits
    n_block: u32,       // elements of one device's block, heads_per_dev * T * T
    rng_layout: u32,    // 0 original, 1 partitionable
    key_stride: u32,    // words between devices' keys: 0 (shared) or 2
    block_size: vec4<u32>,
    global_stride: vec4<u32>,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read> words: array<u32>;   // the bits, or the keys
@group(0) @binding(4) var<storage, read> offsets: array<u32>; // (devices, 4) block starts
@group(0) @binding(5) var<storage, read_write> o: array<f32>;
@group(0) @binding(6) var<storage, read_write> lse: array<f32>;
@group(0) @binding(7) var<uniform> u: Params;
@group(0) @binding(8) var<storage, read> o_in: array<f32>;
@group(0) @binding(9) var<storage, read> d_o: array<f32>;
@group(0) @binding(10) var<storage, read_write> rows: array<vec2<f32>>; // (lse, delta) per row
@group(0) @binding(11) var<storage, read> rows_in: array<vec2<f32>>;
@group(0) @binding(12) var<storage, read_write> dq: array<f32>;
@group(0) @binding(13) var<storage, read_write> dk: array<f32>;
@group(0) @binding(14) var<storage, read_write> dv: array<f32>;
@group(0) @binding(15) var<storage, read> lse_in: array<f32>;
// The composed lowering's (heads, T, T) scratch: the scores, then the kept probabilities; the
// backward's second, dp then ds.
@group(0) @binding(16) var<storage, read_write> scores: array<f32>;
@group(0) @binding(17) var<storage, read_write> dscores: array<f32>;

var<workgroup> tile_a: array<f32, TILE * MAX_DH>;
var<workgroup> tile_b: array<f32, TILE * MAX_DH>;
var<workgroup> tile_rows: array<vec2<f32>, TILE>; // (lse, delta) of a query tile

// The bits of probability (h, i, j).
fn bits_of(h: u32, i: u32, j: u32) -> u32 {
    if (u.dropout == 1u) { return words[(h * u.t + i) * u.t + j]; }
    let d = h / u.heads_per_dev;
    let l = ((h - d * u.heads_per_dev) * u.t + i) * u.t + j;
    let o4 = 4u * d;
    let start = vec4<u32>(offsets[o4], offsets[o4 + 1u], offsets[o4 + 2u], offsets[o4 + 3u]);
    let g = block_element(l, start, u.block_size, u.global_stride);
    return counter_bits(words[d * u.key_stride], words[d * u.key_stride + 1u], g, u.n_global, u.rng_layout);
}

// The dropout factor of probability (h, i, j): 0 dropped, 1/keep kept, 1 without dropout.
fn keep_factor(h: u32, i: u32, j: u32) -> f32 {
    if (u.dropout == 0u) { return 1.0; }
    return select(0.0, u.keep_scale, uniform01(bits_of(h, i, j)) < u.keep);
}

fn head_of(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y + wid.z * nwg.y;
}

// Stages rows [r0, r0 + TILE) of head h of `a` (and `b`) into the tiles; rows past T read 0.
fn stage_kv(h: u32, r0: u32, lid: u32) {
    let base = h * u.t * u.dh;
    for (var e = lid; e < TILE * u.dh; e += WG) {
        let r = r0 + e / u.dh;
        var x = 0.0;
        var y = 0.0;
        if (r < u.t) {
            x = k[base + r * u.dh + e % u.dh];
            y = v[base + r * u.dh + e % u.dh];
        }
        tile_a[e] = x;
        tile_b[e] = y;
    }
}

fn stage_q_do(h: u32, r0: u32, lid: u32) {
    let base = h * u.t * u.dh;
    for (var e = lid; e < TILE * u.dh; e += WG) {
        let r = r0 + e / u.dh;
        var x = 0.0;
        var y = 0.0;
        if (r < u.t) {
            x = q[base + r * u.dh + e % u.dh];
            y = d_o[base + r * u.dh + e % u.dh];
        }
        tile_a[e] = x;
        tile_b[e] = y;
    }
    if (lid < TILE) {
        let r = r0 + lid;
        var rows = vec2<f32>(0.0, 0.0);
        if (r < u.t) { rows = rows_in[h * u.t + r]; }
        tile_rows[lid] = rows;
    }
}

// The keys of the tile at j0 that query i sees.
fn keys_seen(i: u32, j0: u32) -> u32 {
    if (i < j0) { return 0u; }
    return min(TILE, i - j0 + 1u);
}

@compute @workgroup_size(64)
fn forward(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let h = head_of(wid, nwg);
    if (h >= u.heads) { return; } // uniform: the whole workgroup leaves
    let first = wid.x * WG;
    let i = first + lid;
    let live = i < u.t;
    let row = (h * u.t + i) * u.dh;
    var qi: array<f32, MAX_DH>;
    var acc: array<f32, MAX_DH>;
    if (live) {
        for (var d = 0u; d < u.dh; d++) { qi[d] = q[row + d]; acc[d] = 0.0; }
    }
    var m = LOWEST;
    var l = 0.0;
    let end = min(first + WG, u.t);
    for (var j0 = 0u; j0 < end; j0 += TILE) {
        stage_kv(h, j0, lid);
        workgroupBarrier();
        var seen = 0u;
        if (live) { seen = keys_seen(i, j0); }
        for (var jj = 0u; jj < seen; jj++) {
            var s = 0.0;
            for (var d = 0u; d < u.dh; d++) { s += qi[d] * tile_a[jj * u.dh + d]; }
            s = u.scale * s;
            if (s > m) {
                let c = exp(m - s);
                l *= c;
                for (var d = 0u; d < u.dh; d++) { acc[d] *= c; }
                m = s;
            }
            let e = exp(s - m);
            l += e;
            let w = e * keep_factor(h, i, j0 + jj);
            for (var d = 0u; d < u.dh; d++) { acc[d] += w * tile_b[jj * u.dh + d]; }
        }
        workgroupBarrier();
    }
    if (live) {
        let inv = 1.0 / l;
        for (var d = 0u; d < u.dh; d++) { o[row + d] = acc[d] * inv; }
        lse[h * u.t + i] = m + log(l);
    }
}

// rows = (lse, rowsum(do * o)), one invocation per row of all heads: the backward's per-row
// pair, in one buffer so dq and dk stay within 8 storage bindings.
@compute @workgroup_size(64)
fn row_delta(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= u.heads * u.t) { return; }
    var s = 0.0;
    for (var d = 0u; d < u.dh; d++) { s += d_o[r * u.dh + d] * o_in[r * u.dh + d]; }
    rows[r] = vec2<f32>(lse_in[r], s);
}

@compute @workgroup_size(64)
fn backward_dq(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let h = head_of(wid, nwg);
    if (h >= u.heads) { return; }
    let first = wid.x * WG;
    let i = first + lid;
    let live = i < u.t;
    let row = (h * u.t + i) * u.dh;
    var qi: array<f32, MAX_DH>;
    var doi: array<f32, MAX_DH>;
    var acc: array<f32, MAX_DH>;
    var lse_i = 0.0;
    var delta_i = 0.0;
    if (live) {
        for (var d = 0u; d < u.dh; d++) { qi[d] = q[row + d]; doi[d] = d_o[row + d]; acc[d] = 0.0; }
        let r = rows_in[h * u.t + i];
        lse_i = r.x;
        delta_i = r.y;
    }
    let end = min(first + WG, u.t);
    for (var j0 = 0u; j0 < end; j0 += TILE) {
        stage_kv(h, j0, lid);
        workgroupBarrier();
        var seen = 0u;
        if (live) { seen = keys_seen(i, j0); }
        for (var jj = 0u; jj < seen; jj++) {
            var s = 0.0;
            var dp = 0.0;
            for (var d = 0u; d < u.dh; d++) {
                s += qi[d] * tile_a[jj * u.dh + d];
                dp += doi[d] * tile_b[jj * u.dh + d];
            }
            let p = exp(u.scale * s - lse_i);
            let ds = u.scale * p * (keep_factor(h, i, j0 + jj) * dp - delta_i);
            for (var d = 0u; d < u.dh; d++) { acc[d] += ds * tile_a[jj * u.dh + d]; }
        }
        workgroupBarrier();
    }
    if (live) {
        for (var d = 0u; d < u.dh; d++) { dq[row + d] = acc[d]; }
    }
}

// The queries of the tile at i0 that see key j, from this index of the tile on.
fn queries_seeing(j: u32, i0: u32) -> u32 {
    if (j <= i0) { return 0u; }
    return min(TILE, j - i0);
}

@compute @workgroup_size(64)
fn backward_dk(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let h = head_of(wid, nwg);
    if (h >= u.heads) { return; }
    let first = wid.x * WG;
    let j = first + lid;
    let live = j < u.t;
    let row = (h * u.t + j) * u.dh;
    var kj: array<f32, MAX_DH>;
    var vj: array<f32, MAX_DH>;
    var acc: array<f32, MAX_DH>;
    if (live) {
        for (var d = 0u; d < u.dh; d++) { kj[d] = k[row + d]; vj[d] = v[row + d]; acc[d] = 0.0; }
    }
    // Queries before the workgroup's first key see none of its keys.
    for (var i0 = first - first % TILE; i0 < u.t; i0 += TILE) {
        stage_q_do(h, i0, lid);
        workgroupBarrier();
        var start = TILE;
        if (live) { start = queries_seeing(j, i0); }
        for (var ii = start; ii < TILE; ii++) {
            let i = i0 + ii;
            if (i >= u.t) { break; }
            var s = 0.0;
            var dp = 0.0;
            for (var d = 0u; d < u.dh; d++) {
                s += tile_a[ii * u.dh + d] * kj[d];
                dp += tile_b[ii * u.dh + d] * vj[d];
            }
            let rows = tile_rows[ii];
            let p = exp(u.scale * s - rows.x);
            let ds = u.scale * p * (keep_factor(h, i, j) * dp - rows.y);
            for (var d = 0u; d < u.dh; d++) { acc[d] += ds * tile_a[ii * u.dh + d]; }
        }
        workgroupBarrier();
    }
    if (live) {
        for (var d = 0u; d < u.dh; d++) { dk[row + d] = acc[d]; }
    }
}

@compute @workgroup_size(64)
fn backward_dv(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let h = head_of(wid, nwg);
    if (h >= u.heads) { return; }
    let first = wid.x * WG;
    let j = first + lid;
    let live = j < u.t;
    let row = (h * u.t + j) * u.dh;
    var kj: array<f32, MAX_DH>;
    var acc: array<f32, MAX_DH>;
    if (live) {
        for (var d = 0u; d < u.dh; d++) { kj[d] = k[row + d]; acc[d] = 0.0; }
    }
    for (var i0 = first - first % TILE; i0 < u.t; i0 += TILE) {
        stage_q_do(h, i0, lid);
        workgroupBarrier();
        var start = TILE;
        if (live) { start = queries_seeing(j, i0); }
        for (var ii = start; ii < TILE; ii++) {
            let i = i0 + ii;
            if (i >= u.t) { break; }
            var s = 0.0;
            for (var d = 0u; d < u.dh; d++) { s += tile_a[ii * u.dh + d] * kj[d]; }
            let w = exp(u.scale * s - tile_rows[ii].x) * keep_factor(h, i, j);
            for (var d = 0u; d < u.dh; d++) { acc[d] += w * tile_b[ii * u.dh + d]; }
        }
        workgroupBarrier();
    }
    if (live) {
        for (var d = 0u; d < u.dh; d++) { dv[row + d] = acc[d]; }
    }
}

// ---- the composed lowering: the same op through the adapter's tuned matmuls ----------------
// On CPU adapters (lavapipe, SwiftShader) every per-lane load is a loop over the lanes, and the
// fused kernels above read each row once per row they meet; the tuned matmuls block 16 x 16
// outputs per invocation instead. There the op runs as scores = scale q k^T (a matmul), `probs`,
// o = probs v (a matmul); its backward as scores again, dp = do v^T, `probs_grad`, then
// dv = p'^T do, dq = ds k, dk = ds^T q. Only the (heads, T, T) scratch of one op at a time is
// held, never across the step: what the op saves for its backward is still o and lse.

// Each row of `scores` becomes its causal softmax times the dropout factor (0 past the
// diagonal), and lse its log-sum-exp: one invocation per row of all heads.
@compute @workgroup_size(64)
fn probs(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= u.heads * u.t) { return; }
    let h = r / u.t;
    let i = r % u.t;
    let base = r * u.t;
    var m = LOWEST;
    var l = 0.0;
    for (var j = 0u; j <= i; j++) {
        let s = scores[base + j];
        let grown = max(m, s);
        l = l * exp(m - grown) + exp(s - grown);
        m = grown;
    }
    let inv = 1.0 / l;
    for (var j = 0u; j < u.t; j++) {
        var p = 0.0;
        if (j <= i) { p = exp(scores[base + j] - m) * inv * keep_factor(h, i, j); }
        scores[base + j] = p;
    }
    lse[r] = m + log(l);
}

// From the scores (scale q k^T) and dp (do v^T): the kept probabilities p' (for dv) in
// `scores`, and ds = scale p (keep dp - delta) in `dscores`; one invocation per element.
@compute @workgroup_size(64)
fn probs_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * 64u;
    if (e >= u.heads * u.t * u.t) { return; }
    let r = e / u.t;
    let j = e % u.t;
    let i = r % u.t;
    let row = rows_in[r];
    var p = 0.0;
    if (j <= i) { p = exp(scores[e] - row.x); }
    let kf = keep_factor(r / u.t, i, j);
    scores[e] = p * kf;
    dscores[e] = u.scale * p * (kf * dscores[e] - row.y);
}
