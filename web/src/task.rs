//! What the model learns on the page: the task (copy, reverse, modadd, or a bundled text) and
//! the optimizer with its learning rate. The data and the optimizer are the core's own
//! (`DataSource`, `Optimizer`); this file names the choices, checks them at the right control
//! in the page's words, and prepares the bundled text.
use serde::{Deserialize, Serialize};
use shardlab::model::{DataSource, Optimizer};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    Copy,
    Reverse,
    Modadd,
    Text,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Opt {
    Adamw,
    Sgd,
}

#[cfg(test)]
pub const TASKS: [Task; 4] = [Task::Copy, Task::Reverse, Task::Modadd, Task::Text];
#[cfg(test)]
const OPTS: [Opt; 2] = [Opt::Adamw, Opt::Sgd];

/// The learning rate the presets start from (what the page trained with before it had a
/// control for it).
pub const DEFAULT_LR: f64 = 3e-3;

/// Lewis Carroll, "Alice's Adventures in Wonderland" (1865), the start of chapter I, "Down the
/// Rabbit-Hole": public domain (published 1865; the author died in 1898).
const ALICE: &str = include_str!("../texts/alice.txt");

/// The bundled text as the model reads it: lower case, `;` and `:` as commas, dashes as
/// spaces, no brackets or quotes, single spaces. So it has 31 distinct characters and fits
/// the presets' vocab of 32.
pub fn text() -> String {
    let mut out = String::with_capacity(ALICE.len());
    for c in ALICE.chars().flat_map(char::to_lowercase) {
        let c = match c {
            ';' | ':' => ',',
            '-' => ' ',
            '(' | ')' | '"' => continue,
            c if c.is_whitespace() => ' ',
            c => c,
        };
        if c == ' ' && (out.is_empty() || out.ends_with(' ')) {
            continue;
        }
        out.push(c);
    }
    out.trim_end().to_string()
}

/// The distinct characters of the bundled text: its token ids are their positions in this
/// sorted list, as `Dataset` assigns them.
#[cfg(test)]
pub fn text_chars() -> Vec<char> {
    let mut set: Vec<char> = text().chars().collect();
    set.sort_unstable();
    set.dedup();
    set
}

impl Task {
    #[cfg(test)]
    pub fn name(self) -> &'static str {
        match self {
            Task::Copy => "copy",
            Task::Reverse => "reverse",
            Task::Modadd => "modadd",
            Task::Text => "text",
        }
    }

    pub fn data(self) -> DataSource {
        match self {
            Task::Copy => DataSource::Copy,
            Task::Reverse => DataSource::Reverse,
            Task::Modadd => DataSource::ModAdd,
            Task::Text => DataSource::Text(text()),
        }
    }
}

