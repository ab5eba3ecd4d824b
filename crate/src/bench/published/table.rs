//! The table of published training runs (docs/published_runs.md), read cell by cell: a row
//! that does not parse is refused with its row number, its name, the cell and the fix.
use crate::ir::{CpOrder, Precision};
use crate::model::{Attention, Capacity, GptConfig, Moe, Remat};
use crate::plan::{parse_stage_layers, AxisKind, Mode, Schedule, Zero};
use crate::sharding::Mesh;

/// The table shipped with shardlab.
pub const TABLE: &str = include_str!("../../../../docs/published_runs.md");
/// Where it lives in the repository, as errors name it.
pub const TABLE_PATH: &str = "docs/published_runs.md";

/// The columns, in order, as the header row names them.
const COLUMNS: [&str; 9] = [
    "run",
    "model",
    "hardware",
    "parallelism",
    "precision",
    "batch",
    "levers",
    "published",
    "source",
];

/// A row that cannot be read, and why, in one line.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct TableError(pub String);

/// What a run's source publishes: one step's wall time, a throughput per device, or the
/// FLOP/s each device achieved by the paper's count of a step's FLOPs.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Published {
    StepSeconds(f64),
    TokensPerSecondPerDevice(f64),
    FlopsPerDevice { flops: f64, count: FlopCount },
}

/// How a paper counts one step's FLOPs, to turn its FLOP/s per device into a step time.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlopCount {
    /// Narayanan et al. 2021 (Megatron-LM), section 5.1: `96 B s l h^2 (1 + s/(6h) + V/(16 l h))`
    /// a step, with activation recomputation (a second forward pass) counted.
    Megatron,
    /// The model FLOPs of MFU (Chowdhery et al. 2022, PaLM, appendix B): `6 N + 12 l h s` a
    /// token, for a model of `params` parameters (the published model's, where the row prices
    /// a stand-in of the same FLOPs).
    SixN { params: f64 },
}

impl FlopCount {
    /// The FLOPs of one step of `cfg` (its global batch) by this count.
    pub fn step_flops(self, cfg: &GptConfig) -> f64 {
        let (b, s, l, h, v) = (
            cfg.batch as f64,
            cfg.seq as f64,
            cfg.layers as f64,
            cfg.d_model as f64,
            cfg.vocab as f64,
        );
        match self {
            FlopCount::Megatron => 96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h)),
            FlopCount::SixN { params } => b * s * (6.0 * params + 12.0 * l * h * s),
        }
    }
}

/// One published run, as its row says it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PublishedRun {
    /// Its position among the table's runs, from 1.
    pub row: usize,
    pub name: String,
    /// The model, the global batch and sequence, the dtype policy, attention and remat.
    pub config: GptConfig,
    /// A device preset's name and how many devices.
    pub device: String,
    pub devices: usize,
    /// The named strategy as the row writes it (it may name one shardlab does not build yet);
    /// None where the row gives a composition by its mesh alone.
    pub strategy: Option<String>,
    #[serde(serialize_with = "mesh_text")]
    pub mesh: Mesh,
    pub mode: Mode,
    /// ZeRO's stage on "dp" (`zero=1`).
    pub zero: Zero,
    /// Sequence parallelism on "tp" (`sp`).
    pub sequence_parallel: bool,
    /// A pipeline's schedule (`schedule=1f1b`).
    pub schedule: Schedule,
    /// Context parallelism's order (`order=zigzag`).
    pub cp_order: CpOrder,
    /// A pipeline's virtual stages: chunks of blocks per stage (`virtual=8`; 1 without).
    pub virtual_stages: usize,
    /// Blocks per pipeline stage, or per virtual stage, where they are not equal
    /// (`stages=7,8,8,7`; empty: equal).
    pub stage_layers: Vec<usize>,
    /// Gradient accumulation: the step in this many slices of the batch (a pipeline's
    /// microbatches).
    pub microbatches: usize,
    pub published: Published,
    pub source: String,
}

fn mesh_text<S: serde::Serializer>(mesh: &Mesh, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&mesh.to_string())
}

impl PublishedRun {
    /// The published step in seconds (a throughput converted by the step's tokens).
    pub fn published_seconds(&self) -> f64 {
        match self.published {
            Published::StepSeconds(s) => s,
            Published::TokensPerSecondPerDevice(r) => {
                (self.config.batch * self.config.seq) as f64 / (r * self.devices as f64)
            }
            Published::FlopsPerDevice { flops, count } => {
                count.step_flops(&self.config) / (flops * self.devices as f64)
            }
        }
    }
}

