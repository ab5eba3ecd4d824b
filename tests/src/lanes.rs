//! lavapipe runs a subgroup as the lanes of one CPU vector: 8 with its default 256-bit vectors,
//! 16 with `LP_NATIVE_VECTOR_WIDTH=512` (what the `shardlab` binary sets on AVX-512 CPUs). It
//! fixes the width when it loads, once per process, so the 16-lane entry points are checked by
//! running tests of the same binary again in a child process with 512-bit vectors.
use super::{adapter_lacks, gpu, Need};

/// The subgroup lanes lavapipe has in this process (8 unless `LP_NATIVE_VECTOR_WIDTH=512`).
pub fn lavapipe_lanes() -> u32 {
    match std::env::var("LP_NATIVE_VECTOR_WIDTH").as_deref() {
        Ok("512") => 16,
        _ => 8,
    }
}

/// Runs the tests matching `filters` in a child process of this test binary with 512-bit
/// lavapipe vectors, and asserts that it passes and that each of `passed` (test names) passed
/// in it. Returns without running in the child itself (or under a user's width), and records a
/// skip where the adapter is not lavapipe or the CPU has no AVX-512.
pub fn check_with_16_lanes(filters: &[&str], passed: &[&str]) {
    if std::env::var_os("LP_NATIVE_VECTOR_WIDTH").is_some() {
        return; // the child (or a user's setting): the tests run at this width already
    }
    let Some(ctx) = gpu() else { return };
    #[cfg(target_arch = "x86_64")]
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    let avx512 = false;
    if !ctx.summary.name.contains("llvmpipe") {
        return adapter_lacks(Need::Llvmpipe, &ctx.summary.identity());
    }
    if !avx512 {
        return adapter_lacks(Need::Avx512, "this CPU has no AVX-512, so no 16-lane lavapipe");
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(filters)
        .args(["--test-threads", "1"])
        .env("LP_NATIVE_VECTOR_WIDTH", "512")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{filters:?} with 512-bit vectors:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in passed {
        let line = format!("{name} ... ok");
        assert!(stdout.contains(&line), "{line} missing:\n{stdout}");
    }
}
