//! Memory per device in closed form, for any composition: formulas of the model's sizes and the
//! mesh's, read without tracing a program, so that a search can screen thousands of
//! compositions (and a plan can size a run too large to trace) before it traces any.
//!
//! Parameters, optimizer state and gradients are exact: each parameter's block is its shape
//! divided by the mesh axes its spec names ([`Parallelism::param_layout`], the logical-axis
//! rules), the blocks summed per device, a pipeline stage holding its own blocks. They equal
//! the traced program's memory plan ([`super::MemoryPlan::of`]) to the byte.
//!
//! Activations are a bound: what a device holds between the passes (each block's saved
//! values, times the blocks of a stage and the microbatches its schedule keeps), plus the
//! busiest moment of the backward pass (one block's gradients in flight, or the head's
//! logits and their gradient). The values each block saves are counted from the block as the
//! model traces it (docs/MODEL.md): per block and microbatch, in elements of one device's
//! residual stream, its layer-norm outputs, the attention output and its statistics, and the
//! MLP's hidden units before and after GELU. Against the liveness plan it is within
//! [`ACTIVATION_BOUND`] (tested on presets and three- and four-axis compositions in both
//! modes).
use super::axes::AxisKind;
use super::pipeline::{StageLayout, Table};
use super::{Mode, Parallel, Parallelism, Schedule, TrainerOptions};
use crate::ir::{DType, Precision};
use crate::model::{param_specs, Attention, GptConfig, ParamSpec, Remat};
use crate::sharding::PartitionSpec;

/// How far the closed form's activations may sit from the traced program's liveness peak:
/// closed / traced lies in [1 / ACTIVATION_BOUND, ACTIVATION_BOUND].
pub const ACTIVATION_BOUND: f64 = 1.4;

/// Bytes one device holds, in closed form (the fields of [`super::MemoryPlan`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct ClosedMemory {
    pub params: u64,
    pub optimizer_state: u64,
    pub gradients: u64,
    pub compute_params: u64,
    pub activations: u64,
    /// All five together: at least the traced plan's total (which holds the gradients and
    /// the activations at their largest only where they meet).
    pub total: u64,
}

impl ClosedMemory {
    /// What the traced step needs at least (its plan's total): the state, and the activations
    /// at the most the closed form overstates them. A screen that drops what needs more than
    /// a device has drops nothing that fits.
    pub fn at_least(&self) -> u64 {
        let activations = (self.activations as f64 / ACTIVATION_BOUND) as u64;
        self.params + self.optimizer_state + self.compute_params + activations
    }
}

/// Elements of a block of `shape` split as `spec` says on `par`'s mesh.
fn local_elements(par: &Parallelism, shape: &[usize], spec: &PartitionSpec) -> u64 {
    shape
        .iter()
        .enumerate()
        .map(|(d, &n)| {
            let split = par.mesh.axes_size(&spec.dim_axes(d)).unwrap_or(1).max(1);
            (n / split) as u64
        })
        .product()
}

/// Per device, the elements of the parameters, their optimizer state (one slot), and the
/// gradient buffers, each summed over the parameters a device holds.
struct Held {
    params: u64,
    state: u64,
    gradients: u64,
}

/// The blocks one device holds: all of them without a pipeline; a stage's otherwise, as its
/// stacked parameters hold them (the longest chunk's rows per chunk: a shorter stage's missing
/// blocks are rows of zeros).
fn device_blocks(opts: &TrainerOptions, par: &Parallelism) -> usize {
    let pp = par.size(AxisKind::Pp);
    if pp <= 1 {
        return opts.config.layers;
    }
    let layout = StageLayout::new(opts.config.layers, pp, opts.virtual_stages.max(1), &opts.stage_layers);
    layout.rows() * layout.chunks
}

/// What each device holds of the parameters of `cfg` under `par` in `mode`: the embeddings
/// and the head whole (split by their specs), and `blocks` blocks.
fn held(cfg: &GptConfig, par: &Parallelism, mode: Mode, blocks: u64) -> Held {
    let one = GptConfig {
        layers: 1,
        ..cfg.clone()
    };
    let specs = param_specs(&one);
    let mut h = Held {
        params: 0,
        state: 0,
        gradients: 0,
    };
    for ps in &specs {
        let times = if is_block(ps) { blocks } else { 1 };
        let (shape, spec) = par.param_layout(&one, ps, mode);
        let (_, state) = par.state_layout(&one, ps, mode);
        let p = local_elements(par, &shape, &spec);
        let s = local_elements(par, &shape, &state);
        // ZeRO-2 reduce-scatters a gradient over "dp" as it is made, where its state is split
        // there and the parameter is not; otherwise the gradient is the parameter's size.
        let scattered = par.zero.shards_gradients() && !spec.uses_axis("dp") && state.uses_axis("dp");
        h.params += times * p;
        h.state += times * s;
        h.gradients += times * if scattered { s } else { p };
    }
    h
}

