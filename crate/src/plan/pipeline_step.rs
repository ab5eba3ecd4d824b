//! Pipeline parallelism's shard_map body, as the JAX docs and MaxText write it: the blocks in
//! `pp` contiguous stages whose weights are stacked on a leading stage axis split over "pp",
//! and a loop over ticks in which every stage runs its blocks on the microbatch it holds and
//! `ppermute` passes the result to the next stage. The loop is unrolled (jit unrolls a Python
//! loop); its gradient, by autodiff through the permutes (each one's transpose sends the
//! cotangents back a stage), runs every backward after every forward: GPipe.
//!
//! Every device runs the same program, so a stage with nothing to do in a tick (the pipeline
//! filling or draining) computes on a zero microbatch whose result nothing reads: the bubble
//! costs here what it costs a real device. The embedding is the first stage's (its output
//! enters the pipeline there only) and the head the last's (only its loss counts); their
//! parameters are replicated over "pp" and their gradients summed over it.
use super::axes::AxisKind;
use super::compose::{gather, scatter_gathered, Compose, ParamPlan};
use super::rules::Holder;
use super::strategy::{check_dropout_key, Schedule};
use super::{Mode, Parallelism, PlanError};
use crate::autodiff::grad_with;
use crate::ir::{Builder, DType, IrError, Op, Owner, RngLayout, Role, Stack, ValueId};
use crate::model::{block, embed, head, microbatch_rows, param_specs, Activations, GptConfig, Local};
use crate::model::{state_input, Optimizer, ParamSpec, Stage, TrainStep};
use crate::partition::{shard_map, Arg};
use crate::setting::{Refusal, Setting};
use crate::sharding::PartitionSpec;

/// Parameters per block (docs/MODEL.md): ln1 (2), qkv (2), proj (2), ln2 (2), fc (2), out (2).
const PER_BLOCK: usize = 12;

/// Checks a pipeline's settings: the schedule orders a pipeline's microbatches and nothing
/// else, and the mode can express it (the stages' split of the blocks is the "pp" axis's own
/// check, [`Parallelism::check`]).
pub(super) fn check_pipeline(par: &Parallelism, schedule: Schedule, mode: Mode) -> Result<(), PlanError> {
    if !par.is_pipeline() {
        if schedule != Schedule::default() {
            let why = format!(
                "orders a pipeline's microbatches, and {} has no 'pp' axis: add one (e.g. {})",
                Setting::Mesh.at(par.name()),
                Setting::MeshAxis("pp".into()).at(2)
            );
            return Err(Refusal::at(Setting::Schedule, schedule.name(), why).into());
        }
        return Ok(());
    }
    if mode != Mode::ShardMap {
        let why = format!(
            "cannot run a pipeline ({}) yet: it needs what MaxText's jit pipeline needs of the partitioner: the \
             stages' blocks applied at once as one vmapped stage over a stacked weight axis, and the shift of the \
             stage buffer lowered to a collective-permute; shardlab's partitioner has neither yet, so jit would run the stages one after \
             another on every device. Use {}, where the body says the schedule",
            Setting::Mesh.at(par.name()),
            Setting::Mode.at(Mode::ShardMap.name())
        );
        return Err(Refusal::at(Setting::Mode, mode.name(), why).into());
    }
    Ok(())
}

