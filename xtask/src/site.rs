//! Builds the page: the web crate as release wasm, wasm-bindgen's ES module, wasm-opt, and the
//! static assets, into `<target>/site` (index.html at its root, web/ and pkg/ beside it).
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::setup;
use crate::util::{cargo, human_bytes, run, step, target_dir, Res};

/// The wasm crate and its output name.
const WEB_PACKAGE: &str = "shardlab-web";
const WASM_NAME: &str = "shardlab_web";
/// Asset kinds copied from web/ (the page's scripts, styles and images, and the peer benchmark's
/// page, web/peers.html).
const ASSET_EXTENSIONS: &[&str] = &["js", "css", "svg", "png", "ico", "json", "html"];
/// WebAssembly features rustc enables by default for wasm32-unknown-unknown; wasm-opt must
/// accept them and must not add others (browsers differ beyond these).
const WASM_FEATURES: &[&str] = &[
    "--enable-bulk-memory",
    "--enable-mutable-globals",
    "--enable-nontrapping-float-to-int",
    "--enable-sign-ext",
    "--enable-reference-types",
    "--enable-multivalue",
];

pub fn site_dir() -> PathBuf {
    target_dir().join("site")
}

/// Builds the whole page and returns the directory to serve.
pub fn build(wasm_bindgen: &Path) -> Res<PathBuf> {
    step("building the page (release wasm)");
    run(
        cargo().args([
            "build",
            "-p",
            WEB_PACKAGE,
            "--target",
            "wasm32-unknown-unknown",
            "--profile",
            "wasm-release",
        ]),
        "cargo build of the wasm crate",
    )?;
    let wasm = target_dir()
        .join("wasm32-unknown-unknown")
        .join("wasm-release")
        .join(format!("{WASM_NAME}.wasm"));
    let site = site_dir();
    if site.exists() {
        std::fs::remove_dir_all(&site).map_err(|e| format!("cannot clear {}: {e}", site.display()))?;
    }
    let pkg = site.join("pkg");
    run(
        Command::new(wasm_bindgen)
            .args([
                "--target",
                "web",
                "--no-typescript",
                "--out-name",
                WASM_NAME,
                "--out-dir",
            ])
            .arg(&pkg)
            .arg(&wasm),
        "wasm-bindgen",
    )?;
    let bg = pkg.join(format!("{WASM_NAME}_bg.wasm"));
    let before = file_len(&bg);
    match setup::wasm_opt() {
        Some(wasm_opt) => {
            let optimized = pkg.join(format!("{WASM_NAME}_bg.opt.wasm"));
            run(
                Command::new(&wasm_opt)
                    .arg("-Oz")
                    .args(WASM_FEATURES)
                    .arg(&bg)
                    .arg("-o")
                    .arg(&optimized),
                "wasm-opt",
            )?;
            std::fs::rename(&optimized, &bg).map_err(|e| format!("cannot replace {}: {e}", bg.display()))?;
            println!(
                "wasm-opt -Oz: {} -> {}",
                human_bytes(before),
                human_bytes(file_len(&bg))
            );
        }
        None => println!(
            "note: wasm-opt not found (it comes with `npm ci` in tests/browser, which needs Node.js); serving the \
             unoptimized wasm ({})",
            human_bytes(before)
        ),
    }
    copy_assets(&crate::util::root(), &site)?;
    vendor(&site)?;
    Ok(site)
}

/// Third-party files the page loads, from tests/browser/node_modules (npm, pinned in its
/// package-lock.json), served from the page's own host: (package, file in the package).
const VENDORED: &[(&str, &str)] = &[
    ("uplot", "dist/uPlot.esm.js"),
    ("uplot", "dist/uPlot.min.css"),
    ("uplot", "LICENSE"),
    ("@jax-js/jax", "LICENSE"),
];

/// Packages whose ES modules are served whole, from a folder of the package: (package, folder,
/// file ending). jax-js's chunks have hashed names and import each other; only the peer
/// benchmark's page (web/peers.html) loads them, never the shardlab page.
const VENDORED_MODULES: &[(&str, &str, &str)] = &[("@jax-js/jax", "dist", ".js")];

/// Copies the vendored files into `<site>/web/vendor/<package>/`. Without them (no Node.js to
/// install them) the page still trains and says that its charts are missing.
fn vendor(site: &Path) -> Res<()> {
    let modules = setup::browser_dir().join("node_modules");
    for (package, file) in VENDORED {
        let from = modules.join(package).join(file);
        if !from.is_file() {
            println!(
                "note: {} is missing (run `npm ci` in tests/browser); the page will have no charts",
                from.display()
            );
            continue;
        }
        let name = Path::new(file).file_name().unwrap_or_default();
        let dir = site.join("web").join("vendor").join(package);
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        std::fs::copy(&from, dir.join(name)).map_err(|e| format!("cannot copy {}: {e}", from.display()))?;
    }
    for (package, folder, ending) in VENDORED_MODULES {
        let from = modules.join(package).join(folder);
        let Ok(entries) = std::fs::read_dir(&from) else {
            println!(
                "note: {} is missing (run `npm ci` in tests/browser); the peer benchmark's page cannot load {package}",
                from.display()
            );
            continue;
        };
        let dir = site.join("web").join("vendor").join(package);
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        for path in entries.flatten().map(|e| e.path()) {
            let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
            if path.is_file() && name.ends_with(ending) {
                std::fs::copy(&path, dir.join(&name)).map_err(|e| format!("cannot copy {}: {e}", path.display()))?;
            }
        }
    }
    Ok(())
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// index.html, and web/'s scripts and styles under the same relative paths.
fn copy_assets(root: &Path, site: &Path) -> Res<()> {
    let copy = |from: &Path, to: &Path| {
        std::fs::copy(from, to)
            .map(|_| ())
            .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))
    };
    copy(&root.join("index.html"), &site.join("index.html"))?;
    let web = site.join("web");
    std::fs::create_dir_all(&web).map_err(|e| format!("cannot create {}: {e}", web.display()))?;
    let src = root.join("web");
    let entries = std::fs::read_dir(&src).map_err(|e| format!("cannot read {}: {e}", src.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let wanted = path
            .extension()
            .and_then(|x| x.to_str())
            .is_some_and(|x| ASSET_EXTENSIONS.contains(&x));
        // package.json / Cargo files are build inputs, not page assets.
        let name = entry.file_name().to_string_lossy().into_owned();
        if wanted && path.is_file() && !name.starts_with("package") {
            copy(&path, &web.join(&name))?;
        }
    }
    Ok(())
}
