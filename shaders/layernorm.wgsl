// LayerNorm over the last axis (MODEL.md): x (rows, C) ->
//   out = (x - mean) * rstd * gamma + beta,  rstd = 1 / sqrt(var + 1e-5), biased variance,
// saving mean and rstd (rows) for the backward.
// With D simulated devices the rows of device d are [d * R, (d + 1) * R), R = rows / D, and
// gamma, beta, dgamma, dbeta are (D, C): each row reads its device's gamma and beta, and each
// device's dgamma and dbeta sum over its own rows only. D = 1 is the plain layernorm.
// Row kernels come in two variants (see RowStrategy): `*_row` runs one invocation per row
// (fast on CPU drivers such as lavapipe), `*_wg` one 256-wide workgroup per row reducing in
// workgroup memory (long rows on GPUs; `wg_sum` of rows.wgsl, composed in front). Row ids
// fold into y past 65535 workgroups.
// Bindings are unique within the module; each entry point uses a subset.

struct Params {
    rows: u32,     // all devices' rows
    c: u32,
    rpd: u32,      // rows per device, R
    devices: u32,  // D
    chunk: u32,    // rows per chunk of the two-stage dgamma, dbeta
    chunks: u32,   // chunks per device, ceil(R / chunk)
    row_groups: u32, // backward_fused_*: the workgroups that compute dx (the rest sum columns)
    residual: u32, // forward_*: 1 when x is x + res_in (a residual add fused in front), stored to sum_out
}

@group(0) @binding(0) var<storage, read> x: array<f32>;            // (rows, C)
@group(0) @binding(1) var<storage, read> gamma: array<f32>;        // (D, C)
@group(0) @binding(2) var<storage, read> beta: array<f32>;         // (D, C)
@group(0) @binding(3) var<storage, read_write> out: array<f32>;    // (rows, C)
@group(0) @binding(4) var<storage, read_write> mean: array<f32>;   // (rows)
@group(0) @binding(5) var<storage, read_write> rstd: array<f32>;   // (rows)
@group(0) @binding(6) var<storage, read> dout: array<f32>;         // (rows, C)
@group(0) @binding(7) var<storage, read> mean_in: array<f32>;      // (rows)
@group(0) @binding(8) var<storage, read> rstd_in: array<f32>;      // (rows)
@group(0) @binding(9) var<storage, read_write> dx: array<f32>;     // (rows, C)
@group(0) @binding(10) var<storage, read_write> dgamma: array<f32>; // (D, C)
@group(0) @binding(11) var<storage, read_write> dbeta: array<f32>;  // (D, C)
@group(0) @binding(12) var<uniform> p: Params;
@group(0) @binding(13) var<storage, read_write> partial: array<f32>; // (D, chunks, 2, C)
@group(0) @binding(14) var<storage, read> partial_in: array<f32>;    // (D, chunks, 2, C)

const EPS: f32 = 1e-5;

// The forward's residual form (Params.residual = 1): the layer norm of x + res_in, the residual
// add fused in front. The sum is made as x is read (the same f32 add the add kernel makes) and
// stored once, in the first pass, to sum_out: the residual stream's next add reads it. Launches
// without it bind stand-ins.
@group(0) @binding(21) var<storage, read> res_in: array<f32>;
@group(0) @binding(22) var<storage, read_write> sum_out: array<f32>;

fn x_at(i: u32) -> f32 {
    if (p.residual == 1u) { return x[i] + res_in[i]; }
    return x[i];
}

// x_at in the later passes, after the first stored the sum: one load where the sum takes two.
// (Each invocation reads back only the elements it stored.)
fn x_again(i: u32) -> f32 {
    if (p.residual == 1u) { return sum_out[i]; }
    return x[i];
}

// Offset of row r's device block in gamma, beta (D, C).
fn param_base(r: u32) -> u32 {
    return (r / p.rpd) * p.c;
}

@compute @workgroup_size(64)
fn forward_row(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= p.rows) { return; }
    let base = r * p.c;
    let pb = param_base(r);
    var s = 0.0;
    for (var j = 0u; j < p.c; j++) {
        let xv = x_at(base + j);
        if (p.residual == 1u) { sum_out[base + j] = xv; }
        s += xv;
    }
    let m = s / f32(p.c);
    // Two passes (mean, then squared deviations): no cancellation for rows far from 0.
    var v = 0.0;
    for (var j = 0u; j < p.c; j++) {
        let d = x_again(base + j) - m;
        v += d * d;
    }
    let rs = 1.0 / sqrt(v / f32(p.c) + EPS);
    for (var j = 0u; j < p.c; j++) {
        out[base + j] = (x_again(base + j) - m) * rs * gamma[pb + j] + beta[pb + j];
    }
    mean[r] = m;
    rstd[r] = rs;
}

