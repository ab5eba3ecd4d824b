//! Install checks: each tool is installed when this machine can (rustup, cargo install, npm,
//! apt-get as root on Debian); otherwise the check stops with one message saying what to install.
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{cargo, cargo_bin_dir, find_program, output_of, run, step, Res};

const WASM_TARGET: &str = "wasm32-unknown-unknown";
/// playwright-core (pinned in tests/browser/package.json) needs this Node.js major version.
const MIN_NODE_MAJOR: u32 = 20;

/// The version of crate `name` that Cargo.lock pins.
pub fn lock_version(lock: &str, name: &str) -> Option<String> {
    let wanted = format!("name = \"{name}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == wanted {
            let version = lines.next()?.trim();
            return version
                .strip_prefix("version = \"")?
                .strip_suffix('"')
                .map(str::to_string);
        }
    }
    None
}

/// The wasm32 target and wasm-bindgen-cli at Cargo.lock's wasm-bindgen version; returns the
/// wasm-bindgen program to run.
pub fn wasm_tools() -> Res<PathBuf> {
    wasm_target()?;
    wasm_bindgen()
}

/// The Rust standard library for wasm32 (rustup target add).
pub fn wasm_target() -> Res<()> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let installed = |rustc: &str| {
        output_of(rustc, &["--print", "target-libdir", "--target", WASM_TARGET])
            .map(PathBuf::from)
            .and_then(|dir| std::fs::read_dir(dir).ok())
            .is_some_and(|mut entries| {
                entries.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libcore")))
            })
    };
    if installed(&rustc) {
        return Ok(());
    }
    if find_program("rustup", &cargo_bin_dir().into_iter().collect::<Vec<_>>()).is_none() {
        return Err(format!(
            "the Rust standard library for {WASM_TARGET} is missing; install it with `rustup target add {WASM_TARGET}` \
             (or your distribution's rust-std package for {WASM_TARGET})"
        ));
    }
    step(&format!("installing the {WASM_TARGET} target (rustup)"));
    run(
        Command::new("rustup").args(["target", "add", WASM_TARGET]),
        "rustup target add",
    )
    .map_err(|e| format!("{e}; install it with `rustup target add {WASM_TARGET}`"))?;
    if installed(&rustc) {
        Ok(())
    } else {
        Err(format!(
            "`rustup target add {WASM_TARGET}` ran but rustc still lacks the target; check `rustup show`"
        ))
    }
}

fn wasm_bindgen() -> Res<PathBuf> {
    let lock_path = crate::util::root().join("Cargo.lock");
    let lock = std::fs::read_to_string(&lock_path).map_err(|e| format!("cannot read {}: {e}", lock_path.display()))?;
    let want = lock_version(&lock, "wasm-bindgen").ok_or(
        "Cargo.lock has no wasm-bindgen entry; run `cargo generate-lockfile` or `cargo build -p shardlab-web`",
    )?;
    let extra: Vec<PathBuf> = cargo_bin_dir().into_iter().collect();
    let current = || {
        let program = find_program("wasm-bindgen", &extra)?;
        let version = output_of(&program, &["--version"])?;
        (version.split_whitespace().nth(1) == Some(want.as_str())).then_some(program)
    };
    if let Some(program) = current() {
        return Ok(program);
    }
    // `--locked` fails on this registry mirror: pin the version only.
    step(&format!(
        "installing wasm-bindgen-cli {want} (matches Cargo.lock; once, a few minutes)"
    ));
    run(
        cargo().args(["install", "wasm-bindgen-cli", "--version", &want]),
        "cargo install wasm-bindgen-cli",
    )
    .map_err(|e| format!("{e}; install it with `cargo install wasm-bindgen-cli --version {want}`"))?;
    current().ok_or_else(|| {
        format!(
            "wasm-bindgen {want} is still not found after `cargo install`; add {} to PATH",
            extra
                .first()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "~/.cargo/bin".into())
        )
    })
}

