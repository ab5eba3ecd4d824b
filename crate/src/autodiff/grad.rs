use std::collections::HashMap;

use super::vjp::vjp;
use crate::ir::{Builder, Checkpoint, CustomVjp, Instr, IrError, Op, ValueId};

/// Appends to `b` the backward pass of everything traced so far, seeded with d`loss` = 1,
/// and returns the gradient of the scalar `loss` with respect to each of `wrt`
/// (zeros where `loss` does not depend on it).
///
/// Regions traced under [`Builder::checkpoint`] are differentiated as `jax.checkpoint` does:
/// just before the region's own backward, its forward is traced again (the ops whose results
/// its policy does not save), and the region's VJPs read those recomputed values. The same ops
/// on the same inputs (and keys) give the same bits, so the gradients do not change; what is
/// held between the forward and the backward does. Recomputations nothing reads are dropped.
///
/// Regions traced under [`Builder::custom_vjp`] are differentiated by their rule, traced once
/// when the sweep reaches the region (every reader of its outputs lies after it, so their
/// cotangents are complete), reading the residuals (recomputed ones inside a checkpoint); the
/// ops inside get no VJP of their own.
pub fn grad(b: &mut Builder, loss: ValueId, wrt: &[ValueId]) -> Result<Vec<ValueId>, IrError> {
    grad_with(b, loss, wrt, 0, &mut |_, _, g| g)
}

/// [`grad`] of what was traced from instruction `start` on (values made before it are
/// constants, as a microbatch's forward treats the parameters it reads), handing each
/// gradient to `on_done(b, k, g)` as soon as it is complete: right after the backward pass
/// reaches the first instruction that reads `wrt[k]`, so that what `on_done` emits (a ZeRO-2
/// reduce-scatter, a microbatch's add into its buffer) runs while the rest of the backward
/// pass is still to come, and the full gradient dies there. Returns what `on_done` returned,
/// in `wrt` order.
pub fn grad_with(
    b: &mut Builder,
    loss: ValueId,
    wrt: &[ValueId],
    start: usize,
    on_done: &mut dyn FnMut(&mut Builder, usize, ValueId) -> ValueId,
) -> Result<Vec<ValueId>, IrError> {
    if !b.shape(loss).is_empty() {
        return Err(IrError::new(
            "grad",
            format!("loss must be a scalar, got {:?}", b.shape(loss)),
        ));
    }
    let one = b.emit1(
        Op::Full {
            shape: vec![],
            value: 1.0,
        },
        &[],
    );
    b.set_name(one, "dloss");
    vjp_with(b, &[(loss, one)], wrt, start, on_done)
}

