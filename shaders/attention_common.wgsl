// Prelude: what the fused attention kernels share (attention.wgsl's workgroup-tiled kernels,
// attention_sg.wgsl's subgroup kernels): the launch's parameters, the per-device positions of
// rows and the dropout factor of a probability, drawn from the same Threefry counters as the
// bits kernels (threefry.wgsl, composed in front of this).
//
// Positions: query i sees key j when pos_k(j) <= pos_q(i), in global sequence positions. One
// device's whole sequence has pos(i) = i; under context parallelism each device holds blocks of
// it (its queries; the keys a ring step brought), each at most two runs of consecutive positions
// (zig-zag holds an early and a late chunk): row i < chunk at start0 + i, else at
// start1 + i - chunk, the starts per device in `offsets`.
// Dropout: keep = uniform(bits) < 1 - rate with jax.random's construction (dropout.wgsl);
// kept probabilities are scaled by 1/keep rounded to f32. The bits either arrive in `words`
// (heads, T, Tk), made by a random_bits launch, or are drawn in place from the key in `words`
// with the counters of the prelude (threefry.wgsl): head h is local head h mod heads_per_dev
// of device h / heads_per_dev; its row of the global (..., T, T) bits is the element of the
// device's block of the leading dims (start offsets[8d..8d+4], canonical rank 4), and the bits
// of (h, i, j) are element (row * seq + pos_q(i)) * seq + pos_k(j). Both give the same bits, so
// no (T, T) array is held.

// f32::MIN written so it parses as a finite f32 (Tint refuses -3.4028235e38, which is past it before rounding).
const LOWEST: f32 = -3.4028234e38;

struct Params {
    heads: u32,
    t: u32,             // query rows per head
    dh: u32,
    dropout: u32,       // 0 none, 1 bits in `words`, 2 bits drawn from the key in `words`
    scale: f32,         // on the scores: 1/sqrt(Dh)
    keep: f32,          // 1 - rate
    keep_scale: f32,    // rng::keep_scale(keep)
    heads_per_dev: u32, // B*H of one device
    n_global: u32,      // the draw (random.wgsl's Params): elements of the global bits
    tk: u32,            // key rows per head
    rng_layout: u32,    // 0 original, 1 partitionable
    key_stride: u32,    // words between devices' keys: 0 (shared) or 2
    seq: u32,           // the global sequence length
    q_chunk: u32,       // rows in the first run of a query block
    k_chunk: u32,       // rows in the first run of a key block
    item_heads: u32,    // heads of one batch item: row_at's split of a head index
    block_size: vec4<u32>,    // a device's block of the bits' leading dims (canonical)
    global_stride: vec4<u32>, // the leading dims' global strides (canonical)
    // Where the rows of q, k, v, o, do, dq, dk and dv sit (row_at); lse and rows are heads-major.
    q_at: vec4<u32>,
    k_at: vec4<u32>,
    v_at: vec4<u32>,
    o_at: vec4<u32>,
    do_at: vec4<u32>,
    dq_at: vec4<u32>,
    dk_at: vec4<u32>,
    dv_at: vec4<u32>,
    // 1 where dk and dv are one buffer, bound once as dk: the dk-and-dv kernel writes dv's rows
    // there too (two writable bindings of one buffer would alias, which WebGPU refuses).
    dv_in_dk: u32,
}

@group(0) @binding(3) var<storage, read> words: array<u32>;   // the bits, or the keys
@group(0) @binding(4) var<storage, read> offsets: array<u32>; // (devices, 8): leading block start, q and k run starts
@group(0) @binding(7) var<uniform> u: Params;

// Element 0 of row i of head h (of all devices' heads) of an operand laid out as `at` = (batch,
// head, row, offset) in f32 elements: head h is head h % item_heads of batch item
// h / item_heads. Heads-major (heads, T, Dh) has item_heads 1 and batch T*Dh. The lowering also
// hands q, k, v, o, do and the gradients as they lie in the (B, T, [3,] H, Dh) arrays around the
// op (the projections' rows), so no transpose copies them in or out.
fn row_at(at: vec4<u32>, h: u32, i: u32) -> u32 {
    return at.w + (h / u.item_heads) * at.x + (h % u.item_heads) * at.y + i * at.z;
}

