//! The named setups, in one place. The CLI (`--preset seed`), the page (which sends them to
//! app.js) and the benchmarks read each preset's model, mesh, strategy and RNG layout here.
use super::{DropoutKey, Mode, Parallel, Parallelism, Schedule, Strategy, TrainerOptions};
use crate::ir::RngLayout;
use crate::model::{Attention, Capacity, GptConfig, Moe};
use crate::sharding::Mesh;

/// A named setup: a model, a mesh and a strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    /// The JAX report's run: data parallelism on 8 devices, dropout 0.1, the original RNG
    /// layout, a 2-layer model of width 128 on batches of 32 x 64 tokens.
    Seed,
    Dp,
    /// Data parallelism with the optimizer state split (ZeRO-1), then the gradients too (ZeRO-2).
    Zero1,
    Zero2,
    Fsdp,
    Tp,
    DpTp,
    /// Long context: the sequence split over "cp" (ring attention in shard_map mode, K and V
    /// gathered by jit), on a sequence of 256.
    Cp,
    /// Megatron tensor parallelism with sequence parallelism.
    TpSp,
    /// Pipeline parallelism: 4 blocks in 4 stages on pp=4, 4 microbatches through them (GPipe),
    /// in shard_map mode.
    Pp,
    /// A mixture of experts: 4 experts in every block, each token routed to its top 2, at
    /// Switch's capacity factor 1.25 and load-balancing coefficient 0.01; the experts split
    /// over ep=2 and the batch over dp=2 x ep=2.
    Moe,
}

impl Preset {
    pub const ALL: [Preset; 11] = [
        Preset::Seed,
        Preset::Dp,
        Preset::Zero1,
        Preset::Zero2,
        Preset::Fsdp,
        Preset::Tp,
        Preset::DpTp,
        Preset::Cp,
        Preset::TpSp,
        Preset::Pp,
        Preset::Moe,
    ];

