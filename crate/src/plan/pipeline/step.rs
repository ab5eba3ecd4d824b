//! Pipeline parallelism's shard_map body, as MaxText lays it out and Megatron-LM schedules
//! it: the blocks in `pp` stages (of `v` chunks each, with virtual stages) whose weights are
//! stacked on a leading stage axis split over "pp"; each stage runs its own passes in the
//! schedule's order ([`super::emit`]), the embedding on the first stage, the head and loss on
//! the last. The replicated parameters' gradients are summed over "pp" (and everything's over
//! the token axes); the optimizer runs on each device's own stage. Inside each stage the other
//! axes compose as in the flat body ([`Compose`]).
use super::emit::{trace, Stages, PER_BLOCK};
use super::layout::StageLayout;
use super::table::Table;
use crate::ir::{DType, Role, Stack, ValueId};
use crate::model::{microbatch_rows, param_specs, GptConfig, Optimizer, ParamSpec, TrainStep};
use crate::partition::{shard_map, Arg};
use crate::plan::axes::AxisKind;
use crate::plan::compose::{gather, scatter_gathered, updates, Compose, ParamPlan};
use crate::plan::rules::Holder;
use crate::plan::strategy::check_dropout_key;
use crate::plan::{Mode, Parallelism, PlanError, Schedule};
use crate::setting::{Refusal, Setting};
use crate::sharding::PartitionSpec;

/// How the pipeline runs: its schedule, chunks per stage and blocks per stage.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelinePlan {
    pub schedule: Schedule,
    /// Virtual stages: chunks of blocks per stage.
    pub chunks: usize,
    /// Blocks per stage (empty: equal stages).
    pub stage_layers: Vec<usize>,
}

/// Checks a pipeline's settings that the mode decides: a schedule orders a pipeline's
/// microbatches and nothing else (the stages' split of the blocks is [`super::check`]'s).
pub(in crate::plan) fn check_pipeline(par: &Parallelism, schedule: Schedule, mode: Mode) -> Result<(), PlanError> {
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
             stage buffer lowered to a collective-permute; shardlab's partitioner has neither yet, so jit would run \
             the stages one after another on every device. Use {}, where the body says the schedule",
            Setting::Mesh.at(par.name()),
            Setting::Mode.at(Mode::ShardMap.name())
        );
        return Err(Refusal::at(Setting::Mode, mode.name(), why).into());
    }
    Ok(())
}

