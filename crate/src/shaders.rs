//! Every WGSL file in shaders/, embedded at build time so native and web builds ship
//! the same kernels. Add a file here when you add one to shaders/. Kernels that share WGSL get
//! it from a prelude (shaders/rows.wgsl: row max and sum), composed in front of their source.

/// The row-reduction prelude of the row-wise kernels (softmax, crossentropy, layernorm).
macro_rules! rows {
    ($file:literal) => {
        concat!(
            include_str!("../../shaders/rows.wgsl"),
            "\n",
            include_str!(concat!("../../shaders/", $file))
        )
    };
}

/// The output prelude of the texture matmuls (shaders/matmul_out.wgsl: Params, C, bias, stores).
macro_rules! matmul_out {
    ($file:literal) => {
        concat!(
            include_str!("../../shaders/matmul_out.wgsl"),
            "\n",
            include_str!(concat!("../../shaders/", $file))
        )
    };
}

/// The Threefry prelude of the kernels that draw random bits (shaders/threefry.wgsl): the bits
/// kernels and fused attention, which draws its dropout bits in place.
macro_rules! threefry {
    ($file:literal) => {
        concat!(
            include_str!("../../shaders/threefry.wgsl"),
            "\n",
            include_str!(concat!("../../shaders/", $file))
        )
    };
}

/// The preludes of the fused attention kernels (shaders/attention_common.wgsl: parameters,
/// positions, the dropout factor), after the Threefry prelude its dropout draws with.
macro_rules! attention {
    ($file:literal) => {
        concat!(
            include_str!("../../shaders/threefry.wgsl"),
            "\n",
            include_str!("../../shaders/attention_common.wgsl"),
            "\n",
            include_str!(concat!("../../shaders/", $file))
        )
    };
}

/// (name, source) of every shared WGSL prelude: no entry points, only what kernels compose.
pub const PRELUDES: &[(&str, &str)] = &[
    ("rows", include_str!("../../shaders/rows.wgsl")),
    ("matmul_out", include_str!("../../shaders/matmul_out.wgsl")),
    ("threefry", include_str!("../../shaders/threefry.wgsl")),
    ("attention_common", include_str!("../../shaders/attention_common.wgsl")),
];

/// (shader, the preludes composed in front of it, in order) for every composed shader.
pub const COMPOSED: &[(&str, &[&str])] = &[
    ("layernorm", &["rows"]),
    ("softmax", &["rows"]),
    ("crossentropy", &["rows"]),
    ("matmul_tex", &["matmul_out"]),
    ("matmul_sg", &["matmul_out"]),
    ("matmul_gpu", &["matmul_out"]),
    ("matmul_coop", &["matmul_out"]),
    ("random", &["threefry"]),
    ("attention", &["threefry", "attention_common"]),
    ("attention_sg", &["threefry", "attention_common"]),
    ("attention_fa", &["threefry", "attention_common"]),
];

/// (shader, the extension it enables in front of its preludes): WGSL wants `enable` before every
/// declaration, so a composed shader's own `enable` line cannot stay in its file.
pub const LEADING_ENABLES: &[(&str, &str)] = &[("matmul_coop", "wgpu_cooperative_matrix")];

/// (shader, the WGSL extension it uses without an `enable` line). naga (wgpu 30) turns subgroup
/// operations on with the device's feature and rejects `enable subgroups;`, while browsers require
/// it: the sources leave it out and [`for_browser`] puts it in.
pub const EXTENSIONS: &[(&str, &str)] = &[
    ("matmul_sg", "subgroups"),
    ("attention_sg", "subgroups"),
    ("matmul_coop", "subgroups"),
];

/// (shader, entry point, storage buffers it binds) of the entry points that bind more than
/// WebGPU's default 8 per stage, in the order of their files: an adapter that allows fewer
/// cannot create them, so the attention designs and the self-test ask [`storage_buffers`] first
/// (a test counts each entry point's bindings with naga and holds this list to them).
pub const OVER_DEFAULT_STORAGE_BUFFERS: &[(&str, &str, u32)] = &[
    ("attention_sg", "backward_dkdv_sg8", 9),
    ("attention_sg", "backward_dkdv_sg16", 9),
    ("attention_sg", "backward_dkdv_sg8_nodrop", 9),
    ("attention_sg", "backward_dkdv_sg16_nodrop", 9),
    ("attention_sg", "backward_dq_delta_sg8", 10),
    ("attention_sg", "backward_dq_delta_sg16", 10),
    ("attention_sg", "backward_dq_delta_sg8_nodrop", 10),
    ("attention_sg", "backward_dq_delta_sg16_nodrop", 10),
    ("attention_fa", "backward_dq_delta", 10),
    ("attention_fa", "backward_dkdv", 9),
];

