// Fused causal attention for CPU adapters: the op and arithmetic of attention.wgsl (its header
// says what each kernel computes), with rows shared across a subgroup by subgroupBroadcast in
// place of workgroup memory. Parameters, positions and dropout: the prelude,
// attention_common.wgsl.
//
// Why: lavapipe runs a subgroup as the lanes of one SIMD vector, and every storage or
// workgroup-memory access as a loop over the lanes, where a broadcast is one shuffle.
// attention.wgsl reads each staged value once per lane and per row it meets, so on lavapipe it
// costs several times the op composed through the tuned matmuls; here a lane loads one row of
// each side per tile, as vec4s, and takes every other lane's row from the broadcasts.
//
// A workgroup is one subgroup of LANES (8 or 16) invocations: LANES rows of one head (queries
// in forward and dq, keys in dk and dv). It walks the other side in tiles of LANES rows, lane c
// loading row c of the tile. Per tile, each lane's values against the tile's rows (scores, and
// dp in the backward) are reduced over Dh in vec4 steps into an array indexed with constants
// only (lane c's value in element c / 4, component c % 4); the weights follow elementwise; the
// output rows are accumulated in place in the output buffer, one vec4 of Dh at a time (an array
// indexed by Dh would be memory the adapter loops over per lane). A tile no row of the workgroup
// sees is skipped whole, as in attention.wgsl.
// Every subgroup operation runs in uniform control flow: the loops' bounds are uniform, rows
// past the end are clamped for loads and masked out of the weights and the stores.
// Rows sit where the prelude's row_at says, in vec4s: Dh and every layout's strides and offset
// multiples of 4 (the launcher checks). Grid: (ceil(rows / LANES), heads)
// workgroups, heads past 65535 folded into z.

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> o: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> lse: array<f32>;
@group(0) @binding(9) var<storage, read> d_o: array<vec4<f32>>;
@group(0) @binding(11) var<storage, read> rows_in: array<vec2<f32>>; // (lse, delta) per query row
@group(0) @binding(12) var<storage, read_write> dq: array<vec4<f32>>;
@group(0) @binding(13) var<storage, read_write> dk: array<vec4<f32>>;
@group(0) @binding(14) var<storage, read_write> dv: array<vec4<f32>>;
// backward_dq_delta's: the forward's o and lse, and the rows' (lse, delta) it writes for dk and dv
// (attention.wgsl's row_delta binds the same numbers).
@group(0) @binding(8) var<storage, read> o_in: array<vec4<f32>>;
@group(0) @binding(15) var<storage, read> lse_in: array<f32>;
@group(0) @binding(10) var<storage, read_write> rows: array<vec2<f32>>;

// One value per row of a tile: row c in element c / 4, component c % 4 (rows past LANES 0).
alias Tile = array<vec4<f32>, 4>;

// x . (lane c's y) for every lane c of the subgroup.
fn dots(x: vec4<f32>, y: vec4<f32>, lanes: u32) -> Tile {
    var r: Tile;
    r[0] = vec4(dot(x, subgroupBroadcast(y, 0u)), dot(x, subgroupBroadcast(y, 1u)),
                dot(x, subgroupBroadcast(y, 2u)), dot(x, subgroupBroadcast(y, 3u)));
    r[1] = vec4(dot(x, subgroupBroadcast(y, 4u)), dot(x, subgroupBroadcast(y, 5u)),
                dot(x, subgroupBroadcast(y, 6u)), dot(x, subgroupBroadcast(y, 7u)));
    if (lanes == 16u) {
        r[2] = vec4(dot(x, subgroupBroadcast(y, 8u)), dot(x, subgroupBroadcast(y, 9u)),
                    dot(x, subgroupBroadcast(y, 10u)), dot(x, subgroupBroadcast(y, 11u)));
        r[3] = vec4(dot(x, subgroupBroadcast(y, 12u)), dot(x, subgroupBroadcast(y, 13u)),
                    dot(x, subgroupBroadcast(y, 14u)), dot(x, subgroupBroadcast(y, 15u)));
    }
    return r;
}

