//! The hand-written shard_map train steps: the per-device bodies a JAX user would write for
//! data parallelism, ZeRO-1 and ZeRO-2, FSDP (ZeRO-3), Megatron tensor parallelism (with
//! sequence parallelism or not), context parallelism with ring attention, and their
//! combinations on a 2-D mesh, each with gradient accumulation over microbatches.
use super::strategy::{check, check_cp, check_dropout_key, p, param_layout, state_layout};
use super::{DropoutKey, Mode, PlanError, Strategy};
use crate::ir::{Builder, CpOrder, DType, IrError, Op, RngLayout, Role, SeqBlock, ValueId};
use crate::model::{accumulate, forward_loss, microbatch_rows, param_specs, Activations, GptConfig, Local};
use crate::model::{state_input, update, MaskBlocks, Optimizer, Ring, TrainStep};
use crate::partition::{shard_map, Arg};
use crate::sharding::{Mesh, PartitionSpec};

/// The whole train step as a shard_map'ed per-device program: forward on local shapes,
/// gradients by autodiff (through the collectives), the reduction of gradients the strategy
/// needs, and the optimizer update on each device's own shard.
pub fn shard_map_train_step(
    cfg: &GptConfig,
    opt: Optimizer,
    rng_layout: RngLayout,
    strategy: Strategy,
    mesh: &Mesh,
    dropout_key: DropoutKey,
) -> Result<TrainStep, PlanError> {
    shard_map_accumulated_step(
        cfg,
        opt,
        rng_layout,
        strategy,
        mesh,
        dropout_key,
        1,
        CpOrder::Contiguous,
    )
}

