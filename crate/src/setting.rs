//! The settings of a run, as the core names them when it refuses one: one vocabulary for the
//! CLI, which writes a setting as its flag (`--d-model`), and the page, which puts the refusal
//! at the setting's control and writes it in its own words (`d_model`). A refusal's text
//! mentions settings through [`Setting::named`] and [`Setting::at`], which each audience
//! renders in its words: no message is searched for a flag afterwards.
use std::fmt;

/// A setting a refusal is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Setting {
    Layers,
    DModel,
    Heads,
    Seq,
    Batch,
    Vocab,
    Tied,
    Dropout,
    Attention,
    Remat,
    Precision,
    /// A mixture-of-experts MLP's experts (0: the dense MLP).
    Experts,
    TopK,
    ExpertWidth,
    /// The experts' capacity: a factor, or dropless.
    Capacity,
    /// Switch's load-balancing loss coefficient.
    AuxLoss,
    /// The busiest expert-parallel device's routed tokens over the mean, as pricing assumes.
    ExpertImbalance,
    Optimizer,
    Lr,
    Data,
    Text,
    Seed,
    Steps,
    Mode,
    /// The mesh as a whole (its axes, their names and order).
    Mesh,
    /// The size of one mesh axis, by name.
    MeshAxis(String),
    /// The type of one mesh axis (explicit, auto or manual), by name.
    AxisType(String),
    /// ZeRO's stage on "dp".
    Zero,
    SequenceParallel,
    CpOrder,
    Schedule,
    /// Chunks of blocks per pipeline stage (interleaved schedules).
    VirtualStages,
    /// Blocks per pipeline stage, one count per stage.
    StageLayers,
    Microbatches,
    DropoutKey,
    Rng,
    CombineAllReduces,
    /// A sharding override, by the value it names.
    Spec(String),
    /// A file of sharding overrides.
    SpecFile,
    /// A file of published runs to price.
    Table,
    Strategy,
    Preset,
    Device,
    Devices,
    MemoryBudget,
}

/// Who reads a refusal: the command line or the page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    Cli,
    Page,
}

/// Marks a mention in a message: START, the setting's index and, after SEP, its value, then
/// END. Control characters no message otherwise holds.
const START: char = '\u{1}';
const SEP: char = '\u{1f}';
const END: char = '\u{2}';

impl Setting {
    /// Every setting without a payload, in one list, so a mention can be read back.
    const PLAIN: [Setting; 42] = [
        Setting::Layers,
        Setting::DModel,
        Setting::Heads,
        Setting::Seq,
        Setting::Batch,
        Setting::Vocab,
        Setting::Tied,
        Setting::Dropout,
        Setting::Attention,
        Setting::Remat,
        Setting::Precision,
        Setting::Experts,
        Setting::TopK,
        Setting::ExpertWidth,
        Setting::Capacity,
        Setting::AuxLoss,
        Setting::ExpertImbalance,
        Setting::Optimizer,
        Setting::Lr,
        Setting::Data,
        Setting::Text,
        Setting::Seed,
        Setting::Steps,
        Setting::Mode,
        Setting::Mesh,
        Setting::Zero,
        Setting::SequenceParallel,
        Setting::CpOrder,
        Setting::Schedule,
        Setting::VirtualStages,
        Setting::StageLayers,
        Setting::Microbatches,
        Setting::DropoutKey,
        Setting::Rng,
        Setting::CombineAllReduces,
        Setting::SpecFile,
        Setting::Table,
        Setting::Strategy,
        Setting::Preset,
        Setting::Device,
        Setting::Devices,
        Setting::MemoryBudget,
    ];

    /// The CLI's flag.
    pub fn flag(&self) -> String {
        match self {
            Setting::MeshAxis(_) => "--mesh".into(),
            Setting::AxisType(_) => "--axis-types".into(),
            Setting::Spec(_) => "--spec".into(),
            Setting::Optimizer => "--opt".into(),
            Setting::Data => "--data".into(),
            Setting::CombineAllReduces => "--combine-all-reduces".into(),
            other => format!("--{}", other.key().replace('_', "-")),
        }
    }