fn is_block(ps: &ParamSpec) -> bool {
    ps.name.starts_with('h') && ps.name.contains('.')
}

/// The parallelism `opts` runs under and the mode its memory is counted in: one device is a
/// mesh of no axes; explicit mode is the global program jit partitions, as in automatic mode
/// (its reshards move what it holds, not how much).
fn layout_of(opts: &TrainerOptions) -> (std::borrow::Cow<'_, Parallelism>, Mode) {
    match &opts.parallel {
        Parallel::None => {
            let none = Parallelism::new(
                crate::sharding::Mesh::new(&[]).expect("an empty mesh"),
                Default::default(),
                false,
            )
            .expect("no axes");
            (std::borrow::Cow::Owned(none), Mode::Single)
        }
        Parallel::ShardMap { par, .. } => (std::borrow::Cow::Borrowed(par), Mode::ShardMap),
        Parallel::Auto { par, .. } | Parallel::Explicit { par, .. } => (std::borrow::Cow::Borrowed(par), Mode::Auto),
    }
}

/// Memory per device of `opts` in closed form (one device, [`Parallel::None`], as a mesh of no
/// axes).
pub fn closed_memory(opts: &TrainerOptions) -> ClosedMemory {
    let cfg = &opts.config;
    let (par, mode) = layout_of(opts);
    let par = par.as_ref();
    let blocks = device_blocks(opts, par) as u64;
    let h = held(
        cfg,
        par,
        if mode == Mode::Single { Mode::ShardMap } else { mode },
        blocks,
    );
    let master = cfg.precision.master_bytes();
    let compute = cfg.precision.compute_bytes(DType::F32);
    let slots = opts.optimizer.slots() as u64;
    let compute_params = if cfg.precision == Precision::F32 {
        0
    } else {
        h.params * compute
    };
    let activations = activations(opts, par, mode);
    let params = h.params * master;
    let optimizer_state = slots * h.state * master;
    let gradients = h.gradients * compute;
    ClosedMemory {
        params,
        optimizer_state,
        gradients,
        compute_params,
        activations,
        total: params + optimizer_state + gradients + compute_params + activations,
    }
}

/// Each pipeline stage's activations at their peak in closed form, first stage first (one
/// entry without a pipeline): what its schedule keeps in flight, and the backward's busiest
/// moment ([`ClosedMemory::activations`] is the largest, or ZeRO's update where that is more).
pub fn stage_activations(opts: &TrainerOptions) -> Vec<u64> {
    let (par, mode) = layout_of(opts);
    backward_peaks(opts, par.as_ref(), mode)
}

/// One device's sizes of a microbatch, in elements.
struct Sizes {
    /// A microbatch's sequences on a device.
    batch: f64,
    /// The residual stream's rows (batch x sequence) a device holds.
    rows: f64,
    /// The rows the matmuls and attention see: the sequence gathered under sequence
    /// parallelism.
    att_rows: f64,
    d: f64,
    tp: f64,
    /// Heads and MLP units a device holds.
    heads: f64,
    mlp: f64,
    /// Keys each query of a device's block meets locally (the ring brings the rest).
    keys: f64,
    vocab: f64,
    /// The MLP's hidden units a device computes per block: its rows times its units; with a
    /// mixture of experts, every expert's slots at the capacity (E x C per sequence, the
    /// dispatch buffers moved, not grown, by expert parallelism) times an expert's units.
    hidden: f64,
    /// A mixture of experts' slots per device and block (E x C per sequence; 0 when dense).
    slots: f64,
    /// A mixture of experts' router outputs per device and block (probabilities; 0 when dense).
    routed: f64,
}

