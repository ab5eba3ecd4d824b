// The output side shared by the texture matmuls (matmul_tex.wgsl, matmul_sg.wgsl), composed in front of
// them: the launch parameters, C, the bias, and the epilogue that scales, adds the bias and the old C and
// stores a 4x4 block (skipping what lies outside M x N).

struct Params {
    m: u32,
    n: u32,
    k: u32,
    flags: u32,    // 1: add the old C (accumulate), 2: add the bias (bias[j] of C's item)
    a_si: u32,     // (unused here: pack has its own strides)
    a_sk: u32,
    b_sk: u32,
    b_sj: u32,
    stride_a: u32, // elements between batch items (0: broadcast: one item in the texture)
    stride_b: u32,
    stride_c: u32,
    alpha: f32,
    mp4: u32,      // texels per k-row of A^T (M padded / 4) and of B (N padded / 4)
    np4: u32,
    kp: u32,       // k-rows per batch item (K)
    stride_bias: u32, // elements between batch items' biases (0: one bias for all)
}

@group(0) @binding(2) var<storage, read> bias: array<f32>;   // (N), or one per batch item
@group(0) @binding(3) var<storage, read_write> c: array<f32>; // (batch, M, N)
@group(0) @binding(4) var<uniform> p: Params;
@group(0) @binding(9) var<storage, read_write> c4: array<vec4<f32>>; // C as vec4 (the `_v4` entry point)

// The 4x4 block x y^T as rows: outer(x, y)[r] = x[r] * y (row r of C's block, four columns).
fn outer(x: vec4<f32>, y: vec4<f32>) -> mat4x4<f32> {
    return mat4x4(y * x.x, y * x.y, y * x.z, y * x.w);
}

// alpha * x, plus the bias and the old C where flagged.
// Where the bias of the batch item holding C element `idx` starts.
fn bias_base(idx: u32) -> u32 {
    if (p.stride_bias == 0u) { return 0u; }
    return idx / p.stride_c * p.stride_bias;
}

fn finish(x: f32, col: u32, idx: u32) -> f32 {
    var y = p.alpha * x;
    if ((p.flags & 2u) != 0u) { y += bias[bias_base(idx) + col]; }
    if ((p.flags & 1u) != 0u) { y += c[idx]; }
    return y;
}

// Rows row .. row+3, columns col .. col+3 of C from v, skipping what lies outside (M, N).
fn store_block(cb: u32, row: u32, col: u32, v: mat4x4<f32>) {
    for (var r = 0u; r < 4u; r++) {
        if (row + r < p.m) {
            let i = cb + (row + r) * p.n + col;
            let x = v[r];
            if (col < p.n) { c[i] = finish(x.x, col, i); }
            if (col + 1u < p.n) { c[i + 1u] = finish(x.y, col + 1u, i + 1u); }
            if (col + 2u < p.n) { c[i + 2u] = finish(x.z, col + 2u, i + 2u); }
            if (col + 3u < p.n) { c[i + 3u] = finish(x.w, col + 3u, i + 3u); }
        }
    }
}

// As store_block, as vec4 stores: N, stride_c and col are multiples of 4.
fn store_block_v4(cb: u32, row: u32, col: u32, v: mat4x4<f32>) {
    if (col >= p.n) { return; }
    var bv = vec4(0.0);
    if ((p.flags & 2u) != 0u) {
        let bb = bias_base(cb) + col;
        bv = vec4(bias[bb], bias[bb + 1u], bias[bb + 2u], bias[bb + 3u]);
    }
    for (var r = 0u; r < 4u; r++) {
        if (row + r < p.m) {
            let i = (cb + (row + r) * p.n + col) / 4u;
            var y = p.alpha * v[r] + bv;
            if ((p.flags & 1u) != 0u) { y += c4[i]; }
            c4[i] = y;
        }
    }
}
