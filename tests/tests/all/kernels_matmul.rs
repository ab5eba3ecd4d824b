//! Every matmul variant and the autotuned launcher against the CPU reference (itself checked against
//! plain f64 loops), on odd shapes, batches with strides and broadcast, transposes, bias, alpha and
//! accumulate, and the shapes of MODEL.md's tiny model.
use shardlab::gpu::GpuContext;
use shardlab::kernels::matmul::{class_key, matmul, variants, MatmulShape, Variant};
use shardlab::model::GptConfig;
use shardlab::reference::matmul as reference;
use shardlab_tests::{assert_close, gpu_or_skip, rand_vec, Need};

const ODD: &[(usize, usize, usize)] = &[(1, 1, 1), (3, 5, 7), (17, 33, 65), (65, 17, 3)];
const TRANSPOSES: [(bool, bool); 4] = [(false, false), (true, false), (false, true), (true, true)];

/// The operands of one test case: inputs, an optional bias and the C that accumulate adds to.
struct Case {
    s: MatmulShape,
    a: Vec<f32>,
    b: Vec<f32>,
    bias: Option<Vec<f32>>,
    c0: Vec<f32>,
}

impl Case {
    fn new(s: MatmulShape, with_bias: bool, seed: u32) -> Self {
        Case {
            a: rand_vec(s.a_len(), seed),
            b: rand_vec(s.b_len(), seed + 1),
            bias: with_bias.then(|| rand_vec((s.batch - 1) * s.stride_bias + s.n, seed + 2)),
            c0: rand_vec(s.c_len(), seed + 3),
            s,
        }
    }

    fn want(&self) -> Vec<f32> {
        let mut c = self.c0.clone();
        reference::matmul(&self.s, &self.a, &self.b, self.bias.as_deref(), &mut c);
        c
    }

    /// Runs `variant` (None: the autotuned launcher) and returns C.
    fn run(&self, ctx: &GpuContext, variant: Option<Variant>) -> Vec<f32> {
        let a = ctx.upload("a", &self.a).unwrap();
        let b = ctx.upload("b", &self.b).unwrap();
        let bias = self.bias.as_ref().map(|x| ctx.upload("bias", x).unwrap());
        let c = ctx.upload("c", &self.c0).unwrap();
        let d = pollster::block_on(async { matmul(ctx, &self.s, &a, &b, bias.as_ref(), &c, variant).await })
            .unwrap_or_else(|e| panic!("{variant:?} {}: {e}", self.s.describe()));
        ctx.run(&d);
        ctx.read_blocking::<f32>(&c).unwrap()
    }

    fn check(&self, ctx: &GpuContext, variant: Option<Variant>) {
        let what = format!(
            "{} {} bias={} {:?}",
            variant.map_or("autotuned", Variant::name),
            self.s.describe(),
            self.bias.is_some(),
            self.s
        );
        assert_close(&what, &self.run(ctx, variant), &self.want(), 1e-4, 1e-4);
    }
}

fn shape(batch: usize, m: usize, n: usize, k: usize, ta: bool, tb: bool) -> MatmulShape {
    MatmulShape {
        trans_a: ta,
        trans_b: tb,
        ..MatmulShape::new(batch, m, n, k)
    }
}

/// C = op(A) @ op(B) in f64 with explicit indexing: the oracle's oracle.
fn loops_f64(s: &MatmulShape, a: &[f32], b: &[f32], bias: Option<&[f32]>, c: &mut [f32]) {
    for z in 0..s.batch {
        for i in 0..s.m {
            for j in 0..s.n {
                let mut acc = 0f64;
                for kk in 0..s.k {
                    let x = if s.trans_a {
                        a[z * s.stride_a + kk * s.m + i]
                    } else {
                        a[z * s.stride_a + i * s.k + kk]
                    };
                    let y = if s.trans_b {
                        b[z * s.stride_b + j * s.k + kk]
                    } else {
                        b[z * s.stride_b + kk * s.n + j]
                    };
                    acc += x as f64 * y as f64;
                }
                let idx = z * s.stride_c + i * s.n + j;
                let old = if s.accumulate { c[idx] as f64 } else { 0.0 };
                c[idx] = (s.alpha as f64 * acc + bias.map_or(0.0, |x| x[z * s.stride_bias + j] as f64) + old) as f32;
            }
        }
    }
}

