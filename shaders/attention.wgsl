// Fused causal attention, FlashAttention-2's arithmetic: q, o, do, dq (heads, T, Dh) and k, v,
// dk, dv (heads, Tk, Dh) with heads = every device's B*H; lse (heads, T); the backward's rows
// (lse, delta) (heads, T, 2). The rows of q, k, v, o, do, dq, dk and dv sit where the prelude's
// row_at says.
//
// A workgroup holds WG rows of one head (queries in forward/dq, keys in dk/dv) and walks the
// other side in tiles of TILE rows staged in workgroup memory, so each row it needs is read
// from storage once per workgroup, not once per lane. Causality bounds every walk (positions
// and dropout: the prelude, attention_common.wgsl). A tile no query of the workgroup can see
// is skipped whole; a query row that sees no key gets o = 0 and lse = LOWEST.
// - forward: an online softmax (running max m, sum l, weighted sum of v rescaled whenever m
//   grows); o = acc / l, lse = m + log(l). No (T, T) array is written.
// - backward: p = exp(s - lse) recomputed; dp = keep * do.v; ds = scale * p * (dp - delta)
//   with delta = do.o (the softmax's row sum of p * dp); dq = ds k, dk = ds q, dv = p keep do.
//   One kernel per output, so no kernel binds more than WebGPU's 8 storage buffers. With
//   blocks, o and lse are the rows' whole attention (ring attention's blocks combined).
// - combine: two partial attentions of the same rows merged (ring attention's accumulation).
// Grid: (ceil(rows / WG), heads) workgroups, heads past 65535 folded into z.

const WG: u32 = 64u;
const TILE: u32 = 16u;
// Head dimensions up to MAX_DH (the launcher refuses more): private rows and tiles are sized by it.
const MAX_DH: u32 = 64u;

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(5) var<storage, read_write> o: array<f32>;
@group(0) @binding(6) var<storage, read_write> lse: array<f32>;
@group(0) @binding(8) var<storage, read> o_in: array<f32>;
@group(0) @binding(9) var<storage, read> d_o: array<f32>;
@group(0) @binding(10) var<storage, read_write> rows: array<vec2<f32>>; // (lse, delta) per row
@group(0) @binding(11) var<storage, read> rows_in: array<vec2<f32>>;
@group(0) @binding(12) var<storage, read_write> dq: array<f32>;
@group(0) @binding(13) var<storage, read_write> dk: array<f32>;
@group(0) @binding(14) var<storage, read_write> dv: array<f32>;
@group(0) @binding(15) var<storage, read> lse_in: array<f32>;
@group(0) @binding(16) var<storage, read> o_a: array<f32>;
@group(0) @binding(17) var<storage, read> lse_a: array<f32>;
@group(0) @binding(18) var<storage, read> o_b: array<f32>;
@group(0) @binding(19) var<storage, read> lse_b: array<f32>;
// The composed lowering's (heads, T, T) scratch: the scores, then the kept probabilities; the
// backward's second, dp then ds.
@group(0) @binding(20) var<storage, read_write> scores: array<f32>;
@group(0) @binding(21) var<storage, read_write> dscores: array<f32>;

var<workgroup> tile_a: array<f32, TILE * MAX_DH>;
var<workgroup> tile_b: array<f32, TILE * MAX_DH>;
var<workgroup> tile_rows: array<vec2<f32>, TILE>; // (lse, delta) of a query tile

// Stages key rows [r0, r0 + TILE) of head h of k and v into the tiles; rows past Tk read 0.
fn stage_kv(h: u32, r0: u32, lid: u32) {
    let bk = row_at(u.k_at, h, 0u);
    let bv = row_at(u.v_at, h, 0u);
    for (var e = lid; e < TILE * u.dh; e += WG) {
        let r = r0 + e / u.dh;
        var x = 0.0;
        var y = 0.0;
        if (r < u.tk) {
            x = k[bk + r * u.k_at.z + e % u.dh];
            y = v[bv + r * u.v_at.z + e % u.dh];
        }
        tile_a[e] = x;
        tile_b[e] = y;
    }
}