/// (float, integer) elements one block saves for its backward pass, per microbatch.
fn saved_per_block(cfg: &GptConfig, s: &Sizes, mode: Mode, sp: bool, ring: bool) -> (f64, f64) {
    let res = s.rows * s.d;
    let full = s.att_rows * s.d;
    let hidden = s.hidden;
    // A mixture of experts' dispatched slots (its experts' weight gradient reads them), and
    // the router's probabilities and gates.
    let experts = s.slots * s.d + 2.0 * s.routed;
    let dropout = cfg.dropout > 0.0;
    match cfg.remat {
        // Its input alone.
        Remat::Full => (res, 0.0),
        // Its input and the outputs of its matmuls the recompute reads: qkv, the projection
        // (partial sums, every row) and fc.
        // (A mixture's experts' matmuls have a batch dimension, the experts: the policy
        // saves them not, and the backward pass recomputes them with their slots.)
        Remat::Dots => (
            res + 3.0 * full / s.tp + full + if s.slots > 0.0 { 0.0 } else { hidden },
            0.0,
        ),
        Remat::None => {
            let norms = held_norms(s, mode, sp);
            let stats = 4.0 * s.rows;
            let attention = match cfg.attention {
                // The output and its log-sum-exp.
                Attention::Fused => full / s.tp + s.att_rows * s.heads,
                // The probabilities (and, with dropout, the dropped ones).
                Attention::Unfused => {
                    let probs = s.att_rows * s.heads * s.keys;
                    probs * if dropout { 2.0 } else { 1.0 }
                }
            };
            // jit gathers a ring's keys and values whole and keeps them for the backward pass;
            // under sequence parallelism it keeps each block's q, k and v as it sliced them.
            let jit = match (mode, ring, sp) {
                (Mode::Auto, true, _) => 2.0 * s.batch * s.keys * s.d / s.tp,
                (Mode::Auto, false, true) => 3.0 * full / s.tp,
                _ => 0.0,
            };
            let floats = norms + 2.0 * res + attention + 2.0 * hidden + stats + jit + experts;
            // The residual dropouts' bits (and unfused, the probabilities').
            let bits = match (dropout, cfg.attention) {
                (false, _) => 0.0,
                (true, Attention::Fused) => 2.0 * res,
                (true, Attention::Unfused) => 2.0 * res + s.att_rows * s.heads * s.keys,
            };
            (floats, bits)
        }
    }
}

/// Elements of the two layer norms' outputs a block holds for its backward pass without remat:
/// the column-parallel matmuls' weight gradients read them. In a shard_map body under tensor
/// parallelism they are read through the pcast that aliases them (the plan counts them where
/// they are made, not held); under sequence parallelism a device holds its rows of them and
/// gathers them again in the backward pass, as Megatron does (Korthikanti et al. 2022, section
/// 4.2.2). jit holds them as the partitioner gathered them, the whole sequence.
fn held_norms(s: &Sizes, mode: Mode, sp: bool) -> f64 {
    match (mode, s.tp > 1.0, sp) {
        (Mode::ShardMap, true, false) => 0.0,
        (Mode::ShardMap, true, true) => 2.0 * s.rows * s.d,
        _ => 2.0 * s.att_rows * s.d,
    }
}

/// Whether the backward pass of `opts` gathers each block's layer norms' outputs over "tp"
/// again (two all-gathers a block): sequence parallelism in a shard_map body without remat,
/// which holds a device's rows of them (`held_norms`; with remat the recompute gathers them,
/// and jit holds them gathered).
pub fn regathers_norms(opts: &TrainerOptions) -> bool {
    let (par, mode) = layout_of(opts);
    mode == Mode::ShardMap && par.sequence_parallel && par.size(AxisKind::Tp) > 1 && opts.config.remat == Remat::None
}

/// Bytes of the busiest stage's activations (at its most microbatches in flight) that are
/// layer norms' outputs held gathered over "tp" under sequence parallelism without remat, less
/// their rows of one device: what the plan holds beyond Megatron's sequence parallelism, which
/// keeps each device's rows of them and gathers them again in the backward pass (Korthikanti et
/// al. 2022, section 4.2.2). A shard_map body holds them as Megatron does (`held_norms`); jit
/// holds them gathered. Zero where nothing is held so.
pub fn gathered_norms(opts: &TrainerOptions) -> u64 {
    let (par, mode) = layout_of(opts);
    let par = par.as_ref();
    let tp = par.size(AxisKind::Tp) as f64;
    if !par.sequence_parallel || tp <= 1.0 || opts.config.remat != Remat::None {
        return 0;
    }
    let pp = par.size(AxisKind::Pp);
    let v = if pp > 1 { opts.virtual_stages.max(1) } else { 1 };
    let chunks = if pp > 1 {
        let table = Table::new(opts.schedule, pp, opts.microbatches.max(1), v);
        let most = table
            .in_flight_around_first_backward()
            .into_iter()
            .map(|(b, a)| b.max(a))
            .max();
        most.unwrap_or(1) as f64 / v as f64
    } else {
        1.0
    };
    let s = sizes(opts, par, mode);
    let beyond = held_norms(&s, mode, true) - 2.0 * s.rows * s.d;
    let width = opts.config.precision.compute_bytes(DType::F32) as f64;
    (chunks * device_blocks(opts, par) as f64 * beyond * width) as u64
}