    /// The name the CLI, the page and its links use.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Seed => "seed",
            Preset::Dp => "dp",
            Preset::Zero1 => "zero1",
            Preset::Zero2 => "zero2",
            Preset::Fsdp => "fsdp",
            Preset::Tp => "tp",
            Preset::DpTp => "dp_tp",
            Preset::Cp => "cp",
            Preset::TpSp => "tp_sp",
            Preset::Pp => "pp",
            Preset::Moe => "moe",
        }
    }

    pub fn parse(name: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The named strategy the preset is (None for a composition no strategy names: the
    /// mixture's dp x ep).
    pub fn strategy(self) -> Option<Strategy> {
        Some(match self {
            Preset::Seed | Preset::Dp => Strategy::Dp,
            Preset::Zero1 => Strategy::Zero1,
            Preset::Zero2 => Strategy::Zero2,
            Preset::Fsdp => Strategy::Fsdp,
            Preset::Tp => Strategy::Tp,
            Preset::DpTp => Strategy::DpTp,
            Preset::Cp => Strategy::Cp,
            Preset::TpSp => Strategy::TpSp,
            Preset::Pp => Strategy::Pp,
            Preset::Moe => return None,
        })
    }

    /// The mesh, as `--mesh` takes it: the seed's 8 devices, a stage per block of the pipeline,
    /// the mixture's experts over ep and its batch over dp x ep, else the strategy's example
    /// mesh.
    pub fn mesh(self) -> &'static str {
        match self {
            Preset::Seed => "dp=8",
            Preset::Pp => "pp=4",
            Preset::Moe => "dp=2,ep=2",
            p => p.strategy().map_or("dp=4", Strategy::example_mesh),
        }
    }

    /// The model. The seed's is the report's; the others are smaller, so that a browser tab
    /// steps them quickly.
    pub fn config(self) -> GptConfig {
        let small = GptConfig {
            layers: 2,
            d_model: 64,
            heads: 4,
            seq: 32,
            batch: 8,
            vocab: 32,
            tied: false,
            dropout: 0.1,
            attention: Attention::Fused,
            remat: Default::default(),
            precision: Default::default(),
            moe: None,
        };
        match self {
            Preset::Seed => GptConfig {
                d_model: 128,
                seq: 64,
                batch: 32,
                vocab: 256,
                ..small
            },
            // Eight times the others' sequence on a quarter of their batch: each of the 4
            // devices holds 64 positions of every sequence.
            Preset::Cp => GptConfig {
                seq: 256,
                batch: 2,
                ..small
            },
            // A block per stage of pp=4.
            Preset::Pp => GptConfig { layers: 4, ..small },
            // Experts of half the dense MLP's width, so that the 4 cost what 2 dense MLPs do.
            Preset::Moe => GptConfig {
                moe: Some(Moe {
                    width: 2 * small.d_model,
                    capacity: Capacity::Factor(1.25),
                    ..Moe::new(4, small.d_model)
                }),
                ..small
            },
            _ => small,
        }
    }

    /// Microbatches per step: the pipeline's 4, so each stage idles (pp - 1) / (M + pp - 1) =
    /// 3/7 of the step where one microbatch would leave it idle 3/4; the others accumulate no
    /// gradients.
    pub fn microbatches(self) -> usize {
        match self {
            Preset::Pp => 4,
            _ => 1,
        }
    }

    /// The pipeline's schedule: GPipe, the one both the page and the CLI default to.
    pub fn schedule(self) -> Schedule {
        Schedule::Gpipe
    }

    /// The modes the preset runs: both, except a pipeline's, which the partitioner cannot
    /// express yet (automatic mode is refused, naming what jit would need).
    pub fn modes(self) -> &'static [Mode] {
        if self.parallelism().is_pipeline() {
            &[Mode::ShardMap]
        } else {
            &[Mode::Auto, Mode::ShardMap]
        }
    }

    /// The RNG layout: the original one (jax_threefry_partitionable off), whose replicated
    /// random bits are the report's cause.
    pub fn rng_layout(self) -> RngLayout {
        RngLayout::Original
    }

    /// The dropout keys of the shard_map body: the same on every device, as the report's body.
    pub fn dropout_key(self) -> DropoutKey {
        DropoutKey::Same
    }

    /// The preset's composition: its strategy's, else its mesh's axes as they are.
    pub fn parallelism(self) -> Parallelism {
        let mesh = Mesh::parse(self.mesh()).expect("every preset's mesh parses (tested)");
        match self.strategy() {
            Some(s) => s.compose(&mesh),
            None => Parallelism::new(mesh, Default::default(), false),
        }
        .expect("every preset's mesh composes (tested)")
    }

    /// The preset's partitioning in `mode` (`Single`: its model on one device).
    pub fn parallel(self, mode: Mode) -> Parallel {
        match mode {
            Mode::Single => Parallel::None,
            Mode::Auto => Parallel::Auto {
                par: self.parallelism(),
                specs: vec![],
            },
            Mode::Explicit => Parallel::Explicit {
                par: self.parallelism(),
                axis_types: vec![],
                specs: vec![],
            },
            Mode::ShardMap => Parallel::ShardMap {
                par: self.parallelism(),
                dropout_key: self.dropout_key(),
            },
        }
    }

    /// The preset's run in `mode`, with the defaults of a run ([`TrainerOptions::new`]).
    pub fn options(self, mode: Mode) -> TrainerOptions {
        TrainerOptions {
            rng_layout: self.rng_layout(),
            microbatches: self.microbatches(),
            schedule: self.schedule(),
            ..TrainerOptions::new(self.config(), self.parallel(mode))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::check_page_limits;
    use crate::sharding::Mesh;

    #[test]
    fn every_preset_is_named_once_and_parses_back() {
        for p in Preset::ALL {
            assert_eq!(Preset::parse(p.name()), Some(p));
            assert_eq!(serde_json::to_value(p).unwrap(), p.name());
        }
        assert_eq!(Preset::parse("zz"), None);
    }

    #[test]
    fn every_presets_run_plans_in_its_modes_and_a_mode_it_does_not_run_is_refused_naming_why() {
        for p in Preset::ALL {
            for mode in [Mode::Auto, Mode::ShardMap] {
                let planned = crate::plan::build(&p.options(mode));
                if !p.modes().contains(&mode) {
                    // Should the partitioner learn to run it, the preset runs both modes.
                    let e = planned.expect_err(&format!("{p:?} plans in {mode:?}: add it to its modes"));
                    assert!(e.to_string().contains("--mode auto"), "{p:?}: {e}");
                    continue;
                }
                let planned = planned.unwrap_or_else(|e| panic!("{p:?} {mode:?}: {e}"));
                assert_eq!(planned.step.program.devices(), Mesh::parse(p.mesh()).unwrap().devices());
            }
        }
    }

    #[test]
    fn the_pipeline_preset_gives_every_stage_a_block_and_shrinks_the_bubble_with_its_microbatches() {
        let p = Preset::Pp;
        let pp = Mesh::parse(p.mesh()).unwrap().axis_size("pp").unwrap();
        assert_eq!((pp, p.config().layers), (4, 4));
        let opts = p.options(Mode::ShardMap);
        assert_eq!((opts.microbatches, opts.schedule), (4, Schedule::Gpipe));
        let bubble = |m| p.schedule().bubble_fraction(pp, m);
        assert!(bubble(p.microbatches()) < bubble(1));
    }

    #[test]
    fn every_presets_model_and_mesh_fit_its_strategy_and_the_pages_limits() {
        for p in Preset::ALL {
            let cfg = p.config();
            cfg.validate().unwrap();
            let mesh = Mesh::parse(p.mesh()).unwrap();
            assert_eq!(Strategy::of(&p.parallelism()), p.strategy(), "{p:?}");
            assert!(mesh.devices() <= crate::plan::PAGE_MAX_DEVICES);
            let lr = f64::from(TrainerOptions::new(cfg.clone(), Parallel::None).optimizer.lr());
            check_page_limits(&cfg, p.microbatches(), 1, lr).unwrap_or_else(|e| panic!("{p:?}: {e}"));
        }
    }
}
