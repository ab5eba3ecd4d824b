//! A step's time in closed form: the ops of one block, the head and the update on one
//! device's local shapes, each priced with the cost model's own rates ([`work_seconds`]: the
//! roofline of its FLOPs on the matmul units and its bytes through memory, plus a launch) and
//! every collective with [`collective_time_on`] on the mesh's placement, then composed as the
//! step composes them: blocks times microbatches, a pipeline's ticks with its fill and drain,
//! the gradients' reduction beside the optimizer's update.
//!
//! It reads no program, so it prices a composition in microseconds where tracing and
//! scheduling one takes tens of milliseconds to seconds: the search screens every candidate
//! with it and prices only the best exactly ([`super::predict`]), and a published run whose
//! pipeline unrolls too many microbatches to trace is priced by it. What it leaves out of the
//! exact price: the lowering's fused pairs and folded transposes (it prices each op alone),
//! the small ops between the big ones (reshapes, scalars, the loss's mean), and overlap other
//! than what it states (tensor parallelism's collectives wait; a ring's permutes hide behind
//! attention; FSDP's gathers and reduce-scatters behind the pass that follows them; the
//! gradients' reduction behind the updates). On the search's small cases the best of the
//! candidates it passes on is within 2% of the exact winner (tested in [`crate::search`]).
use super::collective::CollectiveKind;
use super::device::DeviceProfile;
use super::expert_load::Routing;
use super::price::work_seconds;
use super::topology::{collective_time_on, MeshLayout};
use super::work::{DotShape, Work, THREEFRY_INT_OPS};
use crate::ir::{CpOrder, DType, Precision};
use crate::model::{Attention, Remat};
use crate::plan::{
    regathers_norms, Action, AxisKind, Mode, Parallelism, Pass as PipePass, StageLayout, Table, TrainerOptions, Zero,
};
use crate::sharding::Mesh;

/// A step in closed form, per device.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct StepEstimate {
    pub step_s: f64,
    /// The ops' work and launches.
    pub compute_s: f64,
    /// Collectives the compute waits for.
    pub exposed_s: f64,
    /// A pipeline's fill and drain: the busiest stage's idle time as its schedule places its
    /// passes.
    pub bubble_s: f64,
    /// Every collective's time by the mesh axes it runs over, hidden or not.
    pub by_axes: Vec<(String, f64)>,
}

/// Seconds of the work one pass of one block asks, and of its blocking and overlapped
/// collectives.
#[derive(Clone, Copy, Debug, Default)]
struct Pass {
    compute: f64,
    /// Collectives the next op waits for (tensor parallelism's).
    blocking: f64,
    /// A ring's permutes, overlapping the pass's attention.
    ring: f64,
    attention: f64,
}

impl Pass {
    fn add(self, o: Pass) -> Pass {
        Pass {
            compute: self.compute + o.compute,
            blocking: self.blocking + o.blocking,
            ring: self.ring + o.ring,
            attention: self.attention + o.attention,
        }
    }

    /// Its time: compute, the collectives it waits for, and what of the ring attention does
    /// not hide.
    fn seconds(self) -> f64 {
        self.compute + self.blocking + (self.ring - self.attention).max(0.0)
    }
}

/// The pricing context: the device at the step's precision, the mesh's placement and the
/// collectives' running totals by axes.
struct Pricer<'a> {
    device: &'a DeviceProfile,
    layout: MeshLayout,
    width: f64,
    by_axes: Vec<(String, f64)>,
}

impl<'a> Pricer<'a> {
    /// Prices on `device` (at the step's precision) over `par`'s mesh, no collective yet.
    fn new(device: &'a DeviceProfile, par: &Parallelism, precision: Precision) -> Self {
        Pricer {
            device,
            layout: MeshLayout::of(&par.mesh, device),
            width: precision.compute_bytes(DType::F32) as f64,
            by_axes: vec![],
        }
    }
}

impl Pricer<'_> {
    /// One kernel: its launch and its roofline.
    fn op(&self, matmul_flops: f64, vector_flops: f64, bytes: f64, dot: Option<DotShape>) -> f64 {
        self.device.launch_s
            + work_seconds(
                self.device,
                &Work {
                    matmul_flops,
                    vector_flops,
                    bytes,
                    dot,
                    launches: 1,
                    ..Default::default()
                },
                1,
            )
    }

    /// A matmul (m x k) @ (k x n), its operands and result through memory.
    fn dot(&self, m: f64, k: f64, n: f64) -> f64 {
        let shape = DotShape {
            batch: 1,
            m: m as usize,
            n: n as usize,
            k: k as usize,
        };
        self.op(2.0 * m * k * n, 0.0, (m * k + k * n + m * n) * self.width, Some(shape))
    }

    /// An elementwise op over `n` elements reading `reads` operands of that size.
    fn elementwise(&self, n: f64, reads: f64, flops_each: f64) -> f64 {
        self.op(0.0, flops_each * n, (reads + 1.0) * n * self.width, None)
    }

    /// A collective over `axes` moving `elements` (at the compute width), counted by axes.
    fn collective(&mut self, kind: CollectiveKind, elements: f64, axes: &[&str]) -> f64 {
        let present: Vec<&str> = axes
            .iter()
            .copied()
            .filter(|a| self.layout.axes.iter().any(|p| p.axis == *a && p.size > 1))
            .collect();
        if present.is_empty() {
            return 0.0;
        }
        let bytes = (elements * self.width) as u64;
        let t = collective_time_on(self.device, &self.layout, kind, bytes, &present).seconds + self.device.launch_s;
        let key = present.join(",");
        match self.by_axes.iter_mut().find(|(k, _)| *k == key) {
            Some(e) => e.1 += t,
            None => self.by_axes.push((key, t)),
        }
        t
    }

    /// `times` of a collective, counted so.
    fn collectives(&mut self, times: f64, kind: CollectiveKind, elements: f64, axes: &[&str]) -> f64 {
        let one = self.collective(kind, elements, axes);
        if let Some(e) = self
            .by_axes
            .iter_mut()
            .find(|(k, _)| *k == axes_key(&self.layout, axes))
        {
            e.1 += (times - 1.0) * one;
        }
        times * one
    }
}

