//! Collectives: every WGSL kernel against its CPU twin on 1-D meshes of 1, 2, 3, 4 and 8 devices
//! and on 2x2, 2x4 and 3x2 meshes (over each axis, both, and both in reverse order), on odd local
//! sizes and several ranks; and every twin against JAX's definition written independently here
//! (global arrays and `NamedSharding` blocks, or mesh coordinates).
use shardlab::gpu::{Dispatch, GpuBuffer, GpuContext, GpuError};
use shardlab::kernels::collectives as gpu;
use shardlab::reference::collectives::{self as twin, CollectiveArgs};
use shardlab::sharding::{self, Mesh, NamedSharding, PartitionSpec, ShardingError};
use shardlab_tests::{assert_close, gpu_or_skip, rand_vec};

/// (mesh, axes of the collective).
type Case = (Mesh, Vec<&'static str>);

fn meshes_1d() -> Vec<Case> {
    [1, 2, 3, 4, 8]
        .iter()
        .map(|&n| (Mesh::new(&[("x", n)]).unwrap(), vec!["x"]))
        .collect()
}

fn meshes_2d() -> Vec<Case> {
    let mut cases = Vec::new();
    for text in ["dp=2,tp=2", "dp=2,tp=4", "dp=3,tp=2"] {
        for axes in [vec!["dp"], vec!["tp"], vec!["dp", "tp"], vec!["tp", "dp"]] {
            cases.push((Mesh::parse(text).unwrap(), axes));
        }
    }
    cases
}

fn all_cases() -> Vec<Case> {
    let mut cases = meshes_1d();
    cases.extend(meshes_2d());
    cases
}

/// Local shapes of several ranks with odd sizes (rank 0 is a scalar per device).
const SHAPES: &[&[usize]] = &[&[], &[1], &[3], &[17], &[3, 5], &[2, 3, 4]];

/// The arguments every collective takes.
fn args<'a>(mesh: &'a Mesh, axes: &'a [&'a str], local_shape: &'a [usize]) -> CollectiveArgs<'a> {
    CollectiveArgs {
        mesh,
        axes,
        local_shape,
    }
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn group_size(mesh: &Mesh, axes: &[&str]) -> usize {
    mesh.axes_size(axes).unwrap()
}

/// Every device's block of `shape`, distinct values.
fn input(mesh: &Mesh, shape: &[usize], seed: u32) -> Vec<f32> {
    rand_vec(mesh.devices() * numel(shape), seed)
}

/// Runs one launch on `x`, into an output prefilled with NaN so unwritten elements fail.
fn on_gpu(
    ctx: &GpuContext,
    x: &[f32],
    out_len: usize,
    launch: impl FnOnce(&GpuBuffer, &GpuBuffer) -> Result<Dispatch, GpuError>,
) -> Vec<f32> {
    let xb = ctx.upload("x", x).unwrap();
    let ob = ctx.upload("out", &vec![f32::NAN; out_len]).unwrap();
    let d = launch(&xb, &ob).unwrap();
    ctx.run(&[d]);
    ctx.read_blocking::<f32>(&ob).unwrap()
}

fn label(op: &str, mesh: &Mesh, axes: &[&str], shape: &[usize], extra: &str) -> String {
    format!("{op} on {mesh} over {axes:?} local {shape:?} {extra}")
}

// ---- GPU vs twin ----

fn check_psum_and_pmean(ctx: &GpuContext, cases: &[Case]) {
    for (mesh, axes) in cases {
        for shape in SHAPES {
            let x = input(mesh, shape, 1);
            let want = twin::psum(&args(mesh, axes, shape), &x).unwrap();
            let got = on_gpu(ctx, &x, want.len(), |xb, ob| {
                pollster::block_on(gpu::psum(ctx, &args(mesh, axes, shape), xb, ob))
            });
            assert_close(&label("psum", mesh, axes, shape, ""), &got, &want, 1e-6, 1e-6);
            let want = twin::pmean(&args(mesh, axes, shape), &x).unwrap();
            let got = on_gpu(ctx, &x, want.len(), |xb, ob| {
                pollster::block_on(gpu::pmean(ctx, &args(mesh, axes, shape), xb, ob))
            });
            assert_close(&label("pmean", mesh, axes, shape, ""), &got, &want, 1e-6, 1e-6);
        }
    }
}

fn check_all_gather(ctx: &GpuContext, cases: &[Case]) {
    for (mesh, axes) in cases {
        for shape in SHAPES {
            for tiled in [true, false] {
                let axes_count = shape.len() + usize::from(!tiled);
                for axis in 0..axes_count {
                    let x = input(mesh, shape, 2);
                    let want = twin::all_gather(&args(mesh, axes, shape), &x, axis, tiled).unwrap();
                    let got = on_gpu(ctx, &x, want.len(), |xb, ob| {
                        pollster::block_on(gpu::all_gather(ctx, &args(mesh, axes, shape), xb, ob, axis, tiled))
                    });
                    let what = label("all_gather", mesh, axes, shape, &format!("axis={axis} tiled={tiled}"));
                    assert_close(&what, &got, &want, 0.0, 0.0);
                }
            }
        }
    }
}

/// A local shape whose dimension `k` is `base[k] * g` (tiled) or `g` inserted at `k` (untiled).
fn divisible_shape(base: &[usize], g: usize, k: usize, tiled: bool) -> Vec<usize> {
    let mut s = base.to_vec();
    if tiled {
        s[k] *= g;
    } else {
        s.insert(k, g);
    }
    s
}

const BASES: &[&[usize]] = &[&[1], &[3], &[17], &[3, 5], &[2, 3, 1]];

fn check_psum_scatter(ctx: &GpuContext, cases: &[Case]) {
    for (mesh, axes) in cases {
        let g = group_size(mesh, axes);
        for base in BASES {
            for tiled in [true, false] {
                for k in 0..base.len() + usize::from(!tiled) {
                    let shape = divisible_shape(base, g, k, tiled);
                    let x = input(mesh, &shape, 3);
                    let want = twin::psum_scatter(&args(mesh, axes, &shape), &x, k, tiled).unwrap();
                    let got = on_gpu(ctx, &x, want.len(), |xb, ob| {
                        pollster::block_on(gpu::psum_scatter(ctx, &args(mesh, axes, &shape), xb, ob, k, tiled))
                    });
                    let what = label("psum_scatter", mesh, axes, &shape, &format!("dim={k} tiled={tiled}"));
                    assert_close(&what, &got, &want, 1e-6, 1e-6);
                }
            }
        }
    }
}

/// Permutations along a group of g: a cyclic shift, a reversal, one partial pair, and none.
fn perms(g: usize) -> Vec<Vec<(usize, usize)>> {
    vec![
        (0..g).map(|i| (i, (i + 1) % g)).collect(),
        (0..g).map(|i| (i, g - 1 - i)).collect(),
        vec![(0, g - 1)],
        vec![],
    ]
}

fn check_ppermute(ctx: &GpuContext, cases: &[Case]) {
    for (mesh, axes) in cases {
        for perm in perms(group_size(mesh, axes)) {
            for shape in SHAPES {
                let x = input(mesh, shape, 4);
                let want = twin::ppermute(&args(mesh, axes, shape), &x, &perm).unwrap();
                let got = on_gpu(ctx, &x, want.len(), |xb, ob| {
                    pollster::block_on(gpu::ppermute(ctx, &args(mesh, axes, shape), xb, ob, &perm))
                });
                assert_close(
                    &label("ppermute", mesh, axes, shape, &format!("{perm:?}")),
                    &got,
                    &want,
                    0.0,
                    0.0,
                );
            }
        }
    }
}

/// (local shape, split_axis, concat_axis, tiled) of every all_to_all case for group size g.
fn all_to_all_cases(g: usize) -> Vec<(Vec<usize>, usize, usize, bool)> {
    let mut cases = Vec::new();
    for base in BASES {
        for s in 0..base.len() {
            for c in 0..base.len() {
                cases.push((divisible_shape(base, g, s, true), s, c, true));
            }
        }
        for s in 0..=base.len() {
            for c in 0..=base.len() {
                cases.push((divisible_shape(base, g, s, false), s, c, false));
            }
        }
    }
    cases
}

fn check_all_to_all(ctx: &GpuContext, cases: &[Case]) {
    for (mesh, axes) in cases {
        for (shape, s, c, tiled) in all_to_all_cases(group_size(mesh, axes)) {
            let x = input(mesh, &shape, 5);
            let want = twin::all_to_all(&args(mesh, axes, &shape), &x, s, c, tiled).unwrap();
            let got = on_gpu(ctx, &x, want.len(), |xb, ob| {
                pollster::block_on(gpu::all_to_all(ctx, &args(mesh, axes, &shape), xb, ob, s, c, tiled))
            });
            let what = label(
                "all_to_all",
                mesh,
                axes,
                &shape,
                &format!("split={s} concat={c} tiled={tiled}"),
            );
            assert_close(&what, &got, &want, 0.0, 0.0);
        }
    }
}

fn check_axis_index(ctx: &GpuContext, cases: &[Case]) {
    for (mesh, axes) in cases {
        let want = twin::axis_index(mesh, axes).unwrap();
        let out = ctx.upload("axis index", &vec![u32::MAX; mesh.devices()]).unwrap();
        let d = pollster::block_on(gpu::axis_index(ctx, mesh, axes, &out)).unwrap();
        ctx.run(&[d]);
        let got = ctx.read_blocking::<u32>(&out).unwrap();
        assert_eq!(got, want, "axis_index on {mesh} over {axes:?}");
    }
}

/// psum of several arrays packed in one arena, in place, against the twin and, bit for bit,
/// against one psum launch per array; the arena between the arrays keeps its values.
fn check_psum_packed(ctx: &GpuContext, cases: &[Case]) {
    // Sizes on both sides of the kernel's 256-element spans, with gaps between the arrays.
    let sizes = [1usize, 17, 256, 300];
    for (mesh, axes) in cases {
        let d = mesh.devices();
        let mut arrays = vec![];
        let mut end = 3;
        for &n in &sizes {
            arrays.push((end, n));
            end += d * n + 5;
        }
        let arena = rand_vec(end, 7);
        let mut want = arena.clone();
        twin::psum_packed(mesh, axes, &mut want, &arrays).unwrap();
        let buf = ctx.upload("arena", &arena).unwrap();
        let dispatch = pollster::block_on(gpu::psum_packed(ctx, mesh, axes, &buf, &arrays)).unwrap();
        ctx.run(&[dispatch]);
        let got = ctx.read_blocking::<f32>(&buf).unwrap();
        let what = label("psum_packed", mesh, axes, &sizes, "");
        assert_close(&what, &got, &want, 1e-6, 1e-6);
        for &(start, n) in &arrays {
            let x = &arena[start..start + d * n];
            let alone = on_gpu(ctx, x, x.len(), |xb, ob| {
                pollster::block_on(gpu::psum(ctx, &args(mesh, axes, &[n]), xb, ob))
            });
            let packed = &got[start..start + d * n];
            assert!(
                alone.iter().zip(packed).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: array at {start} differs from its own psum"
            );
        }
    }
}

#[test]
fn psum_of_packed_arrays_matches_reference_and_each_arrays_own_psum_on_1d_and_2d_meshes() {
    check_psum_packed(gpu_or_skip!(), &all_cases());
}

#[test]
fn psum_and_pmean_match_reference_on_1d_meshes_of_1_2_3_4_and_8_devices() {
    check_psum_and_pmean(gpu_or_skip!(), &meshes_1d());
}

#[test]
fn psum_and_pmean_match_reference_on_2x2_2x4_and_3x2_meshes() {
    check_psum_and_pmean(gpu_or_skip!(), &meshes_2d());
}

#[test]
fn all_gather_matches_reference_on_1d_meshes_of_1_2_3_4_and_8_devices() {
    check_all_gather(gpu_or_skip!(), &meshes_1d());
}

#[test]
fn all_gather_matches_reference_on_2x2_2x4_and_3x2_meshes() {
    check_all_gather(gpu_or_skip!(), &meshes_2d());
}

#[test]
fn psum_scatter_matches_reference_on_1d_meshes_of_1_2_3_4_and_8_devices() {
    check_psum_scatter(gpu_or_skip!(), &meshes_1d());
}

#[test]
fn psum_scatter_matches_reference_on_2x2_2x4_and_3x2_meshes() {
    check_psum_scatter(gpu_or_skip!(), &meshes_2d());
}

#[test]
fn ppermute_matches_reference_on_1d_meshes_of_1_2_3_4_and_8_devices() {
    check_ppermute(gpu_or_skip!(), &meshes_1d());
}

#[test]
fn ppermute_matches_reference_on_2x2_2x4_and_3x2_meshes() {
    check_ppermute(gpu_or_skip!(), &meshes_2d());
}

#[test]
fn all_to_all_matches_reference_on_1d_meshes_of_1_2_3_4_and_8_devices() {
    check_all_to_all(gpu_or_skip!(), &meshes_1d());
}

#[test]
fn all_to_all_matches_reference_on_2x2_2x4_and_3x2_meshes() {
    check_all_to_all(gpu_or_skip!(), &meshes_2d());
}

#[test]
fn axis_index_matches_reference_on_1d_and_2d_meshes() {
    check_axis_index(gpu_or_skip!(), &all_cases());
}

/// Bit patterns an f32 load or store may change (a driver that canonicalises NaNs or flushes
/// denormals): quiet and signalling NaNs with payloads, a negative NaN, and denormals.
const SPECIAL_BITS: [u32; 5] = [0x7fc0_0001, 0xffc0_0000, 0x7f80_0001, 0x0000_0001, 0x807f_ffff];

/// `n` u32 values cycling through [`SPECIAL_BITS`], each kept in its class (NaN stays NaN,
/// denormal stays denormal) but made distinct, so a moved element cannot pass for another.
fn special_bits(n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| {
            let (base, k) = (SPECIAL_BITS[i % SPECIAL_BITS.len()], (i / SPECIAL_BITS.len()) as u32);
            if base == 0x807f_ffff {
                base - k
            } else {
                base + k
            }
        })
        .collect()
}

