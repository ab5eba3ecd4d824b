//! The cost model counts a step's launches from `exec::lowered`, read off the program alone:
//! it must say, instruction by instruction, what the GPU lowering really dispatches (fused
//! pairs, two-stage column sums, operand transposes, per-operand psums and gradient psums summed
//! in place as one, strided pieces).
use shardlab::exec::{lowered, GpuExecutor, Parallel, TrainerOptions};
use shardlab::gpu::GpuContext;
use shardlab::ir::RngLayout;
use shardlab::model::{DataSource, GptConfig, Init, Optimizer};
use shardlab::plan::{DropoutKey, Strategy};
use shardlab::sharding::Mesh;

fn options(parallel: Parallel) -> TrainerOptions {
    TrainerOptions {
        // 128 rows per device on one device (two-stage column sums), 64 on two.
        config: GptConfig {
            layers: 1,
            d_model: 16,
            heads: 2,
            seq: 32,
            batch: 4,
            vocab: 16,
            tied: false,
            dropout: 0.1,
            attention: Default::default(),
            remat: Default::default(),
            precision: Default::default(),
            moe: None,
        },
        optimizer: Optimizer::AdamW { lr: 1e-3 },
        init: Init::Formula,
        data: DataSource::Formula,
        seed: 0,
        rng_layout: RngLayout::Original,
        parallel,
        combine_all_reduces: true,
        microbatches: 1,
        cp_order: Default::default(),
        schedule: Default::default(),
        virtual_stages: 1,
        stage_layers: vec![],
    }
}

#[test]
fn lowered_dispatch_counts_match_what_the_gpu_executor_dispatches() {
    let Some(_) = shardlab_tests::gpu() else {
        return eprintln!("skipped: no GPU adapter");
    };
    // Its own context: a pinned single-pass matmul (tuned variants may add pack passes, which
    // the adapter decides, not the program).
    let ctx = GpuContext::new_blocking().unwrap();
    // and the fused attention kernels, which CPU adapters would compose from matmuls.
    shardlab::kernels::Tuning::with(&ctx, |t| {
        t.matmul_pin = Some(shardlab::kernels::matmul::Variant::Tiled);
        t.attention = Some(shardlab::kernels::attention::Lowering::Fused(
            shardlab::kernels::attention::Kernels::Tiled,
        ));
    })
    .unwrap();
    let mesh = |m: &str| Mesh::parse(m).unwrap();
    let cases = [
        Parallel::None,
        Parallel::Auto {
            par: Strategy::Tp.compose(&mesh("tp=2")).unwrap(),
            specs: vec![],
        },
        Parallel::ShardMap {
            par: Strategy::Fsdp.compose(&mesh("dp=2")).unwrap(),
            dropout_key: DropoutKey::FoldIn,
        },
    ];
    for parallel in cases {
        let name = format!("{parallel:?}");
        let program = shardlab::plan::build(&options(parallel)).unwrap().step.program;
        let exec = pollster::block_on(GpuExecutor::new(&ctx, program.clone())).unwrap();
        let mut ran = vec![0usize; program.instrs.len()];
        for &i in exec.dispatch_instrs() {
            ran[i] += 1;
        }
        let planned: Vec<usize> = lowered(&program).iter().map(|l| l.dispatches).collect();
        for (i, (p, r)) in planned.iter().zip(&ran).enumerate() {
            assert_eq!(p, r, "{name}: instruction {i} ({})", program.instrs[i].op.name());
        }
        assert!(
            lowered(&program).iter().any(|l| l.fuses.is_some()),
            "{name}: no fused pair"
        );
    }
}