// The vec4 views of the row kernels' operands (`forward_row4`, `backward_dx_row4`: C a multiple
// of 4, bindings on 16 bytes). On lavapipe every storage access is a per-lane loop, so a row
// reads a quarter as many times; the sums still add the elements one by one, in order.
@group(0) @binding(15) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(16) var<storage, read> gamma4: array<vec4<f32>>;
@group(0) @binding(17) var<storage, read> beta4: array<vec4<f32>>;
@group(0) @binding(18) var<storage, read_write> out4: array<vec4<f32>>;
@group(0) @binding(19) var<storage, read> dout4: array<vec4<f32>>;
@group(0) @binding(20) var<storage, read_write> dx4: array<vec4<f32>>;
@group(0) @binding(23) var<storage, read> res_in4: array<vec4<f32>>;
@group(0) @binding(24) var<storage, read_write> sum_out4: array<vec4<f32>>;

fn x4_at(i: u32) -> vec4<f32> {
    if (p.residual == 1u) { return x4[i] + res_in4[i]; }
    return x4[i];
}

fn x4_again(i: u32) -> vec4<f32> {
    if (p.residual == 1u) { return sum_out4[i]; }
    return x4[i];
}

fn sum4(acc: f32, v: vec4<f32>) -> f32 {
    return acc + v.x + v.y + v.z + v.w;
}

// A row of up to ROW_CACHE vec4s stays in the invocation's private memory after its first read:
// lavapipe's private arrays are plain stack memory, several times cheaper than its per-lane
// storage loads, so the later passes over the row load nothing from storage. Longer rows are read
// again from storage. The arithmetic and its order are the same either way.
const ROW_CACHE: u32 = 64u;
var<private> row_a: array<vec4<f32>, 64>;
var<private> row_b: array<vec4<f32>, 64>;

@compute @workgroup_size(64)
fn forward_row4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= p.rows) { return; }
    let c4 = p.c / 4u;
    let cached = c4 <= ROW_CACHE;
    let base = r * c4;
    let pb = param_base(r) / 4u;
    var s = 0.0;
    for (var j = 0u; j < c4; j++) {
        let xv = x4_at(base + j);
        if (p.residual == 1u) { sum_out4[base + j] = xv; }
        if (cached) { row_a[j] = xv; }
        s = sum4(s, xv);
    }
    let m = s / f32(p.c);
    var v = 0.0;
    for (var j = 0u; j < c4; j++) {
        var xv: vec4<f32>;
        if (cached) { xv = row_a[j]; } else { xv = x4_again(base + j); }
        let d = xv - m;
        v = sum4(v, d * d);
    }
    let rs = 1.0 / sqrt(v / f32(p.c) + EPS);
    for (var j = 0u; j < c4; j++) {
        var xv: vec4<f32>;
        if (cached) { xv = row_a[j]; } else { xv = x4_again(base + j); }
        out4[base + j] = (xv - m) * rs * gamma4[pb + j] + beta4[pb + j];
    }
    mean[r] = m;
    rstd[r] = rs;
}

@compute @workgroup_size(256)
fn forward_wg(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let r = wid.x + wid.y * nwg.x; // uniform: the early return keeps barriers uniform
    if (r >= p.rows) { return; }
    let base = r * p.c;
    let pb = param_base(r);
    var s = 0.0;
    for (var j = lid; j < p.c; j += WG) {
        let xv = x_at(base + j);
        if (p.residual == 1u) { sum_out[base + j] = xv; }
        s += xv;
    }
    let m = wg_sum(lid, s) / f32(p.c);
    var v = 0.0;
    for (var j = lid; j < p.c; j += WG) {
        let d = x_again(base + j) - m;
        v += d * d;
    }
    let rs = 1.0 / sqrt(wg_sum(lid, v) / f32(p.c) + EPS);
    for (var j = lid; j < p.c; j += WG) {
        out[base + j] = (x_again(base + j) - m) * rs * gamma[pb + j] + beta[pb + j];
    }
    if (lid == 0u) {
        mean[r] = m;
        rstd[r] = rs;
    }
}

// dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)),  dnorm = dout * gamma,
// xhat = (x - mean) * rstd.
@compute @workgroup_size(64)
fn backward_dx_row(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    dx_row(gid.x + gid.y * nwg.x * 64u);
}

fn dx_row(r: u32) {
    if (r >= p.rows) { return; }
    let base = r * p.c;
    let pb = param_base(r);
    let m = mean_in[r];
    let rs = rstd_in[r];
    var a = 0.0;
    var b = 0.0;
    for (var j = 0u; j < p.c; j++) {
        let dn = dout[base + j] * gamma[pb + j];
        a += dn;
        b += dn * (x[base + j] - m) * rs;
    }
    a /= f32(p.c);
    b /= f32(p.c);
    for (var j = 0u; j < p.c; j++) {
        let dn = dout[base + j] * gamma[pb + j];
        let xhat = (x[base + j] - m) * rs;
        dx[base + j] = rs * (dn - a - xhat * b);
    }
}

// As backward_dx_row, caching each row's dnorm and x (row_a, row_b) as forward_row4 caches x.
@compute @workgroup_size(64)
fn backward_dx_row4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    dx_row4(gid.x + gid.y * nwg.x * 64u);
}

fn dx_row4(r: u32) {
    if (r >= p.rows) { return; }
    let c4 = p.c / 4u;
    let cached = c4 <= ROW_CACHE;
    let base = r * c4;
    let pb = param_base(r) / 4u;
    let m = mean_in[r];
    let rs = rstd_in[r];
    var a = 0.0;
    var b = 0.0;
    for (var j = 0u; j < c4; j++) {
        let dn = dout4[base + j] * gamma4[pb + j];
        let xv = x4[base + j];
        if (cached) { row_a[j] = dn; row_b[j] = xv; }
        a = sum4(a, dn);
        b = sum4(b, dn * (xv - m) * rs);
    }
    a /= f32(p.c);
    b /= f32(p.c);
    for (var j = 0u; j < c4; j++) {
        var dn: vec4<f32>;
        var xv: vec4<f32>;
        if (cached) {
            dn = row_a[j];
            xv = row_b[j];
        } else {
            dn = dout4[base + j] * gamma4[pb + j];
            xv = x4[base + j];
        }
        let xhat = (xv - m) * rs;
        dx4[base + j] = rs * (dn - a - xhat * b);
    }
}

@compute @workgroup_size(256)
fn backward_dx_wg(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    dx_wg(wid.x + wid.y * nwg.x, lid);
}

// Row r's dx by the workgroup: r must be uniform (its barriers).
fn dx_wg(r: u32, lid: u32) {
    if (r >= p.rows) { return; }
    let base = r * p.c;
    let pb = param_base(r);
    let m = mean_in[r];
    let rs = rstd_in[r];
    var a = 0.0;
    var b = 0.0;
    for (var j = lid; j < p.c; j += WG) {
        let dn = dout[base + j] * gamma[pb + j];
        a += dn;
        b += dn * (x[base + j] - m) * rs;
    }
    a = wg_sum(lid, a) / f32(p.c);
    b = wg_sum(lid, b) / f32(p.c);
    for (var j = lid; j < p.c; j += WG) {
        let dn = dout[base + j] * gamma[pb + j];
        let xhat = (x[base + j] - m) * rs;
        dx[base + j] = rs * (dn - a - xhat * b);
    }
}

// dgamma = sum over rows of dout * xhat, dbeta = sum over rows of dout, per device, and dx, in one
// launch (backward_fused_*): its first `row_groups` workgroups compute dx as the backward_dx_*
// entry points do, the rest each device's column sums. A column sum adds each chunk's rows in
// order from 0.0, then the chunks in order: the two-stage sums' arithmetic below
// (backward_params_partial_row, backward_params_finish), in one invocation, so it is deterministic
// and the same numbers whether a device's rows fill one chunk or several.

