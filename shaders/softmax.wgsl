// Causal softmax of attention scores: s, p viewed (rows, T), rows = B*H*T, the query of row
// r is i = r % T, and columns j > i are masked (p = 0 there; MODEL.md's -1e30 before the
// softmax gives the same). No scaling here: the matmul applies 1/sqrt(Dh).
// Row kernels come in two variants (see RowStrategy): `*_row` one invocation per row with
// a single online max/sum pass, `*_wg` one 256-wide workgroup per row reducing in workgroup
// memory. Row ids fold into y past 65535 workgroups.

struct Params {
    rows: u32,
    t: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> s: array<f32>;           // (rows, T) scores
@group(0) @binding(1) var<storage, read_write> p: array<f32>;     // (rows, T) probabilities
@group(0) @binding(2) var<storage, read> p_in: array<f32>;        // (rows, T)
@group(0) @binding(3) var<storage, read> dp: array<f32>;          // (rows, T)
@group(0) @binding(4) var<storage, read_write> ds: array<f32>;    // (rows, T)
@group(0) @binding(5) var<uniform> u: Params;

const WG: u32 = 256u;
const LOWEST: f32 = -3.0e38; // running max of an empty set; exp(LOWEST - m) = 0

var<workgroup> red_m: array<f32, 256>;
var<workgroup> red_s: array<f32, 256>;

// Combines per-invocation (max, sum of exp(v - max)) pairs over the workgroup.
// Call from uniform control flow only.
fn wg_max_sum(lid: u32, m: f32, l: f32) -> vec2<f32> {
    red_m[lid] = m;
    red_s[lid] = l;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
        if (lid < st) {
            let m1 = red_m[lid];
            let m2 = red_m[lid + st];
            let mm = max(m1, m2);
            red_s[lid] = red_s[lid] * exp(m1 - mm) + red_s[lid + st] * exp(m2 - mm);
            red_m[lid] = mm;
        }
        workgroupBarrier();
    }
    let r = vec2<f32>(red_m[0], red_s[0]);
    workgroupBarrier();
    return r;
}

fn wg_sum(lid: u32, v: f32) -> f32 {
    red_s[lid] = v;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
        if (lid < st) {
            red_s[lid] += red_s[lid + st];
        }
        workgroupBarrier();
    }
    let total = red_s[0];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(64)
fn causal_forward_row(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= u.rows) { return; }
    let i = r % u.t;
    let base = r * u.t;
    var m = LOWEST;
    var l = 0.0;
    for (var j = 0u; j <= i; j++) {
        let v = s[base + j];
        if (v > m) {
            l = l * exp(m - v) + 1.0;
            m = v;
        } else {
            l += exp(v - m);
        }
    }
    let inv = 1.0 / l;
    for (var j = 0u; j < u.t; j++) {
        var e = 0.0;
        if (j <= i) { e = exp(s[base + j] - m) * inv; }
        p[base + j] = e;
    }
}

@compute @workgroup_size(256)
fn causal_forward_wg(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let r = wid.x + wid.y * nwg.x; // uniform: the early return keeps barriers uniform
    if (r >= u.rows) { return; }
    let i = r % u.t;
    let base = r * u.t;
    var m = LOWEST;
    var l = 0.0;
    for (var j = lid; j <= i; j += WG) {
        let v = s[base + j];
        if (v > m) {
            l = l * exp(m - v) + 1.0;
            m = v;
        } else {
            l += exp(v - m);
        }
    }
    let ml = wg_max_sum(lid, m, l);
    let inv = 1.0 / ml.y;
    for (var j = lid; j < u.t; j += WG) {
        var e = 0.0;
        if (j <= i) { e = exp(s[base + j] - ml.x) * inv; }
        p[base + j] = e;
    }
}

// ds = p * (dp - sum_j p*dp) over the unmasked j <= i; 0 where masked.
@compute @workgroup_size(64)
fn causal_backward_row(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= u.rows) { return; }
    let i = r % u.t;
    let base = r * u.t;
    var dot = 0.0;
    for (var j = 0u; j <= i; j++) { dot += p_in[base + j] * dp[base + j]; }
    for (var j = 0u; j < u.t; j++) {
        var g = 0.0;
        if (j <= i) { g = p_in[base + j] * (dp[base + j] - dot); }
        ds[base + j] = g;
    }
}

@compute @workgroup_size(256)
fn causal_backward_wg(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let r = wid.x + wid.y * nwg.x;
    if (r >= u.rows) { return; }
    let i = r % u.t;
    let base = r * u.t;
    var part = 0.0;
    for (var j = lid; j <= i; j += WG) { part += p_in[base + j] * dp[base + j]; }
    let dot = wg_sum(lid, part);
    for (var j = lid; j < u.t; j += WG) {
        var g = 0.0;
        if (j <= i) { g = p_in[base + j] * (dp[base + j] - dot); }
        ds[base + j] = g;
    }
}
