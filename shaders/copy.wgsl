// Strided copy: for every multi-index i over `shape`,
//   dst[dst_offset + sum_k i_k * dst_strides_k]  = (or +=)  src[src_offset + sum_k i_k * src_strides_k].
// One kernel serves transpose (permuted strides), slice (offset + strides of the source),
// concat (copy into a slice of dst), and broadcast (source stride 0).
// Requirement: no two multi-indices may address the same dst element (no dst stride 0 over
// an extent > 1, no overlapping dst strides); otherwise writes race. The launcher rejects
// dst stride 0; the executor only produces injective dst layouts.
// The launcher drops unit axes and merges axes contiguous in both src and dst, so a plain
// copy is rank 1 and a transpose rank 2: each extra axis costs an integer div and mod per
// element (slow where there is no vector division, e.g. lavapipe). The rank is a literal in
// each entry point (`copy_<rank>`, `accumulate_<rank>`) so the driver drops unused axes;
// a rank read from the uniform made a plain copy 4x slower on lavapipe.
// One invocation per element, the last axis fastest; ids fold into y past 65535 workgroups.
// `copy4_<rank>` moves four elements per invocation as a vec4 where the launcher found the last
// axis contiguous on both sides and everything else a multiple of 4 (then shape, strides and
// offsets are in units of four elements): on lavapipe every storage access is a per-lane loop,
// so a vec4 moves four elements for the price of one, and the index arithmetic is shared by four.

struct Params {
    shape: array<vec4<u32>, 2>,       // axes 0..5 in .xyzw of [0] then .xy of [1], right-aligned
    src_strides: array<vec4<u32>, 2>,
    dst_strides: array<vec4<u32>, 2>,
    total: u32,                       // product of the shape
    src_offset: u32,
    dst_offset: u32,
    src_outer: u32,                   // strides of the outermost active axis, axis 6 - rank
    dst_outer: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

// Elements move as u32 bit patterns, so a copy is exact for f32 and u32 data alike (token
// ids, random bits): an f32 load/store may flush denormals or canonicalize NaNs on some
// drivers. Only `accumulate_*` adds, as f32.
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read> src4: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> dst4: array<vec4<u32>>;

const WG: u32 = 256u;

// (src index, dst index) of the e-th element in row-major order: split off the inner axes
// one by one (unrolled, constant indices); what remains indexes the outermost active axis.
// Each axis has its own `let k`: with one shared `var k` lavapipe (Mesa llvmpipe) computed
// wrong addresses for copy_3 (and only copy_3), though the two are equivalent WGSL.
fn addresses(e: u32, rank: u32) -> vec2<u32> {
    var rem = e;
    var s = p.src_offset;
    var d = p.dst_offset;
    if (rank > 1u) {
        let k = rem % p.shape[1].y; rem /= p.shape[1].y; s += k * p.src_strides[1].y; d += k * p.dst_strides[1].y;
    }
    if (rank > 2u) {
        let k = rem % p.shape[1].x; rem /= p.shape[1].x; s += k * p.src_strides[1].x; d += k * p.dst_strides[1].x;
    }
    if (rank > 3u) {
        let k = rem % p.shape[0].w; rem /= p.shape[0].w; s += k * p.src_strides[0].w; d += k * p.dst_strides[0].w;
    }
    if (rank > 4u) {
        let k = rem % p.shape[0].z; rem /= p.shape[0].z; s += k * p.src_strides[0].z; d += k * p.dst_strides[0].z;
    }
    if (rank > 5u) {
        let k = rem % p.shape[0].y; rem /= p.shape[0].y; s += k * p.src_strides[0].y; d += k * p.dst_strides[0].y;
    }
    s += rem * p.src_outer;
    d += rem * p.dst_outer;
    return vec2<u32>(s, d);
}

@compute @workgroup_size(256)
fn copy_1(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 1u);
    dst[a.y] = src[a.x];
}

@compute @workgroup_size(256)
fn copy_2(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 2u);
    dst[a.y] = src[a.x];
}

@compute @workgroup_size(256)
fn copy_3(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 3u);
    dst[a.y] = src[a.x];
}

@compute @workgroup_size(256)
fn copy_4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 4u);
    dst[a.y] = src[a.x];
}

@compute @workgroup_size(256)
fn copy_5(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 5u);
    dst[a.y] = src[a.x];
}

@compute @workgroup_size(256)
fn copy_6(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 6u);
    dst[a.y] = src[a.x];
}

@compute @workgroup_size(256)
fn accumulate_1(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 1u);
    dst[a.y] = bitcast<u32>(bitcast<f32>(dst[a.y]) + bitcast<f32>(src[a.x]));
}

@compute @workgroup_size(256)
fn accumulate_2(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 2u);
    dst[a.y] = bitcast<u32>(bitcast<f32>(dst[a.y]) + bitcast<f32>(src[a.x]));
}

@compute @workgroup_size(256)
fn accumulate_3(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 3u);
    dst[a.y] = bitcast<u32>(bitcast<f32>(dst[a.y]) + bitcast<f32>(src[a.x]));
}

@compute @workgroup_size(256)
fn accumulate_4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 4u);
    dst[a.y] = bitcast<u32>(bitcast<f32>(dst[a.y]) + bitcast<f32>(src[a.x]));
}

@compute @workgroup_size(256)
fn accumulate_5(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 5u);
    dst[a.y] = bitcast<u32>(bitcast<f32>(dst[a.y]) + bitcast<f32>(src[a.x]));
}

@compute @workgroup_size(256)
fn accumulate_6(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 6u);
    dst[a.y] = bitcast<u32>(bitcast<f32>(dst[a.y]) + bitcast<f32>(src[a.x]));
}

@compute @workgroup_size(256)
fn copy4_1(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 1u);
    dst4[a.y] = src4[a.x];
}

@compute @workgroup_size(256)
fn copy4_2(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 2u);
    dst4[a.y] = src4[a.x];
}

@compute @workgroup_size(256)
fn copy4_3(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 3u);
    dst4[a.y] = src4[a.x];
}

@compute @workgroup_size(256)
fn copy4_4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 4u);
    dst4[a.y] = src4[a.x];
}

@compute @workgroup_size(256)
fn copy4_5(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 5u);
    dst4[a.y] = src4[a.x];
}

@compute @workgroup_size(256)
fn copy4_6(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.total) { return; }
    let a = addresses(e, 6u);
    dst4[a.y] = src4[a.x];
}
