// Cross-entropy of logits (rows, V) against u32 targets (rows):
//   losses[r] = logsumexp(logits[r]) - logits[r, target[r]]
//   dlogits[r] = (softmax(logits[r]) - onehot(target[r])) * dlosses[r]
// A target >= V contributes nothing (loss 0, dlogits 0, like an ignored position) and is
// never used as an index. logsumexp keeps a running max, so large logits do not overflow.
// Row kernels come in two variants (see RowStrategy): `*_row` one invocation per row with a
// single online max/sum pass, `*_wg` one 256-wide workgroup per row reducing in workgroup
// memory (rows.wgsl, composed in front). Row ids fold into y past 65535 workgroups.

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
// logits and dlogits as vec4s, for the `*_row4` entry points (V a multiple of 4).
@group(0) @binding(6) var<storage, read> logits4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> dlogits4: array<vec4<f32>>;

// (max, sum of exp(logit - max)) over columns lid, lid + stride, ... of row `base`.
fn max_sum(base: u32, first: u32, stride: u32) -> vec2<f32> {
    var ml = vec2<f32>(LOWEST, 0.0);
    for (var j = first; j < p.v; j += stride) { ml = online_max_sum(ml, logits[base + j]); }
    return ml;
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

// forward_row and backward_row four columns at a time, where V is a multiple of 4: a quarter of
// the storage accesses, each a loop over the lanes on CPU drivers; the same arithmetic in the
// same order, element by element.

// max_sum over row r, read as vec4s.
fn max_sum4(base4: u32) -> vec2<f32> {
    var ml = vec2<f32>(LOWEST, 0.0);
    for (var j = 0u; j < p.v / 4u; j++) {
        let x = logits4[base4 + j];
        ml = online_max_sum(ml, x.x);
        ml = online_max_sum(ml, x.y);
        ml = online_max_sum(ml, x.z);
        ml = online_max_sum(ml, x.w);
    }
    return ml;
}

@compute @workgroup_size(64)
fn forward_row4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= p.rows) { return; }
    let tgt = targets[r];
    if (tgt >= p.v) {
        losses[r] = 0.0;
        return;
    }
    let base4 = r * (p.v / 4u);
    let ml = max_sum4(base4);
    losses[r] = ml.x + log(ml.y) - logits4[base4 + tgt / 4u][tgt % 4u];
}

@compute @workgroup_size(64)
fn backward_row4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= p.rows) { return; }
    let v4 = p.v / 4u;
    let base4 = r * v4;
    let tgt = targets[r];
    if (tgt >= p.v) {
        for (var j = 0u; j < v4; j++) { dlogits4[base4 + j] = vec4(0.0); }
        return;
    }
    let ml = max_sum4(base4);
    let dl = dlosses[r];
    let scale = dl / ml.y;
    for (var j = 0u; j < v4; j++) {
        let g = exp(logits4[base4 + j] - ml.x) * scale;
        // dl off the target's element, as backward_row's `g -= dl` (x - 0 is x).
        let hit = vec4(4u * j) + vec4(0u, 1u, 2u, 3u) == vec4(tgt);
        dlogits4[base4 + j] = g - select(vec4(0.0), vec4(dl), hit);
    }
}
