//! Every WGSL shader, as the crate compiles it (preludes composed), parses and validates with
//! naga, and so does every prelude alone; and every one translates to the languages wgpu's other
//! backends compile (MSL on Metal, HLSL on DX12, GLSL on GL, SPIR-V on Vulkan), so nothing ships
//! that only lavapipe and SwiftShader accept. No GPU needed.
use std::path::Path;

use naga::back::{glsl, hlsl, msl, spv};
use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};

fn validate(name: &str, src: &str) {
    if let Err(e) = validated(name, src, Capabilities::all()) {
        panic!("{e}");
    }
}

#[test]
fn every_wgsl_file_validates_with_naga() {
    let mut checked = 0;
    for (name, src) in shardlab::shaders::ALL {
        validate(&format!("{name} (composed)"), src);
        checked += 1;
    }
    // Each prelude after the preludes a shader composes in front of it (attention_common calls
    // threefry's functions).
    for (name, src) in shardlab::shaders::PRELUDES {
        let before = shardlab::shaders::COMPOSED
            .iter()
            .find_map(|(_, list)| list.iter().position(|p| p == name).map(|at| &list[..at]))
            .unwrap_or(&[]);
        let mut text = String::new();
        for p in before {
            let (_, s) = shardlab::shaders::PRELUDES.iter().find(|(n, _)| n == p).unwrap();
            text.push_str(s);
            text.push('\n');
        }
        text.push_str(src);
        validate(&format!("prelude {name}"), &text);
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

/// `src` parsed and validated with the capabilities of one backend.
fn validated(name: &str, src: &str, caps: Capabilities) -> Result<(naga::Module, ModuleInfo), String> {
    let module = naga::front::wgsl::parse_str(src).map_err(|e| format!("{name}: {}", e.emit_to_string(src)))?;
    let info = Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| format!("{name}: {}", e.emit_to_string(src)))?;
    Ok((module, info))
}

/// Whether `name` needs subgroups: then it only runs where the adapter offers them, which
/// wgpu's GL backend never does.
fn needs_subgroups(name: &str) -> bool {
    shardlab::shaders::EXTENSIONS
        .iter()
        .any(|(n, e)| *n == name && *e == "subgroups")
}

/// A writer's outputs (one per module, or per entry point for GLSL), each named and paired with
/// whether it holds a compute kernel.
type Written = Result<Vec<(String, bool)>, String>;

/// SPIR-V (Vulkan).
fn vulkan(m: &naga::Module, info: &ModuleInfo) -> Written {
    let words = spv::write_vec(m, info, &spv::Options::default(), None).map_err(|e| e.to_string())?;
    Ok(vec![("SPIR-V".into(), !words.is_empty())])
}

/// MSL (Metal): the language version wgpu asks for on macOS 11 and later.
fn metal(m: &naga::Module, info: &ModuleInfo) -> Written {
    let options = msl::Options {
        lang_version: (2, 3),
        ..msl::Options::default()
    };
    let (text, _) =
        msl::write_string(m, info, &options, &msl::PipelineOptions::default()).map_err(|e| e.to_string())?;
    Ok(vec![("MSL".into(), text.contains("kernel void"))])
}

/// HLSL (DX12): shader model 6.0, which wgpu's DXC path and subgroup operations need.
fn dx12(m: &naga::Module, info: &ModuleInfo) -> Written {
    let options = hlsl::Options {
        shader_model: hlsl::ShaderModel::V6_0,
        ..hlsl::Options::default()
    };
    let mut out = String::new();
    let pipeline = hlsl::PipelineOptions::default();
    hlsl::Writer::new(&mut out, &options, &pipeline)
        .write(m, info, None)
        .map_err(|e| e.to_string())?;
    Ok(vec![("HLSL".into(), out.contains("[numthreads("))])
}

/// GLSL ES 3.10 (GL), one entry point at a time, as wgpu's GL backend writes it.
fn gl(m: &naga::Module, info: &ModuleInfo) -> Written {
    m.entry_points
        .iter()
        .map(|ep| {
            let pipeline = glsl::PipelineOptions {
                shader_stage: ep.stage,
                entry_point: ep.name.clone(),
                multiview: None,
            };
            let mut out = String::new();
            let options = glsl::Options::default();
            glsl::Writer::new(
                &mut out,
                m,
                info,
                &options,
                &pipeline,
                naga::proc::BoundsCheckPolicies::default(),
            )
            .and_then(|mut w| w.write())
            .map_err(|e| format!("({}) {e}", ep.name))?;
            Ok((format!("GLSL ({})", ep.name), out.contains("layout(local_size_x")))
        })
        .collect()
}

/// Each shader's translation for every backend that can run it: the reasons of those that
/// failed; `written` counts the ones written (GLSL: one per entry point).
fn translate(name: &str, src: &str, written: &mut usize) -> Vec<String> {
    type Writer = fn(&naga::Module, &ModuleInfo) -> Written;
    let mut backends: Vec<(&str, Capabilities, Writer)> = vec![
        ("SPIR-V", spv::supported_capabilities(), vulkan),
        ("MSL", msl::supported_capabilities(), metal),
    ];
    // wgpu offers cooperative matrices on Vulkan and Metal alone.
    let cooperative = shardlab::shaders::enables(src).contains(&"wgpu_cooperative_matrix");
    if !cooperative {
        backends.push(("HLSL", hlsl::supported_capabilities(), dx12));
    }
    if !needs_subgroups(name) && !cooperative {
        backends.push(("GLSL", glsl::supported_capabilities(), gl));
    }
    let mut failures = vec![];
    for (backend, caps, write) in backends {
        match validated(name, src, caps).and_then(|(m, info)| write(&m, &info)) {
            Ok(outputs) => {
                for (output, kernel) in outputs {
                    if kernel {
                        *written += 1;
                    } else {
                        failures.push(format!("{name} → {output}: no compute kernel in the output"));
                    }
                }
            }
            Err(e) => failures.push(format!("{name} → {backend}: {e}")),
        }
    }
    failures
}

#[test]
fn every_wgsl_module_translates_to_msl_hlsl_glsl_and_spirv() {
    let mut written = 0;
    let failures: Vec<String> = shardlab::shaders::ALL
        .iter()
        .flat_map(|(name, src)| translate(name, src, &mut written))
        .collect();
    assert!(
        failures.is_empty(),
        "{} translations failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // SPIR-V and MSL of every module, HLSL of every module DX12 can run, and GLSL of every entry
    // point that GL can run.
    let cooperative = |src: &str| shardlab::shaders::enables(src).contains(&"wgpu_cooperative_matrix");
    let hlsl = shardlab::shaders::ALL
        .iter()
        .filter(|(_, src)| !cooperative(src))
        .count();
    let glsl: usize = shardlab::shaders::ALL
        .iter()
        .filter(|(name, src)| !needs_subgroups(name) && !cooperative(src))
        .map(|(_, src)| naga::front::wgsl::parse_str(src).unwrap().entry_points.len())
        .sum();
    assert_eq!(written, 2 * shardlab::shaders::ALL.len() + hlsl + glsl);
}

/// A stage binds 8 storage buffers unless the adapter allows more: every entry point that binds
/// more is in `shaders::OVER_DEFAULT_STORAGE_BUFFERS` with its count (the attention designs and
/// the self-test read it to leave such an entry point to adapters that allow it), and that list
/// names no other.
#[test]
fn entry_points_past_eight_storage_buffers_are_the_listed_ones_with_their_counts() {
    let mut found = vec![];
    for (name, src) in shardlab::shaders::ALL {
        let (module, info) = validated(name, src, Capabilities::all()).unwrap();
        for (i, ep) in module.entry_points.iter().enumerate() {
            let uses = info.get_entry_point(i);
            let storage = module
                .global_variables
                .iter()
                .filter(|(h, g)| matches!(g.space, naga::AddressSpace::Storage { .. }) && !uses[*h].is_empty())
                .count() as u32;
            if storage > 8 {
                found.push((name.to_string(), ep.name.clone(), storage));
            }
        }
    }
    let listed: Vec<(String, String, u32)> = shardlab::shaders::OVER_DEFAULT_STORAGE_BUFFERS
        .iter()
        .map(|(s, e, n)| (s.to_string(), e.to_string(), *n))
        .collect();
    assert_eq!(found, listed);
}
