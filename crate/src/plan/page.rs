//! What a browser tab runs: the page's bounds on every setting, checked here as refusals of
//! the setting they bound, so the page puts each at its control and the bounds live in one
//! place (the page reads them from [`PAGE_LIMITS`] to set its controls' ranges).
use super::Parallelism;
use crate::model::GptConfig;
use crate::setting::{Refusal, Setting};

/// The bounds of one numeric setting on the page.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Limit {
    pub setting: Setting,
    pub min: f64,
    pub max: f64,
}

impl Limit {
    /// `value` within the bounds, or the refusal at its setting.
    pub fn check(&self, value: f64) -> Result<(), Refusal> {
        if value.is_finite() && (self.min..=self.max).contains(&value) {
            return Ok(());
        }
        let why = if value < self.min {
            format!("must be at least {}; use {} or more", self.min, self.min)
        } else {
            format!("is more than this page handles: use {} to {}", self.min, self.max)
        };
        Err(Refusal::at(self.setting.clone(), value, why))
    }
}

const fn limit(setting: Setting, min: f64, max: f64) -> Limit {
    Limit { setting, min, max }
}

/// The page's bounds: sizes above these make programs or buffers a browser tab should not be
/// asked for (vocab needs two tokens for a task to have anything to learn); a dropout rate
/// above 0.95 leaves nothing to train; below 1e-6 nothing visibly learns in the steps a page
/// runs, and above 1 AdamW and SGD both diverge on every preset. Gradient accumulation: at
/// most one microbatch per example of the largest batch; virtual stages, at most one chunk per
/// block of the deepest model. A mixture of experts: 0 experts is the dense MLP; the lower
/// bounds of top-k and the expert width are the model's rules (`Moe::validate`), refused in the
/// flag's words; the load-balancing coefficient is of Switch's 0.01's order, and at 1 it already
/// outweighs the loss.
pub static PAGE_LIMITS: [Limit; 14] = [
    limit(Setting::Layers, 1.0, 12.0),
    limit(Setting::DModel, 1.0, 1024.0),
    limit(Setting::Heads, 1.0, 64.0),
    limit(Setting::Seq, 1.0, 512.0),
    limit(Setting::Batch, 1.0, 512.0),
    limit(Setting::Vocab, 2.0, 4096.0),
    limit(Setting::Microbatches, 1.0, 512.0),
    limit(Setting::VirtualStages, 1.0, 12.0),
    limit(Setting::Dropout, 0.0, 0.95),
    limit(Setting::Lr, 1e-6, 1.0),
    limit(Setting::Experts, 0.0, 64.0),
    limit(Setting::TopK, 0.0, 64.0),
    limit(Setting::ExpertWidth, 0.0, 4096.0),
    limit(Setting::AuxLoss, 0.0, 1.0),
];

/// The page's bound of `setting` (one of [`PAGE_LIMITS`]'s).
pub fn page_limit(setting: &Setting) -> Option<&'static Limit> {
    PAGE_LIMITS.iter().find(|l| l.setting == *setting)
}

/// The most simulated devices the page's mesh may have.
pub const PAGE_MAX_DEVICES: usize = 64;
/// The most elements of one global array the page builds: 2 GiB of f32, so its byte count fits
/// a 32-bit usize.
pub const PAGE_MAX_ELEMENTS: u64 = 1 << 29;
/// More spec overrides than this in one link are not a hand-made edit.
pub const PAGE_MAX_SPECS: usize = 256;

/// The model's sizes (its experts' too), microbatches, virtual stages, dropout and learning rate
/// within the page's bounds.
pub fn check_page_limits(cfg: &GptConfig, microbatches: usize, virtual_stages: usize, lr: f64) -> Result<(), Refusal> {
    let moe = cfg.moe.iter().flat_map(|m| {
        [
            (Setting::Experts, m.experts as f64),
            (Setting::TopK, m.top_k as f64),
            (Setting::ExpertWidth, m.width as f64),
            (Setting::AuxLoss, f64::from(m.aux)),
        ]
    });
    let values = [
        (Setting::Layers, cfg.layers as f64),
        (Setting::DModel, cfg.d_model as f64),
        (Setting::Heads, cfg.heads as f64),
        (Setting::Seq, cfg.seq as f64),
        (Setting::Batch, cfg.batch as f64),
        (Setting::Vocab, cfg.vocab as f64),
        (Setting::Microbatches, microbatches as f64),
        (Setting::VirtualStages, virtual_stages as f64),
        (Setting::Dropout, f64::from(cfg.dropout)),
        (Setting::Lr, lr),
    ];
    for (setting, value) in values.into_iter().chain(moe) {
        if let Some(l) = page_limit(&setting) {
            l.check(value)?;
        }
    }
    Ok(())
}

