//! The configurations `bench model` measures, in three blocks: the sweep (small models, every
//! strategy, both modes and layouts), the held-out block (the seed preset's size and larger,
//! never looked at when the cost model or its calibration was shaped) and the ranking block
//! (every configuration the search considers for one runnable model on 4 devices).
use crate::exec::{ExecError, Parallel, TrainerOptions};
use crate::ir::RngLayout;
use crate::model::{DataSource, GptConfig, Init, Optimizer};
use crate::plan::{DropoutKey, Preset, Strategy};
use crate::sharding::Mesh;

/// Which block a configuration belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Block {
    Sweep,
    HeldOut,
    Ranking,
}

/// One configuration to measure and price.
#[derive(Clone, Debug)]
pub struct Config {
    pub name: String,
    pub block: Block,
    /// Its model's size class (`xs`, `s`, `seed`, `m`).
    pub size: &'static str,
    pub rng: &'static str,
    pub options: TrainerOptions,
}

fn small(layers: usize, d_model: usize, heads: usize, seq: usize, batch: usize, vocab: usize) -> GptConfig {
    GptConfig {
        layers,
        d_model,
        heads,
        seq,
        batch,
        vocab,
        tied: false,
        dropout: 0.1,
        ..GptConfig::tiny()
    }
}

/// The sweep's two model sizes: tiny enough for lavapipe, different enough that the matmul,
/// RNG and launch shares move.
fn sweep_sizes() -> [(&'static str, GptConfig); 2] {
    [("xs", small(1, 32, 2, 16, 8, 32)), ("s", small(2, 64, 4, 32, 16, 64))]
}

/// The held-out block's larger class beside the seed preset: twice its depth and sequence.
fn m_size() -> GptConfig {
    small(4, 128, 4, 128, 16, 256)
}

/// Meshes per strategy and sweep size: 1 to 8 devices over the sweep.
fn mesh_for(strategy: Strategy, size: usize) -> &'static str {
    match (strategy, size) {
        (Strategy::Dp | Strategy::Zero1 | Strategy::Zero2, 0) => "dp=8",
        (Strategy::Dp | Strategy::Zero1 | Strategy::Zero2, _) => "dp=2",
        (Strategy::Fsdp, 0) => "dp=4",
        (Strategy::Fsdp, _) => "dp=8",
        (Strategy::Tp, 0) => "tp=2",
        (Strategy::Tp, _) => "tp=4",
        (Strategy::DpTp, 0) => "dp=2,tp=2",
        (_, _) => "dp=4,tp=2",
    }
}

fn options(config: GptConfig, rng_layout: RngLayout, parallel: Parallel) -> TrainerOptions {
    TrainerOptions {
        optimizer: Optimizer::AdamW { lr: 3e-3 },
        init: Init::Random { seed: 0 },
        data: DataSource::Copy,
        rng_layout,
        ..TrainerOptions::new(config, parallel)
    }
}

fn parallel(mode: &str, strategy: Strategy, mesh: &str) -> Result<Parallel, ExecError> {
    let mesh = Mesh::parse(mesh).map_err(|e| ExecError::Input(e.to_string()))?;
    let par = strategy.compose(&mesh).map_err(|e| ExecError::Input(e.to_string()))?;
    Ok(if mode == "auto" {
        Parallel::Auto { par, specs: vec![] }
    } else {
        Parallel::ShardMap {
            par,
            dropout_key: DropoutKey::Same,
        }
    })
}