fn axes_key(layout: &MeshLayout, axes: &[&str]) -> String {
    axes.iter()
        .copied()
        .filter(|a| layout.axes.iter().any(|p| p.axis == *a && p.size > 1))
        .collect::<Vec<_>>()
        .join(",")
}

/// One device's shapes of a microbatch.
struct Shapes {
    /// Rows the matmuls and attention see (the sequence gathered under sequence parallelism).
    rows: f64,
    /// Rows of the residual stream a device holds.
    res_rows: f64,
    d: f64,
    /// Width of a device's heads together, and of its MLP units.
    heads_d: f64,
    mlp: f64,
    /// Batch x heads products of attention, the queries (and keys) of each on a device, each
    /// head's dimension, and its causal (query, key) pairs on the busiest device.
    products: f64,
    seq_att: f64,
    dh: f64,
    pairs: f64,
    vocab: f64,
    /// A mixture of experts in place of the dense MLP.
    moe: Option<MoeShapes>,
}

/// One device's shapes of a mixture's MLP on a microbatch.
struct MoeShapes {
    experts: f64,
    /// Each expert's hidden units on a device (split over "tp").
    width: f64,
    /// Rows the busiest device's experts compute ([`Routing::rows`]): the step waits for them.
    routed: f64,
}

impl Shapes {
    /// The block's matmuls as (m, k, n): attention's projections, then the MLP's (a mixture's:
    /// its router on the tokens, its experts on the rows routed).
    fn dots(&self) -> Vec<(f64, f64, f64)> {
        let mut dots = vec![
            (self.rows, self.d, 3.0 * self.heads_d),
            (self.rows, self.heads_d, self.d),
        ];
        match &self.moe {
            None => dots.extend([(self.rows, self.d, self.mlp), (self.rows, self.mlp, self.d)]),
            Some(m) => dots.extend([
                (self.rows, self.d, m.experts),
                (m.routed, self.d, m.width),
                (m.routed, m.width, self.d),
            ]),
        }
        dots
    }
}

/// One device's shapes of a microbatch of `opts` under `par`.
fn shapes(opts: &TrainerOptions, par: &Parallelism) -> Shapes {
    let cfg = &opts.config;
    let (tp, cp) = (par.size(AxisKind::Tp) as f64, par.size(AxisKind::Cp) as f64);
    let b = cfg.batch as f64 / par.batch_split() as f64 / opts.microbatches.max(1) as f64;
    let seq = cfg.seq as f64;
    let d = cfg.d_model as f64;
    Shapes {
        rows: b * seq / cp,
        res_rows: b * seq / par.seq_split() as f64,
        d,
        heads_d: d / tp,
        mlp: 4.0 * d / tp,
        products: b * cfg.heads as f64 / tp,
        seq_att: seq / cp,
        dh: d / cfg.heads as f64,
        pairs: causal_pairs(seq, cp, opts.cp_order),
        vocab: cfg.vocab as f64,
        moe: cfg.moe.map(|moe| {
            let routing = Routing::of(&moe, cfg.seq, par.size(AxisKind::Ep));
            MoeShapes {
                experts: moe.experts as f64,
                width: moe.width as f64 / tp,
                routed: routing.rows(b * seq / cp),
            }
        }),
    }
}

/// Causal (query, key) pairs a device of a ring of `cp` computes per head, the busiest's:
/// contiguous blocks leave the last device every earlier block, zig-zag balances them.
fn causal_pairs(seq: f64, cp: f64, order: CpOrder) -> f64 {
    let block = seq / cp;
    match order {
        CpOrder::Zigzag => seq * (seq + 1.0) / 2.0 / cp,
        CpOrder::Contiguous => (cp - 1.0) * block * block + block * (block + 1.0) / 2.0,
    }
}