fn stage_q_do(h: u32, r0: u32, lid: u32) {
    let bq = row_at(u.q_at, h, 0u);
    let bdo = row_at(u.do_at, h, 0u);
    for (var e = lid; e < TILE * u.dh; e += WG) {
        let r = r0 + e / u.dh;
        var x = 0.0;
        var y = 0.0;
        if (r < u.t) {
            x = q[bq + r * u.q_at.z + e % u.dh];
            y = d_o[bdo + r * u.do_at.z + e % u.dh];
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

@compute @workgroup_size(64)
fn forward(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let h = head_of(wid, nwg);
    if (h >= u.heads) { return; } // uniform: the whole workgroup leaves
    let hd = head_at(h);
    let first = wid.x * WG;
    let i = first + lid;
    let live = i < u.t;
    let orow = row_at(u.o_at, h, i);
    var qi: array<f32, MAX_DH>;
    var acc: array<f32, MAX_DH>;
    var pi = 0u;
    if (live) {
        let qrow = row_at(u.q_at, h, i);
        for (var d = 0u; d < u.dh; d++) { qi[d] = q[qrow + d]; acc[d] = 0.0; }
        pi = head_pos_q(hd, i);
    }
    var m = LOWEST;
    var l = 0.0;
    let last = min(first + WG, u.t) - 1u;
    let seen_max = head_q_max(hd, first, last);
    for (var j0 = 0u; j0 < u.tk; j0 += TILE) {
        // A tile past every query of the workgroup is skipped (uniform: no lane needs it).
        if (head_k_min(hd, j0, min(j0 + TILE, u.tk) - 1u) > seen_max) { continue; }
        stage_kv(h, j0, lid);
        workgroupBarrier();
        if (live) {
            for (var jj = 0u; jj < TILE; jj++) {
                let j = j0 + jj;
                if (j >= u.tk) { break; }
                if (head_pos_k(hd, j) > pi) { continue; }
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
                let w = e * head_keep(hd, i, j);
                for (var d = 0u; d < u.dh; d++) { acc[d] += w * tile_b[jj * u.dh + d]; }
            }
        }
        workgroupBarrier();
    }
    if (live) {
        if (l == 0.0) {
            // No key of this block is visible: no weight when blocks are combined.
            for (var d = 0u; d < u.dh; d++) { o[orow + d] = 0.0; }
            lse[h * u.t + i] = LOWEST;
        } else {
            let inv = 1.0 / l;
            for (var d = 0u; d < u.dh; d++) { o[orow + d] = acc[d] * inv; }
            lse[h * u.t + i] = m + log(l);
        }
    }
}

// rows = (lse, rowsum(do * o)), one invocation per row of all heads: the backward's per-row
// pair, in one buffer so dq and dk stay within 8 storage bindings.
@compute @workgroup_size(64)
fn row_delta(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= u.heads * u.t) { return; }
    let dorow = row_at(u.do_at, r / u.t, r % u.t);
    let orow = row_at(u.o_at, r / u.t, r % u.t);
    var s = 0.0;
    for (var d = 0u; d < u.dh; d++) { s += d_o[dorow + d] * o_in[orow + d]; }
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
    let hd = head_at(h);
    let first = wid.x * WG;
    let i = first + lid;
    let live = i < u.t;
    let row = row_at(u.dq_at, h, i);
    var qi: array<f32, MAX_DH>;
    var doi: array<f32, MAX_DH>;
    var acc: array<f32, MAX_DH>;
    var lse_i = 0.0;
    var delta_i = 0.0;
    var pi = 0u;
    if (live) {
        let qrow = row_at(u.q_at, h, i);
        let dorow = row_at(u.do_at, h, i);
        for (var d = 0u; d < u.dh; d++) { qi[d] = q[qrow + d]; doi[d] = d_o[dorow + d]; acc[d] = 0.0; }
        let r = rows_in[h * u.t + i];
        lse_i = r.x;
        delta_i = r.y;
        pi = head_pos_q(hd, i);
    }
    let last = min(first + WG, u.t) - 1u;
    let seen_max = head_q_max(hd, first, last);
    for (var j0 = 0u; j0 < u.tk; j0 += TILE) {
        if (head_k_min(hd, j0, min(j0 + TILE, u.tk) - 1u) > seen_max) { continue; }
        stage_kv(h, j0, lid);
        workgroupBarrier();
        if (live) {
            for (var jj = 0u; jj < TILE; jj++) {
                let j = j0 + jj;
                if (j >= u.tk) { break; }
                if (head_pos_k(hd, j) > pi) { continue; }
                var s = 0.0;
                var dp = 0.0;
                for (var d = 0u; d < u.dh; d++) {
                    s += qi[d] * tile_a[jj * u.dh + d];
                    dp += doi[d] * tile_b[jj * u.dh + d];
                }
                let p = exp(u.scale * s - lse_i);
                let ds = u.scale * p * (head_keep(hd, i, j) * dp - delta_i);
                for (var d = 0u; d < u.dh; d++) { acc[d] += ds * tile_a[jj * u.dh + d]; }
            }
        }
        workgroupBarrier();
    }
    if (live) {
        for (var d = 0u; d < u.dh; d++) { dq[row + d] = acc[d]; }
    }
}

@compute @workgroup_size(64)
fn backward_dk(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let h = head_of(wid, nwg);
    if (h >= u.heads) { return; }
    let hd = head_at(h);
    let first = wid.x * WG;
    let j = first + lid;
    let live = j < u.tk;
    let row = row_at(u.dk_at, h, j);
    var kj: array<f32, MAX_DH>;
    var vj: array<f32, MAX_DH>;
    var acc: array<f32, MAX_DH>;
    var pj = 0u;
    if (live) {
        let krow = row_at(u.k_at, h, j);
        let vrow = row_at(u.v_at, h, j);
        for (var d = 0u; d < u.dh; d++) { kj[d] = k[krow + d]; vj[d] = v[vrow + d]; acc[d] = 0.0; }
        pj = head_pos_k(hd, j);
    }
    let seen_min = head_k_min(hd, first, min(first + WG, u.tk) - 1u);
    for (var i0 = 0u; i0 < u.t; i0 += TILE) {
        // Queries before every key of the workgroup see none of them.
        if (head_q_max(hd, i0, min(i0 + TILE, u.t) - 1u) < seen_min) { continue; }
        stage_q_do(h, i0, lid);
        workgroupBarrier();
        if (live) {
            for (var ii = 0u; ii < TILE; ii++) {
                let i = i0 + ii;
                if (i >= u.t) { break; }
                if (head_pos_q(hd, i) < pj) { continue; }
                var s = 0.0;
                var dp = 0.0;
                for (var d = 0u; d < u.dh; d++) {
                    s += tile_a[ii * u.dh + d] * kj[d];
                    dp += tile_b[ii * u.dh + d] * vj[d];
                }
                let rows = tile_rows[ii];
                let p = exp(u.scale * s - rows.x);
                let ds = u.scale * p * (head_keep(hd, i, j) * dp - rows.y);
                for (var d = 0u; d < u.dh; d++) { acc[d] += ds * tile_a[ii * u.dh + d]; }
            }
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
    let hd = head_at(h);
    let first = wid.x * WG;
    let j = first + lid;
    let live = j < u.tk;
    let row = row_at(u.dv_at, h, j);
    var kj: array<f32, MAX_DH>;
    var acc: array<f32, MAX_DH>;
    var pj = 0u;
    if (live) {
        let krow = row_at(u.k_at, h, j);
        for (var d = 0u; d < u.dh; d++) { kj[d] = k[krow + d]; acc[d] = 0.0; }
        pj = head_pos_k(hd, j);
    }
    let seen_min = head_k_min(hd, first, min(first + WG, u.tk) - 1u);
    for (var i0 = 0u; i0 < u.t; i0 += TILE) {
        if (head_q_max(hd, i0, min(i0 + TILE, u.t) - 1u) < seen_min) { continue; }
        stage_q_do(h, i0, lid);
        workgroupBarrier();
        if (live) {
            for (var ii = 0u; ii < TILE; ii++) {
                let i = i0 + ii;
                if (i >= u.t) { break; }
                if (head_pos_q(hd, i) < pj) { continue; }
                var s = 0.0;
                for (var d = 0u; d < u.dh; d++) { s += tile_a[ii * u.dh + d] * kj[d]; }
                let w = exp(u.scale * s - tile_rows[ii].x) * head_keep(hd, i, j);
                for (var d = 0u; d < u.dh; d++) { acc[d] += w * tile_b[ii * u.dh + d]; }
            }
        }
        workgroupBarrier();
    }
    if (live) {
        for (var d = 0u; d < u.dh; d++) { dv[row + d] = acc[d]; }
    }
}

// Two partial attentions of the same rows merged, one invocation per row of all heads:
// lse = logaddexp(lse_a, lse_b), o = o_a exp(lse_a - lse) + o_b exp(lse_b - lse). A row
// neither saw (both LOWEST) stays o = 0, lse = LOWEST.
@compute @workgroup_size(64)
fn combine(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= u.heads * u.t) { return; }
    let a = lse_a[r];
    let b = lse_b[r];
    if (a == LOWEST && b == LOWEST) {
        for (var d = 0u; d < u.dh; d++) { o[r * u.dh + d] = 0.0; }
        lse[r] = LOWEST;
        return;
    }
    let m = max(a, b);
    let l = m + log(exp(a - m) + exp(b - m));
    let wa = exp(a - l);
    let wb = exp(b - l);
    for (var d = 0u; d < u.dh; d++) { o[r * u.dh + d] = wa * o_a[r * u.dh + d] + wb * o_b[r * u.dh + d]; }
    lse[r] = l;
}

// ---- the composed lowering: the same op through the adapter's tuned matmuls ----------------
// On CPU adapters every per-lane load is a loop over the lanes, and the fused kernels above
// read each row once per row they meet; the tuned matmuls block 16 x 16 outputs per invocation
// instead. Where such an adapter has no subgroups of 8 or 16 for attention_sg.wgsl
// (SwiftShader's are 4), or Dh is not a multiple of 4, the op runs as scores = scale q k^T (a matmul), `probs`,
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