fn activations(opts: &TrainerOptions, par: &Parallelism, mode: Mode) -> u64 {
    let cfg = &opts.config;
    let backward = backward_peaks(opts, par, mode).into_iter().max().unwrap_or(0);
    // ZeRO's update: every parameter's updated blocks gathered whole again, outputs of the
    // step held to its end.
    let width = cfg.precision.compute_bytes(DType::F32) as f64;
    let update =
        zero_gathered(cfg, par, mode, device_blocks(opts, par) as u64) as f64 * width + tokens(opts, par) * 4.0;
    backward.max(update as u64)
}

/// Tokens and targets of one device, held for the step.
fn tokens(opts: &TrainerOptions, par: &Parallelism) -> f64 {
    2.0 * (opts.config.batch / par.batch_split()) as f64 * (opts.config.seq / par.seq_split()) as f64
}

/// One device's sizes of a microbatch of `opts` under `par` in `mode`.
fn sizes(opts: &TrainerOptions, par: &Parallelism, mode: Mode) -> Sizes {
    let cfg = &opts.config;
    let tp = par.size(AxisKind::Tp) as f64;
    let cp = par.size(AxisKind::Cp) as f64;
    let m = opts.microbatches.max(1);
    let b = (cfg.batch / par.batch_split() / m) as f64;
    let seq_att = cfg.seq as f64 / cp;
    let (hidden, slots, routed) = match &cfg.moe {
        None => (b * seq_att * 4.0 * cfg.d_model as f64 / tp, 0.0, 0.0),
        Some(moe) => {
            let slots = b * (moe.experts * moe.slots(cfg.seq)) as f64;
            let routed = b * (cfg.seq * moe.experts) as f64;
            (slots * moe.width as f64 / tp, slots, routed)
        }
    };
    Sizes {
        batch: b,
        rows: b * (cfg.seq / par.seq_split()) as f64,
        att_rows: b * seq_att,
        d: cfg.d_model as f64,
        tp,
        heads: cfg.heads as f64 / tp,
        mlp: 4.0 * cfg.d_model as f64 / tp,
        // jit gathers a ring's keys whole; a shard_map ring meets them a block at a time.
        keys: if mode == Mode::Auto { cfg.seq as f64 } else { seq_att },
        vocab: cfg.vocab as f64,
        hidden,
        slots,
        routed,
    }
}