/// `jax.vjp`'s pullback of what was traced from instruction `start` on: the cotangents of
/// `wrt` given each `(output, cotangent)` of `seeds` (made before the call; they are constants
/// to the sweep, never differentiated), handed to `on_done` as [`grad_with`] does. A pipeline
/// stage's backward pass runs this way, long after its forward, from the cotangent the next
/// stage sent back.
pub fn vjp_with(
    b: &mut Builder,
    seeds: &[(ValueId, ValueId)],
    wrt: &[ValueId],
    start: usize,
    on_done: &mut dyn FnMut(&mut Builder, usize, ValueId) -> ValueId,
) -> Result<Vec<ValueId>, IrError> {
    let forward_len = b.program().instrs.len();
    let needed = needs_grad(b, wrt, start, forward_len);
    let regions: Vec<Checkpoint> = b
        .checkpoints()
        .iter()
        .filter(|c| c.instrs.start >= start && c.instrs.end <= forward_len)
        .cloned()
        .collect();
    let mut region_of = vec![None; forward_len];
    for (r, c) in regions.iter().enumerate() {
        for i in c.instrs.clone() {
            region_of[i] = Some(r);
        }
    }
    let mut entered = vec![false; regions.len()];
    let customs: Vec<CustomVjp> = b
        .custom_vjps()
        .iter()
        .filter(|c| c.instrs.start >= start && c.instrs.end <= forward_len)
        .cloned()
        .collect();
    let mut custom_of = vec![None; forward_len];
    for (r, c) in customs.iter().enumerate() {
        for i in c.instrs.clone() {
            custom_of[i] = Some(r);
        }
    }
    let mut custom_done = vec![false; customs.len()];
    // Forward value -> its recomputation, for the VJPs of the region that made it.
    let mut recomputed: HashMap<ValueId, ValueId> = HashMap::new();
    let backward_start = b.program().instrs.len();
    let mut is_recompute: Vec<bool> = vec![];
    // Per instruction, the `wrt` positions whose first reader it is.
    let mut first_readers: HashMap<usize, Vec<usize>> = HashMap::new();
    for (k, v) in wrt.iter().enumerate() {
        let first = (start..forward_len).find(|&i| b.program().instrs[i].inputs.contains(v));
        if let Some(i) = first {
            first_readers.entry(i).or_default().push(k);
        }
    }

    let mut cts: HashMap<ValueId, ValueId> = HashMap::new();
    for &(v, ct) in seeds {
        let total = match cts.get(&v) {
            Some(&prev) => b.add(prev, ct),
            None => ct,
        };
        cts.insert(v, total);
    }

    let mut done: Vec<Option<ValueId>> = vec![None; wrt.len()];
    for i in (start..forward_len).rev() {
        // In a pipelined program, an instruction's backward is the same stage's work as it.
        let outer = b.program().instrs[i]
            .outputs
            .first()
            .and_then(|o| b.owner_of(*o))
            .map(|o| b.set_owner(o));
        if let Some(c) = custom_of[i] {
            // A custom-VJP region: its rule once, at its last instruction (the first the sweep
            // meets); its other instructions get no VJP of their own.
            if !custom_done[c] {
                custom_done[c] = true;
                let region = &customs[c];
                let out_cts: Vec<Option<ValueId>> = region.outputs.iter().map(|v| cts.get(v).copied()).collect();
                if out_cts.iter().any(Option::is_some) && region.inputs.iter().any(|v| needed[v.index()]) {
                    if let Some(r) = region_of[i] {
                        if !entered[r] {
                            entered[r] = true;
                            recompute(b, &regions[r], &mut recomputed, backward_start, &mut is_recompute);
                        }
                    }
                    let residuals: Vec<ValueId> = region
                        .residuals
                        .iter()
                        .map(|v| recomputed.get(v).copied().unwrap_or(*v))
                        .collect();
                    let made = b.program().values.len();
                    let in_cts = (region.bwd)(b, &residuals, &out_cts);
                    for (v, ct) in region.inputs.iter().zip(in_cts) {
                        let Some(ct) = ct else { continue };
                        type_like_primal(b, ct, *v, made);
                        if needed[v.index()] {
                            let total = match cts.get(v) {
                                Some(&prev) => b.add(prev, ct),
                                None => ct,
                            };
                            cts.insert(*v, total);
                        }
                    }
                }
            }
        } else {
            let instr = b.program().instrs[i].clone();
            let out_cts: Vec<Option<ValueId>> = instr.outputs.iter().map(|v| cts.get(v).copied()).collect();
            if out_cts.iter().any(Option::is_some) && instr.inputs.iter().any(|v| needed[v.index()]) {
                if let Some(r) = region_of[i] {
                    if !entered[r] {
                        entered[r] = true;
                        recompute(b, &regions[r], &mut recomputed, backward_start, &mut is_recompute);
                    }
                }
                let read = |v: &ValueId| recomputed.get(v).copied().unwrap_or(*v);
                let remapped = Instr {
                    op: instr.op.clone(),
                    inputs: instr.inputs.iter().map(read).collect(),
                    outputs: instr.outputs.iter().map(read).collect(),
                };
                let made = b.program().values.len();
                let in_cts = vjp(b, &remapped, &out_cts)?;
                for (v, ct) in instr.inputs.iter().zip(in_cts) {
                    let Some(ct) = ct else { continue };
                    if !needed[v.index()] {
                        continue;
                    }
                    type_like_primal(b, ct, *v, made);
                    let total = match cts.get(v) {
                        Some(&prev) => b.add(prev, ct),
                        None => ct,
                    };
                    cts.insert(*v, total);
                }
            }
        }
        for &k in first_readers.get(&i).map(Vec::as_slice).unwrap_or(&[]) {
            if let Some(&g) = cts.get(&wrt[k]) {
                done[k] = Some(on_done(b, k, g));
            }
        }
        if let Some(o) = outer {
            b.set_owner(o);
        }
    }
    let mut grads = Vec::with_capacity(wrt.len());
    for (k, v) in wrt.iter().enumerate() {
        let g = match done[k] {
            Some(g) => g,
            None => {
                let shape = b.shape(*v);
                let zeros = b.emit1(Op::Full { shape, value: 0.0 }, &[]);
                b.type_like(zeros, *v, (0..b.shape(*v).len()).collect());
                on_done(b, k, zeros)
            }
        };
        grads.push(g);
    }
    if let Some(e) = b.error() {
        return Err(e.clone());
    }
    drop_unread_recomputations(b, backward_start, is_recompute, &grads);
    Ok(grads)
}

