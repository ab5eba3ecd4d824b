//! Every module of the crate imports only the modules below it in [`ORDER`] (README, "How it
//! is built"). The check reads the source: every `crate::` path in any form (`use crate::a`,
//! `use crate::{a, b::c}`, `pub use`, a path written in an expression) and every `super::`
//! chain that climbs to the crate root, so an import that runs up the stack fails a test.
//! A total order also rules out circles between modules.
use std::path::{Path, PathBuf};

/// The crate's modules, lowest first: each may import only the ones before it.
const ORDER: [&str; 18] = [
    "setting",
    "sharding",
    "rng",
    "ir",
    "autodiff",
    "model",
    "partition",
    "plan",
    "shaders",
    "gpu",
    "reference",
    "kernels",
    "exec",
    "profile",
    "search",
    "export",
    "selftest",
    "bench",
];

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a source file under `src/`: `exec/gpu/lower.rs` is `[exec, gpu, lower]`,
/// `exec/gpu/mod.rs` is `[exec, gpu]`.
fn module_path(relative: &Path) -> Vec<String> {
    let mut path: Vec<String> = relative
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if path.last().is_some_and(|l| l == "mod" || l == "lib" || l == "main") {
        path.pop();
    }
    path
}

/// `text` without comments and without the contents of string and char literals, so that
/// only code is read.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                out.push(' ');
            }
            // A raw string: r"…", r#"…"#.
            b'r' if raw_string_at(b, i) && !text[..i].chars().next_back().is_some_and(is_ident) => {
                let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
                let close = format!("\"{}", "#".repeat(hashes));
                let open = i + 1 + hashes + 1;
                i = text[open..]
                    .find(&close)
                    .map_or(b.len(), |end| open + end + close.len());
                out.push_str("\"\"");
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            // A char literal ('a', '\n'), not a lifetime ('a).
            b'\'' if b.get(i + 2) == Some(&b'\'') || b.get(i + 1) == Some(&b'\\') => {
                i += 1;
                while i < b.len() && b[i] != b'\'' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("' '");
            }
            _ => {
                let c = text[i..].chars().next().expect("a char");
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    out
}

/// Whether a raw string (`r"`, `r#"`) starts at `i`, not a raw identifier (`r#type`).
fn raw_string_at(b: &[u8], i: usize) -> bool {
    let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
    b.get(i + 1 + hashes) == Some(&b'"')
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The first segment of each path a `use` tree names at `at` (`a::b` gives `a`,
/// `{a, b::{c}, self}` gives `a`, `b`).
fn heads(code: &str, at: usize) -> Vec<String> {
    let rest = code[at..].trim_start();
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 0;
        let mut items = vec![];
        let mut item = String::new();
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(std::mem::take(&mut item));
                    continue;
                }
                _ => {}
            }
            item.push(c);
        }
        items.push(item);
        items
            .iter()
            .map(|i| i.trim().chars().take_while(|c| is_ident(*c)).collect::<String>())
            .filter(|h| !h.is_empty() && h != "self")
            .collect()
    } else {
        let head: String = rest.chars().take_while(|c| is_ident(*c)).collect();
        if head.is_empty() {
            vec![]
        } else {
            vec![head]
        }
    }
}

/// The crate's top-level modules that `code`, the code of the module at `path`, names.
fn named_modules(code: &str, path: &[String]) -> Vec<String> {
    let mut out = vec![];
    let mut from = 0;
    while let Some(found) = code[from..].find("::") {
        let sep = from + found;
        from = sep + 2;
        let before = &code[..sep];
        let word_start = before.rfind(|c: char| !is_ident(c)).map_or(0, |i| i + 1);
        let word = &before[word_start..];
        // Only a path's first `crate` or `super` (`a::super` is no path).
        let preceded = before[..word_start].trim_end().ends_with("::");
        if preceded {
            continue;
        }
        match word {
            "crate" => out.extend(heads(code, from)),
            "super" => {
                let mut level = 1;
                let mut at = from;
                while code[at..].trim_start().starts_with("super::") {
                    at = code.len() - code[at..].trim_start().len() + "super::".len();
                    level += 1;
                }
                // `super` climbs one module per step; once at the crate root the next segment
                // is a top-level module.
                if level >= path.len() {
                    out.extend(heads(code, at));
                }
                from = at;
            }
            _ => {}
        }
    }
    out
}

#[test]
fn no_module_imports_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![];
    sources(&src, &mut files);
    let mut violations = vec![];
    let mut seen = vec![];
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        let path = module_path(relative);
        let Some(top) = path.first() else { continue };
        if top == "bin" || top == "layering" {
            continue;
        }
        let Some(rank) = ORDER.iter().position(|m| m == top) else {
            violations.push(format!("module `{top}` is not in layering::ORDER"));
            continue;
        };
        seen.push(top.clone());
        let text = std::fs::read_to_string(file).expect("a source file");
        for named in named_modules(&code_only(&text), &path) {
            if named == *top {
                continue;
            }
            match ORDER.iter().position(|m| *m == named) {
                Some(r) if r < rank => {}
                Some(_) => violations.push(format!("{} ({top}) uses crate::{named}, above it", relative.display())),
                None => {}
            }
        }
    }
    for m in ORDER {
        assert!(
            seen.iter().any(|s| s == m),
            "layering::ORDER names `{m}`, which has no sources"
        );
    }
    assert!(
        violations.is_empty(),
        "imports up the stack:\n{}",
        violations.join("\n")
    );
}

#[cfg(test)]
mod reading {
    use super::*;

    fn named(code: &str, path: &[&str]) -> Vec<String> {
        let path: Vec<String> = path.iter().map(|s| s.to_string()).collect();
        named_modules(&code_only(code), &path)
    }

    #[test]
    fn every_form_of_a_crate_path_is_read() {
        assert_eq!(named("use crate::plan::Planned;", &["ir"]), ["plan"]);
        assert_eq!(named("pub use crate::plan;", &["ir"]), ["plan"]);
        assert_eq!(
            named("use crate::{ir::Op, plan, sharding::{Mesh, P}};", &["ir"]),
            ["ir", "plan", "sharding"]
        );
        assert_eq!(named("let x = crate::plan::build(o);", &["ir"]), ["plan"]);
        assert_eq!(named("use crate::planner::X;", &["ir"]), ["planner"]);
    }

    #[test]
    fn super_chains_are_resolved_against_the_files_module() {
        // exec/gpu/lower.rs: super is exec::gpu, super::super is exec, three reach the root.
        let lower = ["exec", "gpu", "lower"];
        assert!(named("use super::super::Tensor;", &lower).is_empty());
        assert_eq!(named("use super::super::super::plan::X;", &lower), ["plan"]);
        assert_eq!(
            named("use super::super::super::{plan, ir::Op};", &lower),
            ["plan", "ir"]
        );
        // A top-level module's mod.rs: super is the root.
        assert_eq!(named("use super::plan;", &["exec"]), ["plan"]);
        assert!(named("use super::Tensor;", &["exec", "trainer"]).is_empty());
    }

    #[test]
    fn comments_and_strings_are_not_read() {
        assert!(named(
            "// use crate::plan;\n/* crate::plan */ let s = \"crate::plan\";",
            &["ir"]
        )
        .is_empty());
        assert_eq!(named("let c = '\"'; use crate::plan;", &["ir"]), ["plan"]);
        assert!(named("let s = r#\"say \"crate::plan\"\"#;", &["ir"]).is_empty());
    }
}