/// Bytes each stage holds at the backward pass's peak (one entry without a pipeline).
fn backward_peaks(opts: &TrainerOptions, par: &Parallelism, mode: Mode) -> Vec<u64> {
    let cfg = &opts.config;
    let pp = par.size(AxisKind::Pp);
    let m = opts.microbatches.max(1);
    let s = sizes(opts, par, mode);
    let tp = s.tp;
    let blocks = device_blocks(opts, par) as f64;
    let (per_block, per_block_bits) = saved_per_block(cfg, &s, mode, par.sequence_parallel, par.is_cp());
    let res = s.rows * s.d;
    // FSDP: each block's weights, gathered before use, held for its backward pass (a
    // pipeline's stage gathers its stack once, through a view the plan counts where it is
    // made). jit under sequence and context parallelism gathers the row-parallel weights
    // (the projection's and the MLP's output) whole and holds them.
    let ep = par.size(AxisKind::Ep) as f64;
    let block_weights = match &cfg.moe {
        None => 12.0 * s.d * s.d / tp + 13.0 * s.d,
        // Attention's, the router's, and this device's experts'.
        Some(moe) => {
            let (e, f) = (moe.experts as f64, moe.width as f64);
            4.0 * s.d * s.d / tp + 8.0 * s.d + s.d * e + 2.0 * e / ep * s.d * f / tp
        }
    };
    let gathered = match (par.has(AxisKind::Fsdp) && pp == 1, mode) {
        (true, _) => block_weights,
        (false, Mode::Auto) if par.is_cp() && par.sequence_parallel => 5.0 * s.d * s.d,
        _ => 0.0,
    };
    // Microbatches whose blocks a stage holds at once: as many as its schedule has forwarded
    // and not yet backed ([`Table::in_flight`]: GPipe all of them, 1F1B at most pp; with
    // virtual stages, chunks of 1/v of the stage's blocks), beside the running sums of the
    // stage's gradients. Accumulation holds one.
    // A stage's gradients: its blocks', and of the replicated parameters the one its own work
    // uses (the embeddings on the first stage, the head on the last; tied, wte on both).
    let stage_grads = blocks * block_weights + if cfg.tied || pp > 1 { 1.0 } else { 2.0 } * s.vocab * s.d;
    // Per stage (one without a pipeline): the microbatch chunks it holds before its first
    // backward, and after it, beside the running sums of its gradients.
    let in_flight: Vec<(usize, usize)> = if pp > 1 {
        Table::new(opts.schedule, pp, m, opts.virtual_stages.max(1)).in_flight_around_first_backward()
    } else {
        vec![(1, 1)]
    };
    let v = if pp > 1 { opts.virtual_stages.max(1) as f64 } else { 1.0 };
    let sums = if pp > 1 { 1.5 * stage_grads } else { 0.0 };
    // The busiest moment of the backward pass: the last block's (recomputed) values with the
    // gradients of its MLP's hidden units, of a weight and of the residual in flight; or, on
    // the last stage, the head's logits and their gradient beside the final layer norm's
    // output.
    let none = GptConfig {
        remat: Remat::None,
        ..cfg.clone()
    };
    let (block_now, _) = saved_per_block(&none, &s, mode, par.sequence_parallel, par.is_cp());
    let recompute = if cfg.remat == Remat::None { 0.0 } else { block_now };
    let unit_weights = match &cfg.moe {
        None => s.d * s.mlp,
        Some(moe) => moe.experts as f64 / ep * s.d * moe.width as f64 / tp,
    };
    let busiest = recompute + res + s.hidden + unit_weights;
    let head = 2.0 * s.rows * s.vocab + res;
    // Each stage's peak, the device's the largest: what it holds, and the backward's busiest
    // moment. A pipeline's running sums of its stage's gradients (values of their own, with a
    // transposed copy of each contribution) grow through the backward pass: GPipe's while its
    // held activations shrink, so its peak is one or the other.
    let last = in_flight.len() - 1;
    let width = cfg.precision.compute_bytes(DType::F32) as f64;
    let ints = tokens(opts, par);
    in_flight
        .iter()
        .enumerate()
        .map(|(stage, &(before, after))| {
            let sets = before.max(after) as f64 / v;
            let held = |chunks: usize| chunks as f64 / v * blocks * per_block + blocks * gathered;
            let transient = res + if stage == last { busiest.max(head) } else { busiest };
            let floats = match opts.schedule {
                Schedule::Gpipe if pp > 1 => (held(before) + transient).max(sums + transient + blocks * per_block),
                _ if pp > 1 => (held(before) + transient).max(held(after) + transient + sums),
                _ => held(before) + transient,
            };
            let bits = sets * blocks * per_block_bits;
            (floats * width + (bits + ints) * 4.0) as u64
        })
        .collect()
}

