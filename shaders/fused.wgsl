// Fused elementwise chains: one pass over memory and one dispatch where the unfused program
// makes two (the executor's lowering recognises the pairs; crate/src/exec/gpu/fuse.rs). Each
// entry computes exactly what the two kernels it replaces compute, in the same order, so the
// results round the same (CPU twins: crate/src/reference/fused.rs).
// With D simulated devices, the full-size operands are (D, nl) and the bias (D, nb): element i
// meets bias[(i / nl) * nb + i % nb], its device's block (as elementwise.wgsl's `add`).
// One invocation per element; ids fold into y past 65535 workgroups (see grid_1d). The entries
// ending in 4 take four elements per invocation as vec4s, where n and the bias period are
// multiples of 4 and the bindings start on 16 bytes: on lavapipe every storage access is a
// per-lane loop, so a vec4 moves four elements for the price of one. Same arithmetic per element.

struct Params {
    n: u32,      // elements of the full-size operands, all devices
    nb: u32,     // period of the bias within one device
    nl: u32,     // elements per device (n / D)
    keep: f32,   // dropout: 1 - rate
    scale: f32,  // dropout: rng::keep_scale(keep)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;          // (D, nl)
@group(0) @binding(1) var<storage, read> bias: array<f32>;       // (D, nb)
@group(0) @binding(2) var<storage, read> residual: array<f32>;   // (D, nl)
@group(0) @binding(3) var<storage, read> bits: array<u32>;       // (D, nl)
@group(0) @binding(4) var<storage, read_write> pre: array<f32>;  // (D, nl)
@group(0) @binding(5) var<storage, read_write> out: array<f32>;  // (D, nl)
@group(0) @binding(6) var<uniform> p: Params;

const WG: u32 = 256u;
const S: f32 = 0.7978845608028654; // sqrt(2/pi)
const K: f32 = 0.044715;

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

fn bias_at(i: u32) -> f32 {
    return bias[(i / p.nl) * p.nb + i % p.nb];
}

// As gelu.wgsl's: tanh of a clamped argument (inf/inf on some drivers otherwise).
fn tanh_safe(u: f32) -> f32 {
    return tanh(clamp(u, -10.0, 10.0));
}

// pre = a + bias; out = gelu(pre)   (add then gelu; the backward reads pre)
@compute @workgroup_size(256)
fn bias_gelu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= p.n) { return; }
    let v = a[i] + bias_at(i);
    pre[i] = v;
    out[i] = 0.5 * v * (1.0 + tanh_safe(S * (v + K * v * v * v)));
}

// out = residual + (a + bias)   (add then the residual add)
@compute @workgroup_size(256)
fn bias_residual(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= p.n) { return; }
    out[i] = residual[i] + (a[i] + bias_at(i));
}

// out = residual + dropout(a)   (dropout.wgsl's `apply`, then the residual add)
@compute @workgroup_size(256)
fn dropout_residual(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= p.n) { return; }
    let u = bitcast<f32>((bits[i] >> 9u) | 0x3f800000u) - 1.0;
    out[i] = residual[i] + select(0.0, a[i] * p.scale, u < p.keep);
}

// ---- four elements per invocation ----

@group(0) @binding(10) var<storage, read> a4: array<vec4<f32>>;
@group(0) @binding(11) var<storage, read> bias4: array<vec4<f32>>;
@group(0) @binding(12) var<storage, read> residual4: array<vec4<f32>>;
@group(0) @binding(13) var<storage, read> bits4: array<vec4<u32>>;
@group(0) @binding(14) var<storage, read_write> pre4: array<vec4<f32>>;
@group(0) @binding(15) var<storage, read_write> out4: array<vec4<f32>>;

// The bias of elements 4 j .. 4 j + 3 (nb a multiple of 4: one block of the bias).
fn bias4_at(j: u32) -> vec4<f32> {
    let i = j * 4u;
    return bias4[((i / p.nl) * p.nb + i % p.nb) / 4u];
}

@compute @workgroup_size(256)
fn bias_gelu4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = index(gid, nwg);
    if (j * 4u >= p.n) { return; }
    let v = a4[j] + bias4_at(j);
    pre4[j] = v;
    out4[j] = 0.5 * v * (1.0 + tanh(clamp(S * (v + K * v * v * v), vec4(-10.0), vec4(10.0))));
}

@compute @workgroup_size(256)
fn bias_residual4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = index(gid, nwg);
    if (j * 4u >= p.n) { return; }
    out4[j] = residual4[j] + (a4[j] + bias4_at(j));
}

@compute @workgroup_size(256)
fn dropout_residual4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = index(gid, nwg);
    if (j * 4u >= p.n) { return; }
    let u = bitcast<vec4<f32>>((bits4[j] >> vec4(9u)) | vec4(0x3f800000u)) - 1.0;
    out4[j] = residual4[j] + select(vec4(0.0), a4[j] * p.scale, u < vec4(p.keep));
}
