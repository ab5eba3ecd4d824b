// A mixture-of-experts block's routing (crate/src/reference/moe.rs is the CPU twin; the
// encodings are crate/src/ir/moe.rs's). For D simulated devices the token-major arrays hold
// D x G groups one after another (a device's groups are a run of them); the expert buffers
// (E, G, C, W) are per device, device d's block after d - 1 others.
//   places (G, S, k) u32: choice j of token s at slot e * C + c, or E * C + e when dropped
//   owners (G, E, C) u32: the choice s * k + j in slot c of expert e, or S * k when empty
//   load   (G, 2, E):     every expert's choices of the group, then those kept

struct Params {
    groups: u32,   // G per device
    seq: u32,      // S
    experts: u32,  // E
    k: u32,
    capacity: u32, // C
    width: u32,    // W, a moved row's length
    devices: u32,  // D
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;          // (D*G, S, E)
@group(0) @binding(1) var<storage, read_write> probs: array<f32>;     // (D*G, S, E)
@group(0) @binding(2) var<storage, read_write> gates: array<f32>;     // (D*G, S, k)
@group(0) @binding(3) var<storage, read_write> places: array<u32>;    // (D*G, S, k)
@group(0) @binding(4) var<storage, read_write> owners: array<u32>;    // (D*G, E, C)
@group(0) @binding(5) var<storage, read_write> load: array<f32>;      // (D*G, 2, E)
@group(0) @binding(6) var<uniform> p: Params;
// route_grad
@group(0) @binding(7) var<storage, read> probs_in: array<f32>;        // (D*G, S, E)
@group(0) @binding(8) var<storage, read> gates_in: array<f32>;        // (D*G, S, k)
@group(0) @binding(9) var<storage, read> places_in: array<u32>;       // (D*G, S, k)
@group(0) @binding(10) var<storage, read> dprobs: array<f32>;         // (D*G, S, E)
@group(0) @binding(11) var<storage, read> dgates: array<f32>;         // (D*G, S, k)
@group(0) @binding(12) var<storage, read_write> dlogits: array<f32>;  // (D*G, S, E)
// dispatch, combine, gate_grad
@group(0) @binding(13) var<storage, read> rows_in: array<f32>;        // (D*G, S, W) or (D, E, G, C, W)
@group(0) @binding(14) var<storage, read> slots_in: array<f32>;       // (D, E, G, C, W)
@group(0) @binding(15) var<storage, read> owners_in: array<u32>;      // (D*G, E, C)
@group(0) @binding(16) var<storage, read> gate_of: array<f32>;        // (D*G, S, k)
@group(0) @binding(17) var<storage, read_write> out: array<f32>;

const WG: u32 = 64u;

fn linear_id(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// Whether (v, e) comes after (pv, pe) in the top-k order: larger values first, ties to the
// lower expert.
fn after(v: f32, e: u32, pv: f32, pe: u32) -> bool {
    return v < pv || (v == pv && e > pe);
}

// One workgroup routes one group. First each token (a lane per token): the softmax, the top
// k, the gates, and each choice's expert, written as its dropped place (E * C + e). Then each
// expert (a lane per expert) walks the group's choices in GShard's order (choice j of every
// token before choice j + 1 of any) and keeps the first C that chose it: their owners, its
// load. Last, each expert writes its kept choices' places; no lane reads a place then.
@compute @workgroup_size(64)
fn route(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let g = wid.x + wid.y * nwg.x; // uniform: the early return keeps barriers uniform
    if (g >= p.devices * p.groups) { return; }
    let e_n = p.experts;
    let slots = e_n * p.capacity;
    for (var t = lid; t < p.seq; t += WG) {
        let row = (g * p.seq + t) * e_n;
        var m = logits[row];
        for (var e = 1u; e < e_n; e++) { m = max(m, logits[row + e]); }
        var sum = 0.0;
        for (var e = 0u; e < e_n; e++) { sum += exp(logits[row + e] - m); }
        for (var e = 0u; e < e_n; e++) { probs[row + e] = exp(logits[row + e] - m) / sum; }
        let at = (g * p.seq + t) * p.k;
        var pv = 0.0;
        var pe = e_n; // no choice yet: every expert comes after it
        var top = 0.0;
        var gsum = 0.0;
        for (var j = 0u; j < p.k; j++) {
            var bv = 0.0;
            var be = e_n;
            for (var e = 0u; e < e_n; e++) {
                let v = logits[row + e];
                let candidate = pe == e_n || after(v, e, pv, pe);
                if (candidate && (be == e_n || v > bv || (v == bv && e < be))) {
                    bv = v;
                    be = e;
                }
            }
            if (j == 0u) { top = bv; }
            let w = exp(bv - top);
            gates[at + j] = w;
            gsum += w;
            places[at + j] = slots + be;
            pv = bv;
            pe = be;
        }
        for (var j = 0u; j < p.k; j++) { gates[at + j] = gates[at + j] / gsum; }
    }
    storageBarrier();
    workgroupBarrier();
    let choices = p.seq * p.k;
    for (var e = lid; e < e_n; e += WG) {
        var routed = 0u;
        var kept = 0u;
        let own = (g * e_n + e) * p.capacity;
        for (var j = 0u; j < p.k; j++) {
            for (var t = 0u; t < p.seq; t++) {
                if (places[(g * p.seq + t) * p.k + j] != slots + e) { continue; }
                routed++;
                if (kept < p.capacity) {
                    owners[own + kept] = t * p.k + j;
                    kept++;
                }
            }
        }
        for (var c = kept; c < p.capacity; c++) { owners[own + c] = choices; }
        load[g * 2u * e_n + e] = f32(routed);
        load[g * 2u * e_n + e_n + e] = f32(kept);
    }
    storageBarrier();
    workgroupBarrier();
    for (var e = lid; e < e_n; e += WG) {
        let own = (g * e_n + e) * p.capacity;
        for (var c = 0u; c < p.capacity; c++) {
            let o = owners[own + c];
            if (o >= choices) { break; }
            places[g * choices + o] = e * p.capacity + c;
        }
    }
}

// The expert of a choice at `place`, kept or dropped.
fn expert_of(place: u32) -> u32 {
    let slots = p.experts * p.capacity;
    if (place >= slots) { return place - slots; }
    return place / p.capacity;
}

// dlogits = p (dp - sum p dp), plus at each chosen expert g_j (dg_j - sum_m g_m dg_m). A lane
// per token.
@compute @workgroup_size(64)
fn route_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let tok = linear_id(gid, nwg);
    if (tok >= p.devices * p.groups * p.seq) { return; }
    let row = tok * p.experts;
    var dot = 0.0;
    for (var e = 0u; e < p.experts; e++) { dot += probs_in[row + e] * dprobs[row + e]; }
    for (var e = 0u; e < p.experts; e++) { dlogits[row + e] = probs_in[row + e] * (dprobs[row + e] - dot); }
    let at = tok * p.k;
    var gdot = 0.0;
    for (var j = 0u; j < p.k; j++) { gdot += gates_in[at + j] * dgates[at + j]; }
    for (var j = 0u; j < p.k; j++) {
        let e = expert_of(places_in[at + j]);
        dlogits[row + e] += gates_in[at + j] * (dgates[at + j] - gdot);
    }
}

// Element (e, g, c, w) of device d's buffer (D, E, G, C, W) from a linear id.
struct Slot {
    d: u32,
    e: u32,
    g: u32, // the group among all devices' (d * G + the device's)
    c: u32,
    w: u32,
}

fn slot_of(i: u32) -> Slot {
    let w = i % p.width;
    let c = (i / p.width) % p.capacity;
    let g = (i / (p.width * p.capacity)) % p.groups;
    let e = (i / (p.width * p.capacity * p.groups)) % p.experts;
    let d = i / (p.width * p.capacity * p.groups * p.experts);
    return Slot(d, e, d * p.groups + g, c, w);
}

// Index in device d's buffer of row (e, g, c), g among all devices' groups, column w.
fn buffer_at(d: u32, e: u32, g: u32, c: u32, w: u32) -> u32 {
    let local = g - d * p.groups;
    return (((d * p.experts + e) * p.groups + local) * p.capacity + c) * p.width + w;
}

// The slot's owner's row of rows_in (G, S, W) and its choice; choice == S * k for none.
fn owned(s: Slot) -> vec2<u32> {
    let o = owners_in[(s.g * p.experts + s.e) * p.capacity + s.c];
    return vec2(o, (s.g * p.seq + o / p.k) * p.width + s.w);
}

// out (D, E, G, C, W): each slot's owner's row, zeros where empty. A lane per element.
@compute @workgroup_size(64)
fn dispatch(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= p.devices * p.experts * p.groups * p.capacity * p.width) { return; }
    let o = owned(slot_of(i));
    var v = 0.0;
    if (o.x < p.seq * p.k) { v = rows_in[o.y]; }
    out[i] = v;
}