// Column sums of (device, column) e.
fn column_sums(e: u32) {
    if (e >= p.devices * p.c) { return; }
    let d = e / p.c;
    let j = e % p.c;
    var dg = 0.0;
    var db = 0.0;
    for (var ch = 0u; ch < p.chunks; ch++) {
        let r0 = d * p.rpd + ch * p.chunk;
        let s = param_sums(j, r0, min(r0 + p.chunk, (d + 1u) * p.rpd), 1u);
        dg += s.x;
        db += s.y;
    }
    dgamma[e] = dg;
    dbeta[e] = db;
}

@compute @workgroup_size(64)
fn backward_fused_row(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
                      @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = wid.x + wid.y * nwg.x;
    if (w < p.row_groups) {
        dx_row(w * 64u + lid);
    } else {
        column_sums((w - p.row_groups) * 64u + lid);
    }
}

@compute @workgroup_size(256)
fn backward_fused_wg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
                     @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = wid.x + wid.y * nwg.x; // uniform: a workgroup computes one row's dx or 256 columns
    if (w < p.row_groups) {
        dx_wg(w, lid);
    } else {
        column_sums((w - p.row_groups) * WG + lid);
    }
}

// Two stages for long columns: each device's rows split into chunks of `chunk`; stage 1 writes
// each chunk's (dgamma, dbeta) sums to `partial` (D, chunks, 2, C), stage 2
// (`backward_params_finish`) adds the chunks up in order. Deterministic, no atomics; many
// invocations even though there are only D * C outputs. Stage 1 comes in the two RowStrategy
// variants: `_row`, one invocation per (device, chunk, column) summing its rows in order, and
// `_wg`, a workgroup per (device, chunk, 64 columns) whose 4 lanes per column sum interleaved
// rows and combine in workgroup memory.

// (dgamma, dbeta) of column j over rows [r0, r1), `stride` apart.
fn param_sums(j: u32, r0: u32, r1: u32, stride: u32) -> vec2<f32> {
    var dg = 0.0;
    var db = 0.0;
    for (var r = r0; r < r1; r += stride) {
        let i = r * p.c + j;
        let g = dout[i];
        dg += g * (x[i] - mean_in[r]) * rstd_in[r];
        db += g;
    }
    return vec2<f32>(dg, db);
}

// Where chunk `ch` of device d puts its sums for column j (dgamma; dbeta is C further).
fn partial_at(d: u32, ch: u32, j: u32) -> u32 {
    return (d * p.chunks + ch) * 2u * p.c + j;
}

@compute @workgroup_size(64)
fn backward_params_partial_row(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * 64u; // ((device, chunk), column)
    if (e >= p.devices * p.chunks * p.c) { return; }
    let dc = e / p.c;
    let j = e % p.c;
    let d = dc / p.chunks;
    let ch = dc % p.chunks;
    let r0 = d * p.rpd + ch * p.chunk;
    let s = param_sums(j, r0, min(r0 + p.chunk, (d + 1u) * p.rpd), 1u);
    let at = partial_at(d, ch, j);
    partial[at] = s.x;
    partial[at + p.c] = s.y;
}

var<workgroup> lanes_g: array<f32, 256>;
var<workgroup> lanes_b: array<f32, 256>;

@compute @workgroup_size(256)
fn backward_params_partial_wg(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    // Uniform per workgroup: which (device, chunk) and which 64 columns. No early return:
    // every invocation reaches the barriers (out-of-range lanes add 0).
    let tiles = (p.c + 63u) / 64u;
    let w = wid.x + wid.y * nwg.x;
    let dc = w / tiles;
    let j = (w % tiles) * 64u + lid % 64u;
    let lane = lid / 64u;
    let d = dc / p.chunks;
    let ch = dc % p.chunks;
    let live = dc < p.devices * p.chunks && j < p.c;
    var s = vec2<f32>(0.0, 0.0);
    if (live) {
        let r0 = d * p.rpd + ch * p.chunk;
        s = param_sums(j, r0 + lane, min(r0 + p.chunk, (d + 1u) * p.rpd), 4u);
    }
    lanes_g[lid] = s.x;
    lanes_b[lid] = s.y;
    workgroupBarrier();
    if (lane < 2u) {
        lanes_g[lid] += lanes_g[lid + 128u];
        lanes_b[lid] += lanes_b[lid + 128u];
    }
    workgroupBarrier();
    if (lane == 0u && live) {
        let at = partial_at(d, ch, j);
        partial[at] = lanes_g[lid] + lanes_g[lid + 64u];
        partial[at + p.c] = lanes_b[lid] + lanes_b[lid + 64u];
    }
}