#[test]
fn reference_matmul_matches_f64_loops_with_every_flag() {
    for &(m, n, k) in ODD {
        for (ta, tb) in TRANSPOSES {
            let mut s = shape(3, m, n, k, ta, tb);
            s.stride_a = 0;
            s.stride_b += 2;
            s.stride_c += 1;
            s.alpha = -0.75;
            s.accumulate = true;
            s.stride_bias = if ta { n + 3 } else { 0 };
            let case = Case::new(s, true, 7);
            let mut want = case.c0.clone();
            loops_f64(&s, &case.a, &case.b, case.bias.as_deref(), &mut want);
            assert_close(&format!("reference {}", s.describe()), &case.want(), &want, 1e-5, 1e-5);
        }
    }
}

/// A bias per batch item (a fused bias add of simulated devices: each device's item adds its own
/// device's bias), with the vec4 stores and without.
#[test]
fn every_variant_adds_each_batch_items_own_bias() {
    let ctx = gpu_or_skip!();
    for v in variants(ctx) {
        for (m, n, k) in [(17, 33, 65), (64, 128, 64)] {
            for tb in [false, true] {
                let mut s = shape(3, m, n, k, false, tb);
                s.stride_bias = n + 4;
                Case::new(s, true, 53).check(ctx, Some(v));
            }
        }
    }
}

#[test]
fn every_variant_matches_reference_on_odd_shapes_and_transposes() {
    let ctx = gpu_or_skip!();
    let names = variants(ctx);
    assert!(
        names.contains(&Variant::Naive),
        "naive must be supported everywhere: {names:?}"
    );
    for v in names {
        for &(m, n, k) in ODD {
            for (ta, tb) in TRANSPOSES {
                Case::new(shape(1, m, n, k, ta, tb), false, 11).check(ctx, Some(v));
            }
        }
    }
}

#[test]
fn every_variant_applies_bias_alpha_and_accumulate() {
    let ctx = gpu_or_skip!();
    for v in variants(ctx) {
        // (n % 4 == 0 takes the vec4 store path of the packed variants, the others the scalar one)
        for &(m, n, k) in &[(3, 5, 7), (17, 32, 65), (33, 36, 16)] {
            for (with_bias, alpha, accumulate) in [(true, 1.0, false), (false, 0.5, true), (true, -2.0, true)] {
                let mut s = shape(1, m, n, k, false, true);
                s.alpha = alpha;
                s.accumulate = accumulate;
                Case::new(s, with_bias, 23).check(ctx, Some(v));
            }
        }
    }
}

#[test]
fn every_variant_handles_batches_with_strides_and_broadcast() {
    let ctx = gpu_or_skip!();
    for v in variants(ctx) {
        for (ta, tb) in TRANSPOSES {
            for &(m, n, k) in &[(3, 5, 7), (17, 16, 9)] {
                // Padded batch strides: items do not touch, the gaps must stay as they were.
                let mut s = shape(3, m, n, k, ta, tb);
                s.stride_a += 5;
                s.stride_b += 3;
                s.stride_c += 4;
                Case::new(s, true, 31).check(ctx, Some(v));
                // One B for every item (weights), then one A for every item.
                let mut s = shape(4, m, n, k, ta, tb);
                s.stride_b = 0;
                Case::new(s, false, 37).check(ctx, Some(v));
                let mut s = shape(2, m, n, k, ta, tb);
                s.stride_a = 0;
                s.accumulate = true;
                Case::new(s, true, 41).check(ctx, Some(v));
            }
        }
    }
}

