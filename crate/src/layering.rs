//! The pipeline's stages import only the stages before them (README, "How it is built"):
//! a check over the source text, so an import that runs up the stack fails a test.
use std::path::Path;

/// The stages, lowest first.
const STACK: [&str; 7] = ["ir", "autodiff", "model", "partition", "plan", "exec", "profile"];

/// Every `.rs` file under `dir`, with its text.
fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            let text = std::fs::read_to_string(&path).expect("a source file");
            out.push((path.display().to_string(), text));
        }
    }
}

/// Whether `text` names module `module` of this crate (`crate::module` as a whole path segment).
fn names(text: &str, module: &str) -> bool {
    let needle = format!("crate::{module}");
    text.match_indices(&needle).any(|(at, _)| {
        let next = text[at + needle.len()..].chars().next();
        !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

#[test]
fn no_stage_imports_a_stage_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut violations = vec![];
    for (k, stage) in STACK.iter().enumerate() {
        let mut files = vec![];
        sources(&src.join(stage), &mut files);
        assert!(!files.is_empty(), "stage `{stage}` has no sources");
        for (path, text) in &files {
            for above in &STACK[k + 1..] {
                if names(text, above) {
                    violations.push(format!("{path} ({stage}) uses crate::{above}"));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "imports up the stack:\n{}",
        violations.join("\n")
    );
}

#[test]
fn names_matches_whole_module_paths_only() {
    assert!(names("use crate::plan::Planned;", "plan"));
    assert!(names("use crate::plan;", "plan"));
    assert!(!names("use crate::planner::X;", "plan"));
    assert!(!names("use crate::ir::Op;", "plan"));
}
