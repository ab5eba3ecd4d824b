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
use super::strategy::{check, p, Schedule};
use super::{DropoutKey, Mode, PlanError, Strategy};
use crate::autodiff::grad_with;
use crate::ir::{Builder, DType, Op, Owner, RngLayout, Role, Stack, ValueId};
use crate::model::{block, embed, head, microbatch_rows, param_specs, Activations, GptConfig, Local};
use crate::model::{MaskBlocks, Optimizer, ParamSpec, Stage, TrainStep};
use crate::partition::{shard_map, Arg};
use crate::sharding::{Mesh, PartitionSpec};

/// Parameters per block (docs/MODEL.md): ln1 (2), qkv (2), proj (2), ln2 (2), fc (2), out (2).
const PER_BLOCK: usize = 12;

/// Checks a pipeline's settings: the stages split the blocks evenly, the schedule is one this
/// engine runs, and the mode can express it. `schedule` is checked for every strategy (it
/// orders a pipeline's microbatches and nothing else).
pub(super) fn check_pipeline(
    cfg: &GptConfig,
    strategy: Strategy,
    mesh: &Mesh,
    schedule: Schedule,
    mode: Mode,
) -> Result<(), PlanError> {
    let invalid = |what: String, why: String| Err(PlanError::Invalid { what, why });
    if !strategy.is_pipeline() {
        if schedule != Schedule::default() {
            return invalid(
                format!("--schedule {}", schedule.name()),
                format!(
                    "orders a pipeline's microbatches, and --strategy {} has none: use --strategy pp or dp_pp",
                    strategy.name()
                ),
            );
        }
        return Ok(());
    }
    let pp = mesh.axis_size("pp").unwrap_or(1);
    let divisors: Vec<String> = (1..=cfg.layers)
        .filter(|d| cfg.layers.is_multiple_of(*d))
        .map(|d| d.to_string())
        .collect();
    if pp > cfg.layers {
        return invalid(
            format!("--mesh pp={pp}"),
            format!(
                "is more stages than --layers {}: every stage runs at least one block; use pp = one of {}",
                cfg.layers,
                divisors.join(", ")
            ),
        );
    }
    if !cfg.layers.is_multiple_of(pp) {
        return invalid(
            format!("--layers {}", cfg.layers),
            format!(
                "does not split into pp = {pp} equal stages: use a layer count that is a multiple of {pp}, or pp = \
                 one of {}",
                divisors.join(", ")
            ),
        );
    }
    if mode == Mode::Auto {
        return invalid(
            format!("--strategy {} --mode auto", strategy.name()),
            "needs what MaxText's jit pipeline needs of the partitioner: the stages' blocks applied at once as one \
             vmapped stage over a stacked weight axis, and the shift of the stage buffer lowered to a \
             collective-permute; shardlab's partitioner has neither yet, so jit would run the stages one after \
             another on every device. Use --mode shard_map, where the body says the schedule"
                .into(),
        );
    }
    if schedule == Schedule::OneFOneB {
        return invalid(
            "--schedule 1f1b".into(),
            "needs every stage to run the backward of a different microbatch in the same tick (stage s the one \
             it ran forward 2(pp-1-s) ticks before): in one program for all devices that is a per-device index \
             into the saved activations, which this engine cannot express yet. Use --schedule gpipe: its bubble \
             is the same, (pp-1)/(M+pp-1); it holds all M microbatches' activations where 1F1B holds pp"
                .into(),
        );
    }
    Ok(())
}