/// Records that `ct`, the cotangent of `primal`, is typed like it, as JAX's transpose rules
/// type every cotangent (`to_cotangent_aval`): where the rule made `ct` (a value numbered from
/// `made` on), not where it passed an operand's cotangent through unchanged.
fn type_like_primal(b: &mut Builder, ct: ValueId, primal: ValueId, made: usize) {
    if ct.index() >= made && b.shape(ct) == b.shape(primal) {
        let rank = b.shape(primal).len();
        b.type_like(ct, primal, (0..rank).collect());
    }
}

/// Traces region `c`'s forward again: every instruction with a result its policy does not
/// save, reading recomputed values where there are some and saved ones elsewhere.
fn recompute(
    b: &mut Builder,
    c: &Checkpoint,
    recomputed: &mut HashMap<ValueId, ValueId>,
    backward_start: usize,
    is_recompute: &mut Vec<bool>,
) {
    for i in c.instrs.clone() {
        let ins = b.program().instrs[i].clone();
        if c.policy.saveable(&ins.op) {
            continue;
        }
        let inputs: Vec<ValueId> = ins
            .inputs
            .iter()
            .map(|v| recomputed.get(v).copied().unwrap_or(*v))
            .collect();
        let at = b.program().instrs.len();
        let outs = b.emit(ins.op.clone(), &inputs);
        is_recompute.resize(at - backward_start, false);
        is_recompute.push(true);
        for (o, r) in ins.outputs.iter().zip(outs) {
            // The recomputation is the same named value (as jax.checkpoint re-runs a
            // with_sharding_constraint inside the block): a constraint on the name pins both.
            if let Some(name) = b.program().values[o.index()].name.clone() {
                b.set_name(r, &name);
            }
            recomputed.insert(*o, r);
        }
    }
}

/// Drops the recomputations whose results nothing reads (a VJP that needs no residual, the
/// region's output), then marks the rest as recomputed.
fn drop_unread_recomputations(b: &mut Builder, backward_start: usize, mut is_recompute: Vec<bool>, grads: &[ValueId]) {
    let prog = b.program();
    is_recompute.resize(prog.instrs.len() - backward_start, false);
    let mut readers = vec![0usize; prog.values.len()];
    for v in prog
        .instrs
        .iter()
        .flat_map(|ins| &ins.inputs)
        .chain(&prog.outputs)
        .chain(grads)
    {
        readers[v.index()] += 1;
    }
    let mut drop = vec![false; is_recompute.len()];
    // Readers come after their producers, so one backward sweep finds every unread chain.
    for k in (0..is_recompute.len()).rev() {
        let ins = &prog.instrs[backward_start + k];
        if is_recompute[k] && ins.outputs.iter().all(|o| readers[o.index()] == 0) {
            drop[k] = true;
            for v in &ins.inputs {
                readers[v.index()] -= 1;
            }
        }
    }
    for k in 0..is_recompute.len() {
        if is_recompute[k] && !drop[k] {
            b.mark_recomputed(backward_start + k);
        }
    }
    b.drop_instrs(backward_start, &drop);
}

/// Which values lie on a path from `wrt` (forward-reachable): only those need cotangents.
fn needs_grad(b: &Builder, wrt: &[ValueId], start: usize, forward_len: usize) -> Vec<bool> {
    let prog = b.program();
    let mut needed = vec![false; prog.values.len()];
    for v in wrt {
        needed[v.index()] = true;
    }
    for instr in &prog.instrs[start..forward_len] {
        if instr.inputs.iter().any(|v| needed[v.index()]) {
            for (k, o) in instr.outputs.iter().enumerate() {
                needed[o.index()] = instr.op.carries_gradient(k);
            }
        }
    }
    needed
}

/// `jax.value_and_grad`: the loss value itself and its gradients.
pub fn value_and_grad(b: &mut Builder, loss: ValueId, wrt: &[ValueId]) -> Result<(ValueId, Vec<ValueId>), IrError> {
    let grads = grad(b, loss, wrt)?;
    Ok((loss, grads))
}