// sum over lanes c of w[c] (lane c's y): the tile's rows weighted.
fn mix(w: Tile, y: vec4<f32>, lanes: u32) -> vec4<f32> {
    var a = w[0].x * subgroupBroadcast(y, 0u) + w[0].y * subgroupBroadcast(y, 1u)
          + w[0].z * subgroupBroadcast(y, 2u) + w[0].w * subgroupBroadcast(y, 3u)
          + w[1].x * subgroupBroadcast(y, 4u) + w[1].y * subgroupBroadcast(y, 5u)
          + w[1].z * subgroupBroadcast(y, 6u) + w[1].w * subgroupBroadcast(y, 7u);
    if (lanes == 16u) {
        a += w[2].x * subgroupBroadcast(y, 8u) + w[2].y * subgroupBroadcast(y, 9u)
           + w[2].z * subgroupBroadcast(y, 10u) + w[2].w * subgroupBroadcast(y, 11u)
           + w[3].x * subgroupBroadcast(y, 12u) + w[3].y * subgroupBroadcast(y, 13u)
           + w[3].z * subgroupBroadcast(y, 14u) + w[3].w * subgroupBroadcast(y, 15u);
    }
    return a;
}

// Lane c's x, for every lane c.
fn lanes_of(x: f32, lanes: u32) -> Tile {
    var r: Tile;
    r[0] = vec4(subgroupBroadcast(x, 0u), subgroupBroadcast(x, 1u), subgroupBroadcast(x, 2u), subgroupBroadcast(x, 3u));
    r[1] = vec4(subgroupBroadcast(x, 4u), subgroupBroadcast(x, 5u), subgroupBroadcast(x, 6u), subgroupBroadcast(x, 7u));
    if (lanes == 16u) {
        r[2] = vec4(subgroupBroadcast(x, 8u), subgroupBroadcast(x, 9u), subgroupBroadcast(x, 10u), subgroupBroadcast(x, 11u));
        r[3] = vec4(subgroupBroadcast(x, 12u), subgroupBroadcast(x, 13u), subgroupBroadcast(x, 14u), subgroupBroadcast(x, 15u));
    }
    return r;
}

fn add(a: Tile, b: Tile) -> Tile {
    return Tile(a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]);
}

// 1 where the query at position pi (this lane's) sees tile rows r0 + 4g .. r0 + 4g + 3 as
// keys (each within the tile's `lanes` rows and the Tk keys, at a position at most pi), else 0.
fn sees_keys(hd: Head, pi: u32, r0: u32, g: u32, lanes: u32) -> vec4<f32> {
    var m = vec4(0.0);
    for (var e = 0u; e < 4u; e++) {
        let c = 4u * g + e;
        let j = r0 + c;
        m[e] = select(0.0, 1.0, c < lanes && j < u.tk && head_pos_k(hd, min(j, u.tk - 1u)) <= pi);
    }
    return m;
}

// 1 where the key at position pj (this lane's) is seen by tile rows r0 + 4g .. as queries.
fn seen_by_queries(hd: Head, pj: u32, r0: u32, g: u32, lanes: u32) -> vec4<f32> {
    var m = vec4(0.0);
    for (var e = 0u; e < 4u; e++) {
        let c = 4u * g + e;
        let i = r0 + c;
        m[e] = select(0.0, 1.0, c < lanes && i < u.t && head_pos_q(hd, min(i, u.t - 1u)) >= pj);
    }
    return m;
}

// The dropout factors of (i, j0 + e) for e < 4 (keys past Tk clamped; masked anyway); 1 where the
// entry point is one without dropout (`drop` false), whose Threefry code the compiler drops.
fn keep_keys(hd: Head, i: u32, j0: u32, drop: bool) -> vec4<f32> {
    if (!drop || u.dropout == 0u) { return vec4(1.0); }
    let last = u.tk - 1u;
    return vec4(head_keep(hd, i, min(j0, last)), head_keep(hd, i, min(j0 + 1u, last)),
                head_keep(hd, i, min(j0 + 2u, last)), head_keep(hd, i, min(j0 + 3u, last)));
}

