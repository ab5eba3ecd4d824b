//! The matmul autotuner: at the first matmul of a shape class on an adapter, time every variant the
//! adapter supports on a small representative problem of that class, keep the fastest one whose result
//! matches the naive kernel's, and cache the choice in the context's [`Tuning`]. Async throughout: in the browser it
//! awaits the GPU instead of blocking.
use super::variants::{build, shape_supports, Operands, Variant};
use super::MatmulShape;
use crate::gpu::{now_ms, Dispatch, GpuContext, GpuError};
use crate::kernels::Tuning;

/// Work (batch*m*n*k) below which a matmul is "small", and "medium"; above, "large".
const SMALL_WORK: usize = 1 << 18;
const MEDIUM_WORK: usize = 1 << 24;

/// How much work a matmul does, by class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SizeClass {
    Small,
    Medium,
    Large,
}

/// The autotuner's cache key: size x alignment x transposes x batched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MatmulClass {
    pub size: SizeClass,
    /// M, N and K all multiples of 16.
    pub aligned: bool,
    pub trans_a: bool,
    pub trans_b: bool,
    pub batched: bool,
}

/// Written as `matmul/large/aligned/nn/single`.
impl std::fmt::Display for MatmulClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let size = match self.size {
            SizeClass::Small => "small",
            SizeClass::Medium => "medium",
            SizeClass::Large => "large",
        };
        let aligned = if self.aligned { "aligned" } else { "unaligned" };
        let t = |x: bool| if x { 't' } else { 'n' };
        let batched = if self.batched { "batched" } else { "single" };
        write!(
            f,
            "matmul/{size}/{aligned}/{}{}/{batched}",
            t(self.trans_a),
            t(self.trans_b)
        )
    }
}

impl MatmulClass {
    /// The class its [`Display`](std::fmt::Display) form names, e.g. `matmul/large/aligned/nn/single`.
    pub fn parse(text: &str) -> Option<MatmulClass> {
        let parts: Vec<&str> = text.split('/').collect();
        let [kind, size, aligned, trans, batched] = parts[..] else {
            return None;
        };
        let size = match size {
            "small" => SizeClass::Small,
            "medium" => SizeClass::Medium,
            "large" => SizeClass::Large,
            _ => return None,
        };
        let flag = |text: &str, yes: &str, no: &str| match text {
            t if t == yes => Some(true),
            t if t == no => Some(false),
            _ => None,
        };
        let t = |c: char| match c {
            't' => Some(true),
            'n' => Some(false),
            _ => None,
        };
        let trans: Vec<char> = trans.chars().collect();
        if kind != "matmul" || trans.len() != 2 {
            return None;
        }
        Some(MatmulClass {
            size,
            aligned: flag(aligned, "aligned", "unaligned")?,
            trans_a: t(trans[0])?,
            trans_b: t(trans[1])?,
            batched: flag(batched, "batched", "single")?,
        })
    }
}

/// The shape class of `s`.
pub fn class_key(s: &MatmulShape) -> MatmulClass {
    let work = s.batch * s.m * s.n * s.k;
    let size = if work < SMALL_WORK {
        SizeClass::Small
    } else if work < MEDIUM_WORK {
        SizeClass::Medium
    } else {
        SizeClass::Large
    };
    MatmulClass {
        size,
        aligned: aligned(s),
        trans_a: s.trans_a,
        trans_b: s.trans_b,
        batched: s.batch > 1,
    }
}

fn aligned(s: &MatmulShape) -> bool {
    s.m.is_multiple_of(16) && s.n.is_multiple_of(16) && s.k.is_multiple_of(16)
}