/// One block's forward pass on one microbatch.
fn block_forward(p: &mut Pricer, s: &Shapes, opts: &TrainerOptions, par: &Parallelism) -> Pass {
    let cfg = &opts.config;
    let (res, full) = (s.res_rows * s.d, s.rows * s.d);
    let sp = par.sequence_parallel;
    let mut pass = Pass::default();
    let mut compute = 0.0;
    let mut blocking = 0.0;
    // Attention's half, then the MLP's: a layer norm, the column-parallel matmul (its input
    // gathered over tp under sequence parallelism), the row-parallel one and its reduction,
    // bias, dropout and the residual.
    for (cols, hidden) in [(3.0 * s.heads_d, false), (s.mlp, true)] {
        compute += p.elementwise(res, 3.0, 8.0);
        if sp {
            blocking += p.collective(CollectiveKind::AllGather, full, &["tp"]);
        }
        if hidden {
            match &s.moe {
                None => {
                    compute += p.dot(s.rows, s.d, cols);
                    compute += p.elementwise(s.rows * s.mlp, 2.0, 9.0);
                    compute += p.dot(s.rows, s.mlp, s.d);
                }
                Some(m) => {
                    let (c, b) = moe_forward(p, s, m);
                    compute += c;
                    blocking += b;
                }
            }
        } else {
            compute += p.dot(s.rows, s.d, cols);
            compute += p.elementwise(s.rows * cols, 2.0, 1.0);
            let attention = attention_pass(p, s, cfg.attention, 1.0);
            compute += attention;
            pass.attention += attention;
            if par.is_cp() {
                let cp = par.size(AxisKind::Cp) as f64;
                // Each step of the ring passes a device's block of keys and values on.
                let kv = 2.0 * s.rows * s.heads_d;
                pass.ring += p.collectives(cp - 1.0, CollectiveKind::CollectivePermute, kv, &["cp"]);
            }
            compute += p.dot(s.rows, s.heads_d, s.d);
        }
        let kind = if sp {
            CollectiveKind::ReduceScatter
        } else {
            CollectiveKind::AllReduce
        };
        blocking += p.collective(kind, full, &["tp"]);
        compute += p.elementwise(res, 3.0, 3.0);
    }
    if cfg.dropout > 0.0 {
        // The residual dropouts' bits, hashed per word (the attention's in its kernel).
        let hashes = 2.0 * res
            + if cfg.attention == Attention::Fused {
                s.pairs * s.products
            } else {
                0.0
            };
        compute += hashes * THREEFRY_INT_OPS / p.device.int_ops;
    }
    pass.compute += compute;
    pass.blocking += blocking;
    pass
}

/// A mixture's MLP forward on one microbatch: (compute, the all-to-alls it waits for). The
/// router's matmul and its top-k on every token; the rows routed gathered, sent to their experts
/// over "ep", through the experts' two matmuls and GELU, sent back and summed per token, every
/// part of the busiest device's (the others wait for it at the combine).
fn moe_forward(p: &mut Pricer, s: &Shapes, m: &MoeShapes) -> (f64, f64) {
    let compute = p.dot(s.rows, s.d, m.experts)
        + p.elementwise(s.rows * m.experts, 1.0, 10.0)
        + p.elementwise(m.routed * s.d, 1.0, 1.0)
        + p.dot(m.routed, s.d, m.width)
        + p.elementwise(m.routed * m.width, 2.0, 9.0)
        + p.dot(m.routed, m.width, s.d)
        + p.elementwise(m.routed * s.d, 2.0, 2.0);
    let blocking = p.collectives(2.0, CollectiveKind::AllToAll, m.routed * s.d, &["ep"]);
    (compute, blocking)
}

/// Attention's work on one microbatch of one block, `scale` times the forward's FLOPs
/// (the backward's dot products are 4x the forward's, as [`super::cost`] counts them).
fn attention_pass(p: &Pricer, s: &Shapes, attention: Attention, scale: f64) -> f64 {
    let pairs = s.pairs * s.products;
    let shape = DotShape {
        batch: s.products as usize,
        m: s.seq_att as usize,
        n: s.seq_att as usize,
        k: s.dh as usize,
    };
    let qkvo = 4.0 * s.rows * s.heads_d * p.width;
    match attention {
        Attention::Fused => p.op(
            scale * pairs * 4.0 * s.dh,
            scale * pairs * 6.0,
            scale * qkvo,
            Some(shape),
        ),
        // Two batched dot products around a softmax over the (T, T) scores.
        Attention::Unfused => {
            let scores = s.products * shape.m as f64 * shape.n as f64;
            2.0 * p.op(
                scale * 2.0 * scores * s.dh,
                0.0,
                scale * (qkvo / 2.0 + scores * p.width),
                Some(shape),
            ) + p.elementwise(scale * scores, 1.0, 5.0)
        }
    }
}

/// One block's backward pass: every matmul twice (the input's gradient and the weight's),
/// the elementwise ops' gradients, attention's backward, and tensor parallelism's
/// collectives again (each forward collective's transpose).
fn block_backward(p: &mut Pricer, s: &Shapes, opts: &TrainerOptions, par: &Parallelism, fwd: Pass) -> Pass {
    let cfg = &opts.config;
    let attention = attention_pass(p, s, cfg.attention, 4.0);
    let mut compute = attention;
    let dots = s.dots();
    for &(m, k, n) in &dots {
        compute += p.dot(m, n, k) + p.dot(k, m, n);
    }
    // The rest: about twice the forward's elementwise work.
    let fwd_dots: f64 = dots.iter().map(|&(m, k, n)| p.dot(m, k, n)).sum();
    let fwd_attention = attention_pass(p, s, cfg.attention, 1.0);
    compute += 2.0 * (fwd.compute - fwd_dots - fwd_attention).max(0.0);
    let ring = if par.is_cp() { 2.0 * fwd.ring } else { 0.0 };
    Pass {
        compute,
        blocking: fwd.blocking,
        ring,
        attention,
    }
}

