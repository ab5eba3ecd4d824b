// Causal softmax of attention scores: s, p viewed (rows, T), rows = B*H*T, the query of row
// r is i = r % T, and columns j > i are masked (p = 0 there; MODEL.md's -1e30 before the
// softmax gives the same). No scaling here: the matmul applies 1/sqrt(Dh).
// Row kernels come in two variants (see RowStrategy): `*_row` one invocation per row with
// a single online max/sum pass, `*_wg` one 256-wide workgroup per row reducing in workgroup
// memory (rows.wgsl, composed in front). Row ids fold into y past 65535 workgroups.

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

@compute @workgroup_size(64)
fn causal_forward_row(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= u.rows) { return; }
    let i = r % u.t;
    let base = r * u.t;
    var ml = vec2<f32>(LOWEST, 0.0);
    for (var j = 0u; j <= i; j++) { ml = online_max_sum(ml, s[base + j]); }
    let inv = 1.0 / ml.y;
    for (var j = 0u; j < u.t; j++) {
        var e = 0.0;
        if (j <= i) { e = exp(s[base + j] - ml.x) * inv; }
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
    var part = vec2<f32>(LOWEST, 0.0);
    for (var j = lid; j <= i; j += WG) { part = online_max_sum(part, s[base + j]); }
    let ml = wg_max_sum(lid, part.x, part.y);
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