    /// The page's control (and its link's key): `d_model`, `mesh.tp`, `spec.w_fc`.
    pub fn key(&self) -> String {
        let key = match self {
            Setting::Layers => "layers",
            Setting::DModel => "d_model",
            Setting::Heads => "heads",
            Setting::Seq => "seq",
            Setting::Batch => "batch",
            Setting::Vocab => "vocab",
            Setting::Tied => "tied",
            Setting::Dropout => "dropout",
            Setting::Attention => "attention",
            Setting::Remat => "remat",
            Setting::Precision => "precision",
            Setting::Experts => "experts",
            Setting::TopK => "top_k",
            Setting::ExpertWidth => "expert_width",
            Setting::Capacity => "capacity",
            Setting::AuxLoss => "aux_loss",
            Setting::ExpertImbalance => "expert_imbalance",
            Setting::Optimizer => "optimizer",
            Setting::Lr => "lr",
            Setting::Data => "task",
            Setting::Text => "text",
            Setting::Seed => "seed",
            Setting::Steps => "steps",
            Setting::Mode => "mode",
            Setting::Mesh => "mesh",
            Setting::MeshAxis(axis) => return format!("mesh.{axis}"),
            Setting::AxisType(axis) => return format!("axis_type.{axis}"),
            Setting::Zero => "zero",
            Setting::SequenceParallel => "sequence_parallel",
            Setting::CpOrder => "cp_order",
            Setting::Schedule => "schedule",
            Setting::VirtualStages => "virtual_stages",
            Setting::StageLayers => "stage_layers",
            Setting::Microbatches => "microbatches",
            Setting::DropoutKey => "dropout_key",
            Setting::Rng => "rng",
            Setting::CombineAllReduces => "combine",
            Setting::Spec(name) => return format!("spec.{name}"),
            Setting::SpecFile => "spec_file",
            Setting::Table => "table",
            Setting::Strategy => "strategy",
            Setting::Preset => "preset",
            Setting::Device => "device",
            Setting::Devices => "devices",
            Setting::MemoryBudget => "memory_budget",
        };
        key.into()
    }

    /// The setting in the page's words: its control's label.
    pub fn label(&self) -> String {
        match self {
            Setting::Lr => "learning rate".into(),
            Setting::Rng => "RNG layout".into(),
            Setting::DropoutKey => "shard_map key".into(),
            Setting::CpOrder => "cp order".into(),
            Setting::VirtualStages => "virtual stages".into(),
            Setting::StageLayers => "stage layers".into(),
            Setting::SequenceParallel => "sequence parallelism".into(),
            Setting::Zero => "ZeRO stage".into(),
            Setting::Device => "device kind".into(),
            Setting::MeshAxis(axis) => format!("mesh axis {axis}"),
            Setting::AxisType(axis) => format!("axis type of {axis}"),
            Setting::Spec(name) => format!("the spec of {name}"),
            Setting::CombineAllReduces => "all-reduce combiner".into(),
            Setting::TopK => "top-k".into(),
            Setting::ExpertWidth => "expert width".into(),
            Setting::Capacity => "capacity factor".into(),
            Setting::AuxLoss => "load-balancing loss".into(),
            Setting::ExpertImbalance => "expert imbalance".into(),
            other => other.key(),
        }
    }

    /// A mention of the setting in a message, which each audience renders in its words.
    pub fn named(&self) -> String {
        self.mark(None)
    }

    /// A mention of the setting at `value` (`--seq 64`, `seq 64`; a mesh axis as `pp=4`).
    pub fn at(&self, value: impl fmt::Display) -> String {
        self.mark(Some(value.to_string()))
    }

    fn mark(&self, value: Option<String>) -> String {
        let id = match self {
            Setting::MeshAxis(axis) => format!("mesh.{axis}"),
            Setting::AxisType(axis) => format!("axis_type.{axis}"),
            Setting::Spec(name) => format!("spec.{name}"),
            other => other.key(),
        };
        match value {
            Some(v) => format!("{START}{id}{SEP}{v}{END}"),
            None => format!("{START}{id}{END}"),
        }
    }

    /// The setting a mention's id names.
    fn of_id(id: &str) -> Option<Setting> {
        if let Some(axis) = id.strip_prefix("mesh.") {
            return Some(Setting::MeshAxis(axis.into()));
        }
        if let Some(axis) = id.strip_prefix("axis_type.") {
            return Some(Setting::AxisType(axis.into()));
        }
        if let Some(name) = id.strip_prefix("spec.") {
            return Some(Setting::Spec(name.into()));
        }
        Setting::PLAIN.into_iter().find(|s| s.key() == id)
    }

