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
    if !b.shape(loss).is_empty() {
        return Err(IrError::new(
            "grad",
            format!("loss must be a scalar, got {:?}", b.shape(loss)),
        ));
    }
    let forward_len = b.program().instrs.len();
    let needed = needs_grad(b, wrt, forward_len);
    let regions: Vec<Checkpoint> = b
        .checkpoints()
        .iter()
        .filter(|c| c.instrs.end <= forward_len)
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
        .filter(|c| c.instrs.end <= forward_len)
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

    let mut cts: HashMap<ValueId, ValueId> = HashMap::new();
    let one = b.emit1(
        Op::Full {
            shape: vec![],
            value: 1.0,
        },
        &[],
    );
    b.set_name(one, "dloss");
    cts.insert(loss, one);

    for i in (0..forward_len).rev() {
        if let Some(c) = custom_of[i] {
            if custom_done[c] {
                continue;
            }
            custom_done[c] = true;
            let region = &customs[c];
            let out_cts: Vec<Option<ValueId>> = region.outputs.iter().map(|v| cts.get(v).copied()).collect();
            if out_cts.iter().all(Option::is_none) || !region.inputs.iter().any(|v| needed[v.index()]) {
                continue;
            }
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
            let in_cts = (region.bwd)(b, &residuals, &out_cts);
            for (v, ct) in region.inputs.iter().zip(in_cts) {
                let Some(ct) = ct else { continue };
                if needed[v.index()] {
                    let total = match cts.get(v) {
                        Some(&prev) => b.add(prev, ct),
                        None => ct,
                    };
                    cts.insert(*v, total);
                }
            }
            continue;
        }
        let instr = b.program().instrs[i].clone();
        let out_cts: Vec<Option<ValueId>> = instr.outputs.iter().map(|v| cts.get(v).copied()).collect();
        if out_cts.iter().all(Option::is_none) || !instr.inputs.iter().any(|v| needed[v.index()]) {
            continue;
        }
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
        let in_cts = vjp(b, &remapped, &out_cts)?;
        for (v, ct) in instr.inputs.iter().zip(in_cts) {
            let Some(ct) = ct else { continue };
            if !needed[v.index()] {
                continue;
            }
            let total = match cts.get(v) {
                Some(&prev) => b.add(prev, ct),
                None => ct,
            };
            cts.insert(*v, total);
        }
    }
    let grads: Vec<ValueId> = wrt
        .iter()
        .map(|v| match cts.get(v) {
            Some(&g) => g,
            None => {
                let shape = b.shape(*v);
                b.emit1(Op::Full { shape, value: 0.0 }, &[])
            }
        })
        .collect();
    if let Some(e) = b.error() {
        return Err(e.clone());
    }
    drop_unread_recomputations(b, backward_start, is_recompute, &grads);
    Ok(grads)
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
fn needs_grad(b: &Builder, wrt: &[ValueId], forward_len: usize) -> Vec<bool> {
    let prog = b.program();
    let mut needed = vec![false; prog.values.len()];
    for v in wrt {
        needed[v.index()] = true;
    }
    for instr in &prog.instrs[..forward_len] {
        if instr.inputs.iter().any(|v| needed[v.index()]) {
            for o in &instr.outputs {
                needed[o.index()] = true;
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
