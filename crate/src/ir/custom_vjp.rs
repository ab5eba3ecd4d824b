//! `jax.custom_vjp`: a traced region whose gradient is a rule the user traces, not the VJPs of
//! the ops inside it. The forward returns its outputs and the residuals the rule reads; the
//! rule maps the outputs' cotangents to the inputs'. Ring attention needs it: differentiating
//! its unrolled ring op by op would hold every key and value block that travelled the ring for
//! the backward, where the rule holds only the device's own and sends them round again.
use std::ops::Range;
use std::sync::Arc;

use super::{Builder, ValueId};

/// A custom VJP's backward: (builder, residuals, the outputs' cotangents, `None` where an
/// output has none) -> the inputs' cotangents, `None` where an input gets none.
pub type VjpRule = Arc<dyn Fn(&mut Builder, &[ValueId], &[Option<ValueId>]) -> Vec<Option<ValueId>> + Send + Sync>;

/// A region traced by [`Builder::custom_vjp`].
#[derive(Clone)]
pub struct CustomVjp {
    /// Its forward instructions.
    pub instrs: Range<usize>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// What the backward reads of the forward.
    pub residuals: Vec<ValueId>,
    pub bwd: VjpRule,
}

impl std::fmt::Debug for CustomVjp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomVjp")
            .field("instrs", &self.instrs)
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .field("residuals", &self.residuals)
            .finish_non_exhaustive()
    }
}
