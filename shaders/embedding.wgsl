// Embedding lookup and its gradient. table (D, V, C); ids (D, nl) u32; out, dout (D, nl, C),
// for D simulated devices (D = 1: one table), nl = N / D ids per device. Device d looks up
// and scatters into its own table block only.
// An id >= V is never used as an index: its output row is 0 and its gradient is dropped,
// so forward and backward stay exact adjoints.

struct Params {
    n: u32,       // ids of all devices, N
    v: u32,
    c: u32,
    groups: u32,  // backward: rows of a dtable block are split into `groups` classes by id % groups
    nl: u32,      // ids per device, N / D
    devices: u32, // D
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> table: array<f32>;        // (D, V, C)
@group(0) @binding(1) var<storage, read> ids: array<u32>;          // (D, nl)
@group(0) @binding(2) var<storage, read_write> out: array<f32>;    // (D, nl, C)
@group(0) @binding(3) var<storage, read> dout: array<f32>;         // (D, nl, C)
@group(0) @binding(4) var<storage, read_write> dtable: array<f32>; // (D, V, C)
@group(0) @binding(5) var<uniform> p: Params;

const WG: u32 = 256u;

// out[i, c] = table[d, ids[i], c], d = i / nl; one invocation per output element.
@compute @workgroup_size(256)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.n * p.c) { return; }
    let i = e / p.c;
    let col = e % p.c;
    let id = ids[i];
    var val = 0.0;
    if (id < p.v) { val = table[((i / p.nl) * p.v + id) * p.c + col]; }
    out[e] = val;
}

// dtable[d, v, c] = sum over device d's ids i with ids[i] == v of dout[i, c],
// deterministically, without atomics: invocation (d, g, c) owns column c of every row v of
// block d with v % groups == g. It zeroes them, then walks device d's ids in order adding the
// matching dout rows, so each sum has a fixed order and no two invocations write the same
// element. `groups` trades parallelism (D * groups * C invocations) against redundant id
// reads (each invocation reads all nl ids of its device). Workgroups of 64, so that few
// invocations still make enough workgroups to spread over a CPU driver's threads.
@compute @workgroup_size(64)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * 64u;
    if (e >= p.devices * p.groups * p.c) { return; }
    let d = e / (p.groups * p.c);
    let g = (e / p.c) % p.groups;
    let col = e % p.c;
    let block = d * p.v * p.c; // device d's dtable block
    for (var v = g; v < p.v; v += p.groups) {
        dtable[block + v * p.c + col] = 0.0;
    }
    for (var i = d * p.nl; i < (d + 1u) * p.nl; i++) {
        let id = ids[i];
        if (id < p.v && id % p.groups == g) {
            dtable[block + id * p.c + col] += dout[i * p.c + col];
        }
    }
}
