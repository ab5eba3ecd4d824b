//! The steps of `cargo xtask test`, by name: the bare command runs them all, in this order;
//! `cargo xtask test NAME...` runs the named ones for a quick loop.
use crate::util::Res;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    Fmt,
    Clippy,
    Doc,
    Native,
    Jax,
    Page,
    Browser,
}

pub const ALL: [Step; 7] = [
    Step::Fmt,
    Step::Clippy,
    Step::Doc,
    Step::Native,
    Step::Jax,
    Step::Page,
    Step::Browser,
];

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::Fmt => "fmt",
            Step::Clippy => "clippy",
            Step::Doc => "doc",
            Step::Native => "native",
            Step::Jax => "jax",
            Step::Page => "page",
            Step::Browser => "browser",
        }
    }

    pub fn about(self) -> &'static str {
        match self {
            Step::Fmt => "rustfmt check",
            Step::Clippy => "clippy, warnings denied: the native crates, and the wasm crate for wasm32",
            Step::Doc => "cargo doc --no-deps, warnings denied",
            Step::Native => "the native tests (GPU tests on lavapipe), xtask's own included",
            Step::Jax => "the export tests: exported scripts run under JAX (target/jax-venv)",
            Step::Page => "the page build (release wasm)",
            Step::Browser => "the browser tests in headless Chromium (builds the page first)",
        }
    }
}

/// One line per step, for the usage text.
pub fn help() -> String {
    ALL.iter()
        .map(|s| format!("  {:<9}{}", s.name(), s.about()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The steps to run, in order: all of them when `args` is empty, else the named ones
/// (the browser tests bring the page build they need).
pub fn parse(args: &[String]) -> Res<Vec<Step>> {
    if args.is_empty() {
        return Ok(ALL.to_vec());
    }
    let mut steps = Vec::new();
    for arg in args {
        let step = ALL.iter().copied().find(|s| s.name() == arg).ok_or_else(|| {
            let names: Vec<&str> = ALL.iter().map(|s| s.name()).collect();
            format!(
                "unknown step `{arg}`; the steps are: {} (`cargo xtask test` with none runs them all)",
                names.join(", ")
            )
        })?;
        steps.push(step);
        if step == Step::Browser {
            steps.push(Step::Page);
        }
    }
    steps.sort();
    steps.dedup();
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn no_step_name_runs_every_step_in_order() {
        assert_eq!(parse(&[]).unwrap(), ALL.to_vec());
    }

    #[test]
    fn named_steps_run_alone_in_order_and_browser_brings_the_page() {
        assert_eq!(parse(&args(&["native"])).unwrap(), vec![Step::Native]);
        assert_eq!(
            parse(&args(&["doc", "fmt", "doc"])).unwrap(),
            vec![Step::Fmt, Step::Doc]
        );
        assert_eq!(parse(&args(&["browser"])).unwrap(), vec![Step::Page, Step::Browser]);
    }

    #[test]
    fn an_unknown_step_is_one_error_listing_the_names() {
        let err = parse(&args(&["natve"])).unwrap_err();
        assert!(err.contains("`natve`"), "{err}");
        for s in ALL {
            assert!(err.contains(s.name()), "{err}");
        }
    }
}