/// A mesh of at most [`PAGE_MAX_DEVICES`] simulated devices.
pub fn check_page_mesh(par: &Parallelism) -> Result<(), Refusal> {
    let devices = par.devices();
    if devices <= PAGE_MAX_DEVICES {
        return Ok(());
    }
    Err(Refusal::at(
        Setting::Mesh,
        par.name(),
        format!(
            "has {devices} devices, and the page simulates at most {PAGE_MAX_DEVICES}: use smaller axes (the CLI plans \
             meshes of up to {})",
            crate::sharding::Mesh::MAX_DEVICES
        ),
    ))
}

/// The largest arrays of a step, counted in u64 before anything is built: none may exceed
/// [`PAGE_MAX_ELEMENTS`] (so no element or byte count wraps on wasm32). Refused at the setting
/// that grows the array most.
pub fn check_page_sizes(cfg: &GptConfig) -> Result<(), Refusal> {
    use Setting::{Batch, DModel, ExpertWidth, Seq, Vocab};
    let [b, t, d, h, v] = [cfg.batch, cfg.seq, cfg.d_model, cfg.heads, cfg.vocab].map(|x| x as u64);
    let arrays: [(&str, &str, Setting, [u64; 4]); 4] = [
        ("attention scores", "batch × heads × seq × seq", Seq, [b, h, t, t]),
        ("logits", "batch × seq × vocab", Vocab, [b, t, v, 1]),
        ("MLP activations", "batch × seq × 4 × d_model", DModel, [b, t, 4, d]),
        ("embedding", "vocab × d_model", Vocab, [v, d, 1, 1]),
    ];
    // Every expert's slots of every sequence, at the capacity (a sequence's length, dropless).
    let experts = cfg.moe.map(|m| {
        let dims = [m.experts, cfg.batch, m.slots(cfg.seq), m.width].map(|x| x as u64);
        (
            "expert activations",
            "experts × batch × capacity slots × expert width",
            ExpertWidth,
            dims,
        )
    });
    for (name, formula, setting, dims) in arrays.into_iter().chain(experts) {
        let n = dims.iter().try_fold(1u64, |acc, x| acc.checked_mul(*x));
        if n.is_some_and(|n| n <= PAGE_MAX_ELEMENTS) {
            continue;
        }
        let shown = n.map_or_else(|| "more than 2^64".to_string(), grouped);
        let gib = n.map_or(f64::INFINITY, |n| n as f64 * 4.0 / (1u64 << 30) as f64);
        return Err(Refusal::new(
            setting.clone(),
            format!(
                "the {name} would have {shown} elements ({formula}, {gib:.1} GiB as f32); the page handles at most \
                 {PAGE_MAX_ELEMENTS} per array: lower {} or {}",
                setting.named(),
                Batch.named()
            ),
        ));
    }
    Ok(())
}

/// `n` with its digits in groups of three: 8,589,934,592.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setting::Audience;

    #[test]
    fn counts_in_refusals_group_their_digits_in_threes() {
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(8_589_934_592), "8,589,934,592");
    }

    #[test]
    fn a_value_outside_the_pages_bounds_is_refused_at_its_setting() {
        let cfg = GptConfig {
            layers: 13,
            ..GptConfig::tiny()
        };
        let e = check_page_limits(&cfg, 1, 1, 3e-3).unwrap_err();
        assert_eq!(e.setting, Setting::Layers);
        assert_eq!(
            e.text(Audience::Page),
            "layers 13: is more than this page handles: use 1 to 12"
        );
        let e = check_page_limits(&GptConfig::tiny(), 1, 1, 0.0).unwrap_err();
        assert_eq!(e.setting, Setting::Lr);
        assert!(check_page_limits(&GptConfig::tiny(), 1, 1, 3e-3).is_ok());
    }

    #[test]
    fn every_limit_bounds_a_distinct_setting() {
        for (i, l) in PAGE_LIMITS.iter().enumerate() {
            assert!(l.min <= l.max, "{l:?}");
            assert!(PAGE_LIMITS[..i].iter().all(|m| m.setting != l.setting), "{l:?}");
        }
    }
}
