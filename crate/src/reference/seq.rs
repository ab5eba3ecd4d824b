//! CPU twin of shaders/seq.wgsl: the rows of a dimension at a sequence block's global
//! positions, and the transpose that puts them back among zeros.
use crate::ir::Runs;

/// An array viewed (outer, n, inner), of which a block takes `len` rows of the n.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqShape {
    pub outer: usize,
    pub n: usize,
    pub len: usize,
    pub inner: usize,
}

impl SeqShape {
    /// The view of an array of `shape` along `dim`, whose block has `len` rows there.
    pub fn of(shape: &[usize], dim: usize, len: usize) -> Self {
        Self {
            outer: shape[..dim].iter().product(),
            n: shape[dim],
            len,
            inner: shape[dim + 1..].iter().product(),
        }
    }
}

/// (outer, n, inner) -> (outer, len, inner): the rows at the block's positions.
pub fn take<T: Copy>(x: &[T], s: &SeqShape, runs: &Runs) -> Vec<T> {
    let mut out = Vec::with_capacity(s.outer * s.len * s.inner);
    for o in 0..s.outer {
        for r in 0..s.len {
            let at = (o * s.n + runs.pos(r)) * s.inner;
            out.extend_from_slice(&x[at..at + s.inner]);
        }
    }
    out
}

/// (outer, len, inner) -> (outer, n, inner): each row at its position, zeros elsewhere.
pub fn put<T: Copy + Default>(x: &[T], s: &SeqShape, runs: &Runs) -> Vec<T> {
    let mut out = vec![T::default(); s.outer * s.n * s.inner];
    for o in 0..s.outer {
        for r in 0..s.len {
            let (from, to) = ((o * s.len + r) * s.inner, (o * s.n + runs.pos(r)) * s.inner);
            out[to..to + s.inner].copy_from_slice(&x[from..from + s.inner]);
        }
    }
    out
}
