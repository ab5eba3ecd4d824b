//! Every WGSL file in shaders/, embedded at build time so native and web builds ship
//! the same kernels. Add a file here when you add one to shaders/.

/// (name, source) of every shader; `name` is the file stem.
pub const ALL: &[(&str, &str)] = &[
    ("elementwise", include_str!("../../shaders/elementwise.wgsl")),
    ("random", include_str!("../../shaders/random.wgsl")),
    ("optimizer", include_str!("../../shaders/optimizer.wgsl")),
    ("layernorm", include_str!("../../shaders/layernorm.wgsl")),
    ("matmul", include_str!("../../shaders/matmul.wgsl")),
    ("matmul_tex", include_str!("../../shaders/matmul_tex.wgsl")),
    ("gelu", include_str!("../../shaders/gelu.wgsl")),
    ("softmax", include_str!("../../shaders/softmax.wgsl")),
    ("crossentropy", include_str!("../../shaders/crossentropy.wgsl")),
    ("embedding", include_str!("../../shaders/embedding.wgsl")),
    ("reduce", include_str!("../../shaders/reduce.wgsl")),
    ("copy", include_str!("../../shaders/copy.wgsl")),
    ("dropout", include_str!("../../shaders/dropout.wgsl")),
    ("collectives", include_str!("../../shaders/collectives.wgsl")),
];

/// The (name, source) of `shaders/<name>.wgsl`.
pub fn get(name: &str) -> Option<(&'static str, &'static str)> {
    ALL.iter().find(|(n, _)| *n == name).copied()
}

/// The names of the `@compute` entry points of a WGSL source, in source order (comments skipped).
pub fn entry_points(src: &str) -> Vec<&str> {
    let tokens = wgsl_words(src);
    let mut entries = Vec::new();
    let mut i = 0;
    while i + 1 < tokens.len() {
        if tokens[i] == "@" && tokens[i + 1] == "compute" {
            // Attributes such as @workgroup_size(...) may sit between @compute and `fn NAME`.
            if let Some(f) = tokens[i + 2..].iter().position(|t| *t == "fn") {
                if let Some(name) = tokens.get(i + 2 + f + 1) {
                    entries.push(*name);
                }
                i += 2 + f;
            }
        }
        i += 1;
    }
    entries
}

/// The extensions a WGSL source enables (`enable f16;` -> `f16`), which an adapter must support.
pub fn enables(src: &str) -> Vec<&str> {
    src.lines()
        .filter_map(|line| line.trim().strip_prefix("enable "))
        .filter_map(|rest| rest.split(';').next())
        .flat_map(|list| list.split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect()
}

/// The identifier-like words and `@` signs of a WGSL source, outside comments (which nest).
fn wgsl_words(src: &str) -> Vec<&str> {
    let b = src.as_bytes();
    let mut words = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'@' {
            words.push("@");
            i += 1;
        } else if b[i].is_ascii_alphabetic() || b[i] == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            words.push(&src[start..i]);
        } else if b[i].is_ascii_digit() {
            // Numbers (1u, 0x1f, 2e3f) are one token and never names.
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    words
}
