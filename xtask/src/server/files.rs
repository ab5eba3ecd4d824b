//! Which file a request names, and its Content-Type.
use std::path::{Component, Path, PathBuf};

/// The file under `root` that a request target names, or None when it names nothing there
/// (missing, malformed, or escaping `root` through `..`, a backslash or a symlink).
pub fn resolve(root: &Path, target: &str) -> Option<PathBuf> {
    let path = target.split(['?', '#']).next()?;
    if !path.starts_with('/') {
        return None;
    }
    let decoded = percent_decode(path)?;
    let mut file = root.to_path_buf();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => continue,
            ".." => return None,
            s if s.contains('\\') || s.contains('\0') || s.contains(':') => return None,
            s => file.push(s),
        }
    }
    // Only plain segments were pushed; still, check the result is a normal path below root.
    if file
        .strip_prefix(root)
        .ok()?
        .components()
        .any(|c| !matches!(c, Component::Normal(_)))
    {
        return None;
    }
    if file.is_dir() {
        file.push("index.html");
    }
    let real = file.canonicalize().ok()?;
    (real.starts_with(root) && real.is_file()).then_some(real)
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The Content-Type of a served file, by extension.
pub fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "wasm" => "application/wasm",
        "json" | "map" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "txt" | "wgsl" | "py" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A site with index.html and web/app.js, in a directory of its own per `name`.
    pub fn site(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-server-{name}-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("web")).unwrap();
        std::fs::write(dir.join("index.html"), "<p>hi</p>").unwrap();
        std::fs::write(dir.join("web").join("app.js"), "1").unwrap();
        dir.canonicalize().unwrap()
    }

    #[test]
    fn resolve_serves_files_and_index_but_never_escapes_the_root() {
        let root = site("resolve");
        assert_eq!(resolve(&root, "/"), Some(root.join("index.html")));
        assert_eq!(resolve(&root, "/web/app.js?v=1"), Some(root.join("web/app.js")));
        assert_eq!(resolve(&root, "/web/%61pp.js"), Some(root.join("web/app.js")));
        assert_eq!(resolve(&root, "/web/missing.js"), None);
        for escape in [
            "/../Cargo.toml",
            "/web/../../x",
            "/%2e%2e/x",
            "/..%2fx",
            "/web\\..\\..\\x",
            "x",
            "/%zz",
            "/a%00b",
        ] {
            assert_eq!(resolve(&root, escape), None, "{escape}");
        }
    }

    #[test]
    fn content_type_is_application_wasm_for_wasm_and_javascript_for_modules() {
        assert_eq!(content_type(Path::new("pkg/a_bg.wasm")), "application/wasm");
        assert_eq!(content_type(Path::new("pkg/a.js")), "text/javascript; charset=utf-8");
        assert_eq!(content_type(Path::new("index.html")), "text/html; charset=utf-8");
        assert_eq!(content_type(Path::new("web/style.css")), "text/css; charset=utf-8");
    }
}
