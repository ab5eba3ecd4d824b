// Optimizer updates, in place over flat f32 parameters (param is one read_write binding).
// One launch may cover many parameters packed in arenas (param, grad, m and v laid out alike),
// each starting on a 256-element block, so a block has one weight decay: `decay[block]`.
// Step-dependent scalars come from `hyper`, a small storage buffer the host rewrites each
// step (layouts: crate/src/kernels/optimizer.rs), so a launch is built once and replayed.

struct Params {
    n: u32,               // elements of param, grad, m, v
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<storage, read_write> param: array<f32>;
@group(0) @binding(1) var<storage, read> grad: array<f32>;
@group(0) @binding(2) var<storage, read_write> m: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<storage, read> hyper: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;
@group(0) @binding(6) var<storage, read> decay: array<f32>;

const WG: u32 = 256u;

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// param -= lr * grad          hyper: [lr]
@compute @workgroup_size(256)
fn sgd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= p.n) { return; }
    param[i] = param[i] - hyper[0] * grad[i];
}

// AdamW as optax computes it (MODEL.md), wd = decay[i / 256]:
//   m = (1-b1) g + b1 m;  v = (1-b2) g^2 + b2 v;  mhat = m / (1-b1^t);  vhat = v / (1-b2^t)
//   param -= lr * (mhat / (sqrt(vhat) + eps) + wd * param)
// hyper: [lr, b1, b2, eps, 1-b1, 1-b2, 1-b1^t, 1-b2^t]
@compute @workgroup_size(256)
fn adamw(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= p.n) { return; }
    let lr = hyper[0];
    let b1 = hyper[1];
    let b2 = hyper[2];
    let eps = hyper[3];
    let g = grad[i];
    let mi = hyper[4] * g + b1 * m[i];
    let vi = hyper[5] * (g * g) + b2 * v[i];
    m[i] = mi;
    v[i] = vi;
    let mhat = mi / hyper[6];
    let vhat = vi / hyper[7];
    let w = param[i];
    let wd = decay[i / WG];
    param[i] = w - lr * (mhat / (sqrt(vhat) + eps) + wd * w);
}

// adamw4: adamw four elements per invocation as vec4s, where n is a multiple of 4 and the
// bindings start on 16 bytes (on lavapipe every storage access is a per-lane loop, and each
// element of adamw makes seven). The same arithmetic per element; a block of 256 elements is
// 64 vec4s, so wd = decay[j / 64].
@group(0) @binding(10) var<storage, read_write> param4: array<vec4<f32>>;
@group(0) @binding(11) var<storage, read> grad4: array<vec4<f32>>;
@group(0) @binding(12) var<storage, read_write> m4: array<vec4<f32>>;
@group(0) @binding(13) var<storage, read_write> v4: array<vec4<f32>>;

@compute @workgroup_size(256)
fn adamw4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = index(gid, nwg);
    if (j * 4u >= p.n) { return; }
    let lr = hyper[0];
    let b1 = hyper[1];
    let b2 = hyper[2];
    let eps = hyper[3];
    let g = grad4[j];
    let mi = hyper[4] * g + b1 * m4[j];
    let vi = hyper[5] * (g * g) + b2 * v4[j];
    m4[j] = mi;
    v4[j] = vi;
    let mhat = mi / hyper[6];
    let vhat = vi / hyper[7];
    let w = param4[j];
    let wd = decay[j / (WG / 4u)];
    param4[j] = w - lr * (mhat / (sqrt(vhat) + eps) + wd * w);
}