/// Every run of `text` (a table in docs/published_runs.md's form); `file` names it in errors.
pub fn parse_table(text: &str, file: &str) -> Result<Vec<PublishedRun>, TableError> {
    let mut rows = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.trim_start().starts_with('|'));
    let Some((header_line, header)) = rows.next() else {
        return Err(TableError(format!(
            "{file}: no table: write a header row `| {} |` and one row per run",
            COLUMNS.join(" | ")
        )));
    };
    let names = cells(header);
    if names != COLUMNS {
        return Err(TableError(format!(
            "{file} line {}: the header row is `{}`; it must be `| {} |`",
            header_line + 1,
            header.trim(),
            COLUMNS.join(" | ")
        )));
    }
    let mut runs = vec![];
    for (line, text) in rows {
        let row = cells(text);
        // The separator row under the header.
        if row
            .iter()
            .all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':')))
        {
            continue;
        }
        let n = runs.len() + 1;
        let name = row.first().cloned().unwrap_or_default();
        let at = |why: String| TableError(format!("{file} row {n} (line {}, `{name}`): {why}", line + 1));
        if row.len() != COLUMNS.len() {
            return Err(at(format!(
                "{} cells where the table has {} columns ({}): a `|` inside a cell, or one missing",
                row.len(),
                COLUMNS.len(),
                COLUMNS.join(", ")
            )));
        }
        runs.push(parse_row(n, &row).map_err(at)?);
    }
    if runs.is_empty() {
        return Err(TableError(format!("{file}: the table has no runs")));
    }
    Ok(runs)
}

/// The cells of a `| a | b |` row, trimmed.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner.split('|').map(|c| c.trim().to_string()).collect()
}

fn number<T: std::str::FromStr>(column: &str, key: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{column} `{key}={text}`: `{text}` is not a number (write e.g. {key}=12)"))
}

/// `key=value` and bare words of a cell.
fn pairs(cell: &str) -> Vec<(&str, Option<&str>)> {
    cell.split_whitespace()
        .map(|w| match w.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (w, None),
        })
        .collect()
}

fn parse_row(row: usize, c: &[String]) -> Result<PublishedRun, String> {
    let name = c[0].clone();
    if name.is_empty() {
        return Err("the run has no name: write one in the first cell".into());
    }
    let mut config = parse_model(&c[1])?;
    let (devices, device) = parse_hardware(&c[2])?;
    let p = parse_parallelism(&c[3])?;
    config.precision = Precision::parse(&c[4]).ok_or_else(|| format!("precision `{}`: write f32 or bf16", c[4]))?;
    (config.batch, config.seq) = parse_batch(&c[5])?;
    let microbatches = parse_levers(&c[6], &mut config)?;
    let published = parse_published(&c[7])?;
    if c[8].is_empty() {
        return Err("source: empty; say where the configuration and the figure are published".into());
    }
    config.validate().map_err(|e| format!("model: {e}"))?;
    if p.mesh.devices() != devices {
        return Err(format!(
            "parallelism: the mesh `{}` has {} devices but the hardware `{}` has {devices}: make them agree",
            crate::plan::mesh_text(&p.mesh),
            p.mesh.devices(),
            c[2]
        ));
    }
    // The data axes split the batch; each of their shards into the microbatches.
    let shards: usize = [AxisKind::Dp, AxisKind::Fsdp]
        .iter()
        .map(|k| p.mesh.size_of(k.name()).unwrap_or(1))
        .product();
    if microbatches == 0 || !config.batch.is_multiple_of(microbatches * shards) {
        return Err(format!(
            "levers: microbatches={microbatches} with batch {} over {shards} data-parallel shards: each shard's rows \
             must split into the microbatches evenly",
            config.batch,
        ));
    }
    Ok(PublishedRun {
        row,
        name,
        config,
        device,
        devices,
        strategy: p.strategy,
        mesh: p.mesh,
        mode: p.mode,
        zero: p.zero,
        sequence_parallel: p.sequence_parallel,
        schedule: p.schedule,
        cp_order: p.cp_order,
        virtual_stages: p.virtual_stages,
        stage_layers: p.stage_layers,
        microbatches,
        published,
        source: c[8].clone(),
    })
}

