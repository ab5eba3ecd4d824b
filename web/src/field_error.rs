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
}

impl FieldError {
    pub fn new(field: &str, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
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
        Self::new(&e.setting().key(), e.text(Audience::Page))
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
}