/// The packed variants pack an operand whose rows are contiguous (A as stored, B transposed)
/// with vec4 loads when K and the batch strides are multiples of 4, and block8 reads an operand
/// already in its layout (A transposed, B as stored, M or N a multiple of 8) without a pack: rows
/// past the matrix, items back to back, strides that keep the vec4s aligned and strides that do
/// not (the scalar pack), and a broadcast operand.
#[test]
fn every_variant_matches_reference_where_operands_pack_as_vec4_or_not_at_all() {
    let ctx = gpu_or_skip!();
    for v in variants(ctx) {
        for (ta, tb) in TRANSPOSES {
            for &(m, n, k) in &[(18, 21, 12), (5, 3, 4), (33, 64, 36), (16, 24, 12), (64, 128, 20)] {
                Case::new(shape(3, m, n, k, ta, tb), true, 59).check(ctx, Some(v));
                let mut s = shape(3, m, n, k, ta, tb);
                s.stride_a += 4;
                s.stride_b += 8;
                Case::new(s, true, 61).check(ctx, Some(v));
                let mut s = shape(3, m, n, k, ta, tb);
                s.stride_a += 2;
                s.stride_b += 6;
                Case::new(s, false, 67).check(ctx, Some(v));
                let mut s = shape(2, m, n, k, ta, tb);
                s.stride_b = 0;
                s.accumulate = true;
                Case::new(s, false, 71).check(ctx, Some(v));
            }
        }
    }
}

/// The matmuls of a forward and backward step of MODEL.md's tiny model.
fn tiny_model_shapes() -> Vec<MatmulShape> {
    let cfg = GptConfig::tiny();
    let (bt, d, v, t, dh) = (cfg.batch * cfg.seq, cfg.d_model, cfg.vocab, cfg.seq, cfg.head_dim());
    let bh = cfg.batch * cfg.heads;
    let mut shapes = Vec::new();
    for out in [3 * d, d, 4 * d, v] {
        shapes.push(shape(1, bt, out, d, false, false)); // x @ W (+ b)
        shapes.push(shape(1, bt, d, out, false, true)); // dx = dy @ W^T
        let mut dw = shape(1, d, out, bt, true, false); // dW += x^T @ dy
        dw.accumulate = true;
        shapes.push(dw);
    }
    shapes.push(shape(1, 4 * bt, d, 4 * d, false, false)); // the MLP down projection's input is 4d wide
    let mut scores = shape(bh, t, t, dh, false, true); // q @ k^T / sqrt(Dh)
    scores.alpha = 1.0 / (dh as f32).sqrt();
    shapes.push(scores);
    shapes.push(shape(bh, t, dh, t, false, false)); // a @ v
    shapes.push(shape(bh, t, t, dh, false, true)); // da = dout @ v^T
    shapes.push(shape(bh, t, dh, t, true, false)); // dv = a^T @ dout
    shapes
}

#[test]
fn every_variant_matches_reference_on_tiny_model_shapes() {
    let ctx = gpu_or_skip!();
    for v in variants(ctx) {
        for s in tiny_model_shapes() {
            Case::new(s, !s.trans_a && !s.trans_b && s.batch == 1, 43).check(ctx, Some(v));
        }
    }
}

#[test]
fn autotuned_matmul_is_right_for_every_shape_class() {
    let ctx = gpu_or_skip!();
    let mut classes = std::collections::BTreeSet::new();
    for (ta, tb) in TRANSPOSES {
        for &(batch, m, n, k) in &[
            (1, 16, 16, 16),
            (1, 5, 7, 3),
            (1, 64, 128, 64),
            (1, 63, 129, 65),
            (1, 256, 256, 256),
            (1, 255, 257, 259),
            (4, 16, 32, 16),
            (3, 9, 17, 5),
            (8, 64, 64, 32),
            (2, 100, 200, 50),
        ] {
            let mut s = shape(batch, m, n, k, ta, tb);
            if batch > 1 {
                s.stride_b = 0;
            }
            Case::new(s, true, 53).check(ctx, None);
            classes.insert(class_key(&s));
        }
    }
    let tuned = shardlab::kernels::Tuning::with(ctx, |t| t.matmul.clone()).unwrap();
    for key in &classes {
        let v = tuned
            .get(key)
            .unwrap_or_else(|| panic!("class {key} was not tuned: {tuned:?}"));
        assert!(
            variants(ctx).contains(v),
            "class {key} chose {v}, not a variant of this adapter"
        );
        // CPU adapters keep the kernels tuned for them: the GPU variants are never timed there.
        assert!(
            !(ctx.summary.is_cpu() && v.for_gpus()),
            "class {key} chose the GPU variant {v} on a CPU adapter"
        );
    }
    assert!(classes.len() >= 24, "shapes cover only {} classes", classes.len());
    eprintln!("autotuner choices: {tuned:#?}");
}