/// A mixture's keys of a model cell, as written: experts= makes the MLP a mixture, the
/// others refine Switch's defaults ([`Moe::new`]).
#[derive(Default)]
struct MoeCell {
    experts: usize,
    top_k: Option<usize>,
    width: Option<usize>,
    capacity: Option<Capacity>,
    imbalance: Option<f32>,
}

impl MoeCell {
    fn build(&self, d_model: usize) -> Result<Option<Moe>, String> {
        if self.experts == 0 {
            return match (self.top_k, self.width, self.capacity, self.imbalance) {
                (None, None, None, None) => Ok(None),
                _ => {
                    Err("model: top_k=, expert_width=, capacity= and imbalance= refine a mixture: add experts=".into())
                }
            };
        }
        let m = Moe::new(self.experts, d_model);
        Ok(Some(Moe {
            top_k: self.top_k.unwrap_or(m.top_k),
            width: self.width.unwrap_or(m.width),
            capacity: self.capacity.unwrap_or(m.capacity),
            imbalance: self.imbalance.unwrap_or(m.imbalance),
            ..m
        }))
    }
}

fn parse_model(cell: &str) -> Result<GptConfig, String> {
    let mut moe = MoeCell::default();
    let mut config = GptConfig {
        layers: 0,
        d_model: 0,
        heads: 0,
        seq: 1,
        batch: 1,
        vocab: 0,
        tied: false,
        dropout: 0.0,
        attention: Attention::Fused,
        remat: Remat::None,
        precision: Precision::F32,
        moe: None,
    };
    for (key, value) in pairs(cell) {
        match (key, value) {
            ("tied", None) => config.tied = true,
            ("layers", Some(v)) => config.layers = number("model", key, v)?,
            ("d_model", Some(v)) => config.d_model = number("model", key, v)?,
            ("heads", Some(v)) => config.heads = number("model", key, v)?,
            ("vocab", Some(v)) => config.vocab = number("model", key, v)?,
            ("dropout", Some(v)) => config.dropout = number("model", key, v)?,
            ("experts", Some(v)) => moe.experts = number("model", key, v)?,
            ("top_k", Some(v)) => moe.top_k = Some(number("model", key, v)?),
            ("expert_width", Some(v)) => moe.width = Some(number("model", key, v)?),
            ("capacity", Some(v)) => {
                moe.capacity = Some(Capacity::parse(v).ok_or_else(|| {
                    format!("model `capacity={v}`: write a factor (capacity=1.25) or capacity=dropless")
                })?)
            }
            ("imbalance", Some(v)) => moe.imbalance = Some(number("model", key, v)?),
            _ => {
                return Err(format!(
                    "model `{key}`: not a model setting; write layers=, d_model=, heads=, vocab=, dropout=, tied, or a \
                     mixture's experts=, top_k=, expert_width=, capacity=, imbalance="
                ))
            }
        }
    }
    config.moe = moe.build(config.d_model)?;
    for (key, value) in [
        ("layers", config.layers),
        ("d_model", config.d_model),
        ("heads", config.heads),
        ("vocab", config.vocab),
    ] {
        if value == 0 {
            return Err(format!(
                "model: no {key}=; the model needs layers, d_model, heads and vocab"
            ));
        }
    }
    Ok(config)
}

fn parse_hardware(cell: &str) -> Result<(usize, String), String> {
    let words: Vec<&str> = cell.split_whitespace().collect();
    match words[..] {
        [n, "x", device] => {
            let n: usize = n
                .parse()
                .map_err(|_| format!("hardware `{cell}`: `{n}` is not a device count; write e.g. 8 x a100"))?;
            if n == 0 {
                return Err(format!("hardware `{cell}`: no devices; write e.g. 8 x a100"));
            }
            Ok((n, device.to_string()))
        }
        _ => Err(format!("hardware `{cell}`: write N x DEVICE, e.g. 8 x a100")),
    }
}

/// A row's parallelism cell, read.
struct ParallelismCell {
    strategy: Option<String>,
    mesh: Mesh,
    mode: Mode,
    zero: Zero,
    sequence_parallel: bool,
    schedule: Schedule,
    cp_order: CpOrder,
    virtual_stages: usize,
    stage_layers: Vec<usize>,
}