/// As [`on_gpu`], for u32 data; the output is prefilled with a marker so unwritten elements fail.
fn on_gpu_bits(
    ctx: &GpuContext,
    x: &[u32],
    out_len: usize,
    launch: impl FnOnce(&GpuBuffer, &GpuBuffer) -> Result<Dispatch, GpuError>,
) -> Vec<u32> {
    let xb = ctx.upload("x bits", x).unwrap();
    let ob = ctx.upload("out bits", &vec![0xdead_beefu32; out_len]).unwrap();
    let d = launch(&xb, &ob).unwrap();
    ctx.run(&[d]);
    ctx.read_blocking::<u32>(&ob).unwrap()
}

#[test]
fn data_moving_collectives_keep_every_bit_of_nan_and_denormal_u32_patterns() {
    let ctx = gpu_or_skip!();
    for (mesh, axes) in all_cases() {
        let g = group_size(&mesh, &axes);
        // Dimension 1 splits evenly over the group, for all_to_all.
        let shape = [3, 2 * g];
        let x = special_bits(mesh.devices() * numel(&shape));
        assert_eq!(x[..SPECIAL_BITS.len()], SPECIAL_BITS);
        let a = args(&mesh, &axes, &shape);
        for (axis, tiled) in [(0, true), (1, true), (1, false)] {
            let want = twin::all_gather(&a, &x, axis, tiled).unwrap();
            let got = on_gpu_bits(ctx, &x, want.len(), |xb, ob| {
                pollster::block_on(gpu::all_gather(ctx, &a, xb, ob, axis, tiled))
            });
            let what = label(
                "all_gather u32",
                &mesh,
                &axes,
                &shape,
                &format!("axis={axis} tiled={tiled}"),
            );
            assert_eq!(got, want, "{what}");
        }
        for perm in perms(g) {
            let want = twin::ppermute(&a, &x, &perm).unwrap();
            let got = on_gpu_bits(ctx, &x, want.len(), |xb, ob| {
                pollster::block_on(gpu::ppermute(ctx, &a, xb, ob, &perm))
            });
            assert_eq!(
                got,
                want,
                "{}",
                label("ppermute u32", &mesh, &axes, &shape, &format!("{perm:?}"))
            );
        }
        for (split, concat) in [(1, 0), (1, 1)] {
            let want = twin::all_to_all(&a, &x, split, concat, true).unwrap();
            let got = on_gpu_bits(ctx, &x, want.len(), |xb, ob| {
                pollster::block_on(gpu::all_to_all(ctx, &a, xb, ob, split, concat, true))
            });
            let what = label(
                "all_to_all u32",
                &mesh,
                &axes,
                &shape,
                &format!("split={split} concat={concat}"),
            );
            assert_eq!(got, want, "{what}");
        }
    }
}

