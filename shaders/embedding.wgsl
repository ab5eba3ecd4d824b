// Embedding lookup and its gradient. table (V, C); ids (N) u32; out, dout (N, C).
// An id >= V is never used as an index: its output row is 0 and its gradient is dropped,
// so forward and backward stay exact adjoints.

struct Params {
    n: u32,
    v: u32,
    c: u32,
    groups: u32, // backward: rows of dtable are split into `groups` classes by id % groups
}

@group(0) @binding(0) var<storage, read> table: array<f32>;        // (V, C)
@group(0) @binding(1) var<storage, read> ids: array<u32>;          // (N)
@group(0) @binding(2) var<storage, read_write> out: array<f32>;    // (N, C)
@group(0) @binding(3) var<storage, read> dout: array<f32>;         // (N, C)
@group(0) @binding(4) var<storage, read_write> dtable: array<f32>; // (V, C)
@group(0) @binding(5) var<uniform> p: Params;

const WG: u32 = 256u;

// out[i, c] = table[ids[i], c]; one invocation per output element.
@compute @workgroup_size(256)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.n * p.c) { return; }
    let i = e / p.c;
    let col = e % p.c;
    let id = ids[i];
    var val = 0.0;
    if (id < p.v) { val = table[id * p.c + col]; }
    out[e] = val;
}

// dtable[v, c] = sum over i with ids[i] == v of dout[i, c], deterministically, without atomics:
// invocation (g, c) owns column c of every row v with v % groups == g. It zeroes them, then
// walks the ids in order adding the matching dout rows, so each sum has a fixed order and no
// two invocations write the same element. `groups` trades parallelism (groups * C
// invocations) against redundant id reads (each invocation reads all N ids).
@compute @workgroup_size(256)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.groups * p.c) { return; }
    let g = e / p.c;
    let col = e % p.c;
    for (var v = g; v < p.v; v += p.groups) {
        dtable[v * p.c + col] = 0.0;
    }
    for (var i = 0u; i < p.n; i++) {
        let id = ids[i];
        if (id < p.v && id % p.groups == g) {
            dtable[id * p.c + col] += dout[i * p.c + col];
        }
    }
}
