// Embedding lookup and its gradient. table (D, V, C); ids (D, nl) u32; out, dout (D, nl, C),
// for D simulated devices (D = 1: one table), nl = N / D ids per device. Device d looks up
// and scatters into its own table block only.
// An id >= V is never used as an index: its output row is 0 and its gradient is dropped,
// so forward and backward stay exact adjoints.

struct Params {
    n: u32,       // ids of all devices, N
    v: u32,
    c: u32,
    groups: u32,  // backward: rows of a dtable block are split into `groups` runs of consecutive rows
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
// The same ids, dout and dtable as vec4s, for backward_v4; table and out for forward_v4.
@group(0) @binding(6) var<storage, read> ids4: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read> dout4: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> dtable4: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read> table4: array<vec4<f32>>;
@group(0) @binding(10) var<storage, read_write> out4: array<vec4<f32>>;

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

// forward, four columns per invocation where C is a multiple of 4: a quarter of the accesses,
// each a loop over the lanes on CPU drivers, and of the index divisions.
@compute @workgroup_size(256)
fn forward_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let c4 = p.c / 4u;
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.n * c4) { return; }
    let i = e / c4;
    let id = ids[i];
    var val = vec4(0.0);
    if (id < p.v) { val = table4[((i / p.nl) * p.v + id) * c4 + e % c4]; }
    out4[e] = val;
}

// Rows lo .. hi of a dtable block: run g of `groups` runs of consecutive rows. A range test
// per id, where `id % groups` cost CPU drivers a division per lane (no vector integer divide).
fn run_of(g: u32) -> vec2<u32> {
    let span = (p.v + p.groups - 1u) / p.groups;
    return vec2(min(g * span, p.v), min(g * span + span, p.v));
}

// dtable[d, v, c] = sum over device d's ids i with ids[i] == v of dout[i, c],
// deterministically, without atomics: invocation (d, g, c) owns column c of run g of the rows
// of block d (run_of). It zeroes them, then walks device d's ids in order adding the matching
// dout rows, so each sum has a fixed order and no two invocations write the same element.
// `groups` trades parallelism (D * groups * C invocations) against redundant id reads (each
// invocation reads all nl ids of its device). Workgroups of 64, so that few invocations still
// make enough workgroups to spread over a CPU driver's threads.
@compute @workgroup_size(64)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * 64u;
    if (e >= p.devices * p.groups * p.c) { return; }
    let d = e / (p.groups * p.c);
    let run = run_of((e / p.c) % p.groups);
    let col = e % p.c;
    let block = d * p.v * p.c; // device d's dtable block
    for (var v = run.x; v < run.y; v++) {
        dtable[block + v * p.c + col] = 0.0;
    }
    for (var i = d * p.nl; i < (d + 1u) * p.nl; i++) {
        let id = ids[i];
        if (id >= run.x && id < run.y) {
            dtable[block + id * p.c + col] += dout[i * p.c + col];
        }
    }
}

// backward with four columns per invocation and four ids per read, where C and N / D are
// multiples of 4: the same sums in the same order (each column's adds are backward's), with a
// quarter of the id reads and of the dtable and dout accesses, each of which a CPU driver runs
// as a loop over the lanes. Invocation (d, g, c4) owns columns 4 c4 .. 4 c4 + 3.
@compute @workgroup_size(64)
fn backward_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let c4 = p.c / 4u;
    let e = gid.x + gid.y * nwg.x * 64u;
    if (e >= p.devices * p.groups * c4) { return; }
    let d = e / (p.groups * c4);
    let run = run_of((e / c4) % p.groups);
    let col = e % c4;
    let block = d * p.v * c4; // device d's dtable block, in vec4s
    for (var v = run.x; v < run.y; v++) {
        dtable4[block + v * c4 + col] = vec4(0.0);
    }
    let nl4 = p.nl / 4u;
    for (var i4 = d * nl4; i4 < (d + 1u) * nl4; i4++) {
        let four = ids4[i4];
        for (var k = 0u; k < 4u; k++) {
            let id = four[k];
            if (id >= run.x && id < run.y) {
                let row = dtable4[block + id * c4 + col];
                dtable4[block + id * c4 + col] = row + dout4[(4u * i4 + k) * c4 + col];
            }
        }
    }
}
