//! The all-reduce combiner on a train step: the program's psums merged
//! ([`crate::partition::combine_all_reduces_mapped`]), its phase boundaries moved with them.
use crate::model::TrainStep;
use crate::partition::{combine_all_reduces_mapped, combined_starts};

/// A train step with its all-reduces combined; the forward / backward / update boundaries
/// follow the instructions they held (a psum moved past a boundary belongs to the later phase).
pub fn combine_train_step(step: &TrainStep) -> TrainStep {
    let (program, position) = combine_all_reduces_mapped(&step.program);
    let at = combined_starts(&position, program.instrs.len());
    TrainStep {
        forward_end: at[step.forward_end.min(position.len())],
        backward_end: at[step.backward_end.min(position.len())],
        program,
        config: step.config.clone(),
        optimizer: step.optimizer,
    }
}
