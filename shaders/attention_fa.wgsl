// Fused causal attention for GPUs, in the FlashAttention-2 manner: the arithmetic of attention.wgsl
// (online softmax forward; p recomputed from lse in the backward; the same dropout factors from the
// prelude, attention_common.wgsl) with each block of rows split across its workgroup.
//
// A workgroup holds BR rows of one head, LANES invocations a row: lane l keeps vec4s l, l+4, l+8 and
// l+12 of the row (dims 4x .. 4x+3 of vec4 x; Dh up to MAX_DH), in registers, indexed by constants.
// It walks the other side in tiles staged in workgroup memory. Per tile, each lane makes its part of
// every dot product of its row with the tile's rows and leaves it in workgroup memory; after a barrier
// every lane of the row sums the four parts in one order, so all four hold the same score bit for bit,
// and each accumulates its own dims. The lanes also share out the tile's dropout factors, each drawing
// a quarter of them. No subgroup operation: it runs wherever WebGPU does.
//   forward            query blocks: o, lse. Grid: (ceil(T / BR), heads).
//   backward_dq_delta  query blocks: each row's (lse, delta = rowsum(do * o)) into `rows`, and dq.
//   backward_dkdv      key blocks, FlashAttention-2's backward: dk and dv of BR keys together, each
//                      probability and dp made once. Grid: (ceil(Tk / BR), heads).
// With attention.wgsl's one row per invocation, a GPU ran `small` (32 heads of 64 rows) on 32
// workgroups; here it gets 128, and the rows' vectors stay in registers.

const BR: u32 = 16u;     // rows per workgroup
const LANES: u32 = 4u;   // invocations per row
const FT: u32 = 16u;     // rows of the forward's tiles
const BT: u32 = 8u;      // rows of the backward's tiles
const ROW4: u32 = 16u;   // vec4s of a row of MAX_DH
const MAX_DH: u32 = 64u; // the launcher refuses more

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

// The forward's tiles: FT rows of k and v (ROW4 vec4s each); each row's parts of its scores with
// them ([(row * FT + jj) * LANES + lane]: scalars, so each lane stores only its own word) and the
// dropout factors ([row * FT + jj]).
var<workgroup> fk: array<vec4<f32>, 256>;
var<workgroup> fv: array<vec4<f32>, 256>;
var<workgroup> fpart: array<f32, 1024>;
var<workgroup> fkeep: array<f32, 256>;
// The backward's: BT rows of the other side's two operands (k and v, or q and do), the parts of
// the scores and of dp, the dropout factors, and (dk and dv) the query rows' (lse, delta).
var<workgroup> ba: array<vec4<f32>, 128>;
var<workgroup> bb: array<vec4<f32>, 128>;
var<workgroup> bs: array<f32, 512>;
var<workgroup> bdp: array<f32, 512>;
var<workgroup> bkeep: array<f32, 128>;
var<workgroup> brows: array<vec2<f32>, 8>;

// Which of dims 4x .. 4x+3 a row has.
fn dims(x: u32) -> vec4<bool> {
    let d = 4u * x;
    return vec4(d < u.dh, d + 1u < u.dh, d + 2u < u.dh, d + 3u < u.dh);
}

// vec4 x of the row of an operand at element `at`, zero past Dh. Loads past Dh read other elements
// of the binding (or, past its end, what WGSL's bounds rules give), and are discarded.
fn q4(at: u32, x: u32) -> vec4<f32> {
    let i = at + 4u * x;
    return select(vec4(0.0), vec4(q[i], q[i + 1u], q[i + 2u], q[i + 3u]), dims(x));
}

fn k4(at: u32, x: u32) -> vec4<f32> {
    let i = at + 4u * x;
    return select(vec4(0.0), vec4(k[i], k[i + 1u], k[i + 2u], k[i + 3u]), dims(x));
}

fn v4(at: u32, x: u32) -> vec4<f32> {
    let i = at + 4u * x;
    return select(vec4(0.0), vec4(v[i], v[i + 1u], v[i + 2u], v[i + 3u]), dims(x));
}

fn o4(at: u32, x: u32) -> vec4<f32> {
    let i = at + 4u * x;
    return select(vec4(0.0), vec4(o_in[i], o_in[i + 1u], o_in[i + 2u], o_in[i + 3u]), dims(x));
}

fn do4(at: u32, x: u32) -> vec4<f32> {
    let i = at + 4u * x;
    return select(vec4(0.0), vec4(d_o[i], d_o[i + 1u], d_o[i + 2u], d_o[i + 3u]), dims(x));
}