#[test]
fn collective_launchers_return_errors_instead_of_panicking() {
    let ctx = gpu_or_skip!();
    let mesh = Mesh::parse("dp=2,tp=4").unwrap();
    let x = ctx.zeros("x", 8 * 6).unwrap();
    let out = ctx.zeros("out", 8 * 6).unwrap();
    let small = ctx.zeros("small", 8).unwrap();
    let err = |r: Result<Dispatch, GpuError>| r.err().expect("expected an error").to_string();
    let e = err(pollster::block_on(gpu::psum(
        ctx,
        &args(&mesh, &["pp"], &[6]),
        &x,
        &out,
    )));
    assert!(e.contains("unknown mesh axis 'pp'"), "{e}");
    let e = err(pollster::block_on(gpu::psum(
        ctx,
        &args(&mesh, &["tp"], &[6]),
        &x,
        &small,
    )));
    assert!(e.contains("`out`") && e.contains("holds 8 elements"), "{e}");
    let e = err(pollster::block_on(gpu::psum(ctx, &args(&mesh, &["tp"], &[6]), &x, &x)));
    assert!(e.contains("bound twice"), "{e}");
    let e = err(pollster::block_on(gpu::psum_scatter(
        ctx,
        &args(&mesh, &["tp"], &[6]),
        &x,
        &out,
        0,
        true,
    )));
    assert!(
        e.contains("scatter_dimension 0 of size 6 is not divisible by the group size 4"),
        "{e}"
    );
    let e = err(pollster::block_on(gpu::ppermute(
        ctx,
        &args(&mesh, &["tp"], &[6]),
        &x,
        &out,
        &[(0, 1), (0, 2)],
    )));
    assert!(e.contains("share the source 0"), "{e}");
    let e = err(pollster::block_on(gpu::axis_index(ctx, &mesh, &["dp", "dp"], &small)));
    assert!(e.contains("used twice"), "{e}");
    let e = err(pollster::block_on(gpu::psum_packed(ctx, &mesh, &["tp"], &x, &[(1, 6)])));
    assert!(e.contains("`arena`") && e.contains("holds 48 elements"), "{e}");
    let e = err(pollster::block_on(gpu::psum_packed(ctx, &mesh, &["tp"], &x, &[(0, 0)])));
    assert!(e.contains("at least 1"), "{e}");
    let e = err(pollster::block_on(gpu::psum_packed(ctx, &mesh, &["tp"], &x, &[])));
    assert!(e.contains("no arrays"), "{e}");
}

