//! Every WGSL file parses and validates with naga: no GPU needed.
use std::path::Path;

#[test]
fn every_wgsl_file_validates_with_naga() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaders");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("shaders/ exists") {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("wgsl") {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{}: {}", path.display(), e.emit_to_string(&src)));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}: {}", path.display(), e.emit_to_string(&src)));
        checked += 1;
    }
    assert!(checked > 0, "no .wgsl files found in {}", dir.display());
}

#[test]
fn every_wgsl_file_is_registered_in_the_crate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaders");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("wgsl") {
            continue;
        }
        let stem = path.file_stem().unwrap().to_str().unwrap();
        let (_, src) = shardlab::shaders::get(stem)
            .unwrap_or_else(|| panic!("shaders/{stem}.wgsl is missing from crate/src/shaders.rs"));
        assert_eq!(src, std::fs::read_to_string(&path).unwrap());
    }
}