// The four parts of score `at` (a row's entry of a tile), summed in the one order every lane of
// the row uses.
fn total_f(at: u32) -> f32 {
    let i = at * LANES;
    return ((fpart[i] + fpart[i + 1u]) + fpart[i + 2u]) + fpart[i + 3u];
}

fn total_s(at: u32) -> f32 {
    let i = at * LANES;
    return ((bs[i] + bs[i + 1u]) + bs[i + 2u]) + bs[i + 3u];
}

fn total_dp(at: u32) -> f32 {
    let i = at * LANES;
    return ((bdp[i] + bdp[i + 1u]) + bdp[i + 2u]) + bdp[i + 3u];
}

// The row a workgroup's invocation `lid` works on and its lane. The head is not in it: a value
// built from `lid` counts as non-uniform (WGSL's uniformity analysis, which Chrome enforces), and
// the head's early return must stay uniform for the barriers after it.
struct Slot {
    row: u32,  // within the block
    lane: u32,
    i: u32,    // row of the head (queries, or keys in dkdv)
    live: bool,
    at: u32,   // min(i, n - 1): where it reads, so idle rows read real memory
}

fn slot(wid: vec3<u32>, lid: u32, n: u32) -> Slot {
    let row = lid / LANES;
    let i = wid.x * BR + row;
    return Slot(row, lid % LANES, i, i < n, min(i, n - 1u));
}

// Stores vec4 x of a row's result (its dims below Dh) at element `at` of o, dq, dk or dv.
fn store_o(at: u32, x: u32, y: vec4<f32>) {
    for (var e = 0u; e < 4u; e++) { if (4u * x + e < u.dh) { o[at + 4u * x + e] = y[e]; } }
}

fn store_dq(at: u32, x: u32, y: vec4<f32>) {
    for (var e = 0u; e < 4u; e++) { if (4u * x + e < u.dh) { dq[at + 4u * x + e] = y[e]; } }
}

fn store_dk(at: u32, x: u32, y: vec4<f32>) {
    for (var e = 0u; e < 4u; e++) { if (4u * x + e < u.dh) { dk[at + 4u * x + e] = y[e]; } }
}

fn store_dv(at: u32, x: u32, y: vec4<f32>) {
    for (var e = 0u; e < 4u; e++) { if (4u * x + e < u.dh) { dv[at + 4u * x + e] = y[e]; } }
}

@compute @workgroup_size(64)
fn forward(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let h = head_of(wid, nwg);
    if (h >= u.heads) { return; } // uniform: the whole workgroup leaves
    let sl = slot(wid, lid, u.t);
    let hd = head_at(h);
    let lane = sl.lane;
    let qrow = row_at(u.q_at, h, sl.at);
    var qv: array<vec4<f32>, 4>;
    var acc: array<vec4<f32>, 4>;
    for (var c = 0u; c < 4u; c++) {
        qv[c] = q4(qrow, 4u * c + lane);
        acc[c] = vec4(0.0);
    }
    let pi = head_pos_q(hd, sl.at);
    var m = LOWEST;
    var l = 0.0;
    let first = wid.x * BR;
    let seen_max = head_q_max(hd, first, min(first + BR, u.t) - 1u);
    for (var j0 = 0u; j0 < u.tk; j0 += FT) {
        // A tile past every query of the workgroup is skipped (uniform: no row needs it).
        if (head_k_min(hd, j0, min(j0 + FT, u.tk) - 1u) > seen_max) { continue; }
        for (var e = lid; e < FT * ROW4; e += 64u) {
            let j = j0 + e / ROW4;
            let jc = min(j, u.tk - 1u);
            let live = vec4(j < u.tk);
            fk[e] = select(vec4(0.0), k4(row_at(u.k_at, h, jc), e % ROW4), live);
            fv[e] = select(vec4(0.0), v4(row_at(u.v_at, h, jc), e % ROW4), live);
        }
        workgroupBarrier();
        for (var jj = 0u; jj < FT; jj++) {
            var s = 0.0;
            for (var c = 0u; c < 4u; c++) { s += dot(qv[c], fk[jj * ROW4 + 4u * c + lane]); }
            fpart[(sl.row * FT + jj) * LANES + lane] = s;
        }
        for (var jj = lane; jj < FT; jj += LANES) {
            let j = j0 + jj;
            var f = 0.0;
            if (sl.live && j < u.tk && head_pos_k(hd, j) <= pi) { f = head_keep(hd, sl.i, j); }
            fkeep[sl.row * FT + jj] = f;
        }
        workgroupBarrier();
        if (sl.live) {
            for (var jj = 0u; jj < FT; jj++) {
                let j = j0 + jj;
                if (j >= u.tk) { break; }
                if (head_pos_k(hd, j) > pi) { continue; }
                let s = u.scale * total_f(sl.row * FT + jj);
                if (s > m) {
                    let c = exp(m - s);
                    l *= c;
                    for (var x = 0u; x < 4u; x++) { acc[x] *= c; }
                    m = s;
                }
                let e = exp(s - m);
                l += e;
                let w = e * fkeep[sl.row * FT + jj];
                for (var c = 0u; c < 4u; c++) { acc[c] += w * fv[jj * ROW4 + 4u * c + lane]; }
            }
        }
        workgroupBarrier();
    }
    if (!sl.live) { return; }
    let orow = row_at(u.o_at, h, sl.i);
    // No key of this block is visible: o = 0 and lse = LOWEST, no weight when blocks are combined.
    let inv = select(0.0, 1.0 / l, l > 0.0);
    for (var c = 0u; c < 4u; c++) { store_o(orow, 4u * c + lane, acc[c] * inv); }
    if (lane == 0u) { lse[h * u.t + sl.i] = select(LOWEST, m + log(l), l > 0.0); }
}

