//! Every WGSL file in shaders/, embedded at build time so native and web builds ship
//! the same kernels. Add a file here when you add one to shaders/.

/// (name, source) of every shader; `name` is the file stem.
pub const ALL: &[(&str, &str)] = &[
    ("elementwise", include_str!("../../shaders/elementwise.wgsl")),
];

/// The (name, source) of `shaders/<name>.wgsl`.
pub fn get(name: &str) -> Option<(&'static str, &'static str)> {
    ALL.iter().find(|(n, _)| *n == name).copied()
}