// The dropout factors of (i0 + e, j) for e < 4 (1 without dropout, as keep_keys).
fn keep_queries(hd: Head, i0: u32, j: u32, drop: bool) -> vec4<f32> {
    if (!drop || u.dropout == 0u) { return vec4(1.0); }
    let last = u.t - 1u;
    return vec4(head_keep(hd, min(i0, last), j), head_keep(hd, min(i0 + 1u, last), j),
                head_keep(hd, min(i0 + 2u, last), j), head_keep(hd, min(i0 + 3u, last), j));
}

fn hmax(x: vec4<f32>) -> f32 {
    return max(max(x.x, x.y), max(x.z, x.w));
}

// Whether the key tile at j0 holds no key a query of the workgroup sees (its queries' largest
// position is seen_max). Uniform, as every value the subgroup's control flow depends on: the
// per-lane rows are kept apart from these values (a browser's compiler checks it).
fn keys_unseen(hd: Head, seen_max: u32, j0: u32, lanes: u32) -> bool {
    return head_k_min(hd, j0, min(j0 + lanes, u.tk) - 1u) > seen_max;
}

fn forward_sg(wid: vec3<u32>, lid: u32, nwg: vec3<u32>, lanes: u32, drop: bool) {
    let h = head_of(wid, nwg);
    if (h >= u.heads) { return; } // uniform: the whole subgroup leaves
    let hd = head_at(h);
    let dh4 = u.dh / 4u;
    let first = wid.x * lanes;
    let seen_max = head_q_max(hd, first, min(first + lanes, u.t) - 1u);
    // This lane's query row (clamped for loads past T) and its position.
    let live = first + lid < u.t;
    let ic = min(first + lid, u.t - 1u);
    let qrow = row_at(u.q_at, h, ic) / 4u;
    let orow = row_at(u.o_at, h, ic) / 4u;
    let pi = head_pos_q(hd, ic);
    var m = LOWEST;
    var l = 0.0;
    var started = false;
    for (var j0 = 0u; j0 < u.tk; j0 += lanes) {
        if (keys_unseen(hd, seen_max, j0, lanes)) { continue; }
        let jc = min(j0 + lid, u.tk - 1u);
        let krow = row_at(u.k_at, h, jc) / 4u;
        let vrow = row_at(u.v_at, h, jc) / 4u;
        var s: Tile;
        for (var c = 0u; c < dh4; c++) { s = add(s, dots(q[qrow + c], k[krow + c], lanes)); }
        var sees: Tile;
        var top = m;
        for (var g = 0u; g < 4u; g++) {
            sees[g] = sees_keys(hd, pi, j0, g, lanes);
            s[g] = select(vec4(LOWEST), u.scale * s[g], sees[g] > vec4(0.0));
            top = max(top, hmax(s[g]));
        }
        // Online softmax: the sum so far and the rows accumulated in o rescale by exp(m - top).
        let rescale = exp(m - top);
        l *= rescale;
        var w: Tile;
        for (var g = 0u; g < 4u; g++) {
            let p = select(vec4(0.0), exp(s[g] - top), sees[g] > vec4(0.0));
            l += dot(p, vec4(1.0));
            w[g] = p * keep_keys(hd, ic, j0 + 4u * g, drop);
        }
        m = top;
        for (var c = 0u; c < dh4; c++) {
            let a = mix(w, v[vrow + c], lanes);
            if (live) {
                var prev = vec4(0.0);
                if (started) { prev = o[orow + c] * rescale; }
                o[orow + c] = prev + a;
            }
        }
        started = true;
    }
    if (live) {
        let r = h * u.t + ic;
        if (l == 0.0) {
            // No key of this block is visible: no weight when blocks are combined.
            for (var c = 0u; c < dh4; c++) { o[orow + c] = vec4(0.0); }
            lse[r] = LOWEST;
        } else {
            let inv = 1.0 / l;
            for (var c = 0u; c < dh4; c++) { o[orow + c] = o[orow + c] * inv; }
            lse[r] = m + log(l);
        }
    }
}

