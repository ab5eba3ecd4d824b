// Sum over the middle axis: x (outer, n, inner) -> out (outer, inner).
// Bias gradients are sum_axis(dy, 1, B*T, C). One invocation per output element, looping
// over n in order: deterministic (no atomics), and adjacent invocations read adjacent
// floats, so loads coalesce on GPUs. Ids fold into y past 65535 workgroups (see grid_1d).

struct Params {
    outer: u32,
    n: u32,
    inner: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;          // (outer, n, inner)
@group(0) @binding(1) var<storage, read_write> out: array<f32>;  // (outer, inner)
@group(0) @binding(2) var<uniform> p: Params;

const WG: u32 = 256u;

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
