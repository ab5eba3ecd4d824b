use std::collections::HashMap;

use super::vjp::vjp;
use crate::ir::{Builder, IrError, Op, ValueId};

/// Appends to `b` the backward pass of everything traced so far, seeded with d`loss` = 1,
/// and returns the gradient of the scalar `loss` with respect to each of `wrt`
/// (zeros where `loss` does not depend on it).
pub fn grad(b: &mut Builder, loss: ValueId, wrt: &[ValueId]) -> Result<Vec<ValueId>, IrError> {
    if !b.shape(loss).is_empty() {
        return Err(IrError::new(
            "grad",
            format!("loss must be a scalar, got {:?}", b.shape(loss)),
        ));
    }
    let forward_len = b.program().instrs.len();
    let needed = needs_grad(b, wrt, forward_len);

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
        let instr = b.program().instrs[i].clone();
        let out_cts: Vec<Option<ValueId>> = instr.outputs.iter().map(|v| cts.get(v).copied()).collect();
        if out_cts.iter().all(Option::is_none) || !instr.inputs.iter().any(|v| needed[v.index()]) {
            continue;
        }
        let in_cts = vjp(b, &instr, &out_cts)?;
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
    let grads = wrt
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
    Ok(grads)
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
