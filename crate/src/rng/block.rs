//! A rectangular block of a global array: what one simulated device generates.
use std::ops::Range;

use super::RngError;

/// The block `start[d] .. start[d] + size[d]` of every dim `d` of a row-major global array.
/// Its elements are listed in row-major order of the block (the device's local layout).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    global_shape: Vec<usize>,
    start: Vec<usize>,
    size: Vec<usize>,
}

impl Block {
    /// The whole array (what a replicated device holds).
    pub fn full(shape: &[usize]) -> Block {
        Block {
            global_shape: shape.to_vec(),
            start: vec![0; shape.len()],
            size: shape.to_vec(),
        }
    }

    /// The block of `global_shape` given by one index range per dim.
    pub fn new(global_shape: &[usize], ranges: &[Range<usize>]) -> Result<Block, RngError> {
        if ranges.len() != global_shape.len() {
            return Err(RngError::Block(format!(
                "{} ranges given for a rank-{} array of shape {global_shape:?}; give one range per dim",
                ranges.len(),
                global_shape.len()
            )));
        }
        for (d, (r, &g)) in ranges.iter().zip(global_shape).enumerate() {
            if r.start > r.end || r.end > g {
                return Err(RngError::Block(format!(
                    "range {r:?} of dim {d} is not inside 0..{g} (global shape {global_shape:?})"
                )));
            }
        }
        Ok(Block {
            global_shape: global_shape.to_vec(),
            start: ranges.iter().map(|r| r.start).collect(),
            size: ranges.iter().map(|r| r.end - r.start).collect(),
        })
    }

    pub fn global_shape(&self) -> &[usize] {
        &self.global_shape
    }

    pub fn start(&self) -> &[usize] {
        &self.start
    }

    pub fn size(&self) -> &[usize] {
        &self.size
    }

    /// Elements in the block.
    pub fn numel(&self) -> usize {
        self.size.iter().product()
    }

    /// Elements in the global array (a scalar has one).
    pub fn global_numel(&self) -> u64 {
        self.global_shape.iter().map(|&d| d as u64).product()
    }

    /// The row-major global index of each element of the block, in block order.
    pub fn global_indices(&self) -> impl Iterator<Item = u64> + '_ {
        let rank = self.size.len();
        let mut strides = vec![1u64; rank];
        for d in (0..rank.saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * self.global_shape[d + 1] as u64;
        }
        (0..self.numel()).map(move |mut l| {
            let mut g = 0u64;
            for d in (0..rank).rev() {
                let i = l % self.size[d];
                l /= self.size[d];
                g += (self.start[d] + i) as u64 * strides[d];
            }
            g
        })
    }
}