/// `[STRATEGY] MESH [mode=M] [zero=1|2] [sp] [schedule=S] [order=O] [virtual=V] [stages=N,N,...]`:
/// a named strategy and its mesh, or a composition by its mesh alone, then the options that
/// refine its axes.
fn parse_parallelism(cell: &str) -> Result<ParallelismCell, String> {
    let words: Vec<&str> = cell.split_whitespace().collect();
    let (strategy, mesh, rest) = match &words[..] {
        [mesh, rest @ ..] if mesh.contains('=') => (None, *mesh, rest),
        [strategy, mesh, rest @ ..] => (Some(strategy.to_string()), *mesh, rest),
        _ => {
            return Err(format!(
                "parallelism `{cell}`: write a strategy and its mesh (e.g. dp dp=8), or a mesh (e.g. tp=8,pp=2,dp=4)"
            ))
        }
    };
    let mesh = Mesh::parse(mesh).map_err(|e| format!("parallelism `{cell}`: mesh `{mesh}`: {e}"))?;
    let mut p = ParallelismCell {
        strategy,
        mesh,
        mode: Mode::ShardMap,
        zero: Zero::Off,
        sequence_parallel: false,
        schedule: Schedule::default(),
        cp_order: CpOrder::default(),
        virtual_stages: 1,
        stage_layers: vec![],
    };
    for w in rest {
        let bad = || {
            format!(
                "parallelism `{cell}`: `{w}`: write mode=auto|shard_map, zero=1|2, sp, schedule=gpipe|1f1b|zb_h1, \
                 order=contiguous|zigzag, virtual=V (virtual stages) or stages=N,N,... (blocks per pipeline stage or \
                 virtual stage) after the mesh"
            )
        };
        match w.split_once('=') {
            Some(("mode", m)) => {
                p.mode = Mode::parse(m).filter(|m| *m != Mode::Single).ok_or_else(bad)?;
            }
            Some(("zero", z)) => p.zero = Zero::parse(z).ok_or_else(bad)?,
            Some(("schedule", s)) => p.schedule = Schedule::parse(s).ok_or_else(bad)?,
            Some(("order", o)) => p.cp_order = CpOrder::ALL.into_iter().find(|c| c.name() == o).ok_or_else(bad)?,
            Some(("virtual", v)) => p.virtual_stages = v.parse().ok().filter(|&v| v > 0).ok_or_else(bad)?,
            Some(("stages", n)) => {
                p.stage_layers = parse_stage_layers(n).map_err(|e| format!("parallelism `{cell}`: stages={n}: {e}"))?;
            }
            None if *w == "sp" => p.sequence_parallel = true,
            _ => return Err(bad()),
        }
    }
    Ok(p)
}

fn parse_batch(cell: &str) -> Result<(usize, usize), String> {
    let words: Vec<&str> = cell.split_whitespace().collect();
    let bad = || format!("batch `{cell}`: write GLOBAL x SEQ, e.g. 512 x 1024 (sequences a step, tokens each)");
    match words[..] {
        [b, "x", t] => Ok((b.parse().map_err(|_| bad())?, t.parse().map_err(|_| bad())?)),
        _ => Err(bad()),
    }
}

/// Sets attention and remat on `config`; returns the microbatches.
fn parse_levers(cell: &str, config: &mut GptConfig) -> Result<usize, String> {
    let mut microbatches = 1;
    for (key, value) in pairs(cell) {
        let value = value.unwrap_or("");
        match key {
            "attention" => {
                config.attention = Attention::ALL
                    .into_iter()
                    .find(|a| a.name() == value)
                    .ok_or_else(|| format!("levers `attention={value}`: write attention=fused or attention=unfused"))?
            }
            "remat" => {
                config.remat = Remat::parse(value)
                    .ok_or_else(|| format!("levers `remat={value}`: write remat=none, remat=full or remat=dots"))?
            }
            "microbatches" => microbatches = number("levers", key, value)?,
            _ => {
                return Err(format!(
                    "levers `{key}`: not a lever; write attention=, remat= or microbatches="
                ))
            }
        }
    }
    Ok(microbatches)
}

