// Rows of a dimension at the global positions of a device's block of the sequence (context
// parallelism's slice of a replicated array by position, and its transpose).
//
// An array is viewed (outer, rows, inner) per device, devices one after another. A block of
// `len` rows sits at positions start0 + i for rows i < chunk and start1 + i - chunk past it
// (zig-zag holds an early and a late chunk; a contiguous block has chunk = len), the starts of
// device d in starts[2d], starts[2d + 1]. 32-bit words move as they are (f32 or u32).
// - take: (outer, n, inner) -> (outer, len, inner), the block's rows.
// - put: (outer, len, inner) -> (outer, n, inner), the block's rows at their positions, 0 elsewhere.

struct Params {
    devices: u32,
    outer: u32,
    n: u32,     // rows of the whole dimension
    len: u32,   // rows of the block
    inner: u32,
    chunk: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<storage, read> starts: array<u32>; // (devices, 2)
@group(0) @binding(3) var<uniform> p: Params;

const WG: u32 = 256u;

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

fn pos(d: u32, i: u32) -> u32 {
    if (i < p.chunk) { return starts[2u * d] + i; }
    return starts[2u * d + 1u] + i - p.chunk;
}

@compute @workgroup_size(256)
fn take(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = index(gid, nwg);
    let per = p.outer * p.len * p.inner;
    if (e >= p.devices * per) { return; }
    let d = e / per;
    let l = e - d * per;
    let k = l % p.inner;
    let r = (l / p.inner) % p.len;
    let o = l / (p.inner * p.len);
    dst[e] = src[d * p.outer * p.n * p.inner + (o * p.n + pos(d, r)) * p.inner + k];
}

@compute @workgroup_size(256)
fn put(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = index(gid, nwg);
    let per = p.outer * p.n * p.inner;
    if (e >= p.devices * per) { return; }
    let d = e / per;
    let l = e - d * per;
    let k = l % p.inner;
    let row = (l / p.inner) % p.n;
    let o = l / (p.inner * p.n);
    let s0 = starts[2u * d];
    let s1 = starts[2u * d + 1u];
    var r = p.len; // none of the block's rows
    if (row >= s0 && row < s0 + p.chunk) {
        r = row - s0;
    } else if (p.len > p.chunk && row >= s1 && row < s1 + p.len - p.chunk) {
        r = p.chunk + row - s1;
    }
    var v = 0u;
    if (r < p.len) { v = src[d * p.outer * p.len * p.inner + (o * p.len + r) * p.inner + k]; }
    dst[e] = v;
}