fn backward_dq_sg(wid: vec3<u32>, lid: u32, nwg: vec3<u32>, lanes: u32, drop: bool) {
    let h = head_of(wid, nwg);
    if (h >= u.heads) { return; }
    let first = wid.x * lanes;
    let ic = min(first + lid, u.t - 1u);
    dq_rows(h, first, lid, rows_in[h * u.t + ic], lanes, drop);
}

// dq with its rows' (lse, delta) made here, as attention.wgsl's row_delta makes them (delta =
// rowsum(do * o), added in the same order), and written to `rows` for dk and dv: one dispatch
// for two. It binds 10 storage buffers, so the launcher runs it where the adapter allows that
// many, with backward_dkdv_sg below.
fn backward_dq_delta_sg(wid: vec3<u32>, lid: u32, nwg: vec3<u32>, lanes: u32, drop: bool) {
    let h = head_of(wid, nwg);
    if (h >= u.heads) { return; }
    let first = wid.x * lanes;
    let ic = min(first + lid, u.t - 1u);
    let r = h * u.t + ic;
    let dorow = row_at(u.do_at, h, ic) / 4u;
    let orow = row_at(u.o_at, h, ic) / 4u;
    var delta = 0.0;
    for (var c = 0u; c < u.dh / 4u; c++) {
        let x = d_o[dorow + c] * o_in[orow + c];
        delta += x.x;
        delta += x.y;
        delta += x.z;
        delta += x.w;
    }
    let row = vec2(lse_in[r], delta);
    if (first + lid < u.t) { rows[r] = row; }
    dq_rows(h, first, lid, row, lanes, drop);
}

// dq of this lane's query row (first + lid of head h, whose (lse, delta) is `row`).
fn dq_rows(h: u32, first: u32, lid: u32, row: vec2<f32>, lanes: u32, drop: bool) {
    let hd = head_at(h);
    let dh4 = u.dh / 4u;
    let seen_max = head_q_max(hd, first, min(first + lanes, u.t) - 1u);
    let live = first + lid < u.t;
    let ic = min(first + lid, u.t - 1u);
    let qrow = row_at(u.q_at, h, ic) / 4u;
    let dorow = row_at(u.do_at, h, ic) / 4u;
    let dqrow = row_at(u.dq_at, h, ic) / 4u;
    let pi = head_pos_q(hd, ic);
    var started = false;
    for (var j0 = 0u; j0 < u.tk; j0 += lanes) {
        if (keys_unseen(hd, seen_max, j0, lanes)) { continue; }
        let jc = min(j0 + lid, u.tk - 1u);
        let krow = row_at(u.k_at, h, jc) / 4u;
        let vrow = row_at(u.v_at, h, jc) / 4u;
        var s: Tile;
        var dp: Tile;
        for (var c = 0u; c < dh4; c++) {
            s = add(s, dots(q[qrow + c], k[krow + c], lanes));
            dp = add(dp, dots(d_o[dorow + c], v[vrow + c], lanes));
        }
        var ds: Tile;
        for (var g = 0u; g < 4u; g++) {
            let sees = sees_keys(hd, pi, j0, g, lanes) > vec4(0.0);
            let p = select(vec4(0.0), exp(u.scale * s[g] - row.x), sees);
            ds[g] = u.scale * p * (keep_keys(hd, ic, j0 + 4u * g, drop) * dp[g] - row.y);
        }
        for (var c = 0u; c < dh4; c++) {
            let a = mix(ds, k[krow + c], lanes);
            if (live) {
                var prev = vec4(0.0);
                if (started) { prev = dq[dqrow + c]; }
                dq[dqrow + c] = prev + a;
            }
        }
        started = true;
    }
    if (live && !started) {
        for (var c = 0u; c < dh4; c++) { dq[dqrow + c] = vec4(0.0); }
    }
}

