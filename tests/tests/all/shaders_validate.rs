//! Every WGSL shader, as the crate compiles it (preludes composed), parses and validates with
//! naga, and so does every prelude alone: no GPU needed.
use std::path::Path;

fn validate(name: &str, src: &str) {
    let module = naga::front::wgsl::parse_str(src).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
}

#[test]
fn every_wgsl_file_validates_with_naga() {
    let mut checked = 0;
    for (name, src) in shardlab::shaders::ALL {
        validate(&format!("{name} (composed)"), src);
        checked += 1;
    }
    for (name, src) in shardlab::shaders::PRELUDES {
        validate(&format!("prelude {name}"), src);
    }
    assert!(checked > 0, "no shaders in shardlab::shaders::ALL");
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
        let file = std::fs::read_to_string(&path).unwrap();
        if let Some((_, src)) = shardlab::shaders::PRELUDES.iter().find(|(n, _)| *n == stem) {
            assert_eq!(*src, file, "prelude shaders/{stem}.wgsl");
            continue;
        }
        let (_, src) = shardlab::shaders::get(stem)
            .unwrap_or_else(|| panic!("shaders/{stem}.wgsl is missing from crate/src/shaders.rs"));
        assert_eq!(src, shardlab::shaders::compose(stem, &file));
    }
}
