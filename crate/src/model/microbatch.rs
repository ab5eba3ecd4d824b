//! Gradient accumulation: a batch split into K microbatches, each one's loss and gradients
//! traced in turn and summed, then one update (a Python loop of `jax.value_and_grad` over the
//! microbatches, as jit unrolls it; the same sums a `lax.scan` makes).
use super::ModelError;
use crate::autodiff::grad_with;
use crate::ir::{Builder, IrError, ValueId};
use crate::setting::{Refusal, Setting};

/// Checks that `microbatches` splits a batch of `batch` rows held in `shards` equal blocks
/// (the data axes; 1 without data parallelism) into equal microbatches on every shard.
pub fn check_microbatches(batch: usize, microbatches: usize, shards: usize) -> Result<(), ModelError> {
    let k = microbatches;
    let divisors = |n: usize| -> String {
        let ds: Vec<String> = (1..=n)
            .filter(|d| n.is_multiple_of(*d))
            .map(|d| d.to_string())
            .collect();
        ds.join(", ")
    };
    let refuse = |why: String| Err(Refusal::new(Setting::Microbatches, why).into());
    let mb = Setting::Microbatches;
    let b = Setting::Batch.at(batch);
    if k == 0 {
        return refuse(format!(
            "{}: a step needs at least one microbatch; use 1 for no gradient accumulation",
            mb.at(0)
        ));
    }
    if k > batch {
        return refuse(format!(
            "{} is more than {b}: each microbatch needs at least one example; use one of {}",
            mb.at(k),
            divisors(batch)
        ));
    }
    if !batch.is_multiple_of(k) {
        return refuse(format!(
            "{} does not divide {b}: microbatches are equal slices of the batch; use one of {}",
            mb.at(k),
            divisors(batch)
        ));
    }
    let per_shard = batch / shards.max(1);
    if shards > 1 && !per_shard.is_multiple_of(k) {
        return refuse(format!(
            "{} does not divide the {per_shard} examples each data-parallel shard holds ({b} over {shards} \
             devices): every device splits its own rows; use one of {}",
            mb.at(k),
            divisors(per_shard)
        ));
    }
    Ok(())
}

/// Splits `x` (rows first) into `k` microbatches: microbatch j holds rows j, j + k, j + 2k, ...
/// (`x.reshape(B/k, k, ...)[:, j]`). Strided rather than contiguous, so that a batch split
/// over "dp" in blocks of rows leaves every microbatch split over "dp" the same way: each
/// device slices its own rows and no data moves (a contiguous `x.reshape(k, B/k, ...)` makes
/// jit move rows between devices; see tests/tests/all/levers_jax.rs).
pub fn microbatch_rows(b: &mut Builder, x: ValueId, k: usize) -> Vec<ValueId> {
    if k == 1 {
        return vec![x];
    }
    let shape = b.shape(x);
    let rows = shape[0] / k;
    let mut split_shape = vec![rows, k];
    split_shape.extend_from_slice(&shape[1..]);
    let mut mb_shape = vec![rows];
    mb_shape.extend_from_slice(&shape[1..]);
    let grouped = b.reshape(x, &split_shape);
    b.split(grouped, 1, &vec![1; k])
        .into_iter()
        .map(|part| b.reshape(part, &mb_shape))
        .collect()
}

/// The gradients of K microbatches, accumulated: `loss_of(b, j)` traces microbatch j's
/// forward pass and returns the scalar to differentiate (its loss over K, so that the sums are
/// the step's means; the caller keeps the loss it reports), `on_grad(b, i, g)` gets microbatch
/// j's gradient of `wrt[i]` as soon as it is complete (a ZeRO-2 reduce-scatter goes there) and
/// the running sum adds what it returns right there. Each sum of `wrt[i]` is named
/// `names[i]`: the gradient the step holds, one buffer that the microbatches accumulate into.
pub fn accumulate(
    b: &mut Builder,
    microbatches: usize,
    wrt: &[ValueId],
    names: &[String],
    loss_of: &mut dyn FnMut(&mut Builder, usize) -> Result<ValueId, IrError>,
    on_grad: &mut dyn FnMut(&mut Builder, usize, ValueId) -> ValueId,
) -> Result<Accumulated, IrError> {
    let mut sums: Vec<Option<ValueId>> = vec![None; wrt.len()];
    let mut first_forward_end = 0;
    for j in 0..microbatches {
        // What came before (the parameters, the batch's slices) is constant to this microbatch.
        let start = b.program().instrs.len();
        let l = loss_of(b, j)?;
        if j == 0 {
            first_forward_end = b.program().instrs.len();
        }
        // Each gradient joins its buffer as soon as it is complete, so a microbatch's
        // gradients are not all held at once.
        let mut add_to_buffer = |b: &mut Builder, i: usize, g: ValueId| {
            let g = on_grad(b, i, g);
            let sum = match sums[i] {
                Some(prev) => b.add(prev, g),
                None => g,
            };
            b.set_name(sum, &names[i]);
            sum
        };
        let summed = grad_with(b, l, wrt, start, &mut add_to_buffer)?;
        for (i, sum) in summed.into_iter().enumerate() {
            sums[i] = Some(sum);
        }
    }
    let grads = sums
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .filter(|_| microbatches > 0)
        .ok_or_else(|| IrError::new("accumulate", "needs at least one microbatch"))?;
    Ok(Accumulated {
        grads,
        first_forward_end,
    })
}

/// What [`accumulate`] traced.
pub struct Accumulated {
    /// Per `wrt`, the sum over the microbatches of what `on_grad` returned.
    pub grads: Vec<ValueId>,
    /// Where the first microbatch's forward pass ended (the train step's `forward_end`).
    pub first_forward_end: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_count_is_refused_naming_the_flag_and_the_counts_that_fit() {
        let e = check_microbatches(8, 0, 1).unwrap_err().to_string();
        assert!(e.contains("--microbatches 0") && e.contains("use 1"), "{e}");
        let e = check_microbatches(8, 16, 1).unwrap_err().to_string();
        assert!(e.contains("more than --batch 8") && e.contains("1, 2, 4, 8"), "{e}");
        let e = check_microbatches(8, 3, 1).unwrap_err().to_string();
        assert!(
            e.contains("does not divide --batch 8") && e.contains("1, 2, 4, 8"),
            "{e}"
        );
        let e = check_microbatches(8, 4, 4).unwrap_err().to_string();
        assert!(
            e.contains("2 examples each data-parallel shard") && e.contains("use one of 1, 2"),
            "{e}"
        );
        for (batch, k, shards) in [(8, 1, 1), (8, 8, 1), (8, 2, 4), (16, 4, 4)] {
            assert!(check_microbatches(batch, k, shards).is_ok(), "{batch} {k} {shards}");
        }
    }

    #[test]
    fn microbatch_j_holds_every_kth_row_from_row_j() {
        let mut b = Builder::new();
        let x = b.input("x", &[6, 2], crate::ir::DType::F32, crate::ir::Role::Other);
        let parts = microbatch_rows(&mut b, x, 3);
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|p| b.shape(*p) == vec![2, 2]));
        assert_eq!(microbatch_rows(&mut b, x, 1), vec![x]);
    }
}
