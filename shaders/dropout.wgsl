// Applies a dropout mask given as JAX random bits (jax.random.bernoulli's construction):
// u = bitcast<f32>((bits >> 9) | 0x3f800000) - 1 in [0, 1); keep = u < keep_prob;
// out = keep ? x * scale : 0, scale = 1/keep_prob rounded to f32 (as XLA compiles flax's
// x / keep_prob). The backward applies the same bits to dy.

struct Params {
    n: u32,
    keep: f32,   // 1 - rate
    scale: f32,  // rng::keep_scale(keep)
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> bits: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn apply(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) { return; }
    let u = bitcast<f32>((bits[i] >> 9u) | 0x3f800000u) - 1.0;
    out[i] = select(0.0, x[i] * p.scale, u < p.keep);
}
