// Row reductions shared by the row-wise kernels (softmax, crossentropy, layernorm), composed in
// front of each of them by crate/src/shaders.rs. A row is reduced either by one invocation
// (`*_row` entry points) or by one 256-wide workgroup (`*_wg`), combining per-invocation
// partial results in workgroup memory.

const WG: u32 = 256u;
const LOWEST: f32 = -3.0e38; // running max of an empty set; exp(LOWEST - m) = 0

var<workgroup> red_m: array<f32, 256>;
var<workgroup> red_s: array<f32, 256>;

// One step of the online (max, sum of exp(v - max)) of a row: `ml` with one more value `v`.
fn online_max_sum(ml: vec2<f32>, v: f32) -> vec2<f32> {
    if (v > ml.x) {
        return vec2<f32>(v, ml.y * exp(ml.x - v) + 1.0);
    }
    return vec2<f32>(ml.x, ml.y + exp(v - ml.x));
}

// Combines per-invocation (max, sum of exp(v - max)) pairs over the workgroup.
// Call from uniform control flow only.
fn wg_max_sum(lid: u32, m: f32, l: f32) -> vec2<f32> {
    red_m[lid] = m;
    red_s[lid] = l;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
        if (lid < st) {
            let m1 = red_m[lid];
            let m2 = red_m[lid + st];
            let mm = max(m1, m2);
            red_s[lid] = red_s[lid] * exp(m1 - mm) + red_s[lid + st] * exp(m2 - mm);
            red_m[lid] = mm;
        }
        workgroupBarrier();
    }
    let r = vec2<f32>(red_m[0], red_s[0]);
    workgroupBarrier(); // the arrays are reused by the next call
    return r;
}

// Sum of `v` over the workgroup. Call from uniform control flow only.
fn wg_sum(lid: u32, v: f32) -> f32 {
    red_s[lid] = v;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
        if (lid < st) {
            red_s[lid] += red_s[lid + st];
        }
        workgroupBarrier();
    }
    let total = red_s[0];
    workgroupBarrier(); // `red_s` is reused by the next call
    return total;
}
