// JAX's Threefry-2x32 random bits and dropout, bit-exact with crate/src/rng.
//
// One launch serves every simulated device: device d generates one block of the global
// array (block start in offsets[4d..4d+4], the same block size for all) into elements
// [d * n_block, (d + 1) * n_block) of its output, with the key pair at key[d * key_stride]
// (key_stride 0: one key shared by all devices). Shapes arrive canonicalized to rank 4.
// The key lives in a storage buffer the host rewrites each step, so a launch is replayed.
//
// Threefry, the layouts and the element's counters come from the prelude (threefry.wgsl).

struct Params {
    n_global: u32,              // elements of the global array (< 2^32 - 1)
    n_block: u32,               // elements of each device's block
    n_dev: u32,                 // devices (blocks) in this launch
    rng_layout: u32,            // 0 original, 1 partitionable
    keep: f32,                  // dropout keep probability 1 - rate
    key_stride: u32,            // words between devices' keys: 0 (shared) or 2
    scale: f32,                 // dropout scale 1 / keep, rounded on the host (as XLA does)
    pad0: u32,
    block_size: vec4<u32>,      // block extent per canonical dim (outermost first)
    global_stride: vec4<u32>,   // row-major strides of the canonical global shape
}

@group(0) @binding(0) var<storage, read> key: array<u32>;          // (n_dev or 1, 2)
@group(0) @binding(1) var<storage, read> x: array<f32>;            // (n_dev, n_block)
@group(0) @binding(2) var<storage, read_write> bits: array<u32>;   // (n_dev, n_block)
@group(0) @binding(3) var<storage, read_write> y: array<f32>;      // (n_dev, n_block)
@group(0) @binding(4) var<storage, read> offsets: array<u32>;      // (n_dev, 4) block starts
@group(0) @binding(5) var<uniform> p: Params;

const WG: u32 = 256u;

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// The random bits of element l of device d's block.
fn bits_at(d: u32, l: u32) -> u32 {
    let o = 4u * d;
    let start = vec4<u32>(offsets[o], offsets[o + 1u], offsets[o + 2u], offsets[o + 3u]);
    let g = block_element(l, start, p.block_size, p.global_stride);
    return counter_bits(key[d * p.key_stride], key[d * p.key_stride + 1u], g, p.n_global, p.rng_layout);
}

// Dropout of one element: keep ~ bernoulli(keep) from the element's bits, scaled by 1/keep
// (a multiplication, as XLA computes flax's x / keep_prob).
fn dropout_at(i: u32, v: f32) -> f32 {
    let d = i / p.n_block;
    let kept = uniform01(bits_at(d, i - d * p.n_block)) < p.keep;
    if (kept) {
        return v * p.scale;
    }
    return 0.0;
}

// bits = jax.random.bits(key, global shape, uint32)[block] for every device
@compute @workgroup_size(256)
fn random_bits(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= p.n_dev * p.n_block) { return; }
    let d = i / p.n_block;
    bits[i] = bits_at(d, i - d * p.n_block);
}

// random_bits where every device's block is the whole array in the original layout: one
// invocation per counter pair (j, j + h) writes both words of its hash, elements j and j + h (the
// same words bits_at gives them, from one hash instead of two).
@compute @workgroup_size(256)
fn random_bits_pairs(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let h = p.n_global - p.n_global / 2u;
    let i = index(gid, nwg);
    if (i >= p.n_dev * h) { return; }
    let d = i / h;
    let j = i - d * h;
    let second = j + h < p.n_global;
    let y2 = threefry(key[d * p.key_stride], key[d * p.key_stride + 1u], j, select(0u, j + h, second));
    bits[d * p.n_block + j] = y2.x;
    if (second) {
        bits[d * p.n_block + j + h] = y2.y;
    }
}

// y = keep ? x * (1 / keep_prob) : 0
@compute @workgroup_size(256)
fn dropout_forward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= p.n_dev * p.n_block) { return; }
    y[i] = dropout_at(i, x[i]);
}

// dx = keep ? dout * (1 / keep_prob) : 0, regenerating the forward's mask (x holds dout, y dx)
@compute @workgroup_size(256)
fn dropout_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= p.n_dev * p.n_block) { return; }
    y[i] = dropout_at(i, x[i]);
}

// out[2d .. 2d + 2] = jax.random.fold_in(key of device d, offsets[d]): the key of a
// dropout site (data = site), or of a device (data = axis_index). Keys in `bits`.
@compute @workgroup_size(64)
fn fold_in(@builtin(global_invocation_id) gid: vec3<u32>) {
    let d = gid.x;
    if (d >= p.n_dev) { return; }
    let kb = d * p.key_stride;
    let v = threefry(key[kb], key[kb + 1u], 0u, offsets[d]);
    bits[2u * d] = v.x;
    bits[2u * d + 1u] = v.y;
}
