//! One problem with the page's settings: the control it belongs to and what to do. The core's
//! refusals name their setting ([`shardlab::setting::Setting`]), so the page puts each at that
//! setting's control and writes it in its own words.
use serde::Serialize;
use shardlab::model::ModelError;
use shardlab::plan::PlanError;
use shardlab::setting::{Audience, Refusal};

#[derive(Clone, Debug, Serialize)]
pub struct FieldError {
    pub field: String,
    pub message: String,
    /// Where the core knows the fix as a spec override (explicit mode's `out_sharding=` or
    /// `reshard` of a named value), the page offers it as one press.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<SpecFix>,
}

/// A spec override that fixes the error: `name` pinned to `spec`, as the editor writes it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SpecFix {
    pub name: String,
    pub spec: String,
    /// The fix as JAX code, for the button's words (`out_sharding=P()`).
    pub code: String,
}

impl FieldError {
    pub fn new(field: &str, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
            fix: None,
        }
    }

    /// A refusal of the core, at its setting's control, in the page's words.
    pub fn refused(r: &Refusal) -> Self {
        Self::new(&r.setting.key(), r.text(Audience::Page))
    }

    /// A model error: a refusal at its control; a failed build (a bug) at `fallback`.
    pub fn model(e: &ModelError, fallback: &str) -> Self {
        match e {
            ModelError::Refused(r) => Self::refused(r),
            ModelError::Build(why) => Self::new(fallback, why.clone()),
        }
    }

    /// A planning error, at the control of the setting it is about.
    pub fn plan(e: &PlanError) -> Self {
        let fix = match e {
            PlanError::Explicit(t) if t.fix.named => t.fix.spec.as_ref().map(|spec| SpecFix {
                name: t.fix.value.clone(),
                spec: spec.clone(),
                code: t.fix.code.clone(),
            }),
            _ => None,
        };
        Self {
            fix,
            ..Self::new(&e.setting().key(), e.text(Audience::Page))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardlab::setting::Setting;

    #[test]
    fn a_refusal_is_put_at_its_settings_control_in_the_pages_words() {
        let r = Refusal::at(
            Setting::Schedule,
            "1f1b",
            format!("needs a pipeline; use {}", Setting::Schedule.at("gpipe")),
        );
        let e = FieldError::refused(&r);
        assert_eq!(e.field, "schedule");
        assert_eq!(e.message, "schedule 1f1b: needs a pipeline; use schedule gpipe");
        let spec = FieldError::refused(&Refusal::at(Setting::Spec("h0.w_fc".into()), "P('dp')", "conflicts"));
        assert_eq!(spec.field, "spec.h0.w_fc");
        assert_eq!(spec.message, "h0.w_fc=P('dp'): conflicts");
    }

    #[test]
    fn explicit_modes_refusal_carries_its_fix_as_the_spec_that_writes_it() {
        use crate::modes::Modes;
        use crate::plan::Plan;
        use crate::settings::{Preset, Settings};
        use shardlab::plan::Mode;
        // The last stream split over 'tp' and the head's weight on its rows: the logits'
        // contraction is sharded on both sides, which JAX calls ambiguous.
        let mut s = Settings::preset(Preset::Tp);
        s.mode = Modes::of(&[Mode::Explicit]);
        s.specs.insert("h1.x_mlp".into(), "P(None, None, 'tp')".into());
        s.specs.insert("w_head".into(), "P('tp')".into());
        let par = s.check().unwrap();
        let e = FieldError::plan(&Plan::build(&s, Mode::Explicit, &par).err().expect("JAX refuses it"));
        assert_eq!(e.field, "spec.logits");
        let fix = e.fix.expect("a fix to press");
        assert_eq!((fix.name.as_str(), fix.spec.as_str()), ("logits", "P()"));
        // Pressed: the spec it names plans.
        s.specs.insert(fix.name, fix.spec);
        assert!(Plan::build(&s, Mode::Explicit, &par).is_ok());
        // Other refusals have no spec to press.
        let r = Refusal::at(Setting::Schedule, "1f1b", "needs a pipeline");
        assert!(FieldError::plan(&PlanError::from(r)).fix.is_none());
    }
}
