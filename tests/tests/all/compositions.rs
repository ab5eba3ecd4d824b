//! Meshes of three and four kinds of axes, composed per axis, against the one-device run on 8
//! simulated devices: the losses of 3 steps and the updated parameters agree to 1e-5 in
//! shard_map mode (its body checked by check_vma), in automatic mode and in explicit mode
//! (pipelines are shard_map only), with dropout off and on (each device drawing its block of
//! the one-device run's masks, in both RNG layouts).
use shardlab::exec::{Backend, Parallel, TrainerOptions};
use shardlab::ir::RngLayout;
use shardlab::model::{GptConfig, Optimizer};
use shardlab::plan::{DropoutKey, Parallelism, Zero};
use shardlab::sharding::Mesh;

/// Two blocks (one a stage under pp=2), 4 heads, a sequence of 8 and a batch of 8: every mesh
/// below splits it.
fn config(dropout: f32) -> GptConfig {
    GptConfig {
        layers: 2,
        d_model: 32,
        heads: 4,
        seq: 8,
        batch: 8,
        vocab: 64,
        tied: false,
        dropout,
        attention: Default::default(),
        remat: Default::default(),
        precision: Default::default(),
        moe: None,
    }
}

/// A composition of 8 devices: its mesh and its axes' options.
struct Case {
    mesh: &'static str,
    zero: Zero,
    sequence_parallel: bool,
}

const fn case(mesh: &'static str) -> Case {
    Case {
        mesh,
        zero: Zero::Off,
        sequence_parallel: false,
    }
}

const CASES: [Case; 10] = [
    case("dp=2,tp=2,pp=2"),
    case("fsdp=4,tp=2"),
    case("fsdp=2,tp=2,pp=2"),
    case("dp=2,cp=2,tp=2"),
    Case {
        sequence_parallel: true,
        ..case("tp=4,pp=2")
    },
    case("dp=2,fsdp=2,tp=2"),
    Case {
        sequence_parallel: true,
        ..case("cp=2,tp=4")
    },
    Case {
        zero: Zero::Two,
        ..case("dp=4,tp=2")
    },
    case("pp=2,cp=2,fsdp=2"),
    // The microbatches' gradients leave a pipeline's ticks together: ZeRO-2 reduce-scatters them there.
    Case {
        zero: Zero::Two,
        ..case("dp=4,pp=2")
    },
];

impl Case {
    fn parallelism(&self) -> Parallelism {
        Parallelism::new(Mesh::parse(self.mesh).unwrap(), self.zero, self.sequence_parallel).unwrap()
    }

    fn name(&self) -> String {
        let mut s = self.mesh.to_string();
        if self.zero != Zero::Off {
            s += &format!(" zero {}", self.zero.name());
        }
        if self.sequence_parallel {
            s += " sequence-parallel";
        }
        s
    }
}

fn options(parallel: Parallel, dropout: f32, layout: RngLayout, microbatches: usize) -> TrainerOptions {
    let mut opts = shardlab_tests::formula_options(config(dropout), Optimizer::Sgd { lr: 0.1 }, parallel);
    opts.rng_layout = layout;
    opts.microbatches = microbatches;
    opts
}

fn check(backend: &Backend, dropout: f32, layout: RngLayout) {
    for c in &CASES {
        let par = c.parallelism();
        assert_eq!(par.devices(), 8, "{}", c.name());
        // A pipeline runs two microbatches through its stages; the one-device run draws the
        // same microbatches' masks.
        let k = if par.is_pipeline() { 2 } else { 1 };
        let (want_losses, want_params) =
            shardlab_tests::train_steps(backend, options(Parallel::None, dropout, layout, k), 3);
        let mut runs = vec![(
            "shard_map",
            Parallel::ShardMap {
                par: par.clone(),
                dropout_key: DropoutKey::Global,
            },
        )];
        if !par.is_pipeline() {
            runs.push((
                "explicit",
                Parallel::Explicit {
                    par: par.clone(),
                    axis_types: vec![],
                    specs: vec![],
                },
            ));
            runs.push(("auto", Parallel::Auto { par, specs: vec![] }));
        }
        for (mode, parallel) in runs {
            let what = format!("{mode} {} dropout {dropout} {}", c.name(), layout.name());
            let (losses, params) = shardlab_tests::train_steps(backend, options(parallel, dropout, layout, k), 3);
            for (s, (a, b)) in losses.iter().zip(&want_losses).enumerate() {
                assert!((a - b).abs() <= 1e-5, "{what}: loss {s}: {a} vs one device {b}");
            }
            for (i, (p, q)) in params.iter().zip(&want_params).enumerate() {
                let worst = p.iter().zip(q).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                assert!(worst <= 1e-5, "{what}: param {i} differs by {worst} from one device");
            }
        }
    }
}

#[test]
fn three_and_four_axis_meshes_match_one_device_in_every_mode() {
    check(&Backend::Reference, 0.0, RngLayout::Partitionable);
}

#[test]
fn three_and_four_axis_meshes_draw_the_one_device_runs_masks_in_every_mode_and_layout() {
    for layout in RngLayout::ALL {
        check(&Backend::Reference, 0.1, layout);
    }
}
