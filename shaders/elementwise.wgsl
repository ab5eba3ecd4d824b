// Elementwise kernels over flat f32 arrays. `b` broadcasts with period `nb`
// (b[i % nb]), which covers bias-like operands repeated over leading dims.
// With D simulated devices, a and out are (D, nl) and b is (D, nb): device d = i / nl reads
// its own block of b, b[d * nb + i % nb] (nb divides nl, so i % nb is the local offset's).
// One invocation per element; ids fold into y past 65535 workgroups (see grid_1d).

struct Params {
    n: u32,      // elements of `a` and `out`, all devices
    nb: u32,     // period of `b` within one device (nl for same shape, 1 for a scalar)
    alpha: f32,
    beta: f32,
    nl: u32,     // elements of `a` per device (n / D)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;      // (D, nl)
@group(0) @binding(1) var<storage, read> b: array<f32>;      // (D, nb)
@group(0) @binding(2) var<storage, read_write> out: array<f32>; // (D, nl)
@group(0) @binding(3) var<uniform> p: Params;

const WG: u32 = 256u;

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// The element of `b` that element i of `a` meets: its device's block, period nb.
fn b_index(i: u32) -> u32 {
    return (i / p.nl) * p.nb + i % p.nb;
}

// out = alpha * a + beta * b
@compute @workgroup_size(256)
fn add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= p.n) { return; }
    out[i] = p.alpha * a[i] + p.beta * b[b_index(i)];
}

// out = alpha * a * b
@compute @workgroup_size(256)
fn mul(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= p.n) { return; }
    out[i] = p.alpha * a[i] * b[b_index(i)];
}

// add4 and mul4: add and mul four elements at a time, where n, nl and nb are multiples of 4 and
// the bindings start on 16 bytes. On lavapipe every storage access is a per-lane loop, so a vec4
// moves four elements for the price of one. The same arithmetic per element as add and mul.
@group(0) @binding(4) var<storage, read> a4: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> b4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> out4: array<vec4<f32>>;

@compute @workgroup_size(256)
fn add4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i * 4u >= p.n) { return; }
    out4[i] = p.alpha * a4[i] + p.beta * b4[b_index(i * 4u) / 4u];
}

@compute @workgroup_size(256)
fn mul4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i * 4u >= p.n) { return; }
    out4[i] = p.alpha * a4[i] * b4[b_index(i * 4u) / 4u];
}

// out = alpha * a + beta   (b unbound)
@compute @workgroup_size(256)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= p.n) { return; }
    out[i] = p.alpha * a[i] + p.beta;
}

// out = beta   (a and b unbound): constants, zero cotangents
@compute @workgroup_size(256)
fn fill(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= p.n) { return; }
    out[i] = p.beta;
}

// out = beta on the devices a pipeline stage's work skipped (`b`, one flag per device: nonzero
// where device i / nl keeps zeros), leaving the others' blocks; `a` unbound. Any 4-byte data:
// zero is the same bits in f32 and u32.
@compute @workgroup_size(256)
fn fill_blocks(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= p.n) { return; }
    if (b[i / p.nl] != 0.0) {
        out[i] = p.beta;
    }
}
