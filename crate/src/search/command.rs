//! The command line of a planned run: what `shardlab plan` takes to plan it again, as the
//! search and `bench published` print for each configuration.
use crate::plan::{mesh_text, stage_layers_text, Parallel, Parallelism, TrainerOptions, Zero};

/// `shardlab plan --device DEVICE ...` for `opts`: every flag that changes the plan (the
/// model, the dtype policy, attention, remat, the partitioning), so it reproduces the plan
/// whatever the defaults.
pub fn plan_command(opts: &TrainerOptions, device: &str) -> String {
    let c = &opts.config;
    let mut parts = vec![
        "shardlab plan".to_string(),
        format!("--device {device}"),
        format!("--layers {}", c.layers),
        format!("--d-model {}", c.d_model),
        format!("--heads {}", c.heads),
        format!("--seq {}", c.seq),
        format!("--batch {}", c.batch),
        format!("--vocab {}", c.vocab),
    ];
    if c.tied {
        parts.push("--tied".into());
    }
    if let Some(m) = &c.moe {
        parts.push(format!(
            "--experts {} --top-k {} --expert-width {}",
            m.experts, m.top_k, m.width
        ));
        parts.push(format!("--capacity {} --aux-loss {}", m.capacity.text(), m.aux));
        parts.push(format!("--expert-imbalance {}", m.imbalance));
    }
    parts.push(format!("--dropout {}", c.dropout));
    parts.push(format!("--attention {}", c.attention.name()));
    parts.push(format!("--remat {}", c.remat.name()));
    parts.push(format!("--precision {}", c.precision.name()));
    if let Some(par) = opts.parallel.parallelism() {
        parts.push(format!("--mode {}", opts.parallel.mode_name()));
        parts.extend(composition_flags(par));
    }
    if let Parallel::ShardMap { dropout_key, .. } = &opts.parallel {
        parts.push(format!("--dropout-key {}", dropout_key.name()));
    }
    if c.dropout > 0.0 {
        parts.push(format!("--rng {}", opts.rng_layout.name()));
    }
    if opts.combine_all_reduces {
        parts.push("--combine-all-reduces".into());
    }
    if opts.microbatches > 1 {
        parts.push(format!("--microbatches {}", opts.microbatches));
    }
    if opts.parallel.parallelism().is_some_and(Parallelism::is_pipeline) {
        parts.push(format!("--schedule {}", opts.schedule.name()));
        if opts.virtual_stages > 1 {
            parts.push(format!("--virtual-stages {}", opts.virtual_stages));
        }
        if !opts.stage_layers.is_empty() {
            parts.push(format!("--stage-layers {}", stage_layers_text(&opts.stage_layers)));
        }
    }
    if opts.parallel.parallelism().is_some_and(Parallelism::is_cp) {
        parts.push(format!("--cp-order {}", opts.cp_order.name()));
    }
    parts.join(" ")
}

/// The flags that give a composition: its mesh and its axes' options.
pub fn composition_flags(par: &Parallelism) -> Vec<String> {
    let mut flags = vec![format!("--mesh {}", mesh_text(&par.mesh))];
    if par.zero != Zero::Off {
        flags.push(format!("--zero {}", par.zero.name()));
    }
    if par.sequence_parallel {
        flags.push("--sequence-parallel".into());
    }
    flags
}

/// A configuration in a few words, as lists name it: `shard_map dp dp=4 remat none`.
pub fn describe(opts: &TrainerOptions) -> String {
    let mut remat = match opts.microbatches {
        1 => opts.config.remat.name().to_string(),
        k => format!("{} microbatches {k}", opts.config.remat.name()),
    };
    if opts.parallel.parallelism().is_some_and(Parallelism::is_pipeline) {
        remat = format!("{remat} {}", opts.schedule.name());
    }
    match opts.parallel.parallelism() {
        None => format!("single remat {remat}"),
        Some(par) => {
            // A preset's name says its options; a composition's mesh does not.
            let mut options = String::new();
            if opts.parallel.strategy().is_none() {
                if par.zero != Zero::Off {
                    options += &format!(" zero {}", par.zero.name());
                }
                if par.sequence_parallel {
                    options += " sequence parallel";
                }
            }
            format!(
                "{} {} {}{options} remat {remat}",
                opts.parallel.mode_name(),
                opts.parallel.label(),
                mesh_text(&par.mesh)
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GptConfig;
    use crate::plan::{DropoutKey, Strategy};
    use crate::sharding::Mesh;

    #[test]
    fn the_command_names_every_flag_that_changes_the_plan() {
        let opts = TrainerOptions::new(
            GptConfig {
                dropout: 0.1,
                tied: true,
                ..GptConfig::tiny()
            },
            Parallel::ShardMap {
                par: Strategy::DpTp.compose(&Mesh::parse("dp=2,tp=2").unwrap()).unwrap(),
                dropout_key: DropoutKey::FoldIn,
            },
        );
        let cmd = plan_command(&opts, "h100");
        for flag in [
            "shardlab plan --device h100",
            "--layers 1",
            "--tied",
            "--dropout 0.1",
            "--attention fused",
            "--remat none",
            "--precision f32",
            "--mode shard_map",
            "--mesh dp=2,tp=2",
            "--dropout-key fold_in",
            "--rng partitionable",
        ] {
            assert!(cmd.contains(flag), "{flag}: {cmd}");
        }
    }
}