// ---- twin vs JAX's definition ----

/// The device with `d`'s coordinates on every other axis and index `j` along `axes` (the first
/// axis major), from mesh coordinates.
fn member(mesh: &Mesh, d: usize, axes: &[&str], j: usize) -> usize {
    let mut coords = mesh.device_coords(d).unwrap();
    let mut rest = j;
    for a in axes.iter().rev() {
        let size = mesh.axis_size(a).unwrap();
        coords[mesh.axis_position(a).unwrap()] = rest % size;
        rest /= size;
    }
    mesh.device_at(&coords).unwrap()
}

/// d's index along `axes` from its coordinates.
fn index_along(mesh: &Mesh, d: usize, axes: &[&str]) -> usize {
    let coords = mesh.device_coords(d).unwrap();
    axes.iter().fold(0, |i, a| {
        i * mesh.axis_size(a).unwrap() + coords[mesh.axis_position(a).unwrap()]
    })
}

fn block(x: &[f32], d: usize, n: usize) -> &[f32] {
    &x[d * n..(d + 1) * n]
}

/// Sum over the devices that share d's other coordinates.
fn sum_over(mesh: &Mesh, axes: &[&str], x: &[f32], d: usize, n: usize) -> Vec<f32> {
    let mut s = vec![0.0; n];
    for j in 0..group_size(mesh, axes) {
        for (a, v) in s.iter_mut().zip(block(x, member(mesh, d, axes, j), n)) {
            *a += v;
        }
    }
    s
}