#[test]
fn matmul_rejects_bad_operands_with_a_message() {
    let ctx = gpu_or_skip!();
    let s = shape(2, 4, 5, 6, false, false);
    let a = ctx.zeros("a", s.a_len() - 1).unwrap();
    let b = ctx.zeros("b", s.b_len()).unwrap();
    let c = ctx.zeros("c", s.c_len()).unwrap();
    let err = |r: Result<Vec<_>, shardlab::gpu::GpuError>| r.err().expect("should fail").to_string();
    let msg = err(pollster::block_on(matmul(ctx, &s, &a, &b, None, &c, None)));
    assert!(msg.contains("A holds") && msg.contains("needs"), "{msg}");
    let a = ctx.zeros("a", s.a_len()).unwrap();
    let msg = "fastest".parse::<Variant>().unwrap_err().to_string();
    assert!(msg.contains("unknown matmul variant") && msg.contains("naive"), "{msg}");
    let sq = shape(1, 4, 4, 4, false, false);
    let msg = err(pollster::block_on(matmul(
        ctx,
        &sq,
        &a,
        &b,
        None,
        &a,
        Some(Variant::Naive),
    )));
    assert!(msg.contains("also an input"), "{msg}");
    let mut overlap = s;
    overlap.stride_c = 3;
    let msg = err(pollster::block_on(matmul(ctx, &overlap, &a, &b, None, &c, None)));
    assert!(msg.contains("overlap"), "{msg}");
    let empty = shape(1, 0, 4, 4, false, false);
    let msg = err(pollster::block_on(matmul(ctx, &empty, &a, &b, None, &c, None)));
    assert!(msg.contains("empty shape"), "{msg}");
}

/// lavapipe runs a subgroup as the lanes of one CPU vector: 8 with its default 256-bit vectors, 16
/// with `LP_NATIVE_VECTOR_WIDTH=512` (what the `shardlab` binary sets on AVX-512 CPUs). sg must
/// be offered there, or every test above would pass without it.
#[test]
fn sg_is_offered_where_a_subgroup_is_one_cpu_vector() {
    let ctx = gpu_or_skip!();
    if !ctx.summary.name.contains("llvmpipe") {
        return shardlab_tests::adapter_lacks(Need::Llvmpipe, &ctx.summary.identity());
    }
    for v in [Variant::Sg, Variant::Sg1] {
        assert!(variants(ctx).contains(&v), "{v} missing from {:?}", variants(ctx));
    }
    assert_eq!(
        ctx.adapter.get_info().subgroup_max_size,
        shardlab_tests::lavapipe_lanes()
    );
}

/// sg's blocks are 64 rows by 64 (8 lanes) or 128 (16 lanes) columns, sg1's 32 by 32 (8 lanes) or
/// 64 by 64 (16 lanes): shapes that need several of each, with a partial last block, every
/// transpose, batches, bias and accumulate.
#[test]
fn sg_matches_reference_across_several_blocks_of_rows_and_columns() {
    let ctx = gpu_or_skip!();
    if ![Variant::Sg, Variant::Sg1].iter().any(|v| variants(ctx).contains(v)) {
        return shardlab_tests::adapter_lacks(Need::Subgroups, &ctx.summary.identity());
    }
    for v in [Variant::Sg, Variant::Sg1] {
        if !variants(ctx).contains(&v) {
            continue;
        }
        for (ta, tb) in TRANSPOSES {
            Case::new(shape(2, 130, 270, 21, ta, tb), true, 31).check(ctx, Some(v));
        }
        let mut s = shape(3, 70, 132, 64, false, false);
        s.accumulate = true;
        s.alpha = 0.5;
        Case::new(s, false, 41).check(ctx, Some(v));
    }
}