/// Storage buffers entry point `entry` of `shader` binds where that is more than WebGPU's
/// default 8 per stage ([`OVER_DEFAULT_STORAGE_BUFFERS`]); None for every other entry point.
pub fn storage_buffers(shader: &str, entry: &str) -> Option<u32> {
    OVER_DEFAULT_STORAGE_BUFFERS
        .iter()
        .find(|(s, e, _)| *s == shader && *e == entry)
        .map(|(_, _, n)| *n)
}

/// (name, source) of every shader as compiled, preludes composed; `name` is the file stem.
pub const ALL: &[(&str, &str)] = &[
    ("elementwise", include_str!("../../shaders/elementwise.wgsl")),
    ("random", threefry!("random.wgsl")),
    ("optimizer", include_str!("../../shaders/optimizer.wgsl")),
    ("layernorm", rows!("layernorm.wgsl")),
    ("matmul", include_str!("../../shaders/matmul.wgsl")),
    ("matmul_tex", matmul_out!("matmul_tex.wgsl")),
    ("matmul_sg", matmul_out!("matmul_sg.wgsl")),
    ("matmul_gpu", matmul_out!("matmul_gpu.wgsl")),
    // WGSL wants `enable` before every declaration, so it goes in front of the prelude ([`LEADING_ENABLES`]).
    (
        "matmul_coop",
        concat!("enable wgpu_cooperative_matrix;\n", matmul_out!("matmul_coop.wgsl")),
    ),
    ("gelu", include_str!("../../shaders/gelu.wgsl")),
    ("softmax", rows!("softmax.wgsl")),
    ("crossentropy", rows!("crossentropy.wgsl")),
    ("embedding", include_str!("../../shaders/embedding.wgsl")),
    ("reduce", include_str!("../../shaders/reduce.wgsl")),
    ("copy", include_str!("../../shaders/copy.wgsl")),
    ("dropout", include_str!("../../shaders/dropout.wgsl")),
    ("fused", include_str!("../../shaders/fused.wgsl")),
    ("collectives", include_str!("../../shaders/collectives.wgsl")),
    ("ceiling", include_str!("../../shaders/ceiling.wgsl")),
    ("attention", attention!("attention.wgsl")),
    ("attention_sg", attention!("attention_sg.wgsl")),
    ("attention_fa", attention!("attention_fa.wgsl")),
    ("seq", include_str!("../../shaders/seq.wgsl")),
    ("moe", include_str!("../../shaders/moe.wgsl")),
];

/// The (name, source) of `shaders/<name>.wgsl` as compiled (preludes composed).
pub fn get(name: &str) -> Option<(&'static str, &'static str)> {
    ALL.iter().find(|(n, _)| *n == name).copied()
}

/// The composition of `name`: its preludes' sources, then the file's own, joined by newlines.
/// `file` is the text of `shaders/<name>.wgsl`; for checks that the embedded sources are current.
pub fn compose(name: &str, file: &str) -> String {
    let preludes = COMPOSED.iter().find(|(n, _)| *n == name).map_or(&[][..], |(_, p)| *p);
    let mut src = String::new();
    for (_, e) in LEADING_ENABLES.iter().filter(|(n, _)| *n == name) {
        src.push_str(&format!("enable {e};\n"));
    }
    for p in preludes {
        if let Some((_, text)) = PRELUDES.iter().find(|(n, _)| n == p) {
            src.push_str(text);
            src.push('\n');
        }
    }
    src.push_str(file);
    src
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

/// Every extension shader `name` needs: its `enable` lines and its row of [`EXTENSIONS`].
pub fn extensions<'a>(name: &str, src: &'a str) -> Vec<&'a str> {
    let mut all = enables(src);
    all.extend(EXTENSIONS.iter().filter(|(n, _)| *n == name).map(|(_, e)| *e));
    all
}

/// `src` as a browser's WGSL compiler takes it: the `enable` lines of [`EXTENSIONS`] in front.
pub fn for_browser(name: &str, src: &str) -> String {
    let mut out = String::new();
    for (_, e) in EXTENSIONS.iter().filter(|(n, _)| *n == name) {
        out.push_str(&format!("enable {e};\n"));
    }
    out.push_str(src);
    out
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