/// Seconds of one block's weight gradients (`dW = Xᵀ dY` of every matmul, and its bias's sum):
/// what a split backward leaves for its W slot, everything its input gradient does not need
/// (the program moves the same instructions, `plan/pipeline/emit.rs`); attention's backward,
/// the input gradients' matmuls and the ring stay in B.
fn weight_gradients(p: &Pricer, s: &Shapes) -> f64 {
    // Each matmul's weight gradient and its bias's, a sum of the output's cotangent over rows.
    s.dots()
        .iter()
        .map(|&(m, k, n)| p.dot(k, m, n) + p.elementwise(m * n, 0.0, 1.0))
        .sum()
}

/// Sequence parallelism's backward on one block in a shard_map body: each column-parallel
/// matmul's input gathered again over "tp" for its weight's gradient (a device holds its rows
/// of it between the passes, as Megatron does; [`regathers_norms`] says where). Its time is
/// added to the by-axes totals for `passes` block backwards.
fn regathers(p: &mut Pricer, s: &Shapes, opts: &TrainerOptions, passes: f64) -> Pass {
    if !regathers_norms(opts) {
        return Pass::default();
    }
    let all = p.collectives(2.0 * passes, CollectiveKind::AllGather, s.rows * s.d, &["tp"]);
    Pass {
        blocking: all / passes,
        ..Pass::default()
    }
}

/// The closed-form step of `opts` on `device` (its mode's program: jit and shard_map price
/// alike here, but for a shard_map body's gathers again under sequence parallelism).
pub fn estimate_step(opts: &TrainerOptions, device: &DeviceProfile) -> StepEstimate {
    let cfg = &opts.config;
    let device = device.at_precision(cfg.precision);
    let empty = Parallelism::new(Mesh::new(&[]).expect("no axes"), Zero::Off, false).expect("no axes");
    let par = opts.parallel.parallelism().unwrap_or(&empty);
    let mut p = Pricer::new(&device, par, cfg.precision);
    let pp = par.size(AxisKind::Pp);
    let m = opts.microbatches.max(1) as f64;
    let s = shapes(opts, par);
    let d = s.d;
    // A pipeline's stages (one stage without): the busiest holds the most blocks.
    let v = opts.virtual_stages.max(1);
    let layout = match pp {
        1 => StageLayout::new(cfg.layers, 1, 1, &[]),
        _ => StageLayout::new(cfg.layers, pp, v, &opts.stage_layers),
    };
    let blocks = (0..pp).map(|st| layout.stage_blocks(st)).max().unwrap_or(cfg.layers) as f64;
    let fwd = block_forward(&mut p, &s, opts, par);
    let bwd = block_backward(&mut p, &s, opts, par, fwd);
    // Remat recomputes the forward (its collectives too) before the backward; dots keeps the
    // matmuls' outputs and recomputes the rest.
    let recompute = match cfg.remat {
        Remat::None => Pass::default(),
        Remat::Full => fwd,
        Remat::Dots => Pass {
            compute: fwd.compute * 0.2,
            ..fwd
        },
    };
    let head = head_seconds(&p, &s, cfg.tied);
    // The by-axes totals so far hold one forward of one block: every pass of every block on
    // every microbatch issues them, the backward tensor parallelism's once more and the
    // ring's twice, and remat's recompute the forward's again.
    let recomputes = if recompute.blocking + recompute.ring > 0.0 {
        1.0
    } else {
        0.0
    };
    let ring_key = axes_key(&p.layout, &["cp"]);
    for (axes, t) in p.by_axes.iter_mut() {
        let backward = if *axes == ring_key { 2.0 } else { 1.0 };
        *t *= blocks * m * (1.0 + backward + recomputes);
    }
    let bwd = bwd.add(regathers(&mut p, &s, opts, blocks * m));
    let block_step = fwd.add(bwd).add(recompute);
    let per_microbatch = blocks * block_step.seconds() + head;
    // FSDP gathers each split parameter before its block's forward and reduce-scatters its
    // gradient after the backward (a pipeline's stage once a step), behind the compute that
    // follows: one collective per parameter, as the program issues them.
    let comms = param_comms(opts, par);
    let fsdp_passes = if pp > 1 { 1.0 } else { m };
    let fsdp = if par.has(AxisKind::Fsdp) {
        let (mut gather, mut scatter, mut count) = (0.0, 0.0, 0.0);
        for c in comms.iter().filter(|c| c.fsdp) {
            let times = c.copies(blocks) * fsdp_passes;
            gather += p.collectives(times, CollectiveKind::AllGather, c.gathered, &["fsdp"]);
            scatter += p.collectives(times, CollectiveKind::ReduceScatter, c.gathered, &["fsdp"]);
            count += times;
        }
        let fwd_time = blocks * m * fwd.seconds();
        let bwd_time = blocks * m * bwd.seconds();
        (gather - fwd_time).max(gather / count.max(1.0)) + (scatter - bwd_time).max(0.0)
    } else {
        0.0
    };
    // A pipeline: each stage runs its passes in the order its schedule says, each starting
    // once its input has come from the stage before (or its cotangent from the stage after):
    // the schedule's table placed in time ([`Table::timing`]), the stage's idle time its bubble.
    let (passes, bubble) = if pp > 1 {
        let send = p.collective(CollectiveKind::CollectivePermute, s.res_rows * d, &["pp"]);
        let table = Table::new(opts.schedule, pp, m as usize, v);
        let weight = weight_gradients(&p, &s);
        let time = pass_seconds(
            &table,
            &layout,
            fwd.seconds(),
            bwd.add(recompute).seconds(),
            weight,
            head,
        );
        let timing = table.timing(&time, send);
        // Each stage sends its activation on and its input's cotangent back, per microbatch
        // and chunk.
        let key = axes_key(&p.layout, &["pp"]);
        if let Some(e) = p.by_axes.iter_mut().find(|(k, _)| *k == key) {
            e.1 *= 2.0 * m * v as f64;
        }
        let idle = timing.idle().into_iter().fold(f64::INFINITY, f64::min);
        (timing.makespan, idle)
    } else {
        (m * per_microbatch, 0.0)
    };
    let (reduce, update) = reduction_and_update(&mut p, opts, par, &comms, blocks);
    let compute_s = m * blocks * (block_step.compute) + m * head + update;
    let step_s = device.step_s + passes + fsdp + reduce.max(update);
    StepEstimate {
        step_s,
        compute_s,
        exposed_s: (step_s - device.step_s - compute_s - bubble).max(0.0),
        bubble_s: bubble,
        by_axes: p.by_axes,
    }
}

