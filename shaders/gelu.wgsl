// GELU, tanh form (MODEL.md): out = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))).
// One invocation per element; ids fold into y past 65535 workgroups (see grid_1d). forward4 and
// backward4 take four elements per invocation as vec4s where n is a multiple of 4 and the
// bindings start on 16 bytes (on lavapipe every storage access is a per-lane loop); the same
// arithmetic per element.

struct Params {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> dout: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

const WG: u32 = 256u;
const S: f32 = 0.7978845608028654; // sqrt(2/pi)
const K: f32 = 0.044715;

// Some drivers compute tanh as (e^2u - 1) / (e^2u + 1), which is inf/inf = NaN for large |u|;
// |u| = 10 already rounds tanh to +-1 in f32, so clamping changes nothing else.
fn tanh_safe(u: f32) -> f32 {
    return tanh(clamp(u, -10.0, 10.0));
}

@compute @workgroup_size(256)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= p.n) { return; }
    let v = x[i];
    out[i] = 0.5 * v * (1.0 + tanh_safe(S * (v + K * v * v * v)));
}

// dx = dout * (0.5 * (1 + t) + 0.5 * x * (1 - t^2) * S * (1 + 3K x^2)),  t = tanh(S (x + K x^3))
@compute @workgroup_size(256)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= p.n) { return; }
    let v = x[i];
    let t = tanh_safe(S * (v + K * v * v * v));
    let local = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * S * (1.0 + 3.0 * K * v * v);
    dx[i] = dout[i] * local;
}

@group(0) @binding(10) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(11) var<storage, read_write> out4: array<vec4<f32>>;
@group(0) @binding(12) var<storage, read> dout4: array<vec4<f32>>;
@group(0) @binding(13) var<storage, read_write> dx4: array<vec4<f32>>;

fn tanh_safe4(u: vec4<f32>) -> vec4<f32> {
    return tanh(clamp(u, vec4(-10.0), vec4(10.0)));
}

@compute @workgroup_size(256)
fn forward4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = gid.x + gid.y * nwg.x * WG;
    if (j * 4u >= p.n) { return; }
    let v = x4[j];
    out4[j] = 0.5 * v * (1.0 + tanh_safe4(S * (v + K * v * v * v)));
}

@compute @workgroup_size(256)
fn backward4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = gid.x + gid.y * nwg.x * WG;
    if (j * 4u >= p.n) { return; }
    let v = x4[j];
    let t = tanh_safe4(S * (v + K * v * v * v));
    let local = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * S * (1.0 + 3.0 * K * v * v);
    dx4[j] = dout4[j] * local;
}