/// The pipelined train step: forward through the stages tick by tick, gradients by autodiff,
/// the replicated parameters' gradients summed over "pp" (and everything's over the token
/// axes), the optimizer on each device's own stage. Inside each stage the other axes compose
/// as in the flat body ([`Compose`]).
pub(super) fn pipeline_train_step(
    c: &Compose,
    opt: Optimizer,
    rng_layout: RngLayout,
    microbatches: usize,
    schedule: Schedule,
) -> Result<TrainStep, PlanError> {
    let (cfg, par) = (c.cfg, c.par);
    cfg.validate()?;
    par.check(cfg, microbatches)?;
    check_pipeline(par, schedule, Mode::ShardMap)?;
    par.check_cp(cfg, c.cp_order, Mode::ShardMap)?;
    check_dropout_key(par, c.dropout_key)?;
    let pp = par.size(AxisKind::Pp);
    let (m, lp) = (microbatches, cfg.layers / pp);
    let specs = param_specs(cfg);
    let tail = 2 + PER_BLOCK * cfg.layers;
    // The program's parameters: the embeddings, the first stage's blocks each stacked with the
    // other stages' (row s is stage s's), then the final layer norm and head.
    let held: Vec<Held> = [0, 1]
        .into_iter()
        .map(Held::Whole)
        .chain((0..PER_BLOCK * lp).map(|i| {
            Held::Stacked(Stack {
                first: 2 + i,
                stride: PER_BLOCK * lp,
                count: pp,
            })
        }))
        .chain((tail..specs.len()).map(Held::Whole))
        .collect();
    let plans: Vec<ParamPlan> = held.iter().map(|h| h.plan(cfg, par, &specs)).collect();
    let mut args: Vec<Arg> = vec![];
    for (h, plan) in held.iter().zip(&plans) {
        args.push(h.arg(cfg, par, &specs, None, &plan.spec));
    }
    for (h, plan) in held.iter().zip(&plans) {
        for slot in 0..opt.slots() {
            args.push(h.arg(cfg, par, &specs, Some(slot), &plan.state));
        }
    }
    for (name, role) in [("tokens", Role::Tokens), ("targets", Role::Targets)] {
        args.push(Arg {
            name: name.into(),
            global_shape: vec![cfg.batch, cfg.seq],
            dtype: DType::U32,
            role,
            spec: c.tokens_spec(),
        });
    }
    args.push(Arg {
        name: "key".into(),
        global_shape: vec![2],
        dtype: DType::U32,
        role: Role::RngKey,
        spec: PartitionSpec::replicated(),
    });
    let n = held.len();
    let mut out_specs = vec![PartitionSpec::replicated()];
    for plan in &plans {
        out_specs.push(plan.spec.clone());
        for _ in 0..opt.slots() {
            out_specs.push(plan.state.clone());
        }
    }
    let stage_cfg = GptConfig {
        layers: lp,
        ..cfg.clone()
    };
    let names: Vec<String> = args[..n].iter().map(|a| format!("d{}", a.name)).collect();
    let token_axes = par.token_axes();

    let mut marks = (0, 0);
    let program = shard_map(&par.mesh, &args, &out_specs, |b, vals| {
        let params = &vals[..n];
        let state = &vals[n..n + n * opt.slots()];
        let (mut tokens, mut targets, key) = (vals[vals.len() - 3], vals[vals.len() - 2], vals[vals.len() - 1]);
        let start = b.program().instrs.len();
        b.begin_stages("pp", pp, m);
        // This device's stage's blocks, as one model's parameters (of `stage_cfg`): FSDP's
        // gathered, a stack's leading stage axis dropped.
        let gathered: Vec<ValueId> = params.iter().zip(&plans).map(|(&v, p)| gather(b, v, &p.spec)).collect();
        let view: Vec<ValueId> = gathered
            .iter()
            .zip(&held)
            .map(|(&v, h)| match h {
                Held::Whole(_) => v,
                Held::Stacked(_) => {
                    let shape = b.shape(v);
                    b.reshape(v, &shape[1..])
                }
            })
            .collect();
        let local = Local {
            stage: Some(Stage {
                axis: "pp".into(),
                layers: lp,
            }),
            ..c.local(m)
        };
        (tokens, targets) = c.take_rows(b, &local, tokens, targets);
        let key = c.key(b, key);
        let x_shape = vec![local.batch, local.seq, cfg.d_model];
        let st = Stages {
            cfg,
            stage_cfg: &stage_cfg,
            view,
            tokens: microbatch_rows(b, tokens, m),
            targets: microbatch_rows(b, targets, m),
            key,
            rng_layout,
            local,
            // One row per stage: 1 on that stage, 0 on the others.
            on_stage: (0..pp).map(|s| stage_indicator(b, pp, s, &x_shape)).collect(),
            last: stage_indicator(b, pp, pp - 1, &[]),
            pp,
            m,
            scale: 1.0 / (m * par.token_split()) as f32,
        };
        let traced = match schedule {
            Schedule::Gpipe => gpipe(b, &st, params, start)?,
            Schedule::OneFOneB => {
                let mut traced = one_f_one_b(b, &st, &held)?;
                // Its pullbacks ran from the gathered parameters: FSDP's reduce-scatter by hand.
                for (i, g) in traced.grads.iter_mut().enumerate() {
                    let shape = b.shape(gathered[i]);
                    let whole = b.reshape(*g, &shape);
                    *g = scatter_gathered(b, whole, &plans[i].spec);
                }
                traced
            }
        };
        marks.0 = traced.forward_end;
        b.set_owner(Owner::Every);
        let mut grads = traced.grads;
        for (i, g) in grads.iter_mut().enumerate() {
            // A stage's weights are its own; the replicated ones were used by one stage (the
            // embeddings by the first, the head by the last: tied, by both).
            let extra: &[&str] = match held[i] {
                Held::Stacked(_) => &[],
                Held::Whole(_) => &["pp"],
            };
            // ZeRO-2: the microbatches' gradients come out of the ticks together, so they are
            // reduce-scattered to this device's block once, here (`sum_axes` leaves out "dp").
            if let Some(d) = plans[i].scatter_dim(par.zero) {
                *g = b.psum_scatter(*g, &["dp"], d, true);
            }
            let axes = plans[i].sum_axes(&token_axes, extra, par.zero);
            if !axes.is_empty() {
                *g = b.psum(*g, &axes);
            }
            b.set_name(*g, &names[i]);
        }
        // The step's loss is the mean over the microbatches and the token axes' shards.
        let local_loss = b.scale(traced.losses, 1.0 / m as f32);
        let loss = b.psum(local_loss, &["pp"]);
        let loss = if token_axes.is_empty() {
            loss
        } else {
            b.pmean(loss, &token_axes)
        };
        b.set_name(loss, "loss");
        marks.1 = b.program().instrs.len();

        let mut outs = vec![loss];
        for i in 0..held.len() {
            let slots = opt.slots();
            let st = &state[slots * i..slots * (i + 1)];
            let o = plans[i].update(b, opt, params[i], grads[i], st, par.zero);
            b.set_name(o[0], &format!("{}'", args[i].name));
            for (slot, v) in o.into_iter().enumerate() {
                b.donate(outs.len(), state_input(n, opt, i, slot));
                outs.push(v);
            }
        }
        Ok(outs)
    })?;
    Ok(TrainStep {
        program,
        forward_end: marks.0,
        backward_end: marks.1,
        config: cfg.clone(),
        optimizer: opt,
    })
}

