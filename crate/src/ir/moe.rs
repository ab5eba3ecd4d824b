//! The mixture-of-experts ops' shapes and the encodings of their index arrays, in one place
//! for the reference twins, the kernels (shaders/moe.wgsl) and the partitioner.
//!
//! Routing works per group (a sequence: G groups of S tokens), as GShard and MaxText route:
//! each token picks `k` of `E` experts, and each expert takes at most `C` (the capacity) of a
//! group's choices. Two index arrays say where every choice went, each the other's inverse:
//!
//! - `places` (G, S, k): choice j of token s sits in slot `e * C + c` (slot c of expert e), or,
//!   dropped, at `E * C + e`: its expert is readable either way ([`place_expert`]);
//! - `owners` (G, E, C): slot c of expert e holds choice `s * k + j`, or `S * k` when empty.
//!
//! `load` (G, 2, E) counts, per group, every expert's choices (row 0) and those kept (row 1).
use super::{DType, IrError, Op, ValueInfo};

/// The expert of a choice at `place`, kept or dropped.
pub fn place_expert(place: u32, experts: usize, capacity: usize) -> usize {
    let slots = (experts * capacity) as u32;
    if place >= slots {
        (place - slots) as usize
    } else {
        place as usize / capacity
    }
}

/// The slot (expert, c) of a kept choice; None for a dropped one.
pub fn place_slot(place: u32, experts: usize, capacity: usize) -> Option<(usize, usize)> {
    let p = place as usize;
    (p < experts * capacity).then(|| (p / capacity, p % capacity))
}

fn info(shape: Vec<usize>, dtype: DType) -> ValueInfo {
    ValueInfo {
        shape,
        dtype,
        name: None,
    }
}

/// Checks that `v` is `dtype` of `shape`, naming it `what` in the error.
fn expect(op: &Op, what: &str, v: &ValueInfo, shape: &[usize], dtype: DType) -> Result<(), IrError> {
    if v.shape != shape || v.dtype != dtype {
        return Err(IrError::new(
            op.name(),
            format!(
                "{what} must be {}{shape:?}, got {}{:?}",
                dtype.name(),
                v.dtype.name(),
                v.shape
            ),
        ));
    }
    Ok(())
}

/// (G, S, k) of the routing arrays `places` (and `owners` (G, E, C)), checked against each other.
fn routing(op: &Op, places: &ValueInfo, owners: &ValueInfo) -> Result<[usize; 5], IrError> {
    let (p, o) = (&places.shape, &owners.shape);
    if p.len() != 3 || o.len() != 3 || p[0] != o[0] || places.dtype != DType::U32 || owners.dtype != DType::U32 {
        return Err(IrError::new(
            op.name(),
            format!("takes places u32 (G, S, k) and owners u32 (G, E, C), got {p:?} and {o:?}"),
        ));
    }
    Ok([p[0], p[1], p[2], o[1], o[2]])
}

/// Output types of a mixture-of-experts op from its input types.
pub fn infer(op: &Op, ins: &[&ValueInfo]) -> Result<Vec<ValueInfo>, IrError> {
    let err = |m: String| Err(IrError::new(op.name(), m));
    let arity = |lo: usize, hi: usize| -> Result<(), IrError> {
        if ins.len() < lo || ins.len() > hi {
            return Err(IrError::new(
                op.name(),
                format!("takes {lo} to {hi} operands, got {}", ins.len()),
            ));
        }
        Ok(())
    };
    match op {
        Op::MoeRoute { k, capacity } => {
            arity(1, 1)?;
            let s = &ins[0].shape;
            if s.len() != 3 || ins[0].dtype != DType::F32 {
                return err(format!("takes logits f32 (G, S, E), got {s:?}"));
            }
            let (g, t, e) = (s[0], s[1], s[2]);
            if *k == 0 || *k > e || *capacity == 0 {
                return err(format!(
                    "top_k {k} must be in [1, {e}] and capacity {capacity} at least 1"
                ));
            }
            Ok(vec![
                info(vec![g, t, e], DType::F32),
                info(vec![g, t, *k], DType::F32),
                info(vec![g, t, *k], DType::U32),
                info(vec![g, e, *capacity], DType::U32),
                info(vec![g, 2, e], DType::F32),
            ])
        }
        Op::MoeRouteGrad { .. } => {
            arity(5, 5)?;
            let (probs, gates) = (&ins[0].shape, &ins[1].shape);
            expect(op, "gates", ins[1], gates, DType::F32)?;
            expect(op, "places", ins[2], gates, DType::U32)?;
            expect(op, "dprobs", ins[3], probs, DType::F32)?;
            expect(op, "dgates", ins[4], gates, DType::F32)?;
            if probs.len() != 3 || gates.len() != 3 || probs[..2] != gates[..2] {
                return err(format!(
                    "takes probs (G, S, E) and gates (G, S, k), got {probs:?} and {gates:?}"
                ));
            }
            Ok(vec![info(probs.clone(), DType::F32)])
        }
        Op::MoeDispatch | Op::MoeCombine => {
            arity(3, 4)?;
            let [g, s, k, e, c] = routing(op, ins[1], ins[2])?;
            if let Some(gates) = ins.get(3) {
                expect(op, "gates", gates, &[g, s, k], DType::F32)?;
            }
            let x = &ins[0].shape;
            let d = x.last().copied().unwrap_or(0);
            let (want, out) = match op {
                Op::MoeDispatch => (vec![g, s, d], vec![e, g, c, d]),
                _ => (vec![e, g, c, d], vec![g, s, d]),
            };
            expect(op, "its rows", ins[0], &want, DType::F32)?;
            Ok(vec![info(out, DType::F32)])
        }
        Op::MoeGateGrad => {
            arity(3, 3)?;
            let a = &ins[0].shape;
            let b = &ins[1].shape;
            let p = &ins[2].shape;
            let fits = a.len() == 3 && b.len() == 4 && p.len() == 3 && a[0] == b[1] && a[0] == p[0] && a[1] == p[1];
            if !fits || a[2] != b[3] || ins[2].dtype != DType::U32 {
                return err(format!(
                    "takes a (G, S, D), b (E, G, C, D) and places u32 (G, S, k), got {a:?}, {b:?} and {p:?}"
                ));
            }
            Ok(vec![info(p.clone(), DType::F32)])
        }
        _ => err("is not a mixture-of-experts op".into()),
    }
}