// Whether the query tile at i0 holds no query that sees a key of the workgroup (its keys'
// smallest position is seen_min). Uniform, as keys_unseen.
fn queries_unseen(hd: Head, seen_min: u32, i0: u32, lanes: u32) -> bool {
    return head_q_max(hd, i0, min(i0 + lanes, u.t) - 1u) < seen_min;
}

// The weights of a query tile's rows for one key: in dk, ds = scale p (keep dp - delta); in dv,
// p keep.
struct KeyWeights {
    ds: Tile,
    pk: Tile,
}

// This lane's key against the query tile at i0 (this lane's query and do rows at qrow, dorow):
// the tile's weights (`ds` only where `with_dp`, which dk needs and dv does not).
fn key_weights(hd: Head, kr: KeyRow, i0: u32, qrow: u32, dorow: u32, row: vec2<f32>, lanes: u32, with_dp: bool, drop: bool) -> KeyWeights {
    let dh4 = u.dh / 4u;
    var s: Tile;
    var dp: Tile;
    for (var c = 0u; c < dh4; c++) {
        s = add(s, dots(k[kr.k + c], q[qrow + c], lanes));
        if (with_dp) { dp = add(dp, dots(v[kr.v + c], d_o[dorow + c], lanes)); }
    }
    let lses = lanes_of(row.x, lanes);
    let deltas = lanes_of(row.y, lanes);
    var w: KeyWeights;
    for (var g = 0u; g < 4u; g++) {
        let seen = seen_by_queries(hd, kr.pos, i0, g, lanes) > vec4(0.0);
        let p = select(vec4(0.0), exp(u.scale * s[g] - lses[g]), seen);
        let keep = keep_queries(hd, i0 + 4u * g, kr.j, drop);
        w.pk[g] = p * keep;
        w.ds[g] = u.scale * p * (keep * dp[g] - deltas[g]);
    }
    return w;
}

// This lane's key row of the block of head h that starts at row `first`, clamped for loads past
// Tk: whether it is one, its index, the first vec4 of its row of k, v, dk and dv, and its
// position.
struct KeyRow {
    live: bool,
    j: u32,
    k: u32,
    v: u32,
    dk: u32,
    dv: u32,
    pos: u32,
}

fn key_row(hd: Head, h: u32, first: u32, lid: u32) -> KeyRow {
    let j = min(first + lid, u.tk - 1u);
    let k4 = row_at(u.k_at, h, j) / 4u;
    let v4 = row_at(u.v_at, h, j) / 4u;
    let dk4 = row_at(u.dk_at, h, j) / 4u;
    let dv4 = row_at(u.dv_at, h, j) / 4u;
    return KeyRow(first + lid < u.tk, j, k4, v4, dk4, dv4, head_pos_k(hd, j));
}

// The query tile at i0 against this lane's key: the first vec4 of the query and do rows this
// lane loads (clamped past T), and the tile's weights (key_weights).
struct QueryTile {
    q: u32,
    d_o: u32,
    w: KeyWeights,
}

fn query_tile(hd: Head, h: u32, kr: KeyRow, i0: u32, lid: u32, lanes: u32, with_dp: bool, drop: bool) -> QueryTile {
    let i = min(i0 + lid, u.t - 1u);
    let q4 = row_at(u.q_at, h, i) / 4u;
    let do4 = row_at(u.do_at, h, i) / 4u;
    return QueryTile(q4, do4, key_weights(hd, kr, i0, q4, do4, rows_in[h * u.t + i], lanes, with_dp, drop));
}

