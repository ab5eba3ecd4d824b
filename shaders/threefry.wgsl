// Prelude: JAX's Threefry-2x32 and the bits of one element of a block of a global array,
// bit-exact with crate/src/rng. random.wgsl (the bits kernels) and attention.wgsl (dropout bits
// drawn inside the fused kernels) compose it, so both draw the same mask from the same counters.
//
// Layouts (see crate/src/rng): original (0): element g of the flattened global array of
// n_global elements is output (g < h ? 0 : 1) of the hash of the counter pair (j, j + h),
// h = ceil(n_global / 2), j = g mod h (a count past the end is 0). Partitionable (1):
// element g is the xor of both outputs of the hash of the pair (0, g).

fn rotl(v: u32, r: u32) -> u32 {
    return (v << r) | (v >> (32u - r));
}

// Four Threefry rounds with rotation amounts r.
fn group4(v: vec2<u32>, r: vec4<u32>) -> vec2<u32> {
    var a = v.x;
    var b = v.y;
    a = a + b; b = rotl(b, r.x) ^ a;
    a = a + b; b = rotl(b, r.y) ^ a;
    a = a + b; b = rotl(b, r.z) ^ a;
    a = a + b; b = rotl(b, r.w) ^ a;
    return vec2<u32>(a, b);
}

// Threefry-2x32, 20 rounds (JAX's _threefry2x32_lowering, unrolled).
fn threefry(k0: u32, k1: u32, c0: u32, c1: u32) -> vec2<u32> {
    let k2 = k0 ^ k1 ^ 0x1BD11BDAu;
    let ra = vec4<u32>(13u, 15u, 26u, 6u);
    let rb = vec4<u32>(17u, 29u, 16u, 24u);
    var v = vec2<u32>(c0 + k0, c1 + k1);
    v = group4(v, ra); v = vec2<u32>(v.x + k1, v.y + k2 + 1u);
    v = group4(v, rb); v = vec2<u32>(v.x + k2, v.y + k0 + 2u);
    v = group4(v, ra); v = vec2<u32>(v.x + k0, v.y + k1 + 3u);
    v = group4(v, rb); v = vec2<u32>(v.x + k1, v.y + k2 + 4u);
    v = group4(v, ra); v = vec2<u32>(v.x + k2, v.y + k0 + 5u);
    return v;
}

// The global row-major index of element l of a block starting at `start`, of extent `size`
// per canonical dim (outermost first), in a global array of row-major strides `stride`.
fn block_element(l: u32, start: vec4<u32>, size: vec4<u32>, stride: vec4<u32>) -> u32 {
    let i3 = l % size.w;
    var r = l / size.w;
    let i2 = r % size.z;
    r = r / size.z;
    let i1 = r % size.y;
    let i0 = r / size.y;
    return (start.x + i0) * stride.x + (start.y + i1) * stride.y + (start.z + i2) * stride.z
        + (start.w + i3) * stride.w;
}

// The random bits of element g of a global array of n_global elements in `rng_layout`.
fn counter_bits(k0: u32, k1: u32, g: u32, n_global: u32, rng_layout: u32) -> u32 {
    if (rng_layout == 1u) {
        let y2 = threefry(k0, k1, 0u, g);
        return y2.x ^ y2.y;
    }
    let h = n_global - n_global / 2u;
    let first = g < h;
    let j = select(g - h, g, first);
    let c1 = select(0u, j + h, j + h < n_global);
    let y2 = threefry(k0, k1, j, c1);
    return select(y2.y, y2.x, first);
}

// JAX's float32 uniform in [0, 1): 23 random mantissa bits on 1.0, minus 1.
fn uniform01(b: u32) -> f32 {
    return bitcast<f32>((b >> 9u) | 0x3f800000u) - 1.0;
}