/// What one stage computes with, shared by the schedules: the model's pieces on this
/// device's stage, its microbatches and the masks that say which stage a device is.
struct Stages<'a> {
    cfg: &'a GptConfig,
    /// The model with this stage's blocks only (its parameters are `view`).
    stage_cfg: &'a GptConfig,
    view: Vec<ValueId>,
    tokens: Vec<ValueId>,
    targets: Vec<ValueId>,
    key: ValueId,
    rng_layout: RngLayout,
    local: Local,
    /// Per stage, 1 on its devices and 0 on the others, (B/M, T, C).
    on_stage: Vec<ValueId>,
    /// 1 on the last stage, a scalar.
    last: ValueId,
    pp: usize,
    m: usize,
    /// 1 / (M * dp): a microbatch's share of the step's mean loss on one device.
    scale: f32,
}

/// What a schedule traced: the sum of the microbatches' losses (on the last stage; zero on
/// the others), each parameter's gradient on this device (before the sums over devices), and
/// where the first backward work began.
struct Traced {
    losses: ValueId,
    grads: Vec<ValueId>,
    forward_end: usize,
}

impl Stages<'_> {
    fn acts(&self, key: ValueId, j: usize) -> Activations<'_> {
        Activations {
            params: &self.view,
            tokens: self.tokens[j],
            targets: self.targets[j],
            key,
            rng_layout: self.rng_layout,
            local: self.local.clone(),
        }
    }

    /// The one-device run's key for the microbatch stage s holds, `base + per_stage * s`
    /// (folded in only when there are several, as the one-device run does).
    fn microbatch_key(&self, b: &mut Builder, base: i64, per_stage: i64) -> ValueId {
        if self.m == 1 {
            return self.key;
        }
        // u32 arithmetic, as jnp.uint32 wraps: a bubble's negative microbatch is some key.
        b.fold_in_axis_affine(self.key, &["pp"], per_stage as u32, base as u32)
    }

    /// The stage's blocks on `x`, with the dropout keys of microbatch `key`.
    fn run(&self, b: &mut Builder, x: ValueId, key: ValueId) -> ValueId {
        let a = self.acts(key, 0);
        let mut x = x;
        for l in 0..self.stage_cfg.layers {
            x = b.checkpoint(self.cfg.remat.policy(), |b| block(b, self.stage_cfg, &a, l, x));
        }
        x
    }

    /// Microbatch `j` entering the pipeline: every device embeds it, and only the first
    /// stage's copy survives the mask (the others' gradient is zero).
    fn enter(&self, b: &mut Builder, j: usize) -> ValueId {
        let before = b.set_owner(Owner::First);
        let x = embed(b, &self.acts(self.key, j));
        let x = b.mul(x, self.on_stage[0]);
        b.set_owner(before);
        x
    }

    /// Microbatch `j`'s mean loss from the last stage's output `y` (zero on other stages).
    fn loss(&self, b: &mut Builder, y: ValueId, j: usize) -> ValueId {
        let before = b.set_owner(Owner::Last);
        let logits = head(b, self.stage_cfg, &self.acts(self.key, j), y);
        let ce = b.cross_entropy(logits, self.targets[j]);
        let ce = b.mean(ce);
        let l = b.mul(ce, self.last);
        b.set_owner(before);
        l
    }

    /// `sum(y * ct)`: a scalar whose gradient through `y` is the cotangent `ct` (made before
    /// the instructions it is differentiated over, so a constant to them): jax.vjp's pullback
    /// as a gradient.
    fn pullback(&self, b: &mut Builder, y: ValueId, ct: ValueId) -> ValueId {
        let rank = b.shape(y).len();
        let p = b.mul(y, ct);
        b.sum(p, &(0..rank).collect::<Vec<_>>())
    }
}