@compute @workgroup_size(256)
fn backward_params_finish(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG; // (device, column)
    if (e >= p.devices * p.c) { return; }
    let d = e / p.c;
    let j = e % p.c;
    var dg = 0.0;
    var db = 0.0;
    for (var ch = 0u; ch < p.chunks; ch++) {
        let at = (d * p.chunks + ch) * 2u * p.c + j;
        dg += partial_in[at];
        db += partial_in[at + p.c];
    }
    dgamma[e] = dg;
    dbeta[e] = db;
}

// backward_params_partial_row4 and backward_params_finish4: the two stages of dgamma and dbeta
// with four adjacent columns per invocation (C a multiple of 4, bindings on 16 bytes): on
// lavapipe every storage access is a per-lane loop, so dout and x move four columns per load, and
// a row's mean and rstd are read once for four. Each column still adds its rows one by one, in
// order: the same arithmetic as backward_params_partial_row and backward_params_finish.
@group(0) @binding(21) var<storage, read_write> partial4: array<vec4<f32>>; // (D, chunks, 2, C / 4)
@group(0) @binding(22) var<storage, read> partial_in4: array<vec4<f32>>;    // (D, chunks, 2, C / 4)
@group(0) @binding(23) var<storage, read_write> dgamma4: array<vec4<f32>>;  // (D, C / 4)
@group(0) @binding(24) var<storage, read_write> dbeta4: array<vec4<f32>>;   // (D, C / 4)

@compute @workgroup_size(64)
fn backward_params_partial_row4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let c4 = p.c / 4u;
    let e = gid.x + gid.y * nwg.x * 64u; // ((device, chunk), column quad)
    if (e >= p.devices * p.chunks * c4) { return; }
    let dc = e / c4;
    let j = e % c4;
    let d = dc / p.chunks;
    let r0 = d * p.rpd + (dc % p.chunks) * p.chunk;
    var dg = vec4<f32>(0.0);
    var db = vec4<f32>(0.0);
    for (var r = r0; r < min(r0 + p.chunk, (d + 1u) * p.rpd); r++) {
        let i = r * c4 + j;
        let g = dout4[i];
        dg += g * (x4[i] - mean_in[r]) * rstd_in[r];
        db += g;
    }
    let at = dc * 2u * c4 + j;
    partial4[at] = dg;
    partial4[at + c4] = db;
}

@compute @workgroup_size(256)
fn backward_params_finish4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let c4 = p.c / 4u;
    let e = gid.x + gid.y * nwg.x * WG; // (device, column quad)
    if (e >= p.devices * c4) { return; }
    let d = e / c4;
    let j = e % c4;
    var dg = vec4<f32>(0.0);
    var db = vec4<f32>(0.0);
    for (var ch = 0u; ch < p.chunks; ch++) {
        let at = (d * p.chunks + ch) * 2u * c4 + j;
        dg += partial_in4[at];
        db += partial_in4[at + c4];
    }
    dgamma4[e] = dg;
    dbeta4[e] = db;
}

// Column sums of (device, column quad) e: column_sums four columns at a time.
fn column_sums4(e: u32) {
    let c4 = p.c / 4u;
    if (e >= p.devices * c4) { return; }
    let d = e / c4;
    let j = e % c4;
    var dg = vec4<f32>(0.0);
    var db = vec4<f32>(0.0);
    for (var ch = 0u; ch < p.chunks; ch++) {
        let r0 = d * p.rpd + ch * p.chunk;
        var cg = vec4<f32>(0.0);
        var cb = vec4<f32>(0.0);
        for (var r = r0; r < min(r0 + p.chunk, (d + 1u) * p.rpd); r++) {
            let i = r * c4 + j;
            let g = dout4[i];
            cg += g * (x4[i] - mean_in[r]) * rstd_in[r];
            cb += g;
        }
        dg += cg;
        db += cb;
    }
    dgamma4[e] = dg;
    dbeta4[e] = db;
}

// backward_fused_row with rows and columns as vec4s (C a multiple of 4, bindings on 16 bytes).
@compute @workgroup_size(64)
fn backward_fused_row4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
                       @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = wid.x + wid.y * nwg.x;
    if (w < p.row_groups) {
        dx_row4(w * 64u + lid);
    } else {
        column_sums4((w - p.row_groups) * 64u + lid);
    }
}