/// clippy for the clippy step.
pub fn clippy() -> Res<()> {
    if output_of(
        std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()),
        &["clippy", "--version"],
    )
    .is_some()
    {
        return Ok(());
    }
    step("installing clippy (rustup)");
    run(
        Command::new("rustup").args(["component", "add", "clippy"]),
        "rustup component add clippy",
    )
    .map_err(|e| format!("{e}; install it with `rustup component add clippy`"))
}

/// rustfmt for `cargo fmt --check`.
pub fn rustfmt() -> Res<()> {
    if output_of(
        std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()),
        &["fmt", "--version"],
    )
    .is_some()
    {
        return Ok(());
    }
    step("installing rustfmt (rustup)");
    run(
        Command::new("rustup").args(["component", "add", "rustfmt"]),
        "rustup component add rustfmt",
    )
    .map_err(|e| format!("{e}; install it with `rustup component add rustfmt`"))
}

/// The Chromium the browser tests drive: `SHARDLAB_CHROMIUM`, else Debian's /usr/bin/chromium.
pub fn chromium_path() -> PathBuf {
    std::env::var_os("SHARDLAB_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/usr/bin/chromium".into())
}

fn chromium_present() -> bool {
    chromium_path().is_file()
}

/// A Vulkan driver for native wgpu on Linux (lavapipe, from mesa-vulkan-drivers, runs on the CPU).
/// Other systems use Metal or DX12, which need nothing installed.
fn vulkan_present() -> bool {
    if !cfg!(target_os = "linux")
        || std::env::var_os("VK_ICD_FILENAMES").is_some()
        || std::env::var_os("VK_DRIVER_FILES").is_some()
    {
        return true;
    }
    [
        "/usr/share/vulkan/icd.d",
        "/etc/vulkan/icd.d",
        "/usr/local/share/vulkan/icd.d",
    ]
    .iter()
    .any(|dir| {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .any(|e| e.path().extension().is_some_and(|x| x == "json"))
            })
            .unwrap_or(false)
    })
}

fn node_present() -> bool {
    output_of("node", &["--version"]).is_some() && output_of("npm", &["--version"]).is_some()
}

struct Need {
    what: &'static str,
    apt: &'static [&'static str],
    present: fn() -> bool,
    /// Needed by the browser tests (else by the native tests).
    browser: bool,
}

const TEST_NEEDS: &[Need] = &[
    Need {
        what: "a Vulkan driver (lavapipe)",
        apt: &["mesa-vulkan-drivers"],
        present: vulkan_present,
        browser: false,
    },
    Need {
        what: "Chromium",
        apt: &["chromium"],
        present: chromium_present,
        browser: true,
    },
    Need {
        what: "Node.js and npm",
        apt: &["nodejs", "npm"],
        present: node_present,
        browser: true,
    },
];

/// Root on Debian or Ubuntu, where missing packages are installed with apt-get.
pub fn debian_root() -> bool {
    Path::new("/etc/debian_version").exists()
        && output_of("id", &["-u"]).as_deref() == Some("0")
        && find_program("apt-get", &[]).is_some()
}