fn backward_dk_sg(wid: vec3<u32>, lid: u32, nwg: vec3<u32>, lanes: u32, drop: bool) {
    let h = head_of(wid, nwg);
    if (h >= u.heads) { return; }
    let hd = head_at(h);
    let dh4 = u.dh / 4u;
    let first = wid.x * lanes;
    let seen_min = head_k_min(hd, first, min(first + lanes, u.tk) - 1u);
    let kr = key_row(hd, h, first, lid);
    let live = kr.live;
    let krow = kr.dk;
    var started = false;
    for (var i0 = 0u; i0 < u.t; i0 += lanes) {
        if (queries_unseen(hd, seen_min, i0, lanes)) { continue; }
        let qt = query_tile(hd, h, kr, i0, lid, lanes, true, drop);
        let w = qt.w;
        for (var c = 0u; c < dh4; c++) {
            let a = mix(w.ds, q[qt.q + c], lanes);
            if (live) {
                var prev = vec4(0.0);
                if (started) { prev = dk[krow + c]; }
                dk[krow + c] = prev + a;
            }
        }
        started = true;
    }
    if (live && !started) {
        for (var c = 0u; c < dh4; c++) { dk[krow + c] = vec4(0.0); }
    }
}

fn backward_dv_sg(wid: vec3<u32>, lid: u32, nwg: vec3<u32>, lanes: u32, drop: bool) {
    let h = head_of(wid, nwg);
    if (h >= u.heads) { return; }
    let hd = head_at(h);
    let dh4 = u.dh / 4u;
    let first = wid.x * lanes;
    let seen_min = head_k_min(hd, first, min(first + lanes, u.tk) - 1u);
    let kr = key_row(hd, h, first, lid);
    let live = kr.live;
    let krow = kr.dv;
    var started = false;
    for (var i0 = 0u; i0 < u.t; i0 += lanes) {
        if (queries_unseen(hd, seen_min, i0, lanes)) { continue; }
        let qt = query_tile(hd, h, kr, i0, lid, lanes, false, drop);
        let w = qt.w;
        for (var c = 0u; c < dh4; c++) {
            let a = mix(w.pk, d_o[qt.d_o + c], lanes);
            if (live) {
                var prev = vec4(0.0);
                if (started) { prev = dv[krow + c]; }
                dv[krow + c] = prev + a;
            }
        }
        started = true;
    }
    if (live && !started) {
        for (var c = 0u; c < dh4; c++) { dv[krow + c] = vec4(0.0); }
    }
}

// dk and dv in one pass over the query tiles: the probabilities and dp made once for both. It
// binds 9 storage buffers, one past WebGPU's default limit per stage, so the launcher runs it
// (after backward_dq_delta) only where the adapter allows 10 (lavapipe allows 32), and row_delta,
// dq, dk and dv apart elsewhere.
fn backward_dkdv_sg(wid: vec3<u32>, lid: u32, nwg: vec3<u32>, lanes: u32, drop: bool) {
    let h = head_of(wid, nwg);
    if (h >= u.heads) { return; }
    let hd = head_at(h);
    let dh4 = u.dh / 4u;
    let first = wid.x * lanes;
    let seen_min = head_k_min(hd, first, min(first + lanes, u.tk) - 1u);
    let kr = key_row(hd, h, first, lid);
    let live = kr.live;
    let dkrow = kr.dk;
    let dvrow = kr.dv;
    var started = false;
    for (var i0 = 0u; i0 < u.t; i0 += lanes) {
        if (queries_unseen(hd, seen_min, i0, lanes)) { continue; }
        let qt = query_tile(hd, h, kr, i0, lid, lanes, true, drop);
        let w = qt.w;
        for (var c = 0u; c < dh4; c++) {
            let ak = mix(w.ds, q[qt.q + c], lanes);
            let av = mix(w.pk, d_o[qt.d_o + c], lanes);
            if (live) {
                var prev_k = vec4(0.0);
                var prev_v = vec4(0.0);
                if (started) {
                    prev_k = dk[dkrow + c];
                    if (u.dv_in_dk == 1u) { prev_v = dk[dvrow + c]; } else { prev_v = dv[dvrow + c]; }
                }
                dk[dkrow + c] = prev_k + ak;
                if (u.dv_in_dk == 1u) { dk[dvrow + c] = prev_v + av; } else { dv[dvrow + c] = prev_v + av; }
            }
        }
        started = true;
    }
    if (live && !started) {
        for (var c = 0u; c < dh4; c++) {
            dk[dkrow + c] = vec4(0.0);
            if (u.dv_in_dk == 1u) { dk[dvrow + c] = vec4(0.0); } else { dv[dvrow + c] = vec4(0.0); }
        }
    }
}

