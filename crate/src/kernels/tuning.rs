//! The choices tuned per adapter, held by [`GpuContext::tuning`](crate::gpu::GpuContext): typed,
//! so a misspelt variant cannot silently fall back.
use std::collections::HashMap;

use super::matmul::{MatmulClass, Variant};
use super::RowStrategy;

#[derive(Clone, Debug, Default)]
pub struct Tuning {
    /// The row strategy of every row-wise kernel; `None` picks per adapter and row length.
    pub rowwise: Option<RowStrategy>,
    /// One matmul variant for every shape class (benchmarks and tests that compare programs);
    /// overrides [`Tuning::matmul`].
    pub matmul_pin: Option<Variant>,
    /// The autotuner's matmul variant per shape class.
    pub matmul: HashMap<MatmulClass, Variant>,
}
