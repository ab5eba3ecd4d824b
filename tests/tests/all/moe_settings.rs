//! Hostile mixture-of-experts settings are refused by the core with one error that names the
//! setting (so the CLI words it as its flag and the page puts it at its control) and the fix;
//! none of them panics.
use shardlab::model::{Capacity, GptConfig, Moe};
use shardlab::plan::{Parallelism, Zero};
use shardlab::setting::{Audience, Setting};
use shardlab::sharding::Mesh;

fn config(moe: Moe) -> GptConfig {
    GptConfig {
        moe: Some(moe),
        ..GptConfig::tiny()
    }
}

#[test]
fn hostile_expert_settings_are_refused_at_their_flag_with_the_fix() {
    let four = Moe::new(4, 64);
    let cases = [
        (
            Moe { top_k: 5, ..four },
            Setting::TopK,
            "--top-k 5",
            "between 1 and --experts 4",
        ),
        (
            Moe { top_k: 0, ..four },
            Setting::TopK,
            "--top-k 0",
            "between 1 and --experts 4",
        ),
        (
            Moe { width: 0, ..four },
            Setting::ExpertWidth,
            "--expert-width 0",
            "at least 1 hidden unit",
        ),
        (
            Moe {
                capacity: Capacity::Factor(0.0),
                ..four
            },
            Setting::Capacity,
            "--capacity 0",
            "--capacity dropless",
        ),
        (
            Moe {
                capacity: Capacity::Factor(f32::NAN),
                ..four
            },
            Setting::Capacity,
            "--capacity NaN",
            "above 0",
        ),
        (
            Moe {
                capacity: Capacity::Factor(-1.0),
                ..four
            },
            Setting::Capacity,
            "--capacity -1",
            "above 0",
        ),
        (
            Moe { aux: f32::NAN, ..four },
            Setting::AuxLoss,
            "--aux-loss NaN",
            "at least 0",
        ),
        (
            Moe { imbalance: 0.5, ..four },
            Setting::ExpertImbalance,
            "--expert-imbalance 0.5",
            "at least 1",
        ),
        (
            Moe {
                imbalance: f32::NAN,
                ..four
            },
            Setting::ExpertImbalance,
            "--expert-imbalance NaN",
            "at least 1",
        ),
    ];
    for (moe, setting, starts, fix) in cases {
        let err = config(moe).validate().expect_err(starts);
        assert_eq!(err.setting(), Some(&setting), "{starts}: {err}");
        let text = err.to_string();
        assert!(
            text.starts_with(starts) && text.contains(fix),
            "{starts}: said {text:?}"
        );
    }
}

#[test]
fn an_ep_axis_that_does_not_divide_the_experts_is_refused_with_the_sizes_that_do() {
    let cfg = config(Moe::new(6, 64));
    let par = Parallelism::new(Mesh::parse("ep=4").unwrap(), Zero::Off, false).unwrap();
    let err = par.check(&cfg, 1).expect_err("6 experts on ep=4");
    assert_eq!(err.setting(), Setting::MeshAxis("ep".into()), "{err}");
    let text = err.to_string();
    assert!(
        text.starts_with("--mesh ep=4 does not divide --experts 6") && text.contains("one of 1, 2, 3, 6"),
        "said {text:?}"
    );
    let page = match &err {
        shardlab::plan::PlanError::Refused(r) => r.text(Audience::Page),
        other => panic!("not a refusal: {other}"),
    };
    assert!(!page.contains("--mesh"), "the page's words name its control: {page:?}");
}

#[test]
fn an_ep_axis_without_experts_is_refused_with_the_fix() {
    let par = Parallelism::new(Mesh::parse("ep=2").unwrap(), Zero::Off, false).unwrap();
    let err = par.check(&GptConfig::tiny(), 1).expect_err("ep on a dense MLP");
    assert_eq!(err.setting(), Setting::MeshAxis("ep".into()), "{err}");
    assert!(err.to_string().contains("--experts 8"), "said {err}");
}

/// The export writes the mixture (`export_jax::exported_mixture_*`); what shardlab refuses to
/// train it refuses to write, with the same fix.
#[test]
fn exporting_a_mixture_in_a_pipeline_is_refused_with_the_fix() {
    let par = Parallelism::new(Mesh::parse("pp=2").unwrap(), Zero::Off, false).unwrap();
    let mut cfg = config(Moe::new(4, 32));
    cfg.layers = 2;
    let parallel = shardlab::exec::Parallel::ShardMap {
        par,
        dropout_key: shardlab::plan::DropoutKey::Same,
    };
    let mut opts = shardlab::exec::TrainerOptions::new(cfg, parallel);
    opts.microbatches = 2;
    let err = shardlab::export::jax_script(&opts, 1).expect_err("no mixture in a pipeline");
    assert!(
        err.to_string().contains("pp=2") && err.to_string().contains("drop the pp axis"),
        "said {err}"
    );
}