/// Seconds of each pass of a pipeline's `table`: a chunk's blocks' forward or backward (a
/// split backward's weight gradients, `weight` a block, in its W slot, the rest in B; the
/// first virtual stage, whose input gradient nobody waits for, runs its backward whole in B);
/// the last virtual stage's with the head and loss (a third of `head` forward, the rest
/// backward; the embedding's lookup, small beside it, counted there too).
fn pass_seconds<'a>(
    table: &'a Table,
    layout: &'a StageLayout,
    fwd: f64,
    bwd: f64,
    weight: f64,
    head: f64,
) -> impl Fn(usize, &Action) -> f64 + 'a {
    let last = table.virtual_stages() - 1;
    move |stage: usize, a: &Action| {
        let blocks = layout.run(stage, a.chunk).1 as f64;
        let k = table.virtual_stage(stage, a.chunk);
        let head_part = |share: f64| if k == last { share * head } else { 0.0 };
        let deferred = if table.split && k > 0 { weight.min(bwd) } else { 0.0 };
        match a.pass {
            PipePass::Forward => blocks * fwd + head_part(1.0 / 3.0),
            PipePass::Backward => blocks * (bwd - deferred) + head_part(2.0 / 3.0),
            PipePass::Weight => blocks * deferred,
        }
    }
}

/// The embedding's lookup and gradient, the final layer norm, the head's matmul (three with
/// its backward) and the cross-entropy, on one microbatch.
fn head_seconds(p: &Pricer, s: &Shapes, _tied: bool) -> f64 {
    let res = s.res_rows * s.d;
    let logits = s.res_rows * s.vocab;
    2.0 * p.elementwise(res, 2.0, 1.0)
        + 3.0 * p.elementwise(res, 3.0, 8.0)
        + 3.0 * p.dot(s.res_rows, s.d, s.vocab)
        + 2.0 * p.elementwise(logits, 1.0, 4.0)
}

/// One parameter's part in the step's collectives, from its layout (the rules table), as the
/// program reduces it ([`crate::plan::Parallelism::token_axes`]).
struct ParamComm {
    /// Whether it is one block's (held once per block of the stage) or the model's.
    in_block: bool,
    /// Elements a device holds of it.
    local: f64,
    /// Elements a device holds once FSDP gathered it (what the gather and the gradient's
    /// reduce-scatter move).
    gathered: f64,
    fsdp: bool,
    /// The axes its gradient is summed over: the token axes it is not split over (and a
    /// pipeline's "pp" for what every stage holds).
    sum_axes: Vec<&'static str>,
    /// ZeRO splits its optimizer state (and, from stage 2, its gradient) over "dp".
    zero_block: bool,
}

impl ParamComm {
    /// How many of it a device holds: one per block of its stage, or one.
    fn copies(&self, blocks: f64) -> f64 {
        if self.in_block {
            blocks
        } else {
            1.0
        }
    }
}

/// Every parameter kind of the model (a block's once), with its collectives.
fn param_comms(opts: &TrainerOptions, par: &Parallelism) -> Vec<ParamComm> {
    let cfg = &opts.config;
    let token_axes = par.token_axes();
    let size = |axes: &[&str]| -> f64 { axes.iter().map(|a| par.mesh.size_of(a).unwrap_or(1) as f64).product() };
    // A block's parameters once: the model's with one block.
    let one_block = crate::model::GptConfig {
        layers: 1,
        ..cfg.clone()
    };
    crate::model::param_specs(&one_block)
        .into_iter()
        .map(|ps| {
            let (shape, spec) = par.param_layout(cfg, &ps, Mode::ShardMap);
            let (_, state) = par.state_layout(cfg, &ps, Mode::ShardMap);
            let in_block = crate::plan::block_leaf(&ps.name).is_some();
            let local = shape.iter().product::<usize>() as f64 / size(&spec.mesh_axes());
            let fsdp = spec.uses_axis("fsdp");
            let zero_block = !spec.uses_axis("dp") && state.uses_axis("dp");
            let scattered = zero_block && par.zero.shards_gradients();
            let every_stage = (!in_block && par.is_pipeline()).then_some("pp");
            let sum_axes = token_axes
                .iter()
                .copied()
                .chain(every_stage)
                .filter(|a| !(spec.uses_axis(a) || scattered && *a == "dp"))
                .collect();
            ParamComm {
                in_block,
                local,
                gathered: if fsdp { local * size(&["fsdp"]) } else { local },
                fsdp,
                sum_axes,
                zero_block,
            }
        })
        .collect()
}

