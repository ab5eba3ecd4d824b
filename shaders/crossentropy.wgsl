// Cross-entropy of logits (rows, V) against u32 targets (rows):
//   losses[r] = logsumexp(logits[r]) - logits[r, target[r]]
//   dlogits[r] = (softmax(logits[r]) - onehot(target[r])) * dlosses[r]
// A target >= V contributes nothing (loss 0, dlogits 0, like an ignored position) and is
// never used as an index. logsumexp keeps a running max, so large logits do not overflow.
// Row kernels come in two variants (see RowStrategy): `*_row` one invocation per row with a
// single online max/sum pass, `*_wg` one 256-wide workgroup per row reducing in workgroup
// memory. Row ids fold into y past 65535 workgroups.

struct Params {
    rows: u32,
    v: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;         // (rows, V)
@group(0) @binding(1) var<storage, read> targets: array<u32>;        // (rows)
@group(0) @binding(2) var<storage, read_write> losses: array<f32>;   // (rows)
@group(0) @binding(3) var<storage, read> dlosses: array<f32>;        // (rows)
@group(0) @binding(4) var<storage, read_write> dlogits: array<f32>;  // (rows, V)
@group(0) @binding(5) var<uniform> p: Params;

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

// (max, sum of exp(logit - max)) over columns lid, lid + stride, ... of row `base`.
fn max_sum(base: u32, first: u32, stride: u32) -> vec2<f32> {
    var m = LOWEST;
    var l = 0.0;
    for (var j = first; j < p.v; j += stride) {
        let x = logits[base + j];
        if (x > m) {
            l = l * exp(m - x) + 1.0;
            m = x;
        } else {
            l += exp(x - m);
        }
    }
    return vec2<f32>(m, l);
}

@compute @workgroup_size(64)
fn forward_row(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= p.rows) { return; }
    let tgt = targets[r];
    if (tgt >= p.v) {
        losses[r] = 0.0;
        return;
    }
    let base = r * p.v;
    let ml = max_sum(base, 0u, 1u);
    losses[r] = ml.x + log(ml.y) - logits[base + tgt];
}

@compute @workgroup_size(256)
fn forward_wg(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let r = wid.x + wid.y * nwg.x; // uniform: the early return keeps barriers uniform
    if (r >= p.rows) { return; }
    let base = r * p.v;
    let part = max_sum(base, lid, WG);
    let ml = wg_max_sum(lid, part.x, part.y);
    if (lid == 0u) {
        let tgt = targets[r];
        var loss = 0.0;
        if (tgt < p.v) { loss = ml.x + log(ml.y) - logits[base + tgt]; }
        losses[r] = loss;
    }
}

@compute @workgroup_size(64)
fn backward_row(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= p.rows) { return; }
    let base = r * p.v;
    let tgt = targets[r];
    if (tgt >= p.v) {
        for (var j = 0u; j < p.v; j++) { dlogits[base + j] = 0.0; }
        return;
    }
    let ml = max_sum(base, 0u, 1u);
    let scale = dlosses[r] / ml.y;
    for (var j = 0u; j < p.v; j++) {
        var g = exp(logits[base + j] - ml.x) * scale;
        if (j == tgt) { g -= dlosses[r]; }
        dlogits[base + j] = g;
    }
}

@compute @workgroup_size(256)
fn backward_wg(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let r = wid.x + wid.y * nwg.x;
    if (r >= p.rows) { return; }
    let base = r * p.v;
    let part = max_sum(base, lid, WG);
    let ml = wg_max_sum(lid, part.x, part.y);
    let tgt = targets[r];
    var dl = dlosses[r];
    if (tgt >= p.v) { dl = 0.0; }
    let scale = dl / ml.y;
    for (var j = lid; j < p.v; j += WG) {
        var g = exp(logits[base + j] - ml.x) * scale;
        if (j == tgt) { g -= dl; }
        dlogits[base + j] = g;
    }
}
