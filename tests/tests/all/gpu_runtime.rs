use shardlab::gpu::GpuError;
use shardlab_tests::gpu_or_skip;

#[test]
fn oversized_buffer_is_an_error_naming_the_tensor_and_limit() {
    let ctx = gpu_or_skip!();
    let too_many = (ctx.limits().max_storage_buffer_binding_size as usize / 4) + 1;
    match ctx.zeros("huge_activation", too_many) {
        Err(e @ GpuError::TooLarge { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("huge_activation") && msg.contains("max_"), "{msg}");
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("allocation over the limit succeeded"),
    }
}

#[test]
fn upload_then_readback_round_trips() {
    let ctx = gpu_or_skip!();
    let data: Vec<u32> = (0..1001).collect();
    let buf = ctx.upload("ints", &data).unwrap();
    assert_eq!(ctx.read_blocking::<u32>(&buf).unwrap(), data);
}

#[test]
fn unknown_shader_is_an_error_not_a_panic() {
    let ctx = gpu_or_skip!();
    let err = ctx.pipeline_blocking("no_such_shader", "main").expect_err("must fail");
    assert!(err.to_string().contains("no_such_shader"));
}