/// The gradients' reduction (one collective per parameter, or per set of axes where the
/// combiner merges them; ZeRO: reduce-scattered over "dp" and the updated blocks gathered),
/// and the optimizer's update of the state a device holds.
fn reduction_and_update(
    p: &mut Pricer,
    opts: &TrainerOptions,
    par: &Parallelism,
    comms: &[ParamComm],
    blocks: f64,
) -> (f64, f64) {
    let dp = par.size(AxisKind::Dp) as f64;
    let mut merged: Vec<(Vec<&'static str>, f64)> = vec![];
    let (mut reduce, mut state) = (0.0, 0.0);
    for c in comms {
        let times = c.copies(blocks);
        if opts.combine_all_reduces {
            match merged.iter_mut().find(|(axes, _)| *axes == c.sum_axes) {
                Some(m) => m.1 += times * c.local,
                None => merged.push((c.sum_axes.clone(), times * c.local)),
            }
        } else {
            reduce += p.collectives(times, CollectiveKind::AllReduce, c.local, &c.sum_axes);
        }
        if c.zero_block {
            if par.zero.shards_gradients() {
                let scatters = times * opts.microbatches as f64;
                reduce += p.collectives(scatters, CollectiveKind::ReduceScatter, c.local, &["dp"]);
            }
            reduce += p.collectives(times, CollectiveKind::AllGather, c.local, &["dp"]);
        }
        state += times * if c.zero_block { c.local / dp } else { c.local };
    }
    for (axes, elements) in &merged {
        reduce += p.collective(CollectiveKind::AllReduce, *elements, axes);
    }
    // AdamW reads the gradient, the f32 master and two moments, and writes them back with the
    // compute copy: 28 bytes an element in either precision.
    let update = p.device.launch_s * 16.0 * blocks + 28.0 * state / p.device.mem_bandwidth;
    (reduce, update)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Precision;
    use crate::model::GptConfig;
    use crate::plan::{DropoutKey, Parallel, Schedule};
    use crate::profile::ScaleOut;

    fn options(mesh: &str, microbatches: usize) -> TrainerOptions {
        scheduled(mesh, microbatches, Schedule::OneFOneB)
    }

    fn scheduled(mesh: &str, microbatches: usize, schedule: Schedule) -> TrainerOptions {
        let cfg = GptConfig {
            layers: 8,
            d_model: 1024,
            heads: 16,
            seq: 1024,
            batch: 64,
            vocab: 50304,
            precision: Precision::Bf16,
            ..GptConfig::tiny()
        };
        let par = Parallelism::new(Mesh::parse(mesh).unwrap(), Zero::Off, false).unwrap();
        TrainerOptions {
            microbatches,
            schedule,
            ..TrainerOptions::new(
                cfg,
                Parallel::ShardMap {
                    par,
                    dropout_key: DropoutKey::Same,
                },
            )
        }
    }

    /// A mixture of 8 experts (top-2) over ep=4 on H100s, routed with `imbalance`.
    fn moe_options(capacity: crate::model::Capacity, imbalance: f32) -> TrainerOptions {
        let mut opts = TrainerOptions {
            schedule: Schedule::default(),
            ..options("ep=4", 1)
        };
        opts.config = GptConfig {
            layers: 2,
            d_model: 512,
            heads: 8,
            seq: 512,
            batch: 16,
            vocab: 1024,
            moe: Some(crate::model::Moe {
                capacity,
                imbalance,
                ..crate::model::Moe::new(8, 512)
            }),
            ..opts.config
        };
        opts
    }

    #[test]
    fn an_unbalanced_load_slows_the_step_by_the_busiest_devices_share_and_the_capacity_caps_it() {
        use crate::model::Capacity;
        let device = crate::profile::h100();
        let estimate = |c: Capacity, i: f32| estimate_step(&moe_options(c, i), &device).step_s;
        // The timeline without overlap: the estimate waits for every all-to-all, and the
        // load's rule, not XLA's overlap of them, is what the two are held to here.
        let exact = |c: Capacity, i: f32| {
            let planned = crate::plan::build(&moe_options(c, i))
                .map_err(|e| e.to_string())
                .unwrap();
            let place = crate::profile::Placement::Real;
            crate::profile::model_step(&planned.step.program, &device, place, false)
                .0
                .step_ms
                / 1e3
        };
        // Dropless, the busiest device twice the mean: its expert matmuls and the all-to-alls
        // that wait on them take longer, and the estimate and the timeline agree by how much.
        let (e1, e2) = (estimate(Capacity::Dropless, 1.0), estimate(Capacity::Dropless, 2.0));
        let (x1, x2) = (exact(Capacity::Dropless, 1.0), exact(Capacity::Dropless, 2.0));
        assert!(
            e2 > 1.05 * e1 && x2 > 1.05 * x1,
            "estimate {e1} -> {e2}, exact {x1} -> {x2}"
        );
        // Within a third: the estimate prices each op alone and a backward's elementwise work
        // as twice the forward's (the GELU's gradient is 1.5x its forward on the timeline).
        let (de, dx) = (e2 - e1, x2 - x1);
        assert!(
            (de / dx - 1.0).abs() < 0.4,
            "the busiest device's extra: estimate {de}, exact {dx}"
        );
        // On the timeline the first device of the ep group does twice its even share of the
        // expert work, the other three what it leaves: (4 - 2) / 3 of theirs.
        let expert_work = |i: f32| {
            let planned = crate::plan::build(&moe_options(Capacity::Dropless, i)).unwrap();
            let prog = &planned.step.program;
            let experts = crate::profile::expert_shares(prog).expect("a mixture");
            let work = crate::profile::spmd_work(prog, &device, crate::profile::Placement::Real);
            [0, 1].map(|d| {
                let tasks = &work.devices[d].tasks;
                experts[d].iter().map(|(i, _)| tasks[*i].work_s).sum::<f64>()
            })
        };
        let (even, skewed) = (expert_work(1.0), expert_work(2.0));
        assert!((skewed[0] / even[0] - 2.0).abs() < 1e-9, "{even:?} -> {skewed:?}");
        assert!((skewed[1] / even[1] - 2.0 / 3.0).abs() < 1e-9, "{even:?} -> {skewed:?}");
        // A capacity of 1.25 caps the busiest device at 1.25 the mean, whatever the imbalance.
        for (price, what) in [
            (&estimate as &dyn Fn(Capacity, f32) -> f64, "estimate"),
            (&exact, "exact"),
        ] {
            let capped = price(Capacity::Factor(1.25), 2.0);
            assert_eq!(capped, price(Capacity::Factor(1.25), 1.25), "{what}");
            assert!(capped < price(Capacity::Dropless, 2.0), "{what}");
        }
    }

    #[test]
    fn a_pipelines_bubble_is_its_fill_and_drain_and_more_microbatches_shrink_it() {
        let device = crate::profile::h100();
        for (m, formula) in [(4, 3.0 / 7.0), (16, 3.0 / 19.0)] {
            let e = estimate_step(&options("dp=2,pp=4", m), &device);
            // The fill and drain of the busiest stage (the last: the head is its own), less
            // than the formula's share: the step's fixed cost, the gradients' reduction and
            // the update are outside the passes, and the lighter stages' idle is no bubble of
            // the busiest.
            let share = e.bubble_s / e.step_s;
            assert!(
                share < formula && share > 0.5 * formula,
                "{m} microbatches: {share} of {e:?}"
            );
            assert!(e.by_axes.iter().any(|(axes, s)| axes == "pp" && *s > 0.0), "{e:?}");
        }
        let none = estimate_step(&options("dp=8", 1), &device);
        assert_eq!(none.bubble_s, 0.0);
    }

    #[test]
    fn zero_bubble_and_virtual_stages_shrink_the_bubble_and_a_lighter_last_stage_the_step() {
        let device = crate::profile::h100();
        let of = |o: &TrainerOptions| estimate_step(o, &device);
        let one = of(&options("pp=4", 8));
        let zb = of(&scheduled("pp=4", 8, Schedule::ZbH1));
        // ZB-H1 runs the same work, its weight passes in 1F1B's drain.
        assert!(zb.bubble_s < 0.7 * one.bubble_s, "{zb:?} vs {one:?}");
        assert!(zb.step_s < one.step_s);
        let interleaved = of(&TrainerOptions {
            virtual_stages: 2,
            ..options("pp=4", 8)
        });
        assert!(interleaved.bubble_s < 0.7 * one.bubble_s, "{interleaved:?} vs {one:?}");
        // The head makes the last stage the busiest: a block moved off it shortens the step.
        let cfg = options("pp=4", 8).config;
        let balanced = of(&TrainerOptions {
            stage_layers: vec![2, 3, 2, 1],
            ..options("pp=4", 8)
        });
        assert_eq!(cfg.layers, 8);
        assert!(balanced.step_s < one.step_s, "{balanced:?} vs {one:?}");
        // GPipe and 1F1B place the same passes with the same dependencies: the same step.
        let gpipe = of(&scheduled("pp=4", 8, Schedule::Gpipe));
        assert!((gpipe.step_s - one.step_s).abs() < 1e-9 * one.step_s);
    }

    #[test]
    fn a_split_backward_is_priced_as_the_program_splits_it() {
        // ZB-H1's W slot runs what the input gradient does not need: the weight gradients'
        // matmuls and their biases' sums; attention's backward and the input gradients stay in
        // B. Priced as half the backward each, W was 1.5x the program's here, and a cp ring's
        // attention-heavy B underpriced.
        let device = crate::profile::h100();
        let opts = scheduled("pp=4", 4, Schedule::ZbH1);
        let prog = crate::plan::build(&opts).unwrap().step.program;
        let ops = crate::profile::price_ops(&prog, &device, crate::profile::Placement::Real);
        let traced = |stage: usize, pass: crate::ir::Pass| -> f64 {
            let span = prog
                .stages
                .as_ref()
                .unwrap()
                .passes
                .iter()
                .find(|p| p.stage == stage && p.action.pass == pass && p.action.microbatch == 0);
            span.unwrap()
                .instrs
                .iter()
                .map(|&i| ops[i].launch_s + ops[i].work_s)
                .sum()
        };
        let e = |stage: usize, pass: PipePass| {
            let par = opts.parallel.parallelism().unwrap();
            let cfg = &opts.config;
            let device = device.at_precision(cfg.precision);
            let mut p = Pricer::new(&device, par, cfg.precision);
            let s = shapes(&opts, par);
            let fwd = block_forward(&mut p, &s, &opts, par);
            let bwd = block_backward(&mut p, &s, &opts, par, fwd);
            let table = Table::new(Schedule::ZbH1, 4, 4, 1);
            let layout = StageLayout::new(cfg.layers, 4, 1, &[]);
            let time = pass_seconds(
                &table,
                &layout,
                fwd.seconds(),
                bwd.seconds(),
                weight_gradients(&p, &s),
                0.0,
            );
            time(
                stage,
                &Action {
                    pass,
                    microbatch: 0,
                    chunk: 0,
                },
            )
        };
        let (b, w) = (traced(1, crate::ir::Pass::Backward), traced(1, crate::ir::Pass::Weight));
        assert!(w < b, "the program's W {w} s against its B {b} s");
        let estimated = e(1, PipePass::Weight);
        assert!(
            (estimated / w - 1.0).abs() < 0.15,
            "W: estimated {estimated:.3e} s, the program's {w:.3e} s"
        );
        // The first stage's input gradient is nobody's: its backward runs whole in B.
        assert!(traced(0, crate::ir::Pass::Weight) < 0.05 * w);
        assert_eq!(e(0, PipePass::Weight), 0.0);
    }

    #[test]
    fn each_axis_collectives_are_priced_on_its_own_links() {
        // tp=8 fills a DGX H100 (its NVLink); dp=8 spans 8 servers (the scale-out network).
        // A network half as fast slows dp's reduction and leaves tp's collectives as they are.
        let device = crate::profile::h100();
        let net = device.scale_out.expect("a DGX H100's network");
        let slow = DeviceProfile {
            scale_out: Some(ScaleOut {
                bandwidth: net.bandwidth / 2.0,
                ..net
            }),
            ..device.clone()
        };
        let time = |d: &DeviceProfile, axes: &str| {
            let e = estimate_step(&options("dp=8,tp=8", 1), d);
            e.by_axes.iter().find(|(a, _)| a == axes).map(|(_, s)| *s).unwrap()
        };
        assert_eq!(time(&device, "tp"), time(&slow, "tp"));
        assert!(time(&slow, "dp") > 1.5 * time(&device, "dp"));
    }

    #[test]
    fn each_parameters_gradient_and_gather_are_priced_as_the_program_issues_them() {
        // On a large mesh a collective's latency is most of a small one's time: pricing one
        // reduction per block where the program issues one per parameter undercounted the
        // step several-fold. The estimate's time on each set of axes now agrees with the
        // traced program's.
        let device = crate::profile::h100();
        for mesh in ["dp=4,fsdp=16", "dp=16,tp=4", "fsdp=8,tp=8"] {
            let opts = TrainerOptions {
                schedule: Schedule::default(),
                ..options(mesh, 1)
            };
            let e = estimate_step(&opts, &device);
            let exact = crate::profile::predict(
                &crate::plan::build(&opts).unwrap().step.program,
                &device,
                crate::profile::Placement::Real,
            );
            let mut compared = 0;
            for (axes, cost) in &exact.collectives_by_axes {
                // The loss's mean: one scalar the estimate leaves out.
                if cost.count <= 1 {
                    continue;
                }
                compared += 1;
                let estimated = e.by_axes.iter().find(|(a, _)| a == axes).map_or(0.0, |(_, s)| s * 1e3);
                assert!(
                    (estimated / cost.ms - 1.0).abs() < 0.2,
                    "{mesh}, over {axes}: estimated {estimated:.2} ms, the program's {:.2} ms ({} collectives)",
                    cost.ms,
                    cost.count
                );
            }
            assert!(
                compared > 0,
                "{mesh}: no collectives to compare in {:?}",
                exact.collectives_by_axes
            );
        }
    }

    #[test]
    fn sequence_parallelisms_gathers_again_in_the_backward_are_priced_on_tp_as_the_program_issues_them() {
        // Each column-parallel matmul's input gathered in the forward and again in the backward
        // (a device holds its rows between the passes, as Megatron-LM does), a reduce-scatter
        // after each row-parallel one and their transposes: the estimate's time on "tp" is the
        // traced program's.
        let device = crate::profile::h100();
        let mut opts = TrainerOptions {
            schedule: Schedule::default(),
            ..options("dp=4,tp=4", 1)
        };
        let Parallel::ShardMap { par, .. } = &mut opts.parallel else {
            unreachable!()
        };
        par.sequence_parallel = true;
        let e = estimate_step(&opts, &device);
        let exact = crate::profile::predict(
            &crate::plan::build(&opts).unwrap().step.program,
            &device,
            crate::profile::Placement::Real,
        );
        let cost = &exact.collectives_by_axes["tp"];
        let estimated = e.by_axes.iter().find(|(a, _)| a == "tp").map_or(0.0, |(_, s)| s * 1e3);
        assert!(
            (estimated / cost.ms - 1.0).abs() < 0.1,
            "estimated {estimated:.2} ms over tp, the program's {:.2} ms ({} collectives)",
            cost.ms,
            cost.count
        );
    }
}