/// Elements of the parameters ZeRO updates by blocks over "dp" and gathers whole again.
fn zero_gathered(cfg: &GptConfig, par: &Parallelism, mode: Mode, blocks: u64) -> u64 {
    if !par.zero.shards_state() {
        return 0;
    }
    let one = GptConfig {
        layers: 1,
        ..cfg.clone()
    };
    let mode = if mode == Mode::Single { Mode::ShardMap } else { mode };
    param_specs(&one)
        .iter()
        .map(|ps| {
            let (shape, spec) = par.param_layout(&one, ps, mode);
            let (_, state) = par.state_layout(&one, ps, mode);
            let split = !spec.uses_axis("dp") && state.uses_axis("dp");
            let times = if is_block(ps) { blocks } else { 1 };
            if split {
                times * local_elements(par, &shape, &spec)
            } else {
                0
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Precision;
    use crate::model::{Attention, Capacity, GptConfig, Moe, Remat};
    use crate::plan::{build, DropoutKey, MemoryPlan, Schedule, Zero};
    use crate::sharding::Mesh;

    /// `layers` small blocks (eight: four pipeline stages of two).
    fn small_blocks(layers: usize) -> GptConfig {
        GptConfig {
            layers,
            d_model: 64,
            heads: 4,
            seq: 16,
            batch: 16,
            vocab: 96,
            ..GptConfig::tiny()
        }
    }

    fn options(
        cfg: &GptConfig,
        mesh: &str,
        zero: Zero,
        sp: bool,
        mode: Mode,
        k: usize,
        schedule: Schedule,
    ) -> TrainerOptions {
        let parallel = if mesh.is_empty() {
            Parallel::None
        } else {
            let par = Parallelism::new(Mesh::parse(mesh).unwrap(), zero, sp).unwrap();
            match mode {
                Mode::Auto => Parallel::Auto { par, specs: vec![] },
                _ => Parallel::ShardMap {
                    par,
                    dropout_key: DropoutKey::Same,
                },
            }
        };
        TrainerOptions {
            microbatches: k,
            schedule,
            ..TrainerOptions::new(cfg.clone(), parallel)
        }
    }

    #[test]
    fn the_closed_form_is_the_traced_plan_exactly_for_state_and_within_its_bound_for_activations() {
        use Mode::{Auto, ShardMap, Single};
        use Schedule::{Gpipe, OneFOneB};
        let base = small_blocks(4);
        // The presets (one and two axes), and three- and four-axis compositions, in both modes.
        let compositions: [(&str, Zero, bool, Mode, usize, Schedule); 24] = [
            ("", Zero::Off, false, Single, 1, Gpipe),
            ("dp=4", Zero::Off, false, ShardMap, 1, Gpipe),
            ("dp=4", Zero::One, false, ShardMap, 1, Gpipe),
            ("dp=4", Zero::Two, false, ShardMap, 2, Gpipe),
            ("fsdp=4", Zero::Off, false, ShardMap, 1, Gpipe),
            ("tp=2", Zero::Off, false, ShardMap, 1, Gpipe),
            ("tp=2", Zero::Off, true, ShardMap, 1, Gpipe),
            ("cp=4", Zero::Off, false, ShardMap, 1, Gpipe),
            ("dp=2,tp=2,pp=2", Zero::Off, false, ShardMap, 2, Gpipe),
            ("dp=2,tp=2,pp=2", Zero::One, false, ShardMap, 4, OneFOneB),
            ("fsdp=2,tp=2", Zero::Off, false, ShardMap, 1, Gpipe),
            ("fsdp=2,tp=2,pp=2", Zero::Off, false, ShardMap, 2, Gpipe),
            ("dp=2,cp=2,tp=2", Zero::Off, false, ShardMap, 1, Gpipe),
            ("tp=2,pp=2", Zero::Off, true, ShardMap, 2, OneFOneB),
            ("dp=2,fsdp=2,tp=2,pp=2", Zero::One, false, ShardMap, 2, Gpipe),
            ("dp=4", Zero::Off, false, Auto, 1, Gpipe),
            ("dp=2,tp=2", Zero::One, false, Auto, 1, Gpipe),
            ("fsdp=2,tp=2", Zero::Off, false, Auto, 1, Gpipe),
            ("dp=2,cp=2,tp=2", Zero::Off, true, Auto, 2, Gpipe),
            // Expert parallelism (a mixture of experts only).
            ("ep=4", Zero::Off, false, ShardMap, 1, Gpipe),
            ("dp=2,ep=2", Zero::One, false, ShardMap, 2, Gpipe),
            ("ep=2,tp=2", Zero::Off, false, ShardMap, 1, Gpipe),
            ("fsdp=2,ep=2", Zero::Off, false, ShardMap, 1, Gpipe),
            ("dp=2,ep=2", Zero::Off, false, Auto, 1, Gpipe),
        ];
        let configs = [
            base.clone(),
            GptConfig {
                remat: Remat::Full,
                ..base.clone()
            },
            GptConfig {
                remat: Remat::Dots,
                dropout: 0.1,
                ..base.clone()
            },
            GptConfig {
                precision: Precision::Bf16,
                vocab: 512,
                ..base.clone()
            },
            GptConfig {
                attention: Attention::Unfused,
                tied: true,
                ..base.clone()
            },
            GptConfig {
                moe: Some(Moe {
                    width: 96,
                    ..Moe::new(4, 64)
                }),
                ..base.clone()
            },
            GptConfig {
                moe: Some(Moe {
                    capacity: Capacity::Dropless,
                    ..Moe::new(8, 64)
                }),
                remat: Remat::Dots,
                ..base.clone()
            },
        ];
        let mut worst: f64 = 1.0;
        for cfg in &configs {
            for (mesh, zero, sp, mode, k, schedule) in compositions {
                let opts = options(cfg, mesh, zero, sp, mode, k, schedule);
                // Ring attention in a shard_map body needs the fused op; "ep" needs a mixture of
                // experts, which composes with neither "cp", "pp" nor sequence parallelism.
                let Ok(planned) = build(&opts) else {
                    let moe = cfg.moe.is_some();
                    let refused = (cfg.attention == Attention::Unfused && mesh.contains("cp"))
                        || (moe && (mesh.contains("cp") || mesh.contains("pp") || sp))
                        || (!moe && mesh.contains("ep"));
                    assert!(refused, "{mesh}: {:?}", build(&opts).err());
                    continue;
                };
                let traced = MemoryPlan::of(&planned.step.program).unwrap();
                let closed = closed_memory(&opts);
                let at = format!(
                    "{mesh} zero {} sp {sp} {} k {k} {}: {cfg:?}",
                    zero.name(),
                    mode.name(),
                    schedule.name()
                );
                assert_eq!(
                    (closed.params, closed.optimizer_state, closed.compute_params),
                    (traced.params, traced.optimizer_state, traced.compute_params),
                    "{at}"
                );
                // jit lays out a gradient where propagation takes it unless pinned (ZeRO,
                // FSDP); under sequence parallelism it keeps some whole that the rules split.
                if !(mode == Auto && sp) {
                    assert_eq!(closed.gradients, traced.gradients, "{at}");
                }
                let ratio = closed.activations as f64 / traced.activations as f64;
                worst = worst.max(ratio.max(1.0 / ratio));
                assert!(
                    (1.0 / ACTIVATION_BOUND..=ACTIVATION_BOUND).contains(&ratio),
                    "{at}: activations {} closed against {} traced",
                    closed.activations,
                    traced.activations
                );
                assert!(closed.at_least() <= traced.total, "{at}");
            }
        }
        assert!(
            worst > 1.0 / ACTIVATION_BOUND.sqrt(),
            "the bound is loose: worst {worst}"
        );
    }

    #[test]
    fn each_stage_holds_the_microbatches_its_schedule_keeps_and_the_device_the_busiest_stages() {
        let cfg = small_blocks(8);
        let at = |schedule| {
            let opts = options(&cfg, "pp=4", Zero::Off, false, Mode::ShardMap, 8, schedule);
            (stage_activations(&opts), closed_memory(&opts).activations)
        };
        let (gpipe, gpipe_peak) = at(Schedule::Gpipe);
        let (one_f_one_b, peak) = at(Schedule::OneFOneB);
        assert_eq!((gpipe.len(), one_f_one_b.len()), (4, 4));
        // 1F1B's stage s holds pp - s microbatches: fewer down the pipeline (the last stage
        // adds the head's logits, so only the first three are compared).
        assert!(one_f_one_b[..3].windows(2).all(|w| w[0] > w[1]), "{one_f_one_b:?}");
        // GPipe holds all eight on every stage; 1F1B's first stage four.
        assert!(gpipe[0] > one_f_one_b[0], "{gpipe:?} {one_f_one_b:?}");
        assert_eq!(gpipe[..3].iter().min(), gpipe[..3].iter().max(), "{gpipe:?}");
        // Without ZeRO's update the device's activations are its busiest stage's.
        assert_eq!(Some(&peak), one_f_one_b.iter().max());
        assert_eq!(Some(&gpipe_peak), gpipe.iter().max());
        // One entry without a pipeline: the device's.
        let single = options(&cfg, "dp=2", Zero::Off, false, Mode::ShardMap, 1, Schedule::Gpipe);
        assert_eq!(stage_activations(&single), [closed_memory(&single).activations]);
    }

    #[test]
    fn under_sequence_parallelism_a_block_holds_korthikantis_activations() {
        // Korthikanti et al. 2022 (arXiv:2205.05198), section 4.2.2: with tensor and sequence
        // parallelism a layer holds s b h (34/t + 5 a s / (h t)) bytes in 16 bits. Without dropout
        // (its two masks, 2 s b h / t bytes) and with fused attention (no scores: the a s^2 term
        // gone) that is 32 s b h / t bytes, 16 s b h / t elements: the two norms' inputs and
        // outputs (4), q, k and v (3), attention's output (1), and the MLP's hidden units before
        // and after GELU (8). Llama 3 405B's stand-in on tp=8: s 8192, b 1, h 16384.
        let cfg = GptConfig {
            layers: 2,
            d_model: 16384,
            heads: 128,
            seq: 8192,
            batch: 1,
            vocab: 256,
            precision: Precision::Bf16,
            ..GptConfig::tiny()
        };
        let opts = options(&cfg, "tp=8", Zero::Off, true, Mode::ShardMap, 1, Schedule::Gpipe);
        let Parallel::ShardMap { par, .. } = &opts.parallel else {
            unreachable!()
        };
        let s = sizes(&opts, par, Mode::ShardMap);
        let (floats, bits) = saved_per_block(&cfg, &s, Mode::ShardMap, true, false);
        let (sbh, t) = (8192.0 * 16384.0, 8.0);
        let korthikanti = 16.0 * sbh / t;
        // The norms' outputs are a device's rows, gathered again in the backward as Megatron
        // gathers them; the closed form counts no q, k and v apart from attention's output, and
        // adds the norms' statistics and attention's log-sum-exp.
        let stats = 4.0 * 1024.0 + 8192.0 * 16.0;
        assert_eq!(floats, korthikanti - 3.0 * sbh / t + stats);
        assert_eq!(bits, 0.0);
        assert_eq!(gathered_norms(&opts), 0);
    }

    #[test]
    fn gathered_norms_are_what_jit_holds_beyond_a_devices_rows_and_only_without_remat() {
        let cfg = small_blocks(8);
        let of =
            |cfg: &GptConfig, sp, mode| gathered_norms(&options(cfg, "tp=2", Zero::Off, sp, mode, 1, Schedule::Gpipe));
        // jit holds each of the 8 blocks' two norms of 16 x 16 rows by 64 gathered over tp = 2
        // (half of them the device's own), in f32; a shard_map body its rows alone.
        assert_eq!(of(&cfg, true, Mode::Auto), 8 * (2 * (16 * 16) * 64 / 2) * 4);
        assert_eq!(of(&cfg, true, Mode::ShardMap), 0);
        assert_eq!(of(&cfg, false, Mode::Auto), 0);
        let full = GptConfig {
            remat: Remat::Full,
            ..cfg
        };
        assert_eq!(of(&full, true, Mode::Auto), 0);
    }

    #[test]
    fn a_model_far_too_large_to_trace_is_sized_per_device() {
        // Megatron's 1T model on tp=8, pp=64, dp=6 (Narayanan et al. 2021): each GPU holds its
        // stage's 2 blocks, their heads' and MLP units' weights split 8 ways by tp, and the
        // embeddings whole (the rules split the vocabulary and the width over fsdp alone).
        let cfg = GptConfig {
            layers: 128,
            d_model: 25600,
            heads: 160,
            seq: 2048,
            batch: 3072,
            vocab: 51200,
            tied: true,
            dropout: 0.0,
            attention: Attention::Fused,
            remat: Remat::None,
            precision: Precision::Bf16,
            moe: None,
        };
        let opts = options(
            &cfg,
            "tp=8,pp=64,dp=6",
            Zero::Off,
            false,
            Mode::ShardMap,
            512,
            Schedule::OneFOneB,
        );
        let m = closed_memory(&opts);
        let (d, v, t) = (25600u64, 51200u64, 2048u64);
        // w_qkv, b_qkv, w_proj, w_fc, b_fc, w_out split over tp; the norms and the residual
        // projections' biases whole.
        let block = (12 * d * d + 7 * d) / 8 + 6 * d;
        let elements = 2 * block + v * d + t * d + 2 * d;
        assert_eq!(m.params, 4 * elements);
        assert_eq!(m.optimizer_state, 8 * elements);
        assert_eq!((m.compute_params, m.gradients), (2 * elements, 2 * elements));
        // 1F1B's first stage holds pp = 64 microbatches' activations of its 2 blocks, nothing
        // recomputed: per block and microbatch, a few residual streams' worth (2048 x 25600
        // in bf16, 105 MB each; tp splits the attention's and the MLP's values 8 ways).
        let streams = 64 * 2 * t * d * 2;
        assert!(
            m.activations > 2 * streams && m.activations < 8 * streams,
            "{}",
            m.activations
        );
    }
}