fn parse_published(cell: &str) -> Result<Published, String> {
    let words: Vec<&str> = cell.split_whitespace().collect();
    let bad = || {
        format!(
            "published `{cell}`: write `T ms/step`, `T s/step`, `R tokens/s/device`, `R TFLOP/s/device megatron` or `R \
             TFLOP/s/device 6N N=PARAMS`"
        )
    };
    let (value, unit, count) = match words[..] {
        [value, unit] => (value, unit, None),
        [value, unit, ref count @ ..] => (value, unit, Some(count)),
        _ => return Err(bad()),
    };
    let v: f64 = value.trim_start_matches('~').parse().map_err(|_| bad())?;
    if !(v.is_finite() && v > 0.0) {
        return Err(bad());
    }
    let count = match count {
        None => None,
        Some(["megatron"]) => Some(FlopCount::Megatron),
        Some(["6N", n]) => {
            let params: f64 = n.strip_prefix("N=").and_then(|n| n.parse().ok()).ok_or_else(bad)?;
            if !(params.is_finite() && params > 0.0) {
                return Err(bad());
            }
            Some(FlopCount::SixN { params })
        }
        Some(_) => return Err(bad()),
    };
    match (unit, count) {
        ("ms/step", None) => Ok(Published::StepSeconds(v * 1e-3)),
        ("s/step", None) => Ok(Published::StepSeconds(v)),
        ("tokens/s/device", None) => Ok(Published::TokensPerSecondPerDevice(v)),
        ("TFLOP/s/device", Some(count)) => Ok(Published::FlopsPerDevice { flops: v * 1e12, count }),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "| run | model | hardware | parallelism | precision | batch | levers | published | source |\n|---|---|---|---|---|---|---|---|---|\n";
    const GOOD: &str = "| a | layers=2 d_model=64 heads=4 vocab=64 tied | 8 x a100 | dp dp=8 | bf16 | 16 x 32 | microbatches=2 | 12 ms/step | here |";

    #[test]
    fn the_shipped_table_parses_and_every_run_names_its_source() {
        let runs = parse_table(TABLE, TABLE_PATH).unwrap();
        assert!(runs.len() >= 2, "{runs:?}");
        let first = &runs[0];
        assert_eq!(first.name, "llm.c GPT-2 124M");
        assert_eq!(
            (first.config.layers, first.config.d_model, first.config.heads),
            (12, 768, 12)
        );
        assert_eq!((first.config.batch, first.config.seq, first.devices), (512, 1024, 8));
        assert_eq!(first.config.precision, Precision::Bf16);
        assert!((first.published_seconds() - 0.3).abs() < 1e-12);
        assert!(runs.iter().all(|r| r.source.contains("llm.c") || !r.source.is_empty()));
    }

    #[test]
    fn a_good_row_reads_every_cell() {
        let runs = parse_table(&format!("{HEADER}{GOOD}\n"), "t.md").unwrap();
        let r = &runs[0];
        assert!(r.config.tied);
        assert_eq!(r.microbatches, 2);
        assert_eq!(r.mode, Mode::ShardMap);
        assert_eq!(r.published, Published::StepSeconds(0.012));
        // A throughput converts by the step's tokens: 16 x 32 tokens over 8 devices at 64 each.
        let t = GOOD.replace("12 ms/step", "64 tokens/s/device");
        let r = &parse_table(&format!("{HEADER}{t}\n"), "t.md").unwrap()[0];
        assert!((r.published_seconds() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn a_row_that_does_not_parse_is_refused_naming_the_row_the_cell_and_the_fix() {
        for (bad, cell) in [
            (GOOD.replace("heads=4", "heads=four"), "`heads=four`"),
            (GOOD.replace("8 x a100", "eight a100"), "hardware `eight a100`"),
            (GOOD.replace("dp dp=8", "dp dp=4"), "has 4 devices"),
            (GOOD.replace("bf16", "fp8"), "precision `fp8`"),
            (GOOD.replace("12 ms/step", "fast"), "published `fast`"),
            (GOOD.replace(" tied", " tied capacity=2"), "add experts="),
            (
                GOOD.replace(" tied", " tied experts=4 capacity=lots"),
                "capacity=dropless",
            ),
            (GOOD.replace(" tied", " tied experts=4 imbalance=0.5"), "at least 1"),
            (
                GOOD.replace("dp dp=8", "dp dp=8 stages=1,x"),
                "stages=1,x: 'x' is no block count",
            ),
            (GOOD.replace("microbatches=2", "microbatches=3"), "microbatches=3"),
            (GOOD.replace(" here |", " |"), "source: empty"),
            (GOOD.replace("| here |", "| he | re |"), "10 cells"),
        ] {
            let text = format!("{HEADER}{GOOD}\n{bad}\n");
            let e = parse_table(&text, "t.md").unwrap_err().0;
            assert!(e.starts_with("t.md row 2 (line 4, `a`): "), "{e}");
            assert!(e.contains(cell), "{cell}: {e}");
        }
        let e = parse_table("| run | model |\n", "t.md").unwrap_err().0;
        assert!(e.contains("header row"), "{e}");
    }
}