/// What the native tests need from the system (lavapipe), or the browser tests (Chromium,
/// Node.js and npm).
pub fn system_packages(browser: bool) -> Res<()> {
    if let Some(path) = std::env::var_os("SHARDLAB_CHROMIUM").filter(|_| browser) {
        if !Path::new(&path).is_file() {
            return Err(format!(
                "SHARDLAB_CHROMIUM={} is not a file; point it at a Chromium or Chrome binary, or unset it to use \
                 /usr/bin/chromium",
                Path::new(&path).display()
            ));
        }
    }
    let missing: Vec<&Need> = TEST_NEEDS
        .iter()
        .filter(|n| n.browser == browser && !(n.present)())
        .collect();
    if !missing.is_empty() {
        let what = missing.iter().map(|n| n.what).collect::<Vec<_>>().join(", ");
        let packages: Vec<&str> = missing.iter().flat_map(|n| n.apt.iter().copied()).collect();
        let command = format!("apt-get install -y {}", packages.join(" "));
        if !debian_root() {
            return Err(format!(
                "missing {what}. Install it: `sudo {command}` on Debian or Ubuntu, or your system's packages for {what} \
                 (SHARDLAB_CHROMIUM=/path/to/chrome selects another Chromium)"
            ));
        }
        step(&format!("installing {what}: {command}"));
        let install = || {
            run(
                Command::new("apt-get")
                    .args(["install", "-y"])
                    .args(&packages)
                    .env("DEBIAN_FRONTEND", "noninteractive"),
                "apt-get install",
            )
        };
        if install().is_err() {
            run(Command::new("apt-get").arg("update"), "apt-get update")
                .map_err(|e| format!("{e}; then run `{command}`"))?;
            install().map_err(|e| format!("{e}; run `{command}` by hand to see why"))?;
        }
        let still: Vec<&str> = missing.iter().filter(|n| !(n.present)()).map(|n| n.what).collect();
        if !still.is_empty() {
            return Err(format!("`{command}` ran but {} is still missing", still.join(", ")));
        }
    }
    if browser {
        node_version()
    } else {
        Ok(())
    }
}

fn node_version() -> Res<()> {
    let version = output_of("node", &["--version"]).unwrap_or_default();
    let major: u32 = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major >= MIN_NODE_MAJOR {
        Ok(())
    } else {
        Err(format!(
            "Node.js {version} is too old for the browser tests (playwright-core needs {MIN_NODE_MAJOR}+); \
             install Node.js {MIN_NODE_MAJOR} or newer (Debian 13's `nodejs` package, or NodeSource's)"
        ))
    }
}

/// The directory of the browser tests' npm packages (playwright-core, binaryen's wasm-opt).
pub fn browser_dir() -> PathBuf {
    crate::util::root().join("tests").join("browser")
}

/// Whether every package of tests/browser/package-lock.json is installed at its locked version.
fn npm_packages_current(dir: &Path) -> Res<bool> {
    let lock_path = dir.join("package-lock.json");
    let text = std::fs::read_to_string(&lock_path).map_err(|e| format!("cannot read {}: {e}", lock_path.display()))?;
    let lock: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", lock_path.display()))?;
    let packages = lock["packages"]
        .as_object()
        .ok_or_else(|| format!("{} has no `packages`", lock_path.display()))?;
    for (path, entry) in packages {
        let Some(name) = path.strip_prefix("node_modules/") else {
            continue;
        };
        if name.contains("/node_modules/") {
            continue;
        }
        let installed = std::fs::read_to_string(dir.join(path).join("package.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["version"].as_str().map(str::to_string));
        if installed.as_deref() != entry["version"].as_str() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `npm ci` in tests/browser when its packages are missing or stale (never downloads a browser:
/// playwright-core drives the system Chromium).
pub fn npm_packages() -> Res<()> {
    let dir = browser_dir();
    if npm_packages_current(&dir)? {
        return Ok(());
    }
    if !node_present() {
        return Err(
            "Node.js and npm are missing; install them with `sudo apt-get install -y nodejs npm` (Node.js 20+)".into(),
        );
    }
    step("installing the browser tests' npm packages (npm ci in tests/browser)");
    run(
        Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&dir),
        "npm ci",
    )
    .map_err(|e| format!("{e}; run `npm ci` in {} to see why", dir.display()))
}

/// binaryen's wasm-opt from tests/browser/node_modules, when installed.
pub fn wasm_opt() -> Option<PathBuf> {
    let p = browser_dir().join("node_modules").join(".bin").join("wasm-opt");
    (p.is_file() && node_present()).then_some(p)
}