fn keep(_: &mut Builder, _: usize, g: ValueId) -> ValueId {
    g
}

/// GPipe: tick t runs microbatch t - s on stage s, forward only; the backward is autodiff's
/// over the whole loop (every forward, then every backward, ticks in reverse), so a stage
/// holds every tick's activations until its backward.
fn gpipe(b: &mut Builder, st: &Stages, params: &[ValueId], start: usize) -> Result<Traced, IrError> {
    let (m, pp) = (st.m, st.pp);
    let entering: Vec<ValueId> = (0..m).map(|j| st.enter(b, j)).collect();
    let forward_ring: Vec<(usize, usize)> = (0..pp - 1).map(|s| (s, s + 1)).collect();
    let mut received: Option<ValueId> = None;
    let mut losses = vec![];
    for t in 0..m + pp - 1 {
        // Stage s holds microbatch t - s; the first stage takes the next one in (a zero one
        // once they are all in), the others what the stage before sent.
        b.set_owner(Owner::Microbatch {
            base: t as i64,
            per_stage: -1,
        });
        let x = match (received, entering.get(t)) {
            (Some(r), Some(&e)) => b.add(r, e),
            (Some(r), None) => r,
            (None, e) => *e.expect("tick 0 takes the first microbatch in"),
        };
        let key = st.microbatch_key(b, t as i64, -1);
        let y = st.run(b, x, key);
        b.set_name(y, &format!("stage_out{t}"));
        // The last stage finishes microbatch t - (pp - 1): its loss is the one that counts.
        if let Some(j) = (t + 1).checked_sub(pp) {
            losses.push(st.loss(b, y, j));
        }
        if t + 1 < m + pp - 1 {
            // Every stage sends each tick (in the bubble, a zero microbatch).
            b.set_owner(Owner::Every);
            received = Some(b.ppermute(y, "pp", &forward_ring));
        }
    }
    b.set_owner(Owner::Last);
    let total = sum_all(b, losses);
    let scaled = b.scale(total, st.scale);
    b.set_owner(Owner::Every);
    let forward_end = b.program().instrs.len();
    let grads = grad_with(b, scaled, params, start, &mut keep)?;
    Ok(Traced {
        losses: total,
        grads,
        forward_end,
    })
}

