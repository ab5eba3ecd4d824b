//! The kernel self-test the page runs: on lavapipe every pipeline compiles and every kernel
//! matches its CPU twin; and its building blocks cannot pass a broken kernel.
use shardlab::selftest::{self, max_abs_error, Status};
use shardlab::shaders::{self, enables, entry_points};
use shardlab_tests::gpu_or_skip;

#[test]
fn selftest_creates_every_pipeline_and_every_kernel_matches_its_cpu_twin() {
    let ctx = gpu_or_skip!();
    let report = pollster::block_on(selftest::run(ctx));
    assert!(report.passed, "self-test failures:\n{}", report.failures().join("\n"));
    for (shader, src) in shaders::ALL {
        for entry in entry_points(src) {
            let check = report
                .pipelines
                .iter()
                .find(|p| p.shader == *shader && p.entry == entry);
            assert!(check.is_some(), "{shader}::{entry} is missing from the report");
        }
    }
    assert_eq!(report.kernels.len(), selftest::KERNELS.len());
    for k in &report.kernels {
        eprintln!(
            "{:?} {} ({}): max abs error {:?}, {:.1} ms",
            k.status, k.name, k.shape, k.max_abs_error, k.ms
        );
        // Only a matmul variant the adapter cannot run may be skipped; naive runs everywhere.
        let may_skip = k.name.starts_with("matmul ") && k.name != "matmul naive";
        match k.status {
            Status::Pass => assert!(k.max_abs_error.is_some_and(|e| e <= k.tolerance), "{k:?}"),
            Status::Skip => assert!(may_skip, "{} was skipped: {:?}", k.name, k.message),
            Status::Fail => unreachable!("report.passed was true"),
        }
    }
    let json = serde_json::to_string(&report).unwrap();
    assert!(json.contains("\"status\":\"pass\""), "{json}");
}

#[test]
fn selftest_reports_an_unknown_shader_as_a_failure_naming_it() {
    let ctx = gpu_or_skip!();
    let check = pollster::block_on(selftest::check_pipeline(ctx, "no_such_shader", "main"));
    assert_eq!(check.status, Status::Fail);
    assert!(check.message.unwrap().contains("no_such_shader"));
}

#[test]
fn selftest_reports_a_shader_without_entry_points_as_a_failure() {
    let ctx = gpu_or_skip!();
    let checks = pollster::block_on(selftest::check_shader(ctx, "empty", "fn helper() {}"));
    assert_eq!(checks.len(), 1);
    assert_eq!(checks[0].status, Status::Fail);
}

#[test]
fn max_abs_error_is_infinite_for_nan_or_length_mismatch() {
    assert_eq!(max_abs_error(&[1.0, 2.0], &[1.0, 2.5]), 0.5);
    assert_eq!(max_abs_error(&[1.0, f32::NAN], &[1.0, 2.0]), f32::INFINITY);
    assert_eq!(max_abs_error(&[f32::INFINITY], &[1.0]), f32::INFINITY);
    assert_eq!(max_abs_error(&[1.0], &[1.0, 2.0]), f32::INFINITY);
    assert_eq!(max_abs_error(&[f32::NEG_INFINITY], &[f32::NEG_INFINITY]), 0.0);
}

#[test]
fn entry_points_lists_compute_functions_in_order_and_skips_comments() {
    let src = "
        // @compute fn commented_out() {}
        /* @compute @workgroup_size(1) fn in_block() { /* nested */ } */
        fn helper() {}
        @compute @workgroup_size(256, 1)
        fn first(@builtin(global_invocation_id) gid: vec3<u32>) {}
        @compute
        @workgroup_size(WG) fn second_one() {}
        @fragment fn not_compute() {}
    ";
    assert_eq!(entry_points(src), vec!["first", "second_one"]);
}

#[test]
fn every_shader_has_an_entry_point() {
    for (shader, src) in shaders::ALL {
        assert!(
            !entry_points(src).is_empty(),
            "shaders/{shader}.wgsl has no @compute entry point"
        );
    }
}

#[test]
fn enables_lists_the_extensions_a_shader_needs() {
    assert_eq!(
        enables("enable f16;\nenable subgroups, f16 ;\nfn f() {}"),
        vec!["f16", "subgroups", "f16"]
    );
    assert!(enables(shaders::get("elementwise").unwrap().1).is_empty());
}

/// naga (native) rejects `enable subgroups;`, browsers require it: the sg matmul's source leaves
/// it out, its extension is still known (adapters without subgroups skip it) and the browser's
/// copy has it first, before the prelude's declarations.
#[test]
fn the_sg_matmul_needs_subgroups_and_the_browser_gets_them_enabled() {
    let (name, src) = shaders::get("matmul_sg").unwrap();
    assert!(enables(src).is_empty(), "naga rejects an enable line");
    assert_eq!(shaders::extensions(name, src), vec!["subgroups"]);
    let web = shaders::for_browser(name, src);
    assert!(web.starts_with("enable subgroups;\n"), "{}", &web[..60]);
    assert!(web.ends_with(src));
    let (tex, tex_src) = shaders::get("matmul_tex").unwrap();
    assert!(shaders::extensions(tex, tex_src).is_empty());
    assert_eq!(shaders::for_browser(tex, tex_src), tex_src);
}
