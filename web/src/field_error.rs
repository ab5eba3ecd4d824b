//! One problem with the page's settings: the control it belongs to and what to do. The core's
//! errors name CLI flags (`--d-model`, `--spec w_fc=...`); here they are put at the control
//! the flag stands for, in the page's words.
use std::collections::BTreeMap;

use serde::Serialize;

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

    /// An error of the core, whose message names CLI flags: the control is the first flag named,
    /// and the flags read as the page's labels.
    pub fn from_core(message: &str, fallback: &str) -> Self {
        // A flag that begins with another (--dropout-key, --dropout) comes first.
        const FLAGS: [(&str, &str); 18] = [
            ("--microbatches", "microbatches"),
            ("--cp-order", "cp_order"),
            ("--schedule", "schedule"),
            ("--mode", "mode"),
            ("--attention", "attention"),
            ("--remat", "remat"),
            ("--dropout-key", "dropout_key"),
            ("--d-model", "d_model"),
            ("--lr", "lr"),
            ("--data", "task"),
            ("--heads", "heads"),
            ("--layers", "layers"),
            ("--batch", "batch"),
            ("--seq", "seq"),
            ("--vocab", "vocab"),
            ("--dropout", "dropout"),
            ("--mesh", "mesh"),
            ("--strategy", "mesh"),
        ];
        let first = FLAGS
            .iter()
            .filter_map(|(flag, field)| message.find(flag).map(|at| (at, *field)))
            .min_by_key(|(at, _)| *at);
        let mut text = message.to_string();
        for (flag, field) in FLAGS {
            text = text.replace(flag, field);
        }
        Self::new(first.map_or(fallback, |(_, f)| f), text)
    }

    /// A planning error: at the spec field of the value it names (`--spec NAME=`, or a
    /// with_sharding_constraint on `NAME` the partitioner cannot honour), else as the core's
    /// errors go.
    pub fn from_plan(specs: &BTreeMap<String, String>, message: &str) -> Self {
        let named = specs
            .keys()
            .filter(|n| message.contains(&format!("`{n}`")) || message.contains(&format!("--spec {n}=")))
            .max_by_key(|n| n.len());
        match named {
            Some(n) => Self::new(&format!("spec.{n}"), message.replace("--spec ", "spec ")),
            None => Self::from_core(message, "mesh"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_constraint_the_partitioner_refuses_is_an_error_at_its_field() {
        let specs: BTreeMap<String, String> = [("h0.w_fc'".to_string(), "P('dp')".to_string())].into();
        let msg = "jit: with_sharding_constraint PartitionSpec('dp',) on `h0.w_fc'`: conflicts with the sharding given for it as an input or output";
        assert_eq!(FieldError::from_plan(&specs, msg).field, "spec.h0.w_fc'");
        assert_eq!(FieldError::from_plan(&specs, "--mesh needs dp").field, "mesh");
    }

    #[test]
    fn a_schedule_the_engine_refuses_is_an_error_at_the_schedule_control_in_the_pages_words() {
        let e = FieldError::from_core(
            "--schedule 1f1b: needs ... Use --schedule gpipe: its bubble is the same",
            "mesh",
        );
        assert_eq!(e.field, "schedule");
        assert_eq!(
            e.message,
            "schedule 1f1b: needs ... Use schedule gpipe: its bubble is the same"
        );
    }

    #[test]
    fn a_core_error_is_put_at_the_first_flag_it_names() {
        let e = FieldError::from_core("--heads 3 does not divide --d-model 64", "mesh");
        assert_eq!(e.field, "heads");
        assert_eq!(e.message, "heads 3 does not divide d_model 64");
    }
}
