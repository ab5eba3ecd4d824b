//! One table of logical-axis rules, as MaxText writes it: every array's dimensions carry a
//! logical name, and the table says which mesh axes may split each name. Every sharding of
//! every composition follows from it: the parameters', the optimizer state's, the tokens' and
//! the activations' that automatic mode pins.
use super::axes::{AxisKind, Zero};
use crate::model::{GptConfig, ParamSpec};
use crate::sharding::{Mesh, PartitionSpec};

/// What a dimension of an array indexes, whatever the mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logical {
    /// The examples of a batch.
    Batch,
    /// The residual stream's sequence positions (MaxText's `activation_length`).
    Length,
    /// wpe's rows: the positions it embeds.
    Position,
    Vocab,
    /// The model's width.
    Embed,
    /// Attention heads (w_qkv's columns per head, w_proj's rows).
    Heads,
    /// The MLP's hidden units.
    Mlp,
    /// A pipeline's stages (the leading axis of stacked block parameters).
    Stage,
    /// A mixture of experts' experts (MaxText's `exp`).
    Expert,
}

use AxisKind::{Cp, Dp, Ep, Fsdp, Pp, Tp};
use Logical::{Batch, Embed, Expert, Heads, Length, Mlp, Position, Stage, Vocab};

/// Which mesh axes may split each logical dimension, in order. A dimension takes every listed
/// axis that the mesh has, that no earlier dimension of the same array took, and that keeps it
/// divisible; the dimensions are taken in order. So FSDP splits each parameter's first
/// dimension it divides (PyTorch FSDP2's rule, Shard(0)), beside tp's split where tp took that
/// one; and the residual stream's length takes "fsdp" only where the batch did not (wpe's rows,
/// read by position). The batch takes "ep" too (experts split over ep, tokens over dp x ep), but
/// in an expert buffer, whose expert dimension comes first and takes "ep".
pub const RULES: [(Logical, &[AxisKind]); 9] = [
    (Batch, &[Dp, Fsdp, Ep]),
    (Length, &[Cp, Fsdp]),
    (Position, &[Fsdp]),
    (Vocab, &[Fsdp]),
    (Embed, &[Fsdp]),
    (Heads, &[Tp, Fsdp]),
    (Mlp, &[Tp, Fsdp]),
    (Stage, &[Pp]),
    (Expert, &[Ep]),
];

/// Whose layout a spec is: a parameter's (and, but under ZeRO, its optimizer state's and
/// gradient's), or the optimizer state's and gradient's where ZeRO splits them over "dp".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    Param,
    State,
}

/// The mesh axes that may split `logical`, refined by the axes' options: sequence parallelism
/// splits the residual stream's length over "tp" too, and ZeRO splits the optimizer state (and,
/// from stage 2, the gradients) over "dp" where FSDP would split the parameter.
pub fn axes_for(logical: Logical, holder: Holder, zero: Zero, sequence_parallel: bool) -> Vec<AxisKind> {
    let listed = RULES.iter().find(|(l, _)| *l == logical).map_or(&[][..], |(_, a)| *a);
    let mut axes = listed.to_vec();
    if logical == Length && sequence_parallel {
        let after_cp = axes.iter().position(|&a| a == Cp).map_or(0, |i| i + 1);
        axes.insert(after_cp, Tp);
    }
    if holder == Holder::State && zero.shards_state() && listed.contains(&Fsdp) {
        axes.push(Dp);
    }
    axes
}

/// The spec of an array of `shape` whose dimensions are `logical`, on `mesh`: each dimension
/// takes, in order, the axes [`axes_for`] lists that the mesh has, that are still free and
/// that keep the dimension divisible. `P()` where no axis splits it.
pub fn resolve(
    mesh: &Mesh,
    shape: &[usize],
    logical: &[Option<Logical>],
    holder: Holder,
    zero: Zero,
    sequence_parallel: bool,
) -> PartitionSpec {
    let mut used: Vec<AxisKind> = vec![];
    let entries = shape
        .iter()
        .zip(logical)
        .map(|(&size, l)| {
            let mut split = 1;
            let mut names = vec![];
            for kind in l
                .map(|l| axes_for(l, holder, zero, sequence_parallel))
                .unwrap_or_default()
            {
                let Some(n) = mesh.size_of(kind.name()) else { continue };
                if used.contains(&kind) || !size.is_multiple_of(split * n) {
                    continue;
                }
                split *= n;
                used.push(kind);
                names.push(kind.name().to_string());
            }
            names
        })
        .collect::<Vec<_>>();
    if entries.iter().all(Vec::is_empty) {
        PartitionSpec::replicated()
    } else {
        PartitionSpec::new(entries)
    }
}

/// A parameter's logical dimensions, with the shape they describe: as stored, or, `per_head`
/// (under tensor parallelism), w_qkv's and b_qkv's columns viewed as (3, H, Dh) so that a
/// split keeps each head whole (a row-major view: the same data). `length_rows` names wpe's
/// rows the residual stream's length (automatic mode: each device holds and updates the rows
/// its tokens read) rather than positions (a shard_map body takes its rows of them).
pub fn param_dims(
    cfg: &GptConfig,
    ps: &ParamSpec,
    per_head: bool,
    length_rows: bool,
) -> (Vec<usize>, Vec<Option<Logical>>) {
    let leaf = ps.name.rsplit('.').next().unwrap_or(&ps.name);
    let (d, h, dh) = (cfg.d_model, cfg.heads, cfg.head_dim());
    let dims: &[Option<Logical>] = match leaf {
        "wte" => &[Some(Vocab), Some(Embed)],
        "wpe" if length_rows => &[Some(Length), Some(Embed)],
        "wpe" => &[Some(Position), Some(Embed)],
        "w_qkv" if per_head => return (vec![d, 3, h, dh], vec![Some(Embed), None, Some(Heads), None]),
        "b_qkv" if per_head => return (vec![3, h, dh], vec![None, Some(Heads), None]),
        "w_qkv" => &[Some(Embed), Some(Heads)],
        "b_qkv" => &[Some(Heads)],
        "w_proj" => &[Some(Heads), Some(Embed)],
        // A mixture of experts: the router's expert scores stay whole (a token chooses among all).
        "w_router" => &[Some(Embed), None],
        "w_fc" if ps.shape.len() == 3 => &[Some(Expert), Some(Embed), Some(Mlp)],
        "w_out" if ps.shape.len() == 3 => &[Some(Expert), Some(Mlp), Some(Embed)],
        "w_fc" => &[Some(Embed), Some(Mlp)],
        "b_fc" => &[Some(Mlp)],
        "w_out" => &[Some(Mlp), Some(Embed)],
        "w_head" => &[Some(Embed), Some(Vocab)],
        // The layer norms' gains and biases, and the residual projections' biases.
        _ => &[Some(Embed)],
    };
    (ps.shape.clone(), dims.to_vec())
}

/// The tokens' and targets' logical dimensions, (B, T).
pub const TOKEN_DIMS: [Option<Logical>; 2] = [Some(Batch), Some(Length)];

/// A mixture of experts' slots (E, G, C, D), laid out for the experts' matmuls: the experts
/// over "ep", the sequences over the data axes left.
pub const EXPERT_SLOTS: [Option<Logical>; 4] = [Some(Expert), Some(Batch), None, None];

/// The same slots laid out as the tokens are: the sequences over every data axis.
pub const TOKEN_SLOTS: [Option<Logical>; 4] = [None, Some(Batch), None, None];

/// A stacked block parameter's leading dimension: one row per pipeline stage.
pub const STAGE: Option<Logical> = Some(Stage);
