// The adapter's ceilings, for `shardlab bench`: the best its arithmetic and its storage buffers give,
// so that every kernel's speed reads as a fraction of what this adapter can do at all.
//   fma_peak  arithmetic alone: each invocation keeps 16 independent vec4 accumulators in registers,
//             runs `iters` loop trips of 4 rounds of x = fma(x, m, c) on each (64 vec4 FMAs a trip:
//             on lavapipe one loop trip costs as much as dozens of FMAs, so the rounds are unrolled),
//             and stores their sum once. 512 FLOPs per invocation per trip.
//   copy4     a storage-buffer copy, one vec4 per invocation: the fastest access an elementwise kernel
//             has (lavapipe loads and stores storage buffers lane by lane; vec4 moves four floats a lane).
// Both have CPU twins (reference::ceiling) that the benchmark checks them against.

struct Params {
    n: u32,      // fma_peak: invocations that store; copy4: vec4s to copy
    iters: u32,  // fma_peak: loop trips
    m: f32,      // fma_peak: x = fma(x, m, c)
    c: f32,
}

@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(64)
fn fma_peak(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    // Starting values differ per invocation, accumulator and lane, so no two chains are alike.
    let x = vec4<f32>(f32(i % 64u) / 64.0) + vec4<f32>(0.0, 0.25, 0.5, 0.75);
    var x0 = x + 0.0;
    var x1 = x + 1.0;
    var x2 = x + 2.0;
    var x3 = x + 3.0;
    var x4 = x + 4.0;
    var x5 = x + 5.0;
    var x6 = x + 6.0;
    var x7 = x + 7.0;
    var x8 = x + 8.0;
    var x9 = x + 9.0;
    var x10 = x + 10.0;
    var x11 = x + 11.0;
    var x12 = x + 12.0;
    var x13 = x + 13.0;
    var x14 = x + 14.0;
    var x15 = x + 15.0;
    let m = vec4<f32>(p.m);
    let c = vec4<f32>(p.c);
    // Named locals, not an array a compiler might keep in memory; four rounds a trip, so the loop's own
    // cost stays small beside 64 FMAs.
    for (var k = 0u; k < p.iters; k++) {
        x0 = fma(fma(fma(fma(x0, m, c), m, c), m, c), m, c);
        x1 = fma(fma(fma(fma(x1, m, c), m, c), m, c), m, c);
        x2 = fma(fma(fma(fma(x2, m, c), m, c), m, c), m, c);
        x3 = fma(fma(fma(fma(x3, m, c), m, c), m, c), m, c);
        x4 = fma(fma(fma(fma(x4, m, c), m, c), m, c), m, c);
        x5 = fma(fma(fma(fma(x5, m, c), m, c), m, c), m, c);
        x6 = fma(fma(fma(fma(x6, m, c), m, c), m, c), m, c);
        x7 = fma(fma(fma(fma(x7, m, c), m, c), m, c), m, c);
        x8 = fma(fma(fma(fma(x8, m, c), m, c), m, c), m, c);
        x9 = fma(fma(fma(fma(x9, m, c), m, c), m, c), m, c);
        x10 = fma(fma(fma(fma(x10, m, c), m, c), m, c), m, c);
        x11 = fma(fma(fma(fma(x11, m, c), m, c), m, c), m, c);
        x12 = fma(fma(fma(fma(x12, m, c), m, c), m, c), m, c);
        x13 = fma(fma(fma(fma(x13, m, c), m, c), m, c), m, c);
        x14 = fma(fma(fma(fma(x14, m, c), m, c), m, c), m, c);
        x15 = fma(fma(fma(fma(x15, m, c), m, c), m, c), m, c);
    }
    if (i < p.n) {
        dst[i] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7
            + x8 + x9 + x10 + x11 + x12 + x13 + x14 + x15;
    }
}

@compute @workgroup_size(256)
fn copy4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) { return; }
    dst[i] = src[i];
}