@compute @workgroup_size(64)
fn backward_dq_delta(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let h = head_of(wid, nwg);
    if (h >= u.heads) { return; }
    let sl = slot(wid, lid, u.t);
    let hd = head_at(h);
    let lane = sl.lane;
    let qrow = row_at(u.q_at, h, sl.at);
    let dorow = row_at(u.do_at, h, sl.at);
    let orow = row_at(u.o_at, h, sl.at);
    var qv: array<vec4<f32>, 4>;
    var dov: array<vec4<f32>, 4>;
    var acc: array<vec4<f32>, 4>;
    var part = 0.0;
    for (var c = 0u; c < 4u; c++) {
        qv[c] = q4(qrow, 4u * c + lane);
        dov[c] = do4(dorow, 4u * c + lane);
        acc[c] = vec4(0.0);
        part += dot(dov[c], o4(orow, 4u * c + lane));
    }
    // delta = rowsum(do * o): the four lanes' parts through workgroup memory.
    bs[sl.row * LANES + lane] = part;
    workgroupBarrier();
    let delta = total_s(sl.row);
    let lse_i = lse_in[h * u.t + sl.at];
    if (sl.live && lane == 0u) { rows[h * u.t + sl.i] = vec2(lse_i, delta); }
    workgroupBarrier();
    let pi = head_pos_q(hd, sl.at);
    let first = wid.x * BR;
    let seen_max = head_q_max(hd, first, min(first + BR, u.t) - 1u);
    for (var j0 = 0u; j0 < u.tk; j0 += BT) {
        if (head_k_min(hd, j0, min(j0 + BT, u.tk) - 1u) > seen_max) { continue; }
        for (var e = lid; e < BT * ROW4; e += 64u) {
            let j = j0 + e / ROW4;
            let jc = min(j, u.tk - 1u);
            let live = vec4(j < u.tk);
            ba[e] = select(vec4(0.0), k4(row_at(u.k_at, h, jc), e % ROW4), live);
            bb[e] = select(vec4(0.0), v4(row_at(u.v_at, h, jc), e % ROW4), live);
        }
        workgroupBarrier();
        for (var jj = 0u; jj < BT; jj++) {
            var s = 0.0;
            var dp = 0.0;
            for (var c = 0u; c < 4u; c++) {
                s += dot(qv[c], ba[jj * ROW4 + 4u * c + lane]);
                dp += dot(dov[c], bb[jj * ROW4 + 4u * c + lane]);
            }
            bs[(sl.row * BT + jj) * LANES + lane] = s;
            bdp[(sl.row * BT + jj) * LANES + lane] = dp;
        }
        for (var jj = lane; jj < BT; jj += LANES) {
            let j = j0 + jj;
            var f = 0.0;
            if (sl.live && j < u.tk && head_pos_k(hd, j) <= pi) { f = head_keep(hd, sl.i, j); }
            bkeep[sl.row * BT + jj] = f;
        }
        workgroupBarrier();
        if (sl.live) {
            for (var jj = 0u; jj < BT; jj++) {
                let j = j0 + jj;
                if (j >= u.tk) { break; }
                if (head_pos_k(hd, j) > pi) { continue; }
                let at = sl.row * BT + jj;
                let p = exp(u.scale * total_s(at) - lse_i);
                let ds = u.scale * p * (bkeep[at] * total_dp(at) - delta);
                for (var c = 0u; c < 4u; c++) { acc[c] += ds * ba[jj * ROW4 + 4u * c + lane]; }
            }
        }
        workgroupBarrier();
    }
    if (!sl.live) { return; }
    let row = row_at(u.dq_at, h, sl.i);
    for (var c = 0u; c < 4u; c++) { store_dq(row, 4u * c + lane, acc[c]); }
}