/// The 16-lane entry points, checked in a child process of this test binary with 512-bit vectors
/// (lavapipe fixes its vector width when it loads, once per process). Runs where lavapipe and
/// AVX-512 are both here; elsewhere there is no 16-lane lavapipe to check.
#[test]
fn sg16_matches_reference_with_512_bit_vectors_in_a_child_process() {
    shardlab_tests::check_with_16_lanes(
        &["kernels_matmul::"],
        &[
            "sg_is_offered_where_a_subgroup_is_one_cpu_vector",
            "sg_matches_reference_across_several_blocks_of_rows_and_columns",
            "every_variant_matches_reference_on_odd_shapes_and_transposes",
            "sg1_reads_operands_holding_k_side_by_side_from_copies_not_packs",
        ],
    );
}

/// tex16 and sg copy an operand into its texture when its memory already is the texture's rows
/// (A transposed, B as stored, rows of a multiple of 64 values, items back to back) instead of
/// packing it; anything else is packed, both operands in one pass.
#[test]
fn texture_variants_copy_operands_already_in_their_layout() {
    let ctx = gpu_or_skip!();
    for v in [Variant::Tex16, Variant::Sg, Variant::Sg1] {
        if !variants(ctx).contains(&v) {
            continue;
        }
        let labels = |s: &MatmulShape| {
            let a = ctx.zeros("a", s.a_len()).unwrap();
            let b = ctx.zeros("b", s.b_len()).unwrap();
            let c = ctx.zeros("c", s.c_len()).unwrap();
            let d = pollster::block_on(matmul(ctx, s, &a, &b, None, &c, Some(v))).unwrap();
            d.iter().map(|d| d.label.clone()).collect::<Vec<_>>()
        };
        let both = labels(&shape(2, 64, 128, 20, true, false));
        assert!(both[0].ends_with("copy A") && both[1].ends_with("copy B"), "{both:?}");
        // Both operands packed: one pass for both.
        let packed = labels(&shape(2, 64, 128, 20, false, true));
        assert!(packed.len() == 2 && packed[0].ends_with(" pack"), "{packed:?}");
        let mut gap = shape(2, 64, 128, 20, true, false);
        gap.stride_b += 64;
        let one = labels(&gap);
        assert!(one[0].ends_with("copy A") && one[1].ends_with(" pack"), "{one:?}");
        Case::new(gap, true, 83).check(ctx, Some(v));
        Case::new(shape(2, 64, 128, 20, true, false), true, 89).check(ctx, Some(v));
    }
}

#[test]
fn sg1_reads_operands_holding_k_side_by_side_from_copies_not_packs() {
    let ctx = gpu_or_skip!();
    if !variants(ctx).contains(&Variant::Sg1) {
        return;
    }
    let labels = |s: &MatmulShape| {
        let a = ctx.zeros("a", s.a_len()).unwrap();
        let b = ctx.zeros("b", s.b_len()).unwrap();
        let c = ctx.zeros("c", s.c_len()).unwrap();
        let d = pollster::block_on(matmul(ctx, s, &a, &b, None, &c, Some(Variant::Sg1))).unwrap();
        d.iter().map(|d| d.label.clone()).collect::<Vec<_>>()
    };
    // A as stored and B transposed (a layer's input gradient): both copied, no pass.
    let nt = shape(2, 64, 96, 128, false, true);
    let both = labels(&nt);
    assert!(
        both.len() == 3 && both[0].ends_with("copy A") && both[1].ends_with("copy B"),
        "{both:?}"
    );
    // A as stored, B as stored (a layer's forward): both copied, A k-major and B as before.
    let nn = shape(2, 64, 128, 128, false, false);
    let fwd = labels(&nn);
    assert!(
        fwd.len() == 3 && fwd[0].ends_with("copy A") && fwd[1].ends_with("copy B"),
        "{fwd:?}"
    );
    // Each alone with the other packed, a broadcast B, several column blocks, bias, alpha and
    // accumulate: against the reference.
    let mut gap = nt;
    gap.stride_b += 4;
    let mut broadcast = nn;
    broadcast.stride_b = 0;
    let wide = shape(1, 16, 144, 64, false, true);
    let mut accumulate = shape(3, 32, 16, 64, false, false);
    accumulate.accumulate = true;
    accumulate.alpha = 0.5;
    for (i, s) in [nt, nn, gap, broadcast, wide, accumulate].into_iter().enumerate() {
        Case::new(s, i % 2 == 0, 97 + 4 * i as u32).check(ctx, Some(Variant::Sg1));
    }
}