// Entry points: each kernel for subgroups of 8 and 16 lanes, with dropout and without
// (`_nodrop`, for launches whose rate is 0). `lanes` and `drop` are constant arguments, so the
// compiler unrolls the tile loops and drops the Threefry code where `drop` is false: a uniform
// branch around it still cost lavapipe a third of the forward.
@compute @workgroup_size(8)
fn forward_sg8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    forward_sg(wid, lid, nwg, 8u, true);
}

@compute @workgroup_size(16)
fn forward_sg16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    forward_sg(wid, lid, nwg, 16u, true);
}

@compute @workgroup_size(8)
fn forward_sg8_nodrop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    forward_sg(wid, lid, nwg, 8u, false);
}

@compute @workgroup_size(16)
fn forward_sg16_nodrop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    forward_sg(wid, lid, nwg, 16u, false);
}

@compute @workgroup_size(8)
fn backward_dq_sg8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dq_sg(wid, lid, nwg, 8u, true);
}

@compute @workgroup_size(16)
fn backward_dq_sg16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dq_sg(wid, lid, nwg, 16u, true);
}

@compute @workgroup_size(8)
fn backward_dq_sg8_nodrop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dq_sg(wid, lid, nwg, 8u, false);
}

@compute @workgroup_size(16)
fn backward_dq_sg16_nodrop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dq_sg(wid, lid, nwg, 16u, false);
}

@compute @workgroup_size(8)
fn backward_dk_sg8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dk_sg(wid, lid, nwg, 8u, true);
}

@compute @workgroup_size(16)
fn backward_dk_sg16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dk_sg(wid, lid, nwg, 16u, true);
}

@compute @workgroup_size(8)
fn backward_dk_sg8_nodrop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dk_sg(wid, lid, nwg, 8u, false);
}

@compute @workgroup_size(16)
fn backward_dk_sg16_nodrop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dk_sg(wid, lid, nwg, 16u, false);
}

@compute @workgroup_size(8)
fn backward_dv_sg8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dv_sg(wid, lid, nwg, 8u, true);
}

@compute @workgroup_size(16)
fn backward_dv_sg16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dv_sg(wid, lid, nwg, 16u, true);
}

@compute @workgroup_size(8)
fn backward_dv_sg8_nodrop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dv_sg(wid, lid, nwg, 8u, false);
}

@compute @workgroup_size(16)
fn backward_dv_sg16_nodrop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dv_sg(wid, lid, nwg, 16u, false);
}

@compute @workgroup_size(8)
fn backward_dkdv_sg8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dkdv_sg(wid, lid, nwg, 8u, true);
}

@compute @workgroup_size(16)
fn backward_dkdv_sg16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dkdv_sg(wid, lid, nwg, 16u, true);
}

@compute @workgroup_size(8)
fn backward_dkdv_sg8_nodrop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dkdv_sg(wid, lid, nwg, 8u, false);
}

@compute @workgroup_size(16)
fn backward_dkdv_sg16_nodrop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dkdv_sg(wid, lid, nwg, 16u, false);
}

@compute @workgroup_size(8)
fn backward_dq_delta_sg8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dq_delta_sg(wid, lid, nwg, 8u, true);
}

@compute @workgroup_size(16)
fn backward_dq_delta_sg16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dq_delta_sg(wid, lid, nwg, 16u, true);
}

@compute @workgroup_size(8)
fn backward_dq_delta_sg8_nodrop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dq_delta_sg(wid, lid, nwg, 8u, false);
}

@compute @workgroup_size(16)
fn backward_dq_delta_sg16_nodrop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    backward_dq_delta_sg(wid, lid, nwg, 16u, false);
}