/// The sweep: one device per size, then both modes x four strategies x both RNG layouts x two
/// sizes (34 in all).
pub fn sweep() -> Result<Vec<Config>, ExecError> {
    let mut out = vec![];
    for (si, (size, config)) in sweep_sizes().into_iter().enumerate() {
        out.push(Config {
            name: format!("{size} single"),
            block: Block::Sweep,
            size,
            rng: "partitionable",
            options: options(config.clone(), RngLayout::Partitionable, Parallel::None),
        });
        for strategy in [Strategy::Dp, Strategy::Fsdp, Strategy::Tp, Strategy::DpTp] {
            for layout in [RngLayout::Original, RngLayout::Partitionable] {
                for mode in ["auto", "shard_map"] {
                    let mesh = mesh_for(strategy, si);
                    out.push(Config {
                        name: format!("{size} {mode} {} {mesh} {}", strategy.name(), layout.name()),
                        block: Block::Sweep,
                        size,
                        rng: layout.name(),
                        options: options(config.clone(), layout, parallel(mode, strategy, mesh)?),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// A held-out configuration: its size class, model, mode, strategy and mesh (None on one
/// device), and RNG layout.
type HeldOutCase = (
    &'static str,
    GptConfig,
    &'static str,
    Option<(Strategy, &'static str)>,
    RngLayout,
);

/// The held-out block: the seed preset itself in both modes, its model under the other
/// strategies, and a larger model (`m`: 4 layers, sequence 128) on one device and on dp=4.
pub fn held_out() -> Result<Vec<Config>, ExecError> {
    let seed = Preset::Seed.config();
    let cases: [HeldOutCase; 7] = [
        (
            "seed",
            seed.clone(),
            "auto",
            Some((Strategy::Dp, "dp=8")),
            RngLayout::Original,
        ),
        (
            "seed",
            seed.clone(),
            "shard_map",
            Some((Strategy::Dp, "dp=8")),
            RngLayout::Original,
        ),
        (
            "seed",
            seed.clone(),
            "auto",
            Some((Strategy::Fsdp, "dp=4")),
            RngLayout::Partitionable,
        ),
        (
            "seed",
            seed.clone(),
            "shard_map",
            Some((Strategy::Tp, "tp=2")),
            RngLayout::Partitionable,
        ),
        (
            "seed",
            seed,
            "auto",
            Some((Strategy::DpTp, "dp=2,tp=2")),
            RngLayout::Original,
        ),
        ("m", m_size(), "single", None, RngLayout::Partitionable),
        (
            "m",
            m_size(),
            "shard_map",
            Some((Strategy::Dp, "dp=4")),
            RngLayout::Partitionable,
        ),
    ];
    cases
        .into_iter()
        .map(|(size, config, mode, split, layout)| {
            let (name, par) = match split {
                None => (format!("{size} single"), Parallel::None),
                Some((strategy, mesh)) => (
                    format!("{size} {mode} {} {mesh} {}", strategy.name(), layout.name()),
                    parallel(mode, strategy, mesh)?,
                ),
            };
            Ok(Config {
                name,
                block: Block::HeldOut,
                size,
                rng: layout.name(),
                options: options(config, layout, par),
            })
        })
        .collect()
}

/// The ranking block: every configuration the search considers for the `s` model on 4
/// devices (each strategy and mesh, both modes, every remat policy), as `plan --search` lists
/// them.
pub fn ranking() -> Vec<Config> {
    let (size, config) = sweep_sizes()[1].clone();
    let base = options(config, RngLayout::Partitionable, Parallel::None);
    crate::search::candidates(&base, 4)
        .into_iter()
        .filter(|c| crate::plan::build(c).is_ok())
        .map(|options| Config {
            name: format!("rank {}", crate::search::describe(&options)),
            block: Block::Ranking,
            size,
            rng: "partitionable",
            options,
        })
        .collect()
}

/// Every block, sweep first.
pub fn all() -> Result<Vec<Config>, ExecError> {
    let mut out = sweep()?;
    out.extend(held_out()?);
    out.extend(ranking());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_held_out_configuration_is_in_the_sweep_and_every_one_plans() {
        let all = all().unwrap();
        let sweep: Vec<_> = all.iter().filter(|c| c.block == Block::Sweep).collect();
        assert_eq!(sweep.len(), 34);
        for c in all.iter().filter(|c| c.block == Block::HeldOut) {
            assert!(
                !sweep.iter().any(|s| s.options.config == c.options.config
                    && s.options.parallel == c.options.parallel
                    && s.options.rng_layout == c.options.rng_layout),
                "{} is in the sweep",
                c.name
            );
        }
        for c in &all {
            crate::plan::build(&c.options).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        }
        let names: std::collections::BTreeSet<_> = all.iter().map(|c| &c.name).collect();
        assert_eq!(names.len(), all.len(), "names are unique");
        assert!(all.iter().filter(|c| c.block == Block::Ranking).count() >= 12);
    }
}