/// The problem timed for `s`'s class: `s` itself where it does at most twice the work of the class's
/// stand-in below, else the stand-in. The shape itself ranks the variants as its class's first matmul
/// will run: attention's batched (64 x 64) @ (64 x 32) leaves half of sg's 64-column blocks idle,
/// and sg1 ran it 2.5x faster, where on a cube stand-in noise picked either. The stand-ins are
/// small enough to tune in well under a second on lavapipe, and large enough too: at 256 block8,
/// which reads B (or a transposed A) without a pack, and tex16, whose packs cost more the smaller
/// the matmul, are within 10-20% of each other on lavapipe and noise picks either, while from 384
/// up tex16 is a clear 30-40% faster.
fn representative(s: &MatmulShape, gpu: bool) -> MatmulShape {
    let stand_in = stand_in(s, gpu);
    let work = |x: &MatmulShape| x.batch * x.m * x.n * x.k;
    if work(s) <= 2 * work(&stand_in) {
        // Items back to back (a broadcast operand stays one item); bias, alpha and accumulate
        // change no variant's loop: the tuner times a plain product of the same dimensions.
        let fresh = MatmulShape::new(s.batch, s.m, s.n, s.k);
        MatmulShape {
            trans_a: s.trans_a,
            trans_b: s.trans_b,
            stride_a: if s.stride_a == 0 { 0 } else { fresh.stride_a },
            stride_b: if s.stride_b == 0 { 0 } else { fresh.stride_b },
            ..fresh
        }
    } else {
        stand_in
    }
}

/// A cube (or a batch of 8 cubes) of the class's size, nudged off multiples of 16 for unaligned
/// classes. On GPUs the large class's cube is 1024: at 384 a GPU's matmul is bound by its launch,
/// and a 128x128 tile leaves most of its multiprocessors idle, so the cube would rank the variants
/// as the model's large matmuls never see them; a GPU times the larger cube in milliseconds.
fn stand_in(s: &MatmulShape, gpu: bool) -> MatmulShape {
    let work = s.batch * s.m * s.n * s.k;
    let d = if work < SMALL_WORK {
        32
    } else if work < MEDIUM_WORK {
        128
    } else if gpu {
        1024
    } else {
        384
    };
    let (batch, d) = if s.batch > 1 { (8, d / 2) } else { (1, d) };
    let (m, n, k) = if aligned(s) { (d, d, d) } else { (d - 3, d + 5, d - 1) };
    MatmulShape {
        trans_a: s.trans_a,
        trans_b: s.trans_b,
        ..MatmulShape::new(batch, m, n, k)
    }
}

/// The variant the launcher uses for `s` on this adapter: the pinned variant (`Tuning::matmul_pin`),
/// else the tuned choice of its class (tuning it now if this is the class's first matmul); when that
/// variant cannot take this shape (limits), the first of block8, tiled, naive that can.
pub async fn choose_variant(ctx: &GpuContext, s: &MatmulShape) -> Result<Variant, GpuError> {
    let key = class_key(s);
    let cached = Tuning::with(ctx, |t| t.matmul_pin.or_else(|| t.matmul.get(&key).copied())).flatten();
    let tuned = match cached {
        Some(v) => v,
        None => {
            let t0 = now_ms();
            let v = tune(ctx, &representative(s, !ctx.summary.is_cpu())).await?;
            ctx.pipelines.add_tuning_ms(now_ms() - t0);
            Tuning::with(ctx, |t| {
                t.matmul.insert(key, v);
                t.tuned += 1;
            });
            v
        }
    };
    let order = [tuned, Variant::Block8, Variant::Tiled, Variant::Naive];
    Ok(order
        .into_iter()
        .find(|v| shape_supports(ctx, *v, s).is_ok())
        .unwrap_or(Variant::Naive))
}

/// The choice for `s` without tuning: the pinned variant or the tuned choice of its class, `None` when
/// its class is untuned.
pub fn tuned_variant(ctx: &GpuContext, s: &MatmulShape) -> Option<Variant> {
    Tuning::with(ctx, |t| t.matmul_pin.or_else(|| t.matmul.get(&class_key(s)).copied())).flatten()
}

/// `v`, or when it cannot take `s` (limits) the first of block8, tiled, naive that can.
pub fn supported_variant(ctx: &GpuContext, v: Variant, s: &MatmulShape) -> Variant {
    [v, Variant::Block8, Variant::Tiled, Variant::Naive]
        .into_iter()
        .find(|v| shape_supports(ctx, *v, s).is_ok())
        .unwrap_or(Variant::Naive)
}