// dispatch, each row times its choice's gate.
@compute @workgroup_size(64)
fn dispatch_gated(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= p.devices * p.experts * p.groups * p.capacity * p.width) { return; }
    let s = slot_of(i);
    let o = owned(s);
    var v = 0.0;
    if (o.x < p.seq * p.k) { v = rows_in[o.y] * gate_of[s.g * p.seq * p.k + o.x]; }
    out[i] = v;
}

// out (D*G, S, W): each token's sum over its kept choices, in choice order, of its slot's row of
// rows_in (D, E, G, C, W). A lane per element.
@compute @workgroup_size(64)
fn combine(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= p.devices * p.groups * p.seq * p.width) { return; }
    let tok = i / p.width;
    let g = tok / p.seq;
    var acc = 0.0;
    for (var j = 0u; j < p.k; j++) {
        let place = places_in[tok * p.k + j];
        if (place >= p.experts * p.capacity) { continue; }
        acc += rows_in[buffer_at(g / p.groups, place / p.capacity, g, place % p.capacity, i % p.width)];
    }
    out[i] = acc;
}

// combine, each slot's row times its choice's gate.
@compute @workgroup_size(64)
fn combine_gated(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= p.devices * p.groups * p.seq * p.width) { return; }
    let tok = i / p.width;
    let g = tok / p.seq;
    var acc = 0.0;
    for (var j = 0u; j < p.k; j++) {
        let place = places_in[tok * p.k + j];
        if (place >= p.experts * p.capacity) { continue; }
        let v = rows_in[buffer_at(g / p.groups, place / p.capacity, g, place % p.capacity, i % p.width)];
        acc += v * gate_of[tok * p.k + j];
    }
    out[i] = acc;
}

// out (D*G, S, k): a kept choice's row of rows_in (D*G, S, W) dotted with its slot's row of
// slots_in (D, E, G, C, W); 0 for a dropped choice. A lane per choice.
@compute @workgroup_size(64)
fn gate_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= p.devices * p.groups * p.seq * p.k) { return; }
    let tok = i / p.k;
    let g = tok / p.seq;
    let place = places_in[i];
    var acc = 0.0;
    if (place < p.experts * p.capacity) {
        let b = buffer_at(g / p.groups, place / p.capacity, g, place % p.capacity, 0u);
        for (var w = 0u; w < p.width; w++) { acc += rows_in[tok * p.width + w] * slots_in[b + w]; }
    }
    out[i] = acc;
}