impl Opt {
    pub fn optimizer(self, lr: f64) -> Optimizer {
        let lr = lr as f32;
        match self {
            Opt::Adamw => Optimizer::AdamW { lr },
            Opt::Sgd => Optimizer::Sgd { lr },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardlab::model::{Dataset, GptConfig};

    #[test]
    fn the_bundled_text_fits_the_presets_vocab_and_reads_as_prose() {
        let t = text();
        assert!(t.len() > 3000, "{}", t.len());
        assert!(t.starts_with("alice was beginning to get very tired"));
        assert!(!t.contains("  ") && !t.contains('"'));
        assert!(text_chars().len() <= 32, "{:?}", text_chars());
        assert_eq!(text_chars()[0], ' ');
    }

    #[test]
    fn every_task_trains_on_the_core_dataset_at_its_smallest_sizes() {
        for task in TASKS {
            let vocab = match task {
                Task::Text => text_chars().len(),
                Task::Modadd => 4,
                _ => 3,
            };
            let seq = if task == Task::Modadd { 4 } else { 3 };
            let cfg = GptConfig {
                vocab,
                seq,
                batch: 2,
                ..GptConfig::tiny()
            };
            Dataset::new(task.data(), &cfg, 0).unwrap_or_else(|e| panic!("{}: {e}", task.name()));
        }
    }

    #[test]
    fn a_vocab_or_seq_too_small_for_the_task_is_flagged_at_that_control() {
        let check = |task: Task, vocab: usize, seq: usize| {
            let s = Settings {
                task,
                vocab,
                seq,
                ..Settings::preset(Preset::Dp)
            };
            s.check().unwrap_err()
        };
        let e = check(Task::Text, 20, 32);
        assert_eq!(e.field, "vocab");
        assert!(e.message.contains("31 distinct characters"), "{}", e.message);
        let e = check(Task::Modadd, 3, 32);
        assert_eq!(e.field, "vocab");
        assert!(e.message.contains("task modadd"), "{}", e.message);
        assert_eq!(check(Task::Modadd, 32, 3).field, "seq");
        let e = check(Task::Reverse, 2, 8);
        assert!(
            e.message.contains("task reverse") && e.message.contains("vocab 16"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("--"), "{}", e.message);
    }

    fn lr_limit() -> &'static shardlab::plan::Limit {
        shardlab::plan::page_limit(&shardlab::setting::Setting::Lr).expect("the page bounds lr")
    }

    #[test]
    fn the_lr_control_refuses_zero_negative_huge_and_non_finite_rates() {
        for bad in [0.0, -0.001, 1e-7, 1.5, 1e30, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let s = Settings {
                lr: bad,
                ..Settings::preset(Preset::Dp)
            };
            assert_eq!(s.check().unwrap_err().field, "lr", "{bad}");
        }
        for good in [lr_limit().min, DEFAULT_LR, 0.1, lr_limit().max] {
            lr_limit().check(good).unwrap();
        }
    }

    use crate::settings::{Preset, Settings};

    #[test]
    fn every_task_optimizer_and_lr_the_page_writes_reads_back_and_trains() {
        for task in TASKS {
            for optimizer in OPTS {
                for lr in [lr_limit().min, 3e-4, DEFAULT_LR, 0.1, lr_limit().max] {
                    let s = Settings {
                        task,
                        optimizer,
                        lr,
                        ..Settings::preset(Preset::Dp)
                    };
                    let json = serde_json::to_string(&s).unwrap();
                    let back: Settings = serde_json::from_str(&json).unwrap();
                    assert_eq!(back, s);
                    back.check().unwrap_or_else(|e| panic!("{json}: {}", e.message));
                    let opts = back.options(shardlab::plan::Mode::Auto, &back.parallelism().unwrap());
                    assert_eq!(opts.optimizer, optimizer.optimizer(lr));
                    assert_eq!(opts.data.name(), task.name());
                }
            }
        }
    }

    #[test]
    fn hostile_task_optimizer_and_lr_values_are_refused() {
        let base = serde_json::to_value(Settings::preset(Preset::Dp)).unwrap();
        let hostile = [
            ("task", serde_json::json!("poetry")),
            ("task", serde_json::json!("Copy")),
            ("task", serde_json::json!(0)),
            ("optimizer", serde_json::json!("adam")),
            ("optimizer", serde_json::json!(null)),
            ("lr", serde_json::json!("0.1")),
            ("lr", serde_json::json!(null)),
            ("lr", serde_json::json!([0.1])),
        ];
        for (key, value) in hostile {
            let mut v = base.clone();
            v[key] = value.clone();
            assert!(serde_json::from_value::<Settings>(v).is_err(), "{key}={value}");
        }
        for key in ["task", "optimizer", "lr"] {
            let mut v = base.clone();
            v.as_object_mut().unwrap().remove(key);
            assert!(serde_json::from_value::<Settings>(v).is_err(), "without {key}");
        }
        for lr in [0.0, -0.003, 2.0, 1e-9, 1e300] {
            let s = Settings {
                lr,
                ..Settings::preset(Preset::Dp)
            };
            assert_eq!(s.check().unwrap_err().field, "lr", "{lr}");
        }
        let s = Settings {
            task: Task::Text,
            vocab: 16,
            ..Settings::preset(Preset::Dp)
        };
        assert_eq!(s.check().unwrap_err().field, "vocab");
    }

    #[test]
    fn the_optimizer_choice_is_the_core_optimizer_with_its_lr() {
        assert_eq!(Opt::Adamw.optimizer(0.003), Optimizer::AdamW { lr: 0.003 });
        assert_eq!(Opt::Sgd.optimizer(0.1), Optimizer::Sgd { lr: 0.1 });
    }
}