fn run_pos(s0: u32, s1: u32, chunk: u32, i: u32) -> u32 {
    if (i < chunk) { return s0 + i; }
    return s1 + i - chunk;
}

// The smallest and largest position of rows a..=b of a block (each run is increasing).
fn run_min(s0: u32, s1: u32, chunk: u32, a: u32, b: u32) -> u32 {
    if (b < chunk || a >= chunk) { return run_pos(s0, s1, chunk, a); }
    return min(s0 + a, s1);
}

fn run_max(s0: u32, s1: u32, chunk: u32, a: u32, b: u32) -> u32 {
    if (b < chunk || a >= chunk) { return run_pos(s0, s1, chunk, b); }
    return max(s0 + chunk - 1u, s1 + b - chunk);
}

// What every row of head h shares: its device's runs of query and key positions (pos_q and
// pos_k above: head_pos_q, head_pos_k), and for drawn bits the key and the head's row of the
// global bits. A workgroup reads it once, where reading per row would cost CPU adapters a loop
// over the lanes per read.
struct Head {
    h: u32,
    dev: u32,
    q_runs: vec2<u32>,
    k_runs: vec2<u32>,
    key: vec2<u32>,
    row: u32,
}

fn head_at(h: u32) -> Head {
    let d = h / u.heads_per_dev;
    let o8 = 8u * d;
    var key = vec2(0u);
    var row = 0u;
    if (u.dropout == 2u) {
        let start = vec4<u32>(offsets[o8], offsets[o8 + 1u], offsets[o8 + 2u], offsets[o8 + 3u]);
        row = block_element(h - d * u.heads_per_dev, start, u.block_size, u.global_stride);
        key = vec2(words[d * u.key_stride], words[d * u.key_stride + 1u]);
    }
    return Head(h, d, vec2(offsets[o8 + 4u], offsets[o8 + 5u]), vec2(offsets[o8 + 6u], offsets[o8 + 7u]), key, row);
}

fn head_pos_q(hd: Head, i: u32) -> u32 {
    return run_pos(hd.q_runs.x, hd.q_runs.y, u.q_chunk, i);
}

fn head_pos_k(hd: Head, j: u32) -> u32 {
    return run_pos(hd.k_runs.x, hd.k_runs.y, u.k_chunk, j);
}

// The largest query position among rows a..=b, the smallest key position among rows a..=b.
fn head_q_max(hd: Head, a: u32, b: u32) -> u32 {
    return run_max(hd.q_runs.x, hd.q_runs.y, u.q_chunk, a, b);
}

fn head_k_min(hd: Head, a: u32, b: u32) -> u32 {
    return run_min(hd.k_runs.x, hd.k_runs.y, u.k_chunk, a, b);
}

// The dropout factor of probability (i, j) of head `hd`: 0 dropped, 1/keep kept, 1 without
// dropout.
fn head_keep(hd: Head, i: u32, j: u32) -> f32 {
    if (u.dropout == 0u) { return 1.0; }
    var bits = 0u;
    if (u.dropout == 1u) {
        bits = words[(hd.h * u.t + i) * u.tk + j];
    } else {
        let g = (hd.row * u.seq + head_pos_q(hd, i)) * u.seq + head_pos_k(hd, j);
        bits = counter_bits(hd.key.x, hd.key.y, g, u.n_global, u.rng_layout);
    }
    return select(0.0, u.keep_scale, uniform01(bits) < u.keep);
}

// The dropout factor of probability (h, i, j).
fn keep_factor(h: u32, i: u32, j: u32) -> f32 {
    if (u.dropout == 0u) { return 1.0; }
    return head_keep(head_at(h), i, j);
}

fn head_of(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y + wid.z * nwg.y;
}