/// The pipelined train step: forward through the stages tick by tick, gradients by autodiff,
/// the replicated parameters' gradients summed over "pp" (and everything's over "dp"), the
/// optimizer on each device's own stage.
#[allow(clippy::too_many_arguments)]
pub(super) fn pipeline_train_step(
    cfg: &GptConfig,
    opt: Optimizer,
    rng_layout: RngLayout,
    strategy: Strategy,
    mesh: &Mesh,
    dropout_key: DropoutKey,
    microbatches: usize,
    schedule: Schedule,
) -> Result<TrainStep, PlanError> {
    cfg.validate()?;
    check(cfg, strategy, mesh, microbatches)?;
    check_pipeline(cfg, strategy, mesh, schedule, Mode::ShardMap)?;
    let has_dp = strategy.axes().contains(&"dp");
    if has_dp && dropout_key == DropoutKey::FoldIn {
        return Err(PlanError::Invalid {
            what: "--dropout-key fold_in".into(),
            why: format!(
                "has nothing to choose under --strategy {}: its body draws every device's block of the one-device \
                 run's masks (they differ across devices already); use --dropout-key same",
                strategy.name()
            ),
        });
    }
    let pp = mesh.axis_size("pp")?;
    let dp = if has_dp { mesh.axis_size("dp")? } else { 1 };
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
    let stage_axis = |rank: usize| {
        let mut spec = vec![Some("pp")];
        spec.resize(rank, None);
        p(&spec)
    };
    let mut args: Vec<Arg> = vec![];
    for h in &held {
        args.push(h.arg(&specs, None, &stage_axis));
    }
    for h in &held {
        for slot in 0..opt.slots() {
            args.push(h.arg(&specs, Some(slot), &stage_axis));
        }
    }
    let tokens_spec = p(&[has_dp.then_some("dp"), None]);
    for (name, role) in [("tokens", Role::Tokens), ("targets", Role::Targets)] {
        args.push(Arg {
            name: name.into(),
            global_shape: vec![cfg.batch, cfg.seq],
            dtype: DType::U32,
            role,
            spec: tokens_spec.clone(),
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
    for a in &args[..n] {
        for _ in 0..=opt.slots() {
            out_specs.push(a.spec.clone());
        }
    }
    let stage_cfg = GptConfig {
        layers: lp,
        ..cfg.clone()
    };
    let names: Vec<String> = args[..n].iter().map(|a| format!("d{}", a.name)).collect();

    let mut marks = (0, 0);
    let program = shard_map(mesh, &args, &out_specs, |b, vals| {
        let params = &vals[..n];
        let state = &vals[n..n + n * opt.slots()];
        let (tokens, targets, key) = (vals[vals.len() - 3], vals[vals.len() - 2], vals[vals.len() - 1]);
        let start = b.program().instrs.len();
        b.begin_stages("pp", pp, m);
        // This device's stage's blocks, as one model's parameters (of `stage_cfg`).
        let view: Vec<ValueId> = params
            .iter()
            .zip(&held)
            .map(|(&v, h)| match h {
                Held::Whole(_) => v,
                Held::Stacked(s) => b.reshape(v, &specs[s.first].shape),
            })
            .collect();
        let tokens = microbatch_rows(b, tokens, m);
        let targets = microbatch_rows(b, targets, m);
        let local = Local {
            batch: cfg.batch / dp / m,
            stage: Some(Stage {
                axis: "pp".into(),
                layers: lp,
            }),
            // Under "dp" every device draws its block of the one-device run's masks.
            masks: has_dp.then(|| MaskBlocks {
                batch: Some("dp".into()),
                ..Default::default()
            }),
            ..Local::of(cfg)
        };
        let acts = |key: ValueId, j: usize| Activations {
            params: &view,
            tokens: tokens[j],
            targets: targets[j],
            key,
            rng_layout,
            local: local.clone(),
        };
        let x_shape = vec![local.batch, cfg.seq, cfg.d_model];
        let first = stage_indicator(b, pp, 0, &x_shape);
        let last = stage_indicator(b, pp, pp - 1, &[]);
        // Each microbatch enters at the first stage: every device embeds it, and only the
        // first stage's copy survives the mask (the others' gradient is zero).
        b.set_owner(Owner::First);
        let entering: Vec<ValueId> = (0..m)
            .map(|j| {
                let x = embed(b, &acts(key, j));
                b.mul(x, first)
            })
            .collect();
        let forward_ring: Vec<(usize, usize)> = (0..pp - 1).map(|s| (s, s + 1)).collect();
        let mut received: Option<ValueId> = None;
        let mut losses = vec![];
        for t in 0..m + pp - 1 {
            // Stage s holds microbatch t - s; the first stage takes the next one in (a zero
            // one once they are all in), the others what the stage before sent.
            b.set_owner(Owner::Microbatch {
                base: t as i64,
                per_stage: -1,
            });
            let x = match (received, entering.get(t)) {
                (Some(r), Some(&e)) => b.add(r, e),
                (Some(r), None) => r,
                (None, e) => *e.expect("tick 0 takes the first microbatch in"),
            };
            // The one-device run's keys: microbatch (t - s)'s, and each block's own.
            let key = if m == 1 {
                key
            } else {
                b.fold_in_axis_affine(key, &["pp"], u32::MAX, t as u32)
            };
            let a = acts(key, t.min(m - 1));
            let mut x = x;
            for l in 0..lp {
                x = b.checkpoint(cfg.remat.policy(), |b| block(b, &stage_cfg, &a, l, x));
            }
            b.set_name(x, &format!("stage_out{t}"));
            // The last stage finishes microbatch t - (pp - 1): its loss is the one that counts.
            if let Some(j) = (t + 1).checked_sub(pp) {
                b.set_owner(Owner::Last);
                let logits = head(b, &stage_cfg, &acts(key, j), x);
                let ce = b.cross_entropy(logits, targets[j]);
                let ce = b.mean(ce);
                losses.push(b.mul(ce, last));
            }
            if t + 1 < m + pp - 1 {
                // Every stage sends each tick (in the bubble, a zero microbatch).
                b.set_owner(Owner::Every);
                received = Some(b.ppermute(x, "pp", &forward_ring));
            }
        }
        b.set_owner(Owner::Last);
        let total = losses
            .into_iter()
            .reduce(|a, l| b.add(a, l))
            .expect("at least one microbatch");
        // The step's loss is the mean over microbatches (and "dp" shards): differentiate this
        // device's share, then sum the gradients over the devices.
        let local_loss = b.scale(total, 1.0 / m as f32);
        let scaled = b.scale(total, 1.0 / (m * dp) as f32);
        b.set_owner(Owner::Every);
        marks.0 = b.program().instrs.len();
        let mut keep = |_: &mut Builder, _: usize, g: ValueId| g;
        let mut grads = grad_with(b, scaled, params, start, &mut keep)?;
        for (i, g) in grads.iter_mut().enumerate() {
            // A stage's weights are its own; the replicated ones were used by one stage (the
            // embeddings by the first, the head by the last: tied, by both).
            let axes: Vec<&str> = match held[i] {
                Held::Stacked(_) if has_dp => vec!["dp"],
                Held::Stacked(_) => vec![],
                Held::Whole(_) if has_dp => vec!["dp", "pp"],
                Held::Whole(_) => vec!["pp"],
            };
            if !axes.is_empty() {
                *g = b.psum(*g, &axes);
            }
            b.set_name(*g, &names[i]);
        }
        let loss = b.psum(local_loss, &["pp"]);
        let loss = if has_dp { b.pmean(loss, &["dp"]) } else { loss };
        b.set_name(loss, "loss");
        marks.1 = b.program().instrs.len();

        let mut outs = vec![loss];
        for (i, h) in held.iter().enumerate() {
            let ps = &specs[h.first()];
            match opt {
                Optimizer::Sgd { lr } => {
                    let np = b.emit1(Op::SgdUpdate { lr }, &[params[i], grads[i]]);
                    b.set_name(np, &format!("{}'", args[i].name));
                    b.donate(outs.len(), i);
                    outs.push(np);
                }
                Optimizer::AdamW { lr } => {
                    let wd = if ps.decays() { 0.01 } else { 0.0 };
                    let op = Op::AdamWUpdate {
                        lr,
                        b1: 0.9,
                        b2: 0.999,
                        eps: 1e-8,
                        wd,
                    };
                    let o = b.emit(op, &[params[i], grads[i], state[2 * i], state[2 * i + 1]]);
                    b.set_name(o[0], &format!("{}'", args[i].name));
                    for (slot, v) in o.into_iter().enumerate() {
                        let input = if slot == 0 { i } else { n + 2 * i + (slot - 1) };
                        b.donate(outs.len(), input);
                        outs.push(v);
                    }
                }
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

    /// The shard_map argument of the parameter (`slot` None) or of its optimizer state.
    fn arg(&self, specs: &[ParamSpec], slot: Option<usize>, stage_axis: &dyn Fn(usize) -> PartitionSpec) -> Arg {
        let ps = &specs[self.first()];
        let suffix = slot.map(|s| format!(".{}", ["m", "v"][s])).unwrap_or_default();
        match self {
            Held::Whole(i) => Arg {
                name: format!("{}{suffix}", ps.name),
                global_shape: ps.shape.clone(),
                dtype: DType::F32,
                role: match slot {
                    None => Role::Param(*i),
                    Some(slot) => Role::OptState { param: *i, slot },
                },
                spec: PartitionSpec::replicated(),
            },
            Held::Stacked(stack) => {
                let mut global_shape = vec![stack.count];
                global_shape.extend_from_slice(&ps.shape);
                Arg {
                    // "stages.h0.w_qkv": block 0 of every stage.
                    name: format!("stages.{}{suffix}", ps.name),
                    spec: stage_axis(global_shape.len()),
                    global_shape,
                    dtype: DType::F32,
                    role: match slot {
                        None => Role::ParamStack(*stack),
                        Some(slot) => Role::OptStateStack { stack: *stack, slot },
                    },
                }
            }
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
