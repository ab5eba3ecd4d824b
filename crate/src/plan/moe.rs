//! A mixture of experts in a composition: the "ep" axis's rule (experts split over it, tokens
//! over dp x ep), what composes with it, and automatic mode's shardings of the expert buffers,
//! from the logical-axis rules, which make jit move the tokens' slots by all-to-all.
use super::axes::AxisKind;
use super::rules::{Holder, EXPERT_SLOTS, TOKEN_SLOTS};
use super::{Parallelism, PlanError};
use crate::model::GptConfig;
use crate::setting::{Refusal, Setting};
use crate::sharding::PartitionSpec;

/// `n`'s divisors, `1, 2, 4`.
fn divisors(n: usize) -> String {
    (1..=n)
        .filter(|d| n.is_multiple_of(*d))
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// "ep"'s own rule: it splits a mixture's experts, which must divide by it.
pub(super) fn check_ep(cfg: &GptConfig, ep: usize) -> Result<(), PlanError> {
    let axis = Setting::MeshAxis(AxisKind::Ep.name().into());
    let Some(moe) = &cfg.moe else {
        let why = format!(
            "{} splits a mixture of experts' experts, and the model's MLP is dense: give it experts (e.g. {}), or \
             name the axis dp",
            axis.at(ep),
            Setting::Experts.at(8)
        );
        return Err(Refusal::new(axis, why).into());
    };
    if !moe.experts.is_multiple_of(ep) {
        let why = format!(
            "{} does not divide {}: expert parallelism gives every device the same number of experts; use ep = one of \
             {}, or a number of experts that is a multiple of {ep}",
            axis.at(ep),
            Setting::Experts.at(moe.experts),
            divisors(moe.experts)
        );
        return Err(Refusal::new(axis, why).into());
    }
    Ok(())
}

/// What a mixture of experts composes with: its router counts each sequence's choices in order
/// (an expert's capacity), so every device needs its sequences whole, and its load-balancing
/// loss joins the step's loss, which a pipeline computes on its last stage alone.
pub(super) fn check_moe(par: &Parallelism, cfg: &GptConfig) -> Result<(), PlanError> {
    if cfg.moe.is_none() {
        return Ok(());
    }
    let dense = Setting::Experts.at(0);
    for (kind, why) in [
        (
            AxisKind::Cp,
            "splits the sequences, and a mixture of experts routes whole sequences (an expert takes a sequence's \
             choices in order, up to its capacity)",
        ),
        (
            AxisKind::Pp,
            "runs the blocks in stages, and a mixture of experts' load-balancing losses join the loss the last stage \
             computes: shardlab's pipelines do not carry them yet",
        ),
    ] {
        if par.has(kind) {
            let axis = Setting::MeshAxis(kind.name().into());
            let why = format!(
                "{} {why}; drop the {} axis (ep, dp, fsdp and tp compose with experts), or use a dense MLP ({dense})",
                axis.at(par.size(kind)),
                kind.name()
            );
            return Err(Refusal::new(axis, why).into());
        }
    }
    if par.sequence_parallel {
        let why = format!(
            "splits the sequence over 'tp' around the MLP, and a mixture of experts routes whole sequences: use tensor \
             parallelism without it, or a dense MLP ({dense})"
        );
        return Err(Refusal::named(Setting::SequenceParallel, why).into());
    }
    Ok(())
}

/// Automatic mode's shardings of every block's expert buffers (E, G, C, D), as MaxText
/// constrains its dispatch, from the logical-axis rules: the dispatched slots laid out for the
/// experts' matmuls (experts over "ep"), their outputs laid out as the tokens are (sequences
/// over dp x ep), and each one's cotangent the other way, so that jit moves the slots by an
/// all-to-all four times a block and never gathers the experts. Nothing without an "ep" axis.
pub fn moe_constraints(cfg: &GptConfig, par: &Parallelism, microbatches: usize) -> Vec<(String, PartitionSpec)> {
    let Some(moe) = &cfg.moe else { return vec![] };
    if !par.has(AxisKind::Ep) {
        return vec![];
    }
    let shape = [
        moe.experts,
        cfg.batch / microbatches.max(1),
        moe.slots(cfg.seq),
        cfg.d_model,
    ];
    let experts = par.spec(&shape, &EXPERT_SLOTS, Holder::Param);
    let tokens = par.spec(&shape, &TOKEN_SLOTS, Holder::Param);
    let mut out = vec![];
    for l in 0..cfg.layers {
        for (prefix, what, spec) in [
            ("h", "dispatched", &experts),
            ("h", "expert_out", &tokens),
            ("dh", "expert_out", &experts),
            ("dh", "dispatched", &tokens),
        ] {
            out.push((format!("{prefix}{l}.moe.{what}"), spec.clone()));
        }
    }
    out
}