/// The pipelined train step: each stage's passes as the schedule orders them, the gradients
/// summed over the stages that hold a parameter whole and over the token axes, the optimizer
/// on each device's own stage.
pub(in crate::plan) fn pipeline_train_step(
    c: &Compose,
    opt: Optimizer,
    rng_layout: crate::ir::RngLayout,
    microbatches: usize,
    pipeline: &PipelinePlan,
) -> Result<TrainStep, PlanError> {
    let (cfg, par) = (c.cfg, c.par);
    cfg.validate()?;
    par.check_with_stages(cfg, microbatches, &pipeline.stage_layers)?;
    check_pipeline(par, pipeline.schedule, Mode::ShardMap)?;
    super::check(
        cfg,
        par,
        pipeline.schedule,
        pipeline.chunks,
        &pipeline.stage_layers,
        microbatches,
    )?;
    par.check_cp(cfg, c.cp_order, Mode::ShardMap)?;
    check_dropout_key(par, c.dropout_key)?;
    let pp = par.size(AxisKind::Pp);
    let m = microbatches;
    let layout = StageLayout::new(cfg.layers, pp, pipeline.chunks, &pipeline.stage_layers);
    let table = Table::new(pipeline.schedule, pp, m, pipeline.chunks);
    let rows = layout.rows();
    let specs = param_specs(cfg);
    let tail = 2 + PER_BLOCK * cfg.layers;
    // The program's parameters: the embeddings; per chunk, per row, each block parameter
    // stacked over the stages (row s is stage s's, zeros where it has fewer blocks); the final
    // layer norm and head.
    let stacked = (0..pipeline.chunks).flat_map(|chunk| {
        let layout = &layout;
        (0..rows * PER_BLOCK).map(move |i| {
            let (row, kind) = (i / PER_BLOCK, i % PER_BLOCK);
            let stack = Stack {
                rows: (0..pp)
                    .map(|s| {
                        let (first, blocks) = layout.run(s, chunk);
                        (row < blocks).then_some(2 + PER_BLOCK * (first + row) + kind)
                    })
                    .collect(),
            };
            Held::Stacked {
                stack,
                chunk,
                row,
                kind,
            }
        })
    });
    let held: Vec<Held> = [0, 1]
        .into_iter()
        .map(Held::Whole)
        .chain(stacked)
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
    let chunk_cfg = GptConfig {
        layers: rows,
        ..cfg.clone()
    };
    let names: Vec<String> = args[..n].iter().map(|a| format!("d{}", a.name)).collect();
    let token_axes = par.token_axes();
    let stacked_per_chunk = rows * PER_BLOCK;
    // Per chunk, the positions of a chunk's model view (embeddings, its rows, head) in `held`.
    let held_of: Vec<Vec<usize>> = (0..pipeline.chunks)
        .map(|chunk| {
            [0, 1]
                .into_iter()
                .chain((0..stacked_per_chunk).map(|i| 2 + chunk * stacked_per_chunk + i))
                .chain(2 + pipeline.chunks * stacked_per_chunk..n)
                .collect()
        })
        .collect();

    let mut marks = (0, 0);
    let program = shard_map(&par.mesh, &args, &out_specs, |b, vals| {
        let params = &vals[..n];
        let state = &vals[n..n + n * opt.slots()];
        let (mut tokens, mut targets, key) = (vals[vals.len() - 3], vals[vals.len() - 2], vals[vals.len() - 1]);
        // This device's parameters as its stages' passes read them: FSDP's gathered, a stack's
        // leading stage axis dropped.
        let gathered: Vec<ValueId> = params.iter().zip(&plans).map(|(&v, p)| gather(b, v, &p.spec)).collect();
        let view: Vec<ValueId> = gathered
            .iter()
            .zip(&held)
            .map(|(&g, h)| match h {
                Held::Whole(_) => g,
                Held::Stacked { .. } => {
                    let shape = b.shape(g);
                    b.reshape(g, &shape[1..])
                }
            })
            .collect();
        let local = c.local(m);
        (tokens, targets) = c.take_rows(b, &local, tokens, targets);
        let key = c.key(b, key);
        // Microbatch j's key, as the one-device run folds it (not at all with one).
        let keys: Vec<ValueId> = (0..m)
            .map(|j| if m == 1 { key } else { b.fold_in(key, j as u32) })
            .collect();
        let st = Stages {
            cfg,
            chunk_cfg: chunk_cfg.clone(),
            layout: &layout,
            table: &table,
            chunk_params: held_of
                .iter()
                .map(|positions| positions.iter().map(|&h| view[h]).collect())
                .collect(),
            held_of: held_of.clone(),
            view: view.clone(),
            tokens: microbatch_rows(b, tokens, m),
            targets: microbatch_rows(b, targets, m),
            keys,
            rng_layout,
            local,
            scale: 1.0 / (m * par.token_split()) as f32,
        };
        b.begin_stages("pp", pp, m);
        let traced = trace(b, &st)?;
        marks.0 = traced.forward_end;
        let mut grads = traced.grads;
        for (i, g) in grads.iter_mut().enumerate() {
            // The passes ran from the gathered parameters: FSDP's reduce-scatter by hand.
            let shape = b.shape(gathered[i]);
            let whole = b.reshape(*g, &shape);
            *g = scatter_gathered(b, whole, &plans[i].spec);
            // A stage's weights are its own; the replicated ones were used by one stage (the
            // embeddings by the first, the head by the last: tied, by both).
            let extra: &[&str] = match held[i] {
                Held::Stacked { .. } => &[],
                Held::Whole(_) => &["pp"],
            };
            // ZeRO-2: the microbatches' gradients come out of the passes together, so they are
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

        let names: Vec<&str> = args[..held.len()].iter().map(|a| a.name.as_str()).collect();
        Ok(updates(
            b,
            opt,
            par.zero,
            &plans,
            &names,
            (params, &grads, state),
            vec![loss],
        ))
    })?;
    Ok(TrainStep {
        program,
        forward_end: marks.0,
        backward_end: marks.1,
        config: cfg.clone(),
        optimizer: opt,
    })
}

/// What one program input holds: a parameter whole, or a stack of the stages' copies of one
/// (row `row` of chunk `chunk`, block parameter `kind`).
enum Held {
    Whole(usize),
    Stacked {
        stack: Stack,
        chunk: usize,
        row: usize,
        kind: usize,
    },
}

impl Held {
    /// The parameter whose shape and name the input takes: a stack's first real row, or where
    /// no stage holds a block at that row of the chunk (counts per virtual stage can leave a
    /// chunk short on every stage) block 0's, whose shape every block shares.
    fn first(&self) -> usize {
        match self {
            Held::Whole(i) => *i,
            Held::Stacked { stack, kind, .. } => stack.params().next().unwrap_or(2 + kind),
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
            (Held::Stacked { .. }, holder) => par.stacked_layout(cfg, ps, holder),
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
            Held::Stacked { stack, chunk, row, .. } => Arg {
                // "stages.h0.w_qkv": block 0 of every stage (its first stage's name); a stack of
                // zeros on every stage by its place, "stages.c1.r1.w_qkv".
                name: match stack.params().next() {
                    Some(_) => format!("stages.{}{suffix}", ps.name),
                    None => format!(
                        "stages.c{chunk}.r{row}.{}{suffix}",
                        ps.name.split_once('.').map_or(&*ps.name, |n| n.1)
                    ),
                },
                global_shape,
                dtype: DType::F32,
                role: match slot {
                    None => Role::ParamStack(stack.clone()),
                    Some(slot) => Role::OptStateStack {
                        stack: stack.clone(),
                        slot,
                    },
                },
                spec: spec.clone(),
            },
        }
    }
}
