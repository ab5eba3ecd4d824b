// Collectives across simulated devices. A value of local shape S on D devices is one buffer
// holding the D local blocks one after another: x (D, in_n), out (D, out_n). Each entry point
// is one launch for all devices, one invocation per output element.
//
// The device groups come from a small table built at plan time (table, u32):
//   table[d]          first slot of device d's group in the member list (group * g)
//   table[D + d]      d's rank in its group (jax.lax.axis_index over the collective's axes)
//   table[2D + k]     the member list: groups one after another, each in rank order
// ppermute uses table[d] = the device d receives from, or NONE.
//
// Every collective is a gather over a 4-D view of the output block, row-major, with
// `dims` its extents. For output coordinates c:
//   source offset in a member's block = dot(c, strides) + rank(d) * rank_stride
// `reduce` (psum, pmean, psum_scatter) sums that element over the group's members in rank
// order (deterministic); `gather` (all_gather, all_to_all) reads it from the member whose
// rank is c[member_dim] (the member dim's stride is 0).
//
// `reduce_packed` is psum over many arrays at once, in place: the gradients a step packs into the
// optimizer's arena (crate/src/exec/gpu/packing.rs), one launch instead of one per gradient.
//
// The data-moving entry points (gather, permute) carry any 4-byte data, f32 or u32 (token ids,
// random bits, keys), so they load and store u32 bit patterns (x_bits, out_bits): an f32 load
// and store may flush denormals or canonicalise NaNs on some drivers. Only `reduce` does
// arithmetic, on f32.

struct Params {
    devices: u32,       // D
    group_size: u32,    // g
    in_n: u32,          // elements of one device's input block
    out_n: u32,         // elements of one device's output block
    dims: vec4<u32>,    // the output block viewed as 4-D, row-major
    strides: vec4<u32>, // source strides of each view dim within a member's block
    member_dim: u32,    // gather: the view dim that picks the member
    rank_stride: u32,   // source offset per rank of the receiving device
    mean: u32,          // reduce: 1 divides the sum by g (pmean)
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> table: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read_write> index_out: array<u32>;
@group(0) @binding(5) var<storage, read> x_bits: array<u32>;
@group(0) @binding(6) var<storage, read_write> out_bits: array<u32>;
// reduce_packed: per workgroup (first element of its array in `out`, elements per device,
// first element index this workgroup sums, unused).
@group(0) @binding(7) var<storage, read> spans: array<vec4<u32>>;

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;

// Coordinates of element r of the 4-D output view.
fn coords(r: u32) -> vec4<u32> {
    var rest = r;
    let c3 = rest % p.dims.w;
    rest /= p.dims.w;
    let c2 = rest % p.dims.z;
    rest /= p.dims.z;
    let c1 = rest % p.dims.y;
    let c0 = rest / p.dims.y;
    return vec4<u32>(c0, c1, c2, c3);
}

// psum / pmean / psum_scatter: out[d, c] = sum over members m of x[m, offset(c, rank(d))].
@compute @workgroup_size(256)
fn reduce(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.devices * p.out_n) { return; }
    let d = e / p.out_n;
    let c = coords(e % p.out_n);
    let base = table[d];
    let offset = dot(c, p.strides) + table[p.devices + d] * p.rank_stride;
    var acc = 0.0;
    for (var j = 0u; j < p.group_size; j++) {
        let m = table[2u * p.devices + base + j];
        acc += x[m * p.in_n + offset];
    }
    if (p.mean == 1u) {
        acc = acc / f32(p.group_size);
    }
    out[e] = acc;
}

// psum of packed arrays, in place: for the span of workgroup w (p.out_n spans), every element
// i of its array's device blocks (out[start + d * n + i]) becomes the sum over d's group, added
// in rank order from 0.0 as `reduce` adds it, so the sums are bit for bit reduce's. One
// invocation reads and writes element i of every device, so no invocation reads what another
// wrote.
@compute @workgroup_size(256)
fn reduce_packed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = wid.x + wid.y * nwg.x;
    if (w >= p.out_n) { return; }
    let span = spans[w];
    let i = span.z + lid.x;
    if (i >= span.y) { return; }
    for (var first = 0u; first < p.devices; first += p.group_size) {
        var acc = 0.0;
        for (var j = 0u; j < p.group_size; j++) {
            acc += out[span.x + table[2u * p.devices + first + j] * span.y + i];
        }
        for (var j = 0u; j < p.group_size; j++) {
            out[span.x + table[2u * p.devices + first + j] * span.y + i] = acc;
        }
    }
}

// all_gather / all_to_all: out[d, c] = x[member c[member_dim] of d's group, offset(c, rank(d))],
// bit for bit.
@compute @workgroup_size(256)
fn gather(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.devices * p.out_n) { return; }
    let d = e / p.out_n;
    let c = coords(e % p.out_n);
    let m = table[2u * p.devices + table[d] + c[p.member_dim]];
    let offset = dot(c, p.strides) + table[p.devices + d] * p.rank_stride;
    out_bits[e] = x_bits[m * p.in_n + offset];
}

// ppermute: out[d] = x[source(d)] bit for bit, zeros where d receives nothing.
@compute @workgroup_size(256)
fn permute(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= p.devices * p.out_n) { return; }
    let d = e / p.out_n;
    let src = table[d];
    var v = 0u;
    if (src != NONE) {
        v = x_bits[src * p.in_n + e % p.out_n];
    }
    out_bits[e] = v;
}

// axis_index: index_out[d] = d's rank along the axes (u32).
@compute @workgroup_size(256)
fn axis_index(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let d = gid.x + gid.y * nwg.x * WG;
    if (d >= p.devices) { return; }
    index_out[d] = table[p.devices + d];
}