    fn render(&self, value: Option<&str>, to: Audience) -> String {
        match (to, self, value) {
            (Audience::Cli, Setting::MeshAxis(axis), Some(v)) => format!("--mesh {axis}={v}"),
            (Audience::Cli, Setting::AxisType(axis), Some(v)) => format!("--axis-types {axis}={v}"),
            (Audience::Cli, Setting::Spec(name), Some(v)) => format!("--spec {name}={v}"),
            (Audience::Cli, Setting::Spec(name), None) => format!("--spec {name}"),
            (Audience::Cli, s, Some(v)) => format!("{} {v}", s.flag()),
            (Audience::Cli, s, None) => s.flag(),
            (Audience::Page, Setting::MeshAxis(axis), Some(v)) => format!("{axis}={v}"),
            (Audience::Page, Setting::AxisType(axis), Some(v)) => format!("{axis} {v}"),
            (Audience::Page, Setting::Spec(name), Some(v)) => format!("{name}={v}"),
            (Audience::Page, s, Some(v)) => format!("{} {v}", s.label()),
            (Audience::Page, s, None) => s.label(),
        }
    }
}

/// `a`, `a or b`, `a, b or c`: the settings mentioned as alternatives.
pub fn one_of(settings: &[Setting]) -> String {
    let named: Vec<String> = settings.iter().map(Setting::named).collect();
    match named.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// `text` with every mention rendered for `to`.
pub fn render(text: &str, to: Audience) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(START) {
        out.push_str(&rest[..start]);
        let after = &rest[start + START.len_utf8()..];
        let Some(end) = after.find(END) else {
            out.push_str(after);
            return out;
        };
        let mention = &after[..end];
        let (id, value) = match mention.split_once(SEP) {
            Some((id, v)) => (id, Some(v)),
            None => (mention, None),
        };
        match Setting::of_id(id) {
            Some(s) => out.push_str(&s.render(value, to)),
            None => out.push_str(value.unwrap_or(id)),
        }
        rest = &after[end + END.len_utf8()..];
    }
    out.push_str(rest);
    out
}

/// A refusal of one setting: the setting (where the page puts it) and why, with the fix.
/// Displayed in the CLI's words; [`Refusal::text`] gives either audience's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub setting: Setting,
    /// The message, its mentions of settings marked ([`Setting::named`], [`Setting::at`]).
    message: String,
}

impl Refusal {
    /// `setting` at `value` refused: `"--seq 63: {why}"` on the command line.
    pub fn at(setting: Setting, value: impl fmt::Display, why: impl fmt::Display) -> Self {
        let message = format!("{}: {why}", setting.at(value));
        Self { setting, message }
    }

    /// `setting` refused, named without a value: `"--sequence-parallel: {why}"`.
    pub fn named(setting: Setting, why: impl fmt::Display) -> Self {
        let message = format!("{}: {why}", setting.named());
        Self { setting, message }
    }

    /// A refusal whose whole message is `message` (it names the setting itself).
    pub fn new(setting: Setting, message: impl Into<String>) -> Self {
        Self {
            setting,
            message: message.into(),
        }
    }

    /// The message in `to`'s words.
    pub fn text(&self, to: Audience) -> String {
        render(&self.message, to)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text(Audience::Cli))
    }
}

impl std::error::Error for Refusal {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_reads_as_flags_on_the_command_line_and_as_labels_on_the_page() {
        let r = Refusal::at(
            Setting::Seq,
            63,
            format!(
                "does not split over cp; use {} or {}",
                Setting::CpOrder.at("contiguous"),
                Setting::Lr.named()
            ),
        );
        assert_eq!(r.setting, Setting::Seq);
        assert_eq!(
            r.to_string(),
            "--seq 63: does not split over cp; use --cp-order contiguous or --lr"
        );
        assert_eq!(
            r.text(Audience::Page),
            "seq 63: does not split over cp; use cp order contiguous or learning rate"
        );
    }

    #[test]
    fn every_setting_is_read_back_from_its_mention() {
        let mut all = Setting::PLAIN.to_vec();
        all.extend([
            Setting::MeshAxis("tp".into()),
            Setting::AxisType("tp".into()),
            Setting::Spec("h0.w_fc".into()),
        ]);
        for s in all {
            let id = match &s {
                Setting::MeshAxis(a) => format!("mesh.{a}"),
                Setting::AxisType(a) => format!("axis_type.{a}"),
                Setting::Spec(n) => format!("spec.{n}"),
                other => other.key(),
            };
            assert_eq!(Setting::of_id(&id), Some(s.clone()), "{s:?}");
            assert!(!render(&s.named(), Audience::Cli).contains(START), "{s:?}");
        }
        assert_eq!(
            render(&Setting::MeshAxis("pp".into()).at(4), Audience::Cli),
            "--mesh pp=4"
        );
        assert_eq!(render(&Setting::DModel.named(), Audience::Cli), "--d-model");
        assert_eq!(
            render(&Setting::AxisType("tp".into()).at("auto"), Audience::Cli),
            "--axis-types tp=auto"
        );
        assert_eq!(
            render(&Setting::CombineAllReduces.named(), Audience::Cli),
            "--combine-all-reduces"
        );
    }
}