/// A train step's matmuls built with one `SharedTextures` copy each operand once: a layer's input
/// x is read as rows of K in the forward (sg1's k-major texture) and as k-rows in the weight
/// gradient, its weight w in the forward and (transposed) in the input gradient, the output
/// gradient dy in both gradients, and each pair is the same texels. Every matmul brings its copy
/// when built, so the order they are built in does not matter: `drop_repeated_copies` keeps the
/// first to run. Operands of other contents, or none named, get their own texture.
#[test]
fn matmuls_sharing_textures_copy_each_operand_once_whatever_order_they_are_built_in() {
    use shardlab::kernels::matmul::{drop_repeated_copies, matmul_shared, Operands, SharedTextures, Sharing};
    let ctx = gpu_or_skip!();
    if !variants(ctx).contains(&Variant::Sg1) {
        return;
    }
    let (m, k, n) = (128, 64, 128);
    let x = rand_vec(m * k, 7);
    let w = rand_vec(k * n, 8);
    let dy = rand_vec(m * n, 9);
    let [gx, gw, gdy] = [&x, &w, &dy].map(|v| ctx.upload("operand", v).unwrap());
    // y = x @ w, dx = dy @ w^T, dw = x^T @ dy, each with the contents of (A, B).
    let products = [
        (shape(1, m, n, k, false, false), [&gx, &gw], [1, 2], [&x, &w]),
        (shape(1, m, k, n, false, true), [&gdy, &gw], [3, 2], [&dy, &w]),
        (shape(1, k, n, m, true, false), [&gx, &gdy], [1, 3], [&x, &dy]),
    ];
    let run = |named: &dyn Fn([u64; 2]) -> [Option<u64>; 2]| {
        let textures = SharedTextures::default();
        let outs: Vec<_> = products
            .iter()
            .map(|(s, ..)| ctx.zeros("c", s.c_len()).unwrap())
            .collect();
        // Built last first, run in order.
        let mut built: Vec<Vec<_>> = products
            .iter()
            .zip(&outs)
            .rev()
            .map(|((s, [a, b], contents, _), c)| {
                let ops = Operands { a, b, bias: None, c };
                let sharing = Sharing {
                    textures: &textures,
                    contents: named(*contents),
                };
                pollster::block_on(matmul_shared(ctx, s, ops, Some(Variant::Sg1), Some(sharing))).unwrap()
            })
            .collect();
        built.reverse();
        let (all, kept) = drop_repeated_copies(built.into_iter().flatten().collect());
        ctx.run(&all);
        for ((s, _, _, [a, b]), c) in products.iter().zip(&outs) {
            let mut want = vec![0.0; s.c_len()];
            reference::matmul(s, a, b, None, &mut want);
            assert_close(&s.describe(), &ctx.read_blocking::<f32>(c).unwrap(), &want, 1e-4, 1e-4);
        }
        let copies: Vec<String> = all.iter().filter(|d| d.is_copy()).map(|d| d.label.clone()).collect();
        (copies, kept.iter().filter(|k| !**k).count())
    };
    let (copies, dropped) = run(&|c| c.map(Some));
    assert_eq!(dropped, 3, "{copies:?}");
    assert_eq!(copies.len(), 3, "x, w and dy once each: {copies:?}");
    let (copies, dropped) = run(&|_| [None, None]);
    assert_eq!(
        (copies.len(), dropped),
        (6, 0),
        "nothing named, nothing shared: {copies:?}"
    );
    // dy under one name as an A and another as a B: copied for each, where x and w still share.
    let (copies, _) = run(&|[a, b]| [Some(a), Some(b + 10)]);
    assert_eq!(copies.len(), 4, "{copies:?}");
}