/// 1F1B in lockstep: tick t runs a forward slot (stage s on microbatch t - s, as GPipe) and,
/// once the first microbatch reached the last stage, a backward slot (stage s on microbatch
/// t - 2(pp-1) + s: the last stage backs the one it just finished, each stage before it a tick
/// later, as the cotangents travel back by ppermute). Every device runs one program, so the
/// backward slot cannot read activations saved at a different tick on each stage: each stage
/// keeps its microbatches' inputs (at most 2(pp-1-s)+1 of them) and recomputes its forward
/// from the input before the pullback (what jax.checkpoint around a stage does). A stage holds
/// those inputs and one microbatch's activations, however many microbatches there are.
fn one_f_one_b(b: &mut Builder, st: &Stages, held: &[Held]) -> Result<Traced, IrError> {
    let (m, pp) = (st.m, st.pp);
    let ticks = m + 2 * (pp - 1);
    let forward_ring: Vec<(usize, usize)> = (0..pp - 1).map(|s| (s, s + 1)).collect();
    let backward_ring: Vec<(usize, usize)> = (0..pp - 1).map(|s| (s + 1, s)).collect();
    // Which inputs each pullback differentiates: the stage's blocks, the head (the final layer
    // norm, the head and, tied, wte), the embeddings.
    let stage_params: Vec<usize> = (0..held.len())
        .filter(|&i| matches!(held[i], Held::Stacked(_)))
        .collect();
    let tail = held.len() - (2 + if st.cfg.tied { 0 } else { 1 });
    let mut head_params: Vec<usize> = (tail..held.len()).collect();
    if st.cfg.tied {
        head_params.push(0);
    }
    let mut sums: Vec<Option<ValueId>> = vec![None; held.len()];
    // Summed in the view's shape; the caller maps each sum back to its parameter.
    let mut accumulate = |b: &mut Builder, i: usize, g: ValueId| {
        sums[i] = Some(match sums[i] {
            Some(prev) => b.add(prev, g),
            None => g,
        });
    };
    let mut inputs: Vec<ValueId> = vec![];
    let (mut received, mut returned): (Option<ValueId>, Option<ValueId>) = (None, None);
    let mut losses = vec![];
    let mut forward_end = None;
    for t in 0..ticks {
        // Forward slot.
        let mut head_ct = None;
        if t < m + pp - 1 {
            b.set_owner(Owner::Microbatch {
                base: t as i64,
                per_stage: -1,
            });
            let entering = (t < m).then(|| st.enter(b, t));
            let x = match (received, entering) {
                (Some(r), Some(e)) => b.add(r, e),
                (Some(r), None) => r,
                (None, e) => e.expect("tick 0 takes the first microbatch in"),
            };
            inputs.push(x);
            let key = st.microbatch_key(b, t as i64, -1);
            let y = st.run(b, x, key);
            b.set_name(y, &format!("stage_out{t}"));
            if let Some(j) = (t + 1).checked_sub(pp) {
                // The last stage's loss, and at once its pullback to the stage's output.
                let at = b.program().instrs.len();
                let l = st.loss(b, y, j);
                losses.push(l);
                b.set_owner(Owner::Last);
                let scaled = b.scale(l, st.scale);
                let wrt: Vec<ValueId> = std::iter::once(y)
                    .chain(head_params.iter().map(|&i| st.view[i]))
                    .collect();
                let g = grad_with(b, scaled, &wrt, at, &mut keep)?;
                head_ct = Some(g[0]);
                for (k, &i) in head_params.iter().enumerate() {
                    accumulate(b, i, g[k + 1]);
                }
            }
            if t + 1 < m + pp - 1 {
                b.set_owner(Owner::Every);
                received = Some(b.ppermute(y, "pp", &forward_ring));
            }
        }
        // Backward slot.
        if t + 1 < pp {
            continue;
        }
        let base = t as i64 - 2 * (pp as i64 - 1);
        b.set_owner(Owner::Microbatch { base, per_stage: 1 });
        forward_end.get_or_insert(b.program().instrs.len());
        // Each stage's input of the microbatch it backs: it ran it forward 2(pp-1-s) ticks ago.
        let mut saved = None;
        for s in 0..pp {
            let Some(&x) = t.checked_sub(2 * (pp - 1 - s)).and_then(|at| inputs.get(at)) else {
                continue;
            };
            let mine = b.mul(x, st.on_stage[s]);
            saved = Some(match saved {
                Some(prev) => b.add(prev, mine),
                None => mine,
            });
        }
        let saved = saved.expect("the last stage backs this tick's microbatch, or a stage before it an earlier one");
        let ct = match (returned, head_ct) {
            (Some(r), Some(h)) => b.add(r, h),
            (Some(r), None) => r,
            (None, Some(h)) => h,
            (None, None) => unreachable!("the first backward slot starts at the last stage's first loss"),
        };
        let at = b.program().instrs.len();
        let key = st.microbatch_key(b, base, 1);
        let y = st.run(b, saved, key);
        let l = st.pullback(b, y, ct);
        let wrt: Vec<ValueId> = std::iter::once(saved)
            .chain(stage_params.iter().map(|&i| st.view[i]))
            .collect();
        let g = grad_with(b, l, &wrt, at, &mut keep)?;
        for (k, &i) in stage_params.iter().enumerate() {
            accumulate(b, i, g[k + 1]);
        }
        let dx = g[0];
        // The first stage's input cotangent is its microbatch's embedding's.
        if let Ok(j) = usize::try_from(base) {
            if j < m {
                b.set_owner(Owner::First);
                let at = b.program().instrs.len();
                let e = st.enter(b, j);
                let l = st.pullback(b, e, dx);
                let g = grad_with(b, l, &[st.view[0], st.view[1]], at, &mut keep)?;
                accumulate(b, 0, g[0]);
                accumulate(b, 1, g[1]);
            }
        }
        if t + 1 < ticks {
            b.set_owner(Owner::Every);
            returned = Some(b.ppermute(dx, "pp", &backward_ring));
        }
    }
    b.set_owner(Owner::Last);
    let total = sum_all(b, losses);
    b.set_owner(Owner::Every);
    let grads = sums
        .into_iter()
        .enumerate()
        .map(|(i, g)| {
            g.unwrap_or_else(|| {
                b.emit1(
                    Op::Full {
                        shape: b.shape(st.view[i]),
                        value: 0.0,
                    },
                    &[],
                )
            })
        })
        .collect();
    Ok(Traced {
        losses: total,
        grads,
        forward_end: forward_end.unwrap_or(b.program().instrs.len()),
    })
}

