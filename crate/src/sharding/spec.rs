//! `PartitionSpec`: for each array dimension, the mesh axes that shard it.
use std::fmt;

use super::error::{py_axes, ShardingError};
use super::mesh::is_axis_name;

/// Per dimension: `None` (replicated), one mesh axis, or a tuple of axes (the first major).
/// Entries past the end are `None`. Canonical as in JAX: an empty tuple is `None` and a
/// one-element tuple is that axis, so `P(('dp',)) == P('dp')`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct PartitionSpec {
    entries: Vec<Vec<String>>,
}

impl PartitionSpec {
    /// From per-dimension axis lists (`[]` = None): `vec![vec!["dp".into(), "tp".into()], vec![]]`
    /// is `P(('dp', 'tp'), None)`.
    pub fn new(entries: Vec<Vec<String>>) -> Self {
        Self { entries }
    }

    /// `P()`: replicated on every device.
    pub fn replicated() -> Self {
        Self::default()
    }

    /// One axis or None per dimension: `PartitionSpec::from_axes(&[Some("dp"), None])` is `P('dp', None)`.
    pub fn from_axes(entries: &[Option<&str>]) -> Self {
        Self::new(
            entries
                .iter()
                .map(|e| e.iter().map(|a| a.to_string()).collect())
                .collect(),
        )
    }

    /// A tuple of axes (possibly empty = None) per dimension: `from_tuples(&[&["dp", "tp"], &[]])`
    /// is `P(('dp', 'tp'), None)`.
    pub fn from_tuples(entries: &[&[&str]]) -> Self {
        Self::new(
            entries
                .iter()
                .map(|e| e.iter().map(|a| a.to_string()).collect())
                .collect(),
        )
    }

    /// Parses `P('dp', None)`, `P("dp")`, `P(('dp', 'tp'), None)`, `P()` or `PartitionSpec(...)`,
    /// with single or double quotes, spaces and trailing commas as Python allows.
    pub fn parse(text: &str) -> Result<Self, ShardingError> {
        Parser { text, at: 0 }.spec()
    }

    /// Per dimension, the axes that shard it (empty = replicated).
    pub fn entries(&self) -> &[Vec<String>] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The axes sharding dimension `dim` (empty past the end of the spec).
    pub fn dim_axes(&self, dim: usize) -> Vec<&str> {
        self.entries
            .get(dim)
            .map(|e| e.iter().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// Every mesh axis the spec uses, in order of appearance.
    pub fn mesh_axes(&self) -> Vec<&str> {
        self.entries.iter().flatten().map(String::as_str).collect()
    }

    /// As a JAX program writes it: `P('dp', None)`, `P()`.
    pub fn p_text(&self) -> String {
        let entries: Vec<String> = self
            .entries
            .iter()
            .map(|e| if e.is_empty() { "None".to_string() } else { py_axes(e) })
            .collect();
        format!("P({})", entries.join(", "))
    }

    /// Whether some dimension is sharded over `axis`.
    pub fn uses_axis(&self, axis: &str) -> bool {
        self.entries.iter().flatten().any(|a| a == axis)
    }
}

/// As JAX prints it: `PartitionSpec('dp', None)`, `PartitionSpec(('dp', 'tp'),)`, `PartitionSpec()`
/// (a one-entry spec keeps Python's trailing tuple comma: `PartitionSpec('dp',)`).
impl fmt::Display for PartitionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entries: Vec<String> = self
            .entries
            .iter()
            .map(|e| if e.is_empty() { "None".to_string() } else { py_axes(e) })
            .collect();
        let trailing = if entries.len() == 1 { "," } else { "" };
        write!(f, "PartitionSpec({}{trailing})", entries.join(", "))
    }
}

/// Recursive descent over the Python-like syntax of a spec.
struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl Parser<'_> {
    fn error(&self, reason: impl Into<String>) -> ShardingError {
        ShardingError::SpecSyntax {
            text: self.text.to_string(),
            reason: reason.into(),
        }
    }

    fn rest(&self) -> &str {
        &self.text[self.at..]
    }

    fn skip_spaces(&mut self) {
        let rest = self.rest();
        self.at += rest.len() - rest.trim_start().len();
    }

    /// Consumes `c` (after spaces) if it comes next.
    fn eat(&mut self, c: char) -> bool {
        self.skip_spaces();
        if self.rest().starts_with(c) {
            self.at += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char, what: &str) -> Result<(), ShardingError> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.error(format!("expected {what} at {}", self.found())))
        }
    }

    /// What comes next, for messages.
    fn found(&self) -> String {
        match self.rest().chars().next() {
            None => "the end".into(),
            Some(_) => format!("`{}`", self.rest().chars().take(12).collect::<String>()),
        }
    }

    fn word(&mut self) -> &str {
        self.skip_spaces();
        let rest = self.rest();
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let start = self.at;
        self.at += len;
        &self.text[start..self.at]
    }

    fn spec(mut self) -> Result<PartitionSpec, ShardingError> {
        let head = self.word().to_string();
        if head != "P" && head != "PartitionSpec" {
            return Err(self.error("it must start with `P(` or `PartitionSpec(`"));
        }
        self.expect('(', "`(` after the name")?;
        let mut entries = Vec::new();
        while !self.eat(')') {
            entries.push(self.entry()?);
            if !self.eat(',') {
                self.expect(')', "`,` or `)` after an entry")?;
                break;
            }
        }
        self.skip_spaces();
        if !self.rest().is_empty() {
            return Err(self.error(format!("unexpected {} after the closing `)`", self.found())));
        }
        Ok(PartitionSpec::new(entries))
    }

    /// `None`, `'axis'`, or a tuple `('a', 'b')` (canonical: `()` is None, `('a',)` is 'a').
    fn entry(&mut self) -> Result<Vec<String>, ShardingError> {
        if self.eat('(') {
            let mut names = Vec::new();
            while !self.eat(')') {
                names.push(self.name()?);
                if !self.eat(',') {
                    self.expect(')', "`,` or `)` in a tuple of axes")?;
                    break;
                }
            }
            return Ok(names);
        }
        self.skip_spaces();
        if self.rest().starts_with(['\'', '"']) {
            return Ok(vec![self.name()?]);
        }
        let word = self.word().to_string();
        match word.as_str() {
            "None" => Ok(Vec::new()),
            "" => Err(self.error(format!(
                "expected None, a quoted axis name or a tuple at {}",
                self.found()
            ))),
            other => Err(self.error(format!(
                "`{other}` is not quoted (a mesh axis name is a string, like '{other}', or None)"
            ))),
        }
    }

    /// A quoted axis name.
    fn name(&mut self) -> Result<String, ShardingError> {
        self.skip_spaces();
        let quote = match self.rest().chars().next() {
            Some(q @ ('\'' | '"')) => q,
            _ => return Err(self.error(format!("expected a quoted axis name at {}", self.found()))),
        };
        self.at += 1;
        let end = self
            .rest()
            .find(quote)
            .ok_or_else(|| self.error(format!("the quote {quote} is never closed")))?;
        let name = self.rest()[..end].to_string();
        self.at += end + 1;
        if !is_axis_name(&name) {
            return Err(self.error(format!(
                "'{name}' is not a valid mesh axis name (letters, digits and `_`, not starting with a digit)"
            )));
        }
        Ok(name)
    }
}