/// Compiles the pipelines the autotuner will time for `s`'s class (every variant the adapter supports,
/// on its representative problem and on `s` itself), or only `only`'s, without running anything: on
/// the web the compiles do not hold up the queue, so a page can prepare while it trains and tune later
/// in a few timing runs. A variant that fails to build is left to the tuner, which skips it.
pub async fn prepare(ctx: &GpuContext, s: &MatmulShape, only: Option<Variant>) -> Result<(), GpuError> {
    for shape in [representative(s, !ctx.summary.is_cpu()), *s] {
        let a = ctx.zeros("prepare A", shape.a_len())?;
        let b = ctx.zeros("prepare B", shape.b_len())?;
        let c = ctx.zeros("prepare C", shape.c_len())?;
        let ops = Operands {
            a: &a,
            b: &b,
            bias: None,
            c: &c,
        };
        for v in Variant::ALL {
            if only.is_some_and(|o| o != v) || !tuned_here(ctx, v) || shape_supports(ctx, v, &shape).is_err() {
                continue;
            }
            let _ = build(ctx, v, &shape, ops, None).await;
        }
    }
    Ok(())
}

/// Whether the tuner times `v` on this adapter: the GPU variants not on CPU adapters
/// ([`Variant::for_gpus`]), where they are never the fastest and each would add to every class's
/// tuning.
fn tuned_here(ctx: &GpuContext, v: Variant) -> bool {
    !(v.for_gpus() && ctx.summary.is_cpu())
}

/// Times every supported variant on `rep` and returns the fastest verified one (naive if none beats it).
async fn tune(ctx: &GpuContext, rep: &MatmulShape) -> Result<Variant, GpuError> {
    let a_data = pattern(rep.a_len(), 1);
    let b_data = pattern(rep.b_len(), 2);
    let bias_data = pattern(rep.n, 3);
    let a = ctx.upload("tune A", &a_data)?;
    let b = ctx.upload("tune B", &b_data)?;
    let bias = ctx.upload("tune bias", &bias_data)?;
    let c = ctx.zeros("tune C", rep.c_len())?;
    let ops = Operands {
        a: &a,
        b: &b,
        bias: Some(&bias),
        c: &c,
    };

    let naive = build(ctx, Variant::Naive, rep, ops, None).await?;
    time_dispatches(ctx, &naive).await?;
    let want: Vec<f32> = ctx.read(&c).await?;
    let ms = time_dispatches(ctx, &naive).await?;
    let mut timed = vec![(Variant::Naive, naive, ms)];
    for v in Variant::ALL.into_iter().filter(|v| *v != Variant::Naive) {
        if !tuned_here(ctx, v) || shape_supports(ctx, v, rep).is_err() {
            continue;
        }
        // A variant that fails to compile, errs or computes wrong is skipped, never chosen.
        if let Ok((d, ms)) = try_variant(ctx, v, rep, ops, &want).await {
            timed.push((v, d, ms));
        }
    }
    // Two more rounds over all of them, each keeping its best: interleaved, a burst of load on a
    // shared machine slows every variant of a round alike instead of whichever ran during it. A
    // variant slower than 20 ms is not run again: it is far behind, and its rounds would cost most.
    for _ in 0..2 {
        for (_, d, best) in timed.iter_mut().filter(|t| t.2 < 20.0) {
            *best = best.min(time_dispatches(ctx, d).await?);
        }
    }
    let fastest = timed.iter().min_by(|x, y| x.2.total_cmp(&y.2));
    Ok(fastest.map_or(Variant::Naive, |t| t.0))
}

