//! The command line of a planned run: what `shardlab plan` takes to plan it again, as the
//! search and `bench published` print for each configuration.
use crate::plan::{Parallel, TrainerOptions};

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
    parts.push(format!("--dropout {}", c.dropout));
    parts.push(format!("--attention {}", c.attention.name()));
    parts.push(format!("--remat {}", c.remat.name()));
    parts.push(format!("--precision {}", c.precision.name()));
    match &opts.parallel {
        Parallel::None => {}
        Parallel::Auto { strategy, mesh, .. } | Parallel::ShardMap { strategy, mesh, .. } => {
            parts.push(format!("--mode {}", opts.parallel.mode_name()));
            parts.push(format!("--strategy {}", strategy.name()));
            parts.push(format!("--mesh {}", mesh_flag(mesh)));
        }
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
    if opts.parallel.strategy().is_some_and(|s| s.is_pipeline()) {
        parts.push(format!("--schedule {}", opts.schedule.name()));
    }
    parts.join(" ")
}

/// A configuration in a few words, as lists name it: `shard_map dp dp=4 remat none`.
pub fn describe(opts: &TrainerOptions) -> String {
    let mut remat = match opts.microbatches {
        1 => opts.config.remat.name().to_string(),
        k => format!("{} microbatches {k}", opts.config.remat.name()),
    };
    if opts.parallel.strategy().is_some_and(|s| s.is_pipeline()) {
        remat = format!("{remat} {}", opts.schedule.name());
    }
    match &opts.parallel {
        Parallel::None => format!("single remat {remat}"),
        Parallel::Auto { strategy, mesh, .. } | Parallel::ShardMap { strategy, mesh, .. } => format!(
            "{} {} {} remat {remat}",
            opts.parallel.mode_name(),
            strategy.name(),
            mesh_flag(mesh)
        ),
    }
}

/// A mesh as `--mesh` takes it: `dp=2,tp=4`.
pub(super) fn mesh_flag(mesh: &crate::sharding::Mesh) -> String {
    mesh.axes()
        .iter()
        .map(|(name, size)| format!("{name}={size}"))
        .collect::<Vec<_>>()
        .join(",")
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
                strategy: Strategy::DpTp,
                mesh: Mesh::parse("dp=2,tp=2").unwrap(),
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
            "--strategy dp_tp",
            "--mesh dp=2,tp=2",
            "--dropout-key fold_in",
            "--rng partitionable",
        ] {
            assert!(cmd.contains(flag), "{flag}: {cmd}");
        }
    }
}