fn sum_all(b: &mut Builder, xs: Vec<ValueId>) -> ValueId {
    xs.into_iter()
        .reduce(|a, x| b.add(a, x))
        .expect("at least one microbatch")
}

/// What one program input holds: a parameter whole, or a stack of the stages' copies of one.
enum Held {
    Whole(usize),
    Stacked(Stack),
}

impl Held {
    fn first(&self) -> usize {
        match self {
            Held::Whole(i) => *i,
            Held::Stacked(s) => s.first,
        }
    }

    /// (global shape, spec) of the parameter or, `holder` State, its optimizer state.
    fn layout(
        &self,
        cfg: &GptConfig,
        par: &Parallelism,
        specs: &[ParamSpec],
        holder: Holder,
    ) -> (Vec<usize>, PartitionSpec) {
        let ps = &specs[self.first()];
        match (self, holder) {
            (Held::Whole(_), Holder::Param) => par.param_layout(cfg, ps, Mode::ShardMap),
            (Held::Whole(_), Holder::State) => par.state_layout(cfg, ps, Mode::ShardMap),
            (Held::Stacked(_), holder) => par.stacked_layout(cfg, ps, holder),
        }
    }

    fn plan(&self, cfg: &GptConfig, par: &Parallelism, specs: &[ParamSpec]) -> ParamPlan {
        ParamPlan {
            spec: self.layout(cfg, par, specs, Holder::Param).1,
            state: self.layout(cfg, par, specs, Holder::State).1,
            decays: specs[self.first()].decays(),
        }
    }