@compute @workgroup_size(64)
fn backward_dkdv(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let h = head_of(wid, nwg);
    if (h >= u.heads) { return; }
    let sl = slot(wid, lid, u.tk);
    let hd = head_at(h);
    let lane = sl.lane;
    let krow = row_at(u.k_at, h, sl.at);
    let vrow = row_at(u.v_at, h, sl.at);
    var kv: array<vec4<f32>, 4>;
    var vv: array<vec4<f32>, 4>;
    var gk: array<vec4<f32>, 4>;
    var gv: array<vec4<f32>, 4>;
    for (var c = 0u; c < 4u; c++) {
        kv[c] = k4(krow, 4u * c + lane);
        vv[c] = v4(vrow, 4u * c + lane);
        gk[c] = vec4(0.0);
        gv[c] = vec4(0.0);
    }
    let pj = head_pos_k(hd, sl.at);
    let first = wid.x * BR;
    let seen_min = head_k_min(hd, first, min(first + BR, u.tk) - 1u);
    for (var i0 = 0u; i0 < u.t; i0 += BT) {
        // Queries before every key of the workgroup see none of them.
        if (head_q_max(hd, i0, min(i0 + BT, u.t) - 1u) < seen_min) { continue; }
        for (var e = lid; e < BT * ROW4; e += 64u) {
            let i = i0 + e / ROW4;
            let ic = min(i, u.t - 1u);
            let live = vec4(i < u.t);
            ba[e] = select(vec4(0.0), q4(row_at(u.q_at, h, ic), e % ROW4), live);
            bb[e] = select(vec4(0.0), do4(row_at(u.do_at, h, ic), e % ROW4), live);
        }
        if (lid < BT) {
            var r = vec2(0.0);
            if (i0 + lid < u.t) { r = rows_in[h * u.t + i0 + lid]; }
            brows[lid] = r;
        }
        workgroupBarrier();
        for (var ii = 0u; ii < BT; ii++) {
            var s = 0.0;
            var dp = 0.0;
            for (var c = 0u; c < 4u; c++) {
                s += dot(ba[ii * ROW4 + 4u * c + lane], kv[c]);
                dp += dot(bb[ii * ROW4 + 4u * c + lane], vv[c]);
            }
            bs[(sl.row * BT + ii) * LANES + lane] = s;
            bdp[(sl.row * BT + ii) * LANES + lane] = dp;
        }
        for (var ii = lane; ii < BT; ii += LANES) {
            let i = i0 + ii;
            var f = 0.0;
            if (sl.live && i < u.t && head_pos_q(hd, i) >= pj) { f = head_keep(hd, i, sl.i); }
            bkeep[sl.row * BT + ii] = f;
        }
        workgroupBarrier();
        if (sl.live) {
            for (var ii = 0u; ii < BT; ii++) {
                let i = i0 + ii;
                if (i >= u.t) { break; }
                if (head_pos_q(hd, i) < pj) { continue; }
                let at = sl.row * BT + ii;
                let r = brows[ii];
                let p = exp(u.scale * total_s(at) - r.x);
                let kept = p * bkeep[at];
                let ds = u.scale * p * (bkeep[at] * total_dp(at) - r.y);
                for (var c = 0u; c < 4u; c++) {
                    gv[c] += kept * bb[ii * ROW4 + 4u * c + lane];
                    gk[c] += ds * ba[ii * ROW4 + 4u * c + lane];
                }
            }
        }
        workgroupBarrier();
    }
    if (!sl.live) { return; }
    let row = row_at(u.dk_at, h, sl.i);
    let vrow_out = row_at(u.dv_at, h, sl.i);
    for (var c = 0u; c < 4u; c++) {
        store_dk(row, 4u * c + lane, gk[c]);
        // dk and dv in one buffer are bound once, as dk (the prelude's dv_in_dk).
        if (u.dv_in_dk == 1u) {
            store_dk(vrow_out, 4u * c + lane, gv[c]);
        } else {
            store_dv(vrow_out, 4u * c + lane, gv[c]);
        }
    }
}