/// `v`'s dispatches for `rep`, run once to warm up and checked against naive's result, and one
/// timed run.
async fn try_variant(
    ctx: &GpuContext,
    v: Variant,
    rep: &MatmulShape,
    ops: Operands<'_>,
    want: &[f32],
) -> Result<(Vec<Dispatch>, f64), GpuError> {
    let d = build(ctx, v, rep, ops, None).await?;
    ctx.write(ops.c, &vec![0f32; ops.c.len]);
    time_dispatches(ctx, &d).await?;
    let got: Vec<f32> = ctx.read(ops.c).await?;
    let wrong = got.iter().zip(want).position(|(g, w)| !close(*g, *w, 1e-3, 1e-3));
    if let Some(i) = wrong {
        return Err(GpuError::Invalid(format!(
            "{} differs from naive at {i}: {} vs {}",
            v.name(),
            got[i],
            want[i]
        )));
    }
    let ms = time_dispatches(ctx, &d).await?;
    Ok((d, ms))
}

/// Milliseconds `dispatches` take: GPU time from timestamp queries where the adapter has them and they are
/// plausible, else the wall time from submit until the queue is done. A CPU adapter's wall time is its
/// GPU time, and lavapipe's timestamps do not span the work (0.02 ms reported for a 200 ms matmul).
pub async fn time_dispatches(ctx: &GpuContext, dispatches: &[Dispatch]) -> Result<f64, GpuError> {
    let t0 = now_ms();
    if ctx.summary.timestamp_query && !ctx.summary.is_cpu() {
        let gpu = ctx.run_timed(dispatches).await?;
        let wall = now_ms() - t0;
        return Ok(match gpu {
            Some(t) if t.total_ms() >= 0.5 * wall || wall - t.total_ms() < 2.0 => t.total_ms(),
            _ => wall,
        });
    }
    ctx.run(dispatches);
    ctx.finish().await?;
    Ok(now_ms() - t0)
}

/// Deterministic values in [-0.5, 0.5) (no random-number dependency).
fn pattern(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104729) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

/// |got - want| <= atol + rtol * |want|; NaN is never close.
fn close(got: f32, want: f32, atol: f32, rtol: f32) -> bool {
    (got - want).abs() <= atol + rtol * want.abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tuner_times_a_shape_itself_unless_it_outweighs_its_class_stand_in() {
        // Attention's batched P @ V: its own dimensions, items back to back, no flags.
        let mut att = MatmulShape::new(32, 64, 32, 64);
        att.stride_c = 3000;
        att.stride_bias = 32;
        att.alpha = 0.5;
        att.accumulate = true;
        let rep = representative(&att, false);
        assert_eq!((rep.batch, rep.m, rep.n, rep.k), (32, 64, 32, 64));
        assert_eq!((rep.stride_a, rep.stride_b, rep.stride_c), (64 * 64, 64 * 32, 64 * 32));
        assert_eq!((rep.stride_bias, rep.alpha, rep.accumulate), (0, 1.0, false));
        // A broadcast operand stays one item; transposes are kept.
        let mut bcast = MatmulShape::new(4, 16, 16, 16);
        bcast.stride_b = 0;
        bcast.trans_a = true;
        let rep = representative(&bcast, false);
        assert_eq!((rep.stride_b, rep.trans_a, rep.trans_b), (0, true, false));
        // n = 1024 does far more work than the large class's 384-cube: the cube is timed.
        let big = representative(&MatmulShape::new(1, 1024, 1024, 1024), false);
        assert_eq!((big.batch, big.m, big.n, big.k), (1, 384, 384, 384));
        // A GPU times the large class on a 1024-cube: n = 1024 itself, a 4096-cube's stand-in.
        let gpu = representative(&MatmulShape::new(1, 1024, 1024, 1024), true);
        assert_eq!((gpu.m, gpu.n, gpu.k), (1024, 1024, 1024));
        let huge = representative(&MatmulShape::new(1, 4096, 4096, 4096), true);
        assert_eq!((huge.m, huge.n, huge.k), (1024, 1024, 1024));
        // Just over twice the medium stand-in's work (8 x 64^3): the stand-in; at twice: itself.
        let at_twice = MatmulShape::new(16, 64, 64, 64);
        assert_eq!(representative(&at_twice, false).batch, 16);
        let over = MatmulShape::new(17, 64, 64, 64);
        assert_eq!(representative(&over, false).batch, 8);
    }
}