    /// The shard_map argument of the parameter (`slot` None) or of its optimizer state.
    fn arg(
        &self,
        cfg: &GptConfig,
        par: &Parallelism,
        specs: &[ParamSpec],
        slot: Option<usize>,
        spec: &PartitionSpec,
    ) -> Arg {
        let ps = &specs[self.first()];
        let suffix = slot.map(|s| format!(".{}", ["m", "v"][s])).unwrap_or_default();
        let (global_shape, _) = self.layout(cfg, par, specs, Holder::Param);
        match self {
            Held::Whole(i) => Arg {
                name: format!("{}{suffix}", ps.name),
                global_shape,
                dtype: DType::F32,
                role: match slot {
                    None => Role::Param(*i),
                    Some(slot) => Role::OptState { param: *i, slot },
                },
                spec: spec.clone(),
            },
            Held::Stacked(stack) => Arg {
                // "stages.h0.w_qkv": block 0 of every stage.
                name: format!("stages.{}{suffix}", ps.name),
                global_shape,
                dtype: DType::F32,
                role: match slot {
                    None => Role::ParamStack(*stack),
                    Some(slot) => Role::OptStateStack { stack: *stack, slot },
                },
                spec: spec.clone(),
            },
        }
    }
}

/// 1 on stage `stage` and 0 on the others, broadcast to `shape`: a device's block of the
/// one-hot row `[0, .., 1, .., 0]` over "pp" (a constant; its slice varies along "pp").
fn stage_indicator(b: &mut Builder, pp: usize, stage: usize, shape: &[usize]) -> ValueId {
    let parts: Vec<ValueId> = (0..pp)
        .map(|s| {
            let value = if s == stage { 1.0 } else { 0.0 };
            b.emit1(Op::Full { shape: vec![1], value }, &[])
        })
        .collect();
    let row = b.concat(&parts, 0);
    let mine = b.slice_block(row, &["pp"], 0);
    if shape.is_empty() {
        b.reshape(mine, &[])
    } else {
        b.broadcast_in_dim(mine, shape, &[0])
    }
}
