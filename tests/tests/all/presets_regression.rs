//! Every preset trains to the losses it trained to before parallelism was composed per mesh
//! axis (recorded at `a78024e`, when each strategy was a body of its own): the presets are
//! now compositions of per-axis rules, and their programs must compute the same numbers, bit
//! for bit, in every mode they run, in both RNG layouts, with dropout on.
//!
//! The fixture is tests/fixtures/preset_losses.json, written by this test with
//! `SHARDLAB_WRITE_PRESET_LOSSES=1` on that commit; the CPU reference executor runs both, so
//! the bits do not depend on a GPU's kernel choices.
use std::collections::BTreeMap;

use shardlab::exec::Backend;
use shardlab::ir::RngLayout;
use shardlab::plan::Preset;

const STEPS: usize = 3;
const FIXTURE: &str = "fixtures/preset_losses.json";

/// Every preset's run in every mode it runs, in both RNG layouts: `preset/mode/layout`.
fn runs() -> Vec<(String, shardlab::exec::TrainerOptions)> {
    let mut out = vec![];
    for p in Preset::ALL {
        for &mode in p.modes() {
            for layout in [RngLayout::Original, RngLayout::Partitionable] {
                let mut opts = p.options(mode);
                opts.rng_layout = layout;
                out.push((format!("{}/{}/{}", p.name(), mode.name(), layout.name()), opts));
            }
        }
    }
    out
}

fn losses_of(opts: shardlab::exec::TrainerOptions) -> Vec<u32> {
    let (losses, _) = shardlab_tests::train_steps(&Backend::Reference, opts, STEPS);
    losses.iter().map(|l| l.to_bits()).collect()
}

#[test]
fn every_preset_trains_to_its_losses_from_before_the_composition_bit_for_bit() {
    let path = format!("{}/{FIXTURE}", env!("CARGO_MANIFEST_DIR"));
    let got: BTreeMap<String, Vec<u32>> = runs().into_iter().map(|(k, o)| (k, losses_of(o))).collect();
    if std::env::var_os("SHARDLAB_WRITE_PRESET_LOSSES").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&got).unwrap() + "\n").unwrap();
        return;
    }
    let want: BTreeMap<String, Vec<u32>> =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the fixture is committed")).unwrap();
    let as_f32 = |b: &[u32]| b.iter().map(|&x| f32::from_bits(x)).collect::<Vec<_>>();
    for (run, bits) in &want {
        let got = got.get(run).unwrap_or_else(|| panic!("{run} no longer runs"));
        assert_eq!(got, bits, "{run}: {:?} against {:?} before", as_f32(got), as_f32(bits));
    }
}