/// The mesh axes not in `axes`, in mesh order.
fn other_axes<'a>(mesh: &'a Mesh, axes: &[&str]) -> Vec<&'a str> {
    mesh.axis_names().into_iter().filter(|a| !axes.contains(a)).collect()
}

/// A spec of rank `rank` with dimension 0 over the other axes and dimension `dim` (if any) over `axes`.
fn spec(rank: usize, others: &[&str], dim: Option<usize>, axes: &[&str]) -> PartitionSpec {
    let mut entries = vec![Vec::new(); rank];
    entries[0] = others.iter().map(|a| a.to_string()).collect();
    if let Some(dim) = dim {
        entries[dim] = axes.iter().map(|a| a.to_string()).collect();
    }
    PartitionSpec::new(entries)
}

fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    let total = numel(shape);
    let mut idx = vec![0; shape.len()];
    for _ in 0..total {
        f(&idx);
        for k in (0..shape.len()).rev() {
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

fn flat(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |f, (i, n)| f * n + i)
}

#[test]
fn psum_and_pmean_twins_sum_the_devices_that_share_the_other_coordinates() {
    for (mesh, axes) in all_cases() {
        let g = group_size(&mesh, &axes);
        for shape in SHAPES {
            let n = numel(shape);
            let x = input(&mesh, shape, 11);
            let want: Vec<f32> = (0..mesh.devices())
                .flat_map(|d| sum_over(&mesh, &axes, &x, d, n))
                .collect();
            let what = label("psum", &mesh, &axes, shape, "");
            assert_close(
                &what,
                &twin::psum(&args(&mesh, &axes, shape), &x).unwrap(),
                &want,
                1e-6,
                1e-6,
            );
            let mean: Vec<f32> = want.iter().map(|v| v / g as f32).collect();
            assert_close(
                &what,
                &twin::pmean(&args(&mesh, &axes, shape), &x).unwrap(),
                &mean,
                1e-6,
                1e-6,
            );
        }
    }
}

#[test]
fn all_gather_twin_unshards_a_dimension_sharded_over_the_axes() {
    // x holds the blocks of a global array G whose dimension `axis` is sharded over `axes` (and a
    // leading dimension over the other axes, so every device holds distinct data); all_gather
    // must give the blocks of G with that dimension no longer sharded.
    for (mesh, axes) in all_cases() {
        let g = group_size(&mesh, &axes);
        let others = other_axes(&mesh, &axes);
        let o: usize = others.iter().map(|a| mesh.axis_size(a).unwrap()).product();
        for shape in SHAPES {
            for tiled in [true, false] {
                for axis in 0..shape.len() + usize::from(!tiled) {
                    let mut global = vec![o];
                    global.extend_from_slice(shape);
                    if tiled {
                        global[axis + 1] *= g;
                    } else {
                        global.insert(axis + 1, g);
                    }
                    let rank = global.len();
                    let sharded_in =
                        NamedSharding::new(mesh.clone(), spec(rank, &others, Some(axis + 1), &axes)).unwrap();
                    let gathered = NamedSharding::new(mesh.clone(), spec(rank, &others, None, &axes)).unwrap();
                    let values = rand_vec(numel(&global), 12);
                    let x = sharded_in.shard(&values, &global).unwrap();
                    let want = gathered.shard(&values, &global).unwrap();
                    let got = twin::all_gather(&args(&mesh, &axes, shape), &x, axis, tiled).unwrap();
                    let what = label("all_gather", &mesh, &axes, shape, &format!("axis={axis} tiled={tiled}"));
                    assert_close(&what, &got, &want, 0.0, 0.0);
                }
            }
        }
    }
}

#[test]
fn psum_scatter_twin_keeps_the_block_of_the_sum_at_the_device_index() {
    // Device d keeps the block of the group sum that a sharding of `scatter_dimension` over a mesh
    // of just `axes` gives the device at d's index along them.
    for (mesh, axes) in all_cases() {
        let g = group_size(&mesh, &axes);
        let sizes: Vec<(&str, usize)> = axes.iter().map(|a| (*a, mesh.axis_size(a).unwrap())).collect();
        let sub = Mesh::new(&sizes).unwrap();
        for base in BASES {
            for tiled in [true, false] {
                for k in 0..base.len() + usize::from(!tiled) {
                    let shape = divisible_shape(base, g, k, tiled);
                    let n = numel(&shape);
                    let mut entries = vec![Vec::new(); shape.len()];
                    entries[k] = axes.iter().map(|a| a.to_string()).collect();
                    let scattered = NamedSharding::new(sub.clone(), PartitionSpec::new(entries)).unwrap();
                    let x = input(&mesh, &shape, 13);
                    let mut want = Vec::new();
                    for d in 0..mesh.devices() {
                        let sum = sum_over(&mesh, &axes, &x, d, n);
                        let ranges = scattered.device_indices(index_along(&mesh, d, &axes), &shape).unwrap();
                        let local = scattered.shard_shape(&shape).unwrap();
                        for_each_index(&local, |i| {
                            let at: Vec<usize> = i.iter().zip(&ranges).map(|(i, r)| r.start + i).collect();
                            want.push(sum[flat(&at, &shape)]);
                        });
                    }
                    let got = twin::psum_scatter(&args(&mesh, &axes, &shape), &x, k, tiled).unwrap();
                    let what = label("psum_scatter", &mesh, &axes, &shape, &format!("dim={k} tiled={tiled}"));
                    assert_close(&what, &got, &want, 1e-6, 1e-6);
                }
            }
        }
    }
}

#[test]
fn ppermute_twin_moves_blocks_from_source_to_destination_index_and_zeros_the_rest() {
    for (mesh, axes) in all_cases() {
        for perm in perms(group_size(&mesh, &axes)) {
            for shape in SHAPES {
                let n = numel(shape);
                let x = input(&mesh, shape, 14);
                let mut want = Vec::new();
                for d in 0..mesh.devices() {
                    let i = index_along(&mesh, d, &axes);
                    match perm.iter().find(|(_, dst)| *dst == i) {
                        Some(&(src, _)) => want.extend_from_slice(block(&x, member(&mesh, d, &axes, src), n)),
                        None => want.extend(std::iter::repeat_n(0.0, n)),
                    }
                }
                let got = twin::ppermute(&args(&mesh, &axes, shape), &x, &perm).unwrap();
                assert_close(
                    &label("ppermute", &mesh, &axes, shape, &format!("{perm:?}")),
                    &got,
                    &want,
                    0.0,
                    0.0,
                );
            }
        }
    }
}

#[test]
fn all_to_all_twin_reshards_from_the_concat_axis_to_the_split_axis() {
    // Tiled, split != concat: blocks of G sharded along concat_axis become blocks of G sharded
    // along split_axis (JAX's resharding use of all_to_all).
    for (mesh, axes) in all_cases() {
        let g = group_size(&mesh, &axes);
        let others = other_axes(&mesh, &axes);
        let o: usize = others.iter().map(|a| mesh.axis_size(a).unwrap()).product();
        for (shape, s, c, tiled) in all_to_all_cases(g) {
            if !tiled || s == c {
                continue;
            }
            let mut global = vec![o];
            global.extend_from_slice(&shape);
            global[c + 1] *= g;
            let rank = global.len();
            let before = NamedSharding::new(mesh.clone(), spec(rank, &others, Some(c + 1), &axes)).unwrap();
            let after = NamedSharding::new(mesh.clone(), spec(rank, &others, Some(s + 1), &axes)).unwrap();
            let values = rand_vec(numel(&global), 15);
            let x = before.shard(&values, &global).unwrap();
            let want = after.shard(&values, &global).unwrap();
            let got = twin::all_to_all(&args(&mesh, &axes, &shape), &x, s, c, true).unwrap();
            let what = label(
                "all_to_all",
                &mesh,
                &axes,
                &shape,
                &format!("split={s} concat={c} tiled"),
            );
            assert_close(&what, &got, &want, 0.0, 0.0);
        }
    }
}

#[test]
fn all_to_all_twin_matches_the_elementwise_definition() {
    // Untiled (JAX): out[.., j at concat_axis, ..] = x_j[.., r at split_axis, ..] where x_j is the
    // block of the member at index j and r is the receiver's index. Tiled with split == concat:
    // chunk j of the output is chunk r of x_j.
    for (mesh, axes) in all_cases() {
        let g = group_size(&mesh, &axes);
        for (shape, s, c, tiled) in all_to_all_cases(g) {
            if tiled && s != c {
                continue;
            }
            let n = numel(&shape);
            let out_shape = sharding::all_to_all_shape(&shape, g, s, c, tiled).unwrap();
            let x = input(&mesh, &shape, 16);
            let mut want = Vec::new();
            for d in 0..mesh.devices() {
                let r = index_along(&mesh, d, &axes);
                for_each_index(&out_shape, |o| {
                    let (j, src) = if tiled {
                        let m = shape[s] / g;
                        let mut src = o.to_vec();
                        src[s] = r * m + o[s] % m;
                        (o[s] / m, src)
                    } else {
                        let mut src = o.to_vec();
                        src.remove(c);
                        src.insert(s, r);
                        (o[c], src)
                    };
                    want.push(block(&x, member(&mesh, d, &axes, j), n)[flat(&src, &shape)]);
                });
            }
            let got = twin::all_to_all(&args(&mesh, &axes, &shape), &x, s, c, tiled).unwrap();
            let what = label(
                "all_to_all",
                &mesh,
                &axes,
                &shape,
                &format!("split={s} concat={c} tiled={tiled}"),
            );
            assert_close(&what, &got, &want, 0.0, 0.0);
        }
    }
}

#[test]
fn axis_index_twin_is_the_position_along_the_axes_first_axis_major() {
    for (mesh, axes) in all_cases() {
        let want: Vec<u32> = (0..mesh.devices())
            .map(|d| index_along(&mesh, d, &axes) as u32)
            .collect();
        assert_eq!(twin::axis_index(&mesh, &axes).unwrap(), want, "{mesh} over {axes:?}");
    }
    // Hand-checked: on dp=2,tp=4 over ('tp', 'dp') device 5 (dp=1, tp=1) is at 1*2+1 = 3.
    let mesh = Mesh::parse("dp=2,tp=4").unwrap();
    assert_eq!(twin::axis_index(&mesh, &["tp", "dp"]).unwrap()[5], 3);
}

#[test]
fn collective_twins_on_a_2x4_mesh_match_hand_computed_values() {
    // Device d holds [d]; over tp the groups are [0..4] and [4..8].
    let mesh = Mesh::parse("dp=2,tp=4").unwrap();
    let x: Vec<f32> = (0..8).map(|d| d as f32).collect();
    assert_eq!(
        twin::psum(&args(&mesh, &["tp"], &[1]), &x).unwrap(),
        vec![6., 6., 6., 6., 22., 22., 22., 22.]
    );
    assert_eq!(
        twin::psum(&args(&mesh, &["dp"], &[1]), &x).unwrap(),
        vec![4., 6., 8., 10., 4., 6., 8., 10.]
    );
    assert_eq!(
        twin::pmean(&args(&mesh, &["dp", "tp"], &[1]), &x).unwrap(),
        vec![3.5; 8]
    );
    let gathered = twin::all_gather(&args(&mesh, &["dp"], &[1]), &x, 0, true).unwrap();
    assert_eq!(&gathered[..4], &[0., 4., 1., 5.]);
    let shifted = twin::ppermute(&args(&mesh, &["tp"], &[1]), &x, &[(0, 1), (1, 2), (2, 3)]).unwrap();
    assert_eq!(shifted, vec![0., 0., 1., 2., 0., 4., 5., 6.]);
    // psum_scatter over dp of blocks [d, 10 + d]: device (dp=0, tp=t) keeps element 0 of the sum.
    let y: Vec<f32> = (0..8).flat_map(|d| [d as f32, 10.0 + d as f32]).collect();
    let scattered = twin::psum_scatter(&args(&mesh, &["dp"], &[2]), &y, 0, true).unwrap();
    assert_eq!(scattered, vec![4., 6., 8., 10., 24., 26., 28., 30.]);
}

#[test]
fn collective_twins_reject_bad_arguments_with_actionable_errors() {
    let mesh = Mesh::parse("dp=2,tp=4").unwrap();
    let x = vec![0.0; 8 * 6];
    let msg = |r: Result<Vec<f32>, ShardingError>| r.expect_err("expected an error").to_string();
    let e = msg(twin::psum_scatter(&args(&mesh, &["tp"], &[6]), &x, 0, true));
    assert!(
        e.contains("scatter_dimension 0 of size 6 is not divisible by the group size 4"),
        "{e}"
    );
    let e = msg(twin::psum_scatter(&args(&mesh, &["tp"], &[6]), &x, 0, false));
    assert!(e.contains("must have the group size 4, but it has size 6"), "{e}");
    let e = msg(twin::all_to_all(&args(&mesh, &["tp"], &[6]), &x, 0, 0, true));
    assert!(
        e.contains("split_axis 0 of size 6 is not divisible by the group size 4"),
        "{e}"
    );
    let e = msg(twin::all_to_all(&args(&mesh, &["dp"], &[6]), &x, 0, 0, false));
    assert!(e.contains("must have the group size 2"), "{e}");
    let e = msg(twin::all_to_all(&args(&mesh, &["dp"], &[6]), &x, 0, 1, true));
    assert!(e.contains("concat_axis 1 is out of range"), "{e}");
    let e = msg(twin::all_gather(&args(&mesh, &["dp"], &[6]), &x, 1, true));
    assert!(
        e.contains("axis 1 is out of range for a local block of shape [6]"),
        "{e}"
    );
    let e = msg(twin::ppermute(&args(&mesh, &["tp"], &[6]), &x, &[(0, 1), (2, 1)]));
    assert!(e.contains("share the destination 1"), "{e}");
    let e = msg(twin::ppermute(&args(&mesh, &["tp"], &[6]), &x, &[(0, 4)]));
    assert!(e.contains("(0, 4) is out of range"), "{e}");
    let e = msg(twin::psum(&args(&mesh, &["sp"], &[6]), &x));
    assert!(e.contains("unknown mesh axis 'sp'"), "{e}");
    let e = msg(twin::psum(&args(&mesh, &["tp"], &[5]), &x));
    assert!(e.contains("x holds 48 elements but 40 are needed"), "{e}");
}