/// [`shard_map_train_step`] with gradient accumulation: each device splits its rows into
/// `microbatches` ([`microbatch_rows`]) and runs forward and backward on each in turn. Data
/// parallelism and ZeRO-1 sum the microbatches' gradients on the device and reduce them once,
/// after the last; ZeRO-2 and FSDP hold only their block of the gradients, so they
/// reduce-scatter each microbatch's as it is made and sum the blocks. Context parallelism lays
/// its sequence blocks over the ring in `cp_order`.
#[allow(clippy::too_many_arguments)]
pub(super) fn shard_map_accumulated_step(
    cfg: &GptConfig,
    opt: Optimizer,
    rng_layout: RngLayout,
    strategy: Strategy,
    mesh: &Mesh,
    dropout_key: DropoutKey,
    microbatches: usize,
    cp_order: CpOrder,
) -> Result<TrainStep, PlanError> {
    cfg.validate()?;
    check(cfg, strategy, mesh, microbatches)?;
    check_cp(cfg, strategy, mesh, cp_order, Mode::ShardMap)?;
    let seq_axis = strategy.seq_axis();
    check_dropout_key(strategy, dropout_key)?;
    let specs = param_specs(cfg);
    let layouts: Vec<(Vec<usize>, PartitionSpec)> =
        specs.iter().map(|ps| param_layout(cfg, strategy, mesh, ps)).collect();
    let state_layouts: Vec<(Vec<usize>, PartitionSpec)> =
        specs.iter().map(|ps| state_layout(cfg, strategy, mesh, ps)).collect();
    // Collectives over an axis of size 1 are kept: they are no-ops, but the program stays
    // the same shape for every mesh size and check_vma sees the reductions.
    let has_dp = strategy.axes().contains(&"dp");
    let dp = if has_dp { mesh.axis_size("dp")? } else { 1 };
    // Zig-zag's two chunks are no block of a spec: every "cp" device gets the whole sequence
    // of tokens (a few bytes a row) and takes its rows.
    let zigzag = strategy.is_cp() && cp_order == CpOrder::Zigzag;
    let batch_spec = if zigzag {
        p(&[has_dp.then_some("dp"), None])
    } else {
        strategy.tokens_spec()
    };
    // The axes that split the tokens: the loss is their mean, replicated gradients their sum.
    let token_axes = strategy.token_axes();
    let tokens_split: usize = token_axes
        .iter()
        .map(|a| mesh.axis_size(a))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .product();
    let seq_parts = match seq_axis {
        Some(a) => mesh.axis_size(a)?,
        None => 1,
    };
    // Where each parameter's gradient is reduced: by the transpose of FSDP's all_gather, by a
    // reduce-scatter as it is made (ZeRO-2), or by one all-reduce after the last microbatch.
    let param_split = |i: usize| layouts[i].1.uses_axis("dp");
    let scattered = |i: usize| strategy.shards_gradients() && !param_split(i) && state_layouts[i].1.uses_axis("dp");
    // ZeRO-1 and 2: the update runs on this device's block of a replicated parameter.
    let block_update = |i: usize| !param_split(i) && state_layouts[i].1.uses_axis("dp");

    let mut args: Vec<Arg> = specs
        .iter()
        .zip(&layouts)
        .map(|(ps, (shape, spec))| Arg {
            name: ps.name.clone(),
            global_shape: shape.clone(),
            dtype: DType::F32,
            role: Role::Param(ps.index),
            spec: spec.clone(),
        })
        .collect();
    for (ps, (shape, spec)) in specs.iter().zip(&state_layouts) {
        for slot in 0..opt.slots() {
            args.push(Arg {
                name: format!("{}.{}", ps.name, ["m", "v"][slot]),
                global_shape: shape.clone(),
                dtype: DType::F32,
                role: Role::OptState { param: ps.index, slot },
                spec: spec.clone(),
            });
        }
    }
    for (name, role) in [("tokens", Role::Tokens), ("targets", Role::Targets)] {
        args.push(Arg {
            name: name.into(),
            global_shape: vec![cfg.batch, cfg.seq],
            dtype: DType::U32,
            role,
            spec: batch_spec.clone(),
        });
    }
    args.push(Arg {
        name: "key".into(),
        global_shape: vec![2],
        dtype: DType::U32,
        role: Role::RngKey,
        spec: PartitionSpec::replicated(),
    });

    let n = specs.len();
    let mut out_specs = vec![PartitionSpec::replicated()];
    for ((_, spec), (_, state_spec)) in layouts.iter().zip(&state_layouts) {
        out_specs.push(spec.clone());
        for _ in 0..opt.slots() {
            out_specs.push(state_spec.clone());
        }
    }
    let tp = if strategy.axes().contains(&"tp") {
        mesh.axis_size("tp")?
    } else {
        1
    };
    let k = microbatches;
    let names: Vec<String> = specs.iter().map(|ps| format!("d{}", ps.name)).collect();

    let mut marks = (0, 0);
    let program = shard_map(mesh, &args, &out_specs, |b, vals| {
        let params = &vals[..n];
        let state = &vals[n..n + n * opt.slots()];
        let (mut tokens, mut targets, key) = (vals[vals.len() - 3], vals[vals.len() - 2], vals[vals.len() - 1]);
        // This device's block of the sequence, where it is split.
        let rows = seq_axis.map(|axis| SeqBlock::Part {
            axes: vec![axis.to_string()],
            parts: seq_parts,
            shift: 0,
            order: cp_order,
        });
        if let (true, Some(rows)) = (zigzag, &rows) {
            let take = |b: &mut Builder, x| {
                b.emit1(
                    Op::SeqTake {
                        dim: 1,
                        seq: rows.clone(),
                    },
                    &[x],
                )
            };
            tokens = take(b, tokens);
            targets = take(b, targets);
        }
        let tokens = microbatch_rows(b, tokens, k);
        let targets = microbatch_rows(b, targets, k);
        let local = Local {
            batch: cfg.batch / dp / k,
            heads: cfg.heads / tp,
            tp: (tp > 1 || strategy.axes().contains(&"tp")).then(|| "tp".to_string()),
            seq: cfg.seq / seq_parts,
            sp: strategy == Strategy::TpSp,
            rows: rows.clone(),
            ring: strategy.is_cp().then(|| Ring {
                axis: "cp".into(),
                size: seq_parts,
                order: cp_order,
            }),
            // Where the tokens are split on the sequence, every mask is the device's block of
            // the one-device run's.
            masks: seq_axis.map(|s| MaskBlocks {
                batch: has_dp.then(|| "dp".into()),
                seq: Some(s.into()),
                heads: strategy.is_megatron().then(|| "tp".into()),
                rows: rows.clone().filter(|_| zigzag),
            }),
            stage: None,
        };
        let mut local_losses = vec![];
        let mut loss_of = |b: &mut Builder, j: usize| {
            // FSDP: gather each sharded parameter before use (its transpose reduce-scatters
            // the grad); inside the microbatch, so that each microbatch's gradient reaches it.
            let full: Vec<ValueId> = params
                .iter()
                .zip(&layouts)
                .map(|(&v, (_, spec))| {
                    if spec.uses_axis("dp") {
                        b.all_gather(v, &["dp"], 0, true)
                    } else {
                        v
                    }
                })
                .collect();
            let key = if dropout_key == DropoutKey::FoldIn && has_dp {
                b.fold_in_axis_index(key, &["dp"])
            } else {
                key
            };
            let key = if k == 1 { key } else { b.fold_in(key, j as u32) };
            let acts = Activations {
                params: &full,
                tokens: tokens[j],
                targets: targets[j],
                key,
                rng_layout,
                local: local.clone(),
            };
            let local_loss = forward_loss(b, cfg, &acts);
            local_losses.push(local_loss);
            // The global loss is the mean of the devices' (and microbatches') local means:
            // differentiate loss/(n k), n the devices splitting the tokens, so that summing the
            // gradients over them and the microbatches gives the mean's.
            Ok(if !token_axes.is_empty() || k > 1 {
                b.scale(local_loss, 1.0 / (tokens_split * k) as f32)
            } else {
                local_loss
            })
        };
        let mut on_grad = |b: &mut Builder, i: usize, g: ValueId| {
            if scattered(i) {
                b.psum_scatter(g, &["dp"], 0, true)
            } else {
                g
            }
        };
        let acc = accumulate(b, k, params, &names, &mut loss_of, &mut on_grad)?;
        marks.0 = acc.first_forward_end;
        let mut grads = acc.grads;
        for (i, g) in grads.iter_mut().enumerate() {
            // Gradients of parameters not split over a token axis are the explicit all-reduce
            // of the data-parallel body; dp-sharded ones were reduce-scattered by the
            // all_gather's transpose, ZeRO-2's as they were made, and a sequence-split wpe's
            // block is its own rows'.
            let axes: Vec<&str> = token_axes
                .iter()
                .copied()
                .filter(|a| !layouts[i].1.uses_axis(a))
                .collect();
            if !axes.is_empty() && !scattered(i) {
                *g = b.psum(*g, &axes);
                b.set_name(*g, &names[i]);
            }
        }
        let local_loss = local_losses
            .iter()
            .copied()
            .reduce(|a, l| b.add(a, l))
            .ok_or_else(|| IrError::new("accumulate", "needs at least one microbatch"))?;
        let local_loss = if k > 1 {
            b.scale(local_loss, 1.0 / k as f32)
        } else {
            local_loss
        };
        let loss = if token_axes.is_empty() {
            local_loss
        } else {
            b.pmean(local_loss, &token_axes)
        };
        b.set_name(loss, "loss");
        marks.1 = b.program().instrs.len();

        let mut outs = vec![loss];
        for (i, ps) in specs.iter().enumerate() {
            // ZeRO-1 and 2 update this device's block of the parameter (its optimizer state's
            // block), then gather the updated blocks into the whole parameter again.
            let (param, g) = if block_update(i) {
                let g = if scattered(i) {
                    grads[i]
                } else {
                    b.slice_block(grads[i], &["dp"], 0)
                };
                (b.slice_block(params[i], &["dp"], 0), g)
            } else {
                (params[i], grads[i])
            };
            let gathered = |b: &mut Builder, updated: ValueId| {
                if block_update(i) {
                    b.all_gather_invarying(updated, &["dp"], 0)
                } else {
                    updated
                }
            };
            let slots = opt.slots();
            let mut o = update(b, opt, ps.decays(), param, g, &state[slots * i..slots * (i + 1)]);
            o[0] = gathered(b, o[0]);
            b.set_name(o[0], &format!("{}'", ps.name));
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
