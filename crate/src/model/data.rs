use super::params::SplitMix64;
use super::{GptConfig, ModelError};
use crate::setting::{Refusal, Setting};

/// One batch: inputs `tokens[:, 0:T]` and targets `tokens[:, 1:T+1]`, row-major (B, T).
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub inputs: Vec<u32>,  // (B, T)
    pub targets: Vec<u32>, // (B, T)
}

/// Where training data comes from (`--data`).
#[derive(Clone, Debug, PartialEq)]
pub enum DataSource {
    /// docs/MODEL.md's `data = formula`: the same batch every step.
    Formula,
    /// A run of symbols, a separator, then the same run again.
    Copy,
    /// A run of symbols, a separator, then the run reversed.
    Reverse,
    /// Equations `a + b = (a+b) mod p`, packed end to end.
    ModAdd,
    /// Character-level text (the file's contents).
    Text(String),
}

impl DataSource {
    pub fn name(&self) -> &'static str {
        match self {
            DataSource::Formula => "formula",
            DataSource::Copy => "copy",
            DataSource::Reverse => "reverse",
            DataSource::ModAdd => "modadd",
            DataSource::Text(_) => "text",
        }
    }

    /// Reads `--text FILE` (a regular UTF-8 file of at most [`super::MAX_TEXT_BYTES`]),
    /// rejecting what cannot be a character corpus.
    pub fn from_text_file(path: &str) -> Result<Self, ModelError> {
        let text = super::read_text_file(Setting::Text, path, super::MAX_TEXT_BYTES)?;
        if text.is_empty() {
            return Err(Refusal::at(Setting::Text, path, "is empty: give a text file with some prose in it").into());
        }
        Ok(DataSource::Text(text))
    }
}

/// A data source bound to a configuration: checked once, then yields batches by step.
pub struct Dataset {
    source: DataSource,
    batch: usize,
    seq: usize,
    vocab: usize,
    seed: u64,
    /// Text: the distinct characters (token id = position) and the encoded corpus.
    chars: Vec<char>,
    corpus: Vec<u32>,
}

/// Symbols of the copy/reverse tasks: a small alphabet, so the unpredictable first half
/// costs little and the learnable second half dominates the loss.
const TASK_SYMBOLS: usize = 8;
const MODADD_MAX_P: usize = 97;

impl Dataset {
    pub fn new(source: DataSource, cfg: &GptConfig, seed: u64) -> Result<Self, ModelError> {
        let (b, t, v) = (cfg.batch, cfg.seq, cfg.vocab);
        let mut chars = vec![];
        let mut corpus = vec![];
        match &source {
            DataSource::Formula => {}
            DataSource::Copy | DataSource::Reverse => {
                if v < 3 {
                    let why = format!(
                        "is too small for {}: it needs a separator and at least two symbols, 3 tokens (use {})",
                        Setting::Data.at(source.name()),
                        Setting::Vocab.at(16)
                    );
                    return Err(Refusal::at(Setting::Vocab, v, why).into());
                }
                if t < 3 {
                    let why = format!(
                        "is too short for {}: a sequence holds symbols, a separator and their copy; use {} or more",
                        Setting::Data.at(source.name()),
                        Setting::Seq.at(8)
                    );
                    return Err(Refusal::at(Setting::Seq, t, why).into());
                }
            }
            DataSource::ModAdd => {
                if v < 4 {
                    let why = format!(
                        "is too small for {}: it needs '+', '=' and at least two numbers, 4 tokens (use {})",
                        Setting::Data.at("modadd"),
                        Setting::Vocab.at(16)
                    );
                    return Err(Refusal::at(Setting::Vocab, v, why).into());
                }
                if t < 4 {
                    let why = format!(
                        "is too short for {}: an equation a + b = c takes five tokens, so at least its first four \
                         must fit; use {} or more",
                        Setting::Data.at("modadd"),
                        Setting::Seq.at(8)
                    );
                    return Err(Refusal::at(Setting::Seq, t, why).into());
                }
            }
            DataSource::Text(text) => {
                let mut set: Vec<char> = text.chars().collect();
                set.sort_unstable();
                set.dedup();
                if set.len() > v {
                    let why = format!(
                        "is too small for this text: it has {} distinct characters (use {})",
                        set.len(),
                        Setting::Vocab.at(set.len())
                    );
                    return Err(Refusal::at(Setting::Vocab, v, why).into());
                }
                corpus = text.chars().map(|c| set.binary_search(&c).unwrap() as u32).collect();
                if corpus.len() < t + 2 {
                    let why = format!(
                        "the text has {} characters, too short for {}: give at least {} characters or lower {}",
                        corpus.len(),
                        Setting::Seq.at(t),
                        t + 2,
                        Setting::Seq.named()
                    );
                    return Err(Refusal::new(Setting::Seq, why).into());
                }
                chars = set;
            }
        }
        Ok(Self {
            source,
            batch: b,
            seq: t,
            vocab: v,
            seed,
            chars,
            corpus,
        })
    }

    /// The characters of a text corpus (token id = index), for decoding samples.
    pub fn chars(&self) -> &[char] {
        &self.chars
    }

    /// The batch of step `step` (the formula batch ignores `step`).
    pub fn batch(&self, step: u64) -> Batch {
        let (b, t) = (self.batch, self.seq);
        let mut rng = SplitMix64(self.seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut rows = Vec::with_capacity(b * (t + 1));
        for row in 0..b {
            rows.extend(self.row(row, &mut rng));
        }
        let mut inputs = Vec::with_capacity(b * t);
        let mut targets = Vec::with_capacity(b * t);
        for r in rows.chunks(t + 1) {
            inputs.extend_from_slice(&r[..t]);
            targets.extend_from_slice(&r[1..]);
        }
        Batch { inputs, targets }
    }

    /// One row of T+1 tokens.
    fn row(&self, b: usize, rng: &mut SplitMix64) -> Vec<u32> {
        let (t, v) = (self.seq, self.vocab);
        let n = t + 1;
        match &self.source {
            DataSource::Formula => (0..n).map(|t| ((7 * b + 3 * t * t + 1) % v) as u32).collect(),
            DataSource::Copy | DataSource::Reverse => {
                // symbols 1..=k, separator 0
                let k = TASK_SYMBOLS.min(v - 1);
                let half = (n - 1) / 2;
                let run: Vec<u32> = (0..half).map(|_| 1 + (rng.next_u64() % k as u64) as u32).collect();
                let mut second = run.clone();
                if self.source == DataSource::Reverse {
                    second.reverse();
                }
                let mut row = run;
                row.push(0);
                row.extend(second);
                row.resize(n, 0);
                row
            }
            DataSource::ModAdd => {
                // tokens: numbers 0..p, then '+' = p, '=' = p + 1
                let p = (v - 2).min(MODADD_MAX_P);
                let mut row = Vec::with_capacity(n + 5);
                while row.len() < n {
                    let a = rng.next_u64() % p as u64;
                    let c = rng.next_u64() % p as u64;
                    row.extend([a as u32, p as u32, c as u32, p as u32 + 1, ((a + c) % p as u64) as u32]);
                }
                row.truncate(n);
                row
            }
            DataSource::Text(_) => {
                let start = (rng.next_u64() % (self.corpus.len() - n + 1) as u64) as usize;
                self.corpus[start..start + n].to_vec()
            }
        }
    }
}
