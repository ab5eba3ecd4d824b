// Sum over the middle axis: x (outer, n, inner) -> out (outer, inner). Bias gradients are
// sum_axis(dy, 1, B*T, C).
// Up to 16 chunks of rows, one launch (`sum_axis_chunks`): an invocation per output adds each
// chunk's rows in order from 0.0, then the chunks in order, the arithmetic of the two stages
// below. Longer sums take two stages, so the work spreads over many invocations even when there are few outputs (a
// bias gradient has C of them): the rows split into chunks of `chunk`, stage 1 writes each
// chunk's sum, partial (outer, chunks, inner), and stage 2 (`sum_axis`, n = chunks) adds the
// chunks up in order. With one chunk, stage 1 writes `out` directly. Deterministic: a fixed
// order everywhere, no atomics.
// Stage 1 comes in two variants (RowStrategy): `sum_axis_partial_row`, one invocation per
// (chunk, output) summing its rows in order (CPU drivers, where barriers are coroutines), and
// `sum_axis_partial_wg`, a workgroup per (chunk, 64 outputs) whose 4 lanes per output sum
// interleaved rows and combine in workgroup memory (GPUs: coalesced loads, 4x the lanes).
// Ids fold into y past 65535 workgroups (see grid_1d).

struct Params {
    outer: u32,
    n: u32,
    inner: u32,
    chunk: u32,   // rows per chunk (stage 1)
    chunks: u32,  // ceil(n / chunk)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;          // (outer, n, inner)
@group(0) @binding(1) var<storage, read_write> out: array<f32>;  // (outer, inner), or stage 1's (outer, chunks, inner)
@group(0) @binding(2) var<uniform> p: Params;

const WG: u32 = 256u;
const COLS: u32 = 64u;   // outputs per workgroup of `sum_axis_partial_wg`
const LANES: u32 = 4u;   // lanes per output (WG = COLS * LANES)

var<workgroup> lanes: array<f32, 256>;

// One invocation per output, looping over n in order; adjacent invocations read adjacent
// floats. Stage 2, and the whole sum when n is small.
@compute @workgroup_size(256)
fn sum_axis(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= p.outer * p.inner) { return; }
    let o = i / p.inner;
    let k = i % p.inner;
    var acc = 0.0;
    var at = o * p.n * p.inner + k;
    for (var j = 0u; j < p.n; j++) {
        acc += x[at];
        at += p.inner;
    }
    out[i] = acc;
}

// The sum of output i chunk by chunk, as stage 1 (`_row`) and stage 2 add it.
@compute @workgroup_size(64)
fn sum_axis_chunks(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= p.outer * p.inner) { return; }
    var acc = 0.0;
    for (var c = 0u; c < p.chunks; c++) {
        let r0 = c * p.chunk;
        acc += column_sum(i, r0, min(r0 + p.chunk, p.n), 1u);
    }
    out[i] = acc;
}

// The sum of rows [r0, r1) of output i = (o, k), `stride` rows apart from r0.
fn column_sum(i: u32, r0: u32, r1: u32, stride: u32) -> f32 {
    let o = i / p.inner;
    let k = i % p.inner;
    var acc = 0.0;
    for (var r = r0; r < r1; r += stride) {
        acc += x[(o * p.n + r) * p.inner + k];
    }
    return acc;
}

// Where chunk c's sum of output i = (o, k) goes: (outer, chunks, inner).
fn partial_index(i: u32, c: u32) -> u32 {
    return ((i / p.inner) * p.chunks + c) * p.inner + i % p.inner;
}

@compute @workgroup_size(64)
fn sum_axis_partial_row(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * 64u; // (chunk, output)
    let outputs = p.outer * p.inner;
    if (e >= outputs * p.chunks) { return; }
    let c = e / outputs;
    let i = e % outputs;
    let r0 = c * p.chunk;
    out[partial_index(i, c)] = column_sum(i, r0, min(r0 + p.chunk, p.n), 1u);
}

@compute @workgroup_size(256)
fn sum_axis_partial_wg(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    // Uniform per workgroup: which chunk and which 64 outputs. No early return: every
    // invocation reaches the barriers (out-of-range lanes add 0).
    let outputs = p.outer * p.inner;
    let tiles = (outputs + COLS - 1u) / COLS;
    let w = wid.x + wid.y * nwg.x;
    let c = w / tiles;
    let i = (w % tiles) * COLS + lid % COLS;
    let lane = lid / COLS;
    let r0 = c * p.chunk;
    var acc = 0.0;
    if (c < p.chunks && i < outputs) {
        acc = column_sum(i, r0 + lane, min(r0 + p.chunk, p.n), LANES);
    }
    lanes[lid] = acc;
    workgroupBarrier();
    if (lane < 2u) { lanes[lid] += lanes[lid + 2u * COLS]; }
    workgroupBarrier();
    if (lane == 0u && c < p.chunks && i < outputs) {
        out[partial_index(i, c)] = lanes[lid] + lanes[lid + COLS];
    }
}

// sum_axis4 and sum_axis_partial_row4: the same sums, four adjacent outputs per invocation, where
// inner is a multiple of 4 and the bindings start on 16 bytes. On lavapipe every storage access is
// a per-lane loop, so a vec4 reads four outputs' elements for the price of one. Each output still
// adds its rows one by one, in order: the same arithmetic as sum_axis and sum_axis_partial_row.
@group(0) @binding(3) var<storage, read> x4: array<vec4<f32>>;          // (outer, n, inner / 4)
@group(0) @binding(4) var<storage, read_write> out4: array<vec4<f32>>;  // (outer, inner / 4), or (outer, chunks, inner / 4)

@compute @workgroup_size(256)
fn sum_axis4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG; // (o, k): outputs 4k .. 4k+3 of o
    let inner4 = p.inner / 4u;
    if (i >= p.outer * inner4) { return; }
    var acc = vec4<f32>(0.0);
    var at = (i / inner4) * p.n * inner4 + i % inner4;
    for (var j = 0u; j < p.n; j++) {
        acc += x4[at];
        at += inner4;
    }
    out4[i] = acc;
}

@compute @workgroup_size(64)
fn sum_axis_partial_row4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * 64u; // (chunk, (o, k))
    let inner4 = p.inner / 4u;
    let outputs = p.outer * inner4;
    if (e >= outputs * p.chunks) { return; }
    let c = e / outputs;
    let o = (e % outputs) / inner4;
    let k = e % inner4;
    let r0 = c * p.chunk;
    var acc = vec4<f32>(0.0);
    for (var r = r0; r < min(r0 + p.chunk, p.n); r++) {
        acc += x4[(o * p.n + r) * inner4 + k];
    }
    out4[(o * p.chunks + c) * inner4 + k] = acc;
}

// sum_axis_chunks four adjacent outputs at a time.
@compute @workgroup_size(64)
fn sum_axis_chunks4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u; // (o, k): outputs 4k .. 4k+3 of o
    let inner4 = p.inner / 4u;
    if (i >= p.outer * inner4) { return; }
    let o = i / inner4;
    let k = i % inner4;
    var acc = vec4<f32>(0.0);
    for (var c = 0u; c < p.chunks; c++) {
        let r0 = c * p.chunk;
        var part = vec4<f32>(0.0);
        for (var r = r0; r < min(r0 + p.chunk, p.n); r++) {
            part += x4[(o * p.n + r) * inner4 + k];
        }
        acc += part;
    }
    out4[i] = acc;
}
