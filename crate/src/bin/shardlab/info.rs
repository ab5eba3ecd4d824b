//! `shardlab info [--json]`: the adapter, backend, device type, driver, features and key limits.
use shardlab::gpu::{AdapterSummary, GpuContext};
use shardlab::kernels::matmul;

#[derive(clap::Args)]
pub struct Args {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Serialize)]
struct Info<'a> {
    #[serde(flatten)]
    summary: &'a AdapterSummary,
    matmul_variants: Vec<&'static str>,
    /// The cooperative-matrix configurations the adapter lists (MxNxK, A/B type -> C type), which
    /// say whether it could run `coop8` (8x8x8 f32 -> f32).
    cooperative_matrix_configs: Vec<String>,
}

pub fn run(args: Args) -> Result<(), String> {
    let ctx = GpuContext::new_blocking().map_err(|e| e.to_string())?;
    let info = Info {
        summary: &ctx.summary,
        matmul_variants: matmul::variants(&ctx).into_iter().map(|v| v.name()).collect(),
        cooperative_matrix_configs: ctx
            .adapter
            .cooperative_matrix_properties()
            .iter()
            .map(|c| {
                format!(
                    "{}x{}x{} {:?}->{:?}",
                    c.m_size, c.n_size, c.k_size, c.ab_type, c.cr_type
                )
            })
            .collect(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&info).map_err(|e| e.to_string())?);
        return Ok(());
    }
    let s = &ctx.summary;
    let yes = |b: bool| if b { "yes" } else { "no" };
    println!("adapter      {}", s.name);
    println!("backend      {}", s.backend);
    println!("device type  {}", s.device_type);
    println!("driver       {}", s.driver);
    println!(
        "features     timestamp queries: {}, shader f16: {}, subgroups: {}",
        yes(s.timestamp_query),
        yes(s.shader_f16),
        yes(s.subgroups)
    );
    println!("limits");
    let limits: [(&str, u64); 7] = [
        ("max_buffer_size", s.max_buffer_size),
        ("max_storage_buffer_binding_size", s.max_storage_buffer_binding_size),
        (
            "max_storage_buffers_per_shader_stage",
            s.max_storage_buffers_per_shader_stage as u64,
        ),
        ("max_compute_workgroup_size_x", s.max_compute_workgroup_size_x as u64),
        (
            "max_compute_invocations_per_workgroup",
            s.max_compute_invocations_per_workgroup as u64,
        ),
        (
            "max_compute_workgroup_storage_size",
            s.max_compute_workgroup_storage_size as u64,
        ),
        (
            "max_compute_workgroups_per_dimension",
            s.max_compute_workgroups_per_dimension as u64,
        ),
    ];
    for (name, value) in limits {
        println!("  {name:<38} {value}");
    }
    println!("matmul       variants: {}", info.matmul_variants.join(", "));
    let configs = match info.cooperative_matrix_configs.is_empty() {
        true => "none listed".to_string(),
        false => info.cooperative_matrix_configs.join(", "),
    };
    println!(
        "cooperative  matrices: {configs} (coop8, 8x8x8 F32->F32: {})",
        yes(s.cooperative_matrix)
    );
    Ok(())
}
