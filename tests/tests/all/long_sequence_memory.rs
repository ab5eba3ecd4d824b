//! What a device holds between the forward and the backward under the long-sequence
//! strategies, in closed form: every residual is linear in the sequence, so ring attention
//! divides them all by cp (only its own K and V blocks are held, the ring's custom VJP sends
//! them round again); jit's gathered K and V are held whole; sequence parallelism divides the
//! residual stream and layer norms by tp, where Megatron tp holds them whole, the layer-norm
//! outputs the weight gradients read included (a device holds its rows of them and gathers
//! them again in the backward, as Megatron-LM does).
use shardlab::ir::{CpOrder, Program};
use shardlab::model::GptConfig;
use shardlab::plan::{build, DropoutKey, MemoryPlan, Parallel, Planned, Strategy, TrainerOptions};
use shardlab::sharding::Mesh;

fn config() -> GptConfig {
    GptConfig {
        layers: 2,
        d_model: 32,
        heads: 4,
        seq: 16,
        batch: 4,
        vocab: 32,
        tied: false,
        dropout: 0.0,
        attention: Default::default(),
        remat: Default::default(),
        precision: Default::default(),
        moe: None,
    }
}

fn plan(parallel: Parallel, order: CpOrder) -> Planned {
    build(&TrainerOptions {
        cp_order: order,
        schedule: Default::default(),
        ..TrainerOptions::new(config(), parallel)
    })
    .unwrap()
}

fn shard_map(strategy: Strategy, mesh: &str) -> Parallel {
    Parallel::ShardMap {
        par: strategy.compose(&Mesh::parse(mesh).unwrap()).unwrap(),
        dropout_key: DropoutKey::Same,
    }
}

fn auto(strategy: Strategy, mesh: &str) -> Parallel {
    Parallel::Auto {
        par: strategy.compose(&Mesh::parse(mesh).unwrap()).unwrap(),
        specs: vec![],
    }
}

/// Elements of the values the forward makes and the backward reads.
fn held(p: &Planned) -> usize {
    let prog: &Program = &p.step.program;
    let read_later: std::collections::HashSet<_> = prog.instrs[p.step.forward_end..]
        .iter()
        .flat_map(|ins| ins.inputs.iter().copied())
        .collect();
    prog.instrs[..p.step.forward_end]
        .iter()
        .flat_map(|ins| ins.outputs.iter().copied())
        .filter(|v| read_later.contains(v))
        .map(|v| prog.info(v).numel())
        .sum()
}

/// One device's held elements at sequence length `t`: x0; per layer the layer norms' outputs
/// and row statistics, the per-head view of w_qkv (3 d^2, not an activation), q, k, v, the
/// attention output and its row log-sum-exps, the merged heads, the residual stream twice, the
/// MLP's pre- and post-GELU hidden; then the final layer norm and the logits.
fn one_device(c: &GptConfig, t: usize) -> usize {
    let (b, d, h, v, l) = (c.batch, c.d_model, c.heads, c.vocab, c.layers);
    let btd = b * t * d;
    let layer = 17 * btd + 4 * b * t + b * h * t + 3 * d * d;
    btd + l * layer + btd + 2 * b * t + b * t * v
}

#[test]
fn ring_attention_holds_a_cp_th_of_every_activation() {
    let c = config();
    assert_eq!(held(&plan(Parallel::None, CpOrder::Contiguous)), one_device(&c, c.seq));
    for order in CpOrder::ALL {
        for (strategy, mesh, cp, dp) in [
            (Strategy::Cp, "cp=2", 2, 1),
            (Strategy::Cp, "cp=4", 4, 1),
            (Strategy::DpCp, "dp=2,cp=2", 2, 2),
        ] {
            let c = GptConfig {
                batch: c.batch / dp,
                ..config()
            };
            // The sequence is cp times shorter on each device; the scaled loss is one scalar.
            // Zig-zag takes its rows of the token ids and targets (contiguous gets them as its
            // inputs' blocks), and the backward reads both.
            let ids = match order {
                CpOrder::Contiguous => 0,
                CpOrder::Zigzag => 2 * c.batch * c.seq / cp,
            };
            let want = one_device(&c, c.seq / cp) + 1 + ids;
            assert_eq!(held(&plan(shard_map(strategy, mesh), order)), want, "{mesh} {order:?}");
        }
    }
}

#[test]
fn automatic_cp_holds_its_gathered_k_and_v_whole() {
    let c = config();
    for cp in [2, 4] {
        let (b, t, d, l) = (c.batch, c.seq, c.d_model, c.layers);
        // K and V of every layer whole (B, H, T, Dh) where ring attention holds T/cp of them.
        let gathered = 2 * l * (b * t * d - b * (t / cp) * d);
        let want = one_device(&c, t / cp) + 1 + gathered;
        let got = held(&plan(auto(Strategy::Cp, &format!("cp={cp}")), CpOrder::Contiguous));
        assert_eq!(got, want, "cp={cp}");
    }
}

#[test]
fn sequence_parallelism_divides_the_residual_stream_and_layer_norms_by_tp() {
    let c = config();
    let (b, t, d, h, v, l) = (c.batch, c.seq, c.d_model, c.heads, c.vocab, c.layers);
    let btd = b * t * d;
    for tp in [2, 4] {
        let mesh = format!("tp={tp}");
        // Split over tp in both: the per-head view of w_qkv, q, k, v, o, lse, merged heads, the
        // MLP hidden (13 BTd). Megatron tp holds the residual stream and the layer norms'
        // inputs to the matmuls whole (4 BTd, 4 BT row statistics); sequence parallelism holds
        // a tp-th of them, the two layer-norm outputs the backward gathers again included.
        let split = 13 * btd / tp + b * h * t / tp + 3 * d * d / tp;
        let tail = btd + 2 * b * t + b * t * v;
        let tp_held = btd + l * (4 * btd + 4 * b * t + split) + tail;
        let sp_held = btd / tp + l * (4 * btd / tp + 4 * b * t / tp + split) + tail / tp + 1;
        assert_eq!(
            held(&plan(shard_map(Strategy::Tp, &mesh), CpOrder::Contiguous)),
            tp_held,
            "tp {mesh}"
        );
        assert_eq!(
            held(&plan(shard_map(Strategy::TpSp, &mesh), CpOrder::Contiguous)),
            sp_held,
            "tp_sp {mesh}"
        );
    }
}

#[test]
fn the_memory_plans_peak_drops_with_the_sequence_split() {
    let peak = |p: Planned| MemoryPlan::of(&p.step.program).unwrap().activations;
    let one = peak(plan(Parallel::None, CpOrder::Contiguous));
    let cp2 = peak(plan(shard_map(Strategy::Cp, "cp=2"), CpOrder::Contiguous));
    let cp4 = peak(plan(shard_map(Strategy::Cp, "cp=4"), CpOrder::Contiguous));
    assert!(one > cp2 && cp2 > cp4, "one device {one}, cp=2 {cp2}, cp=4 {cp4}");
    let tp = peak(plan(shard_map(Strategy::Tp, "tp=4"), CpOrder::Contiguous));
    let sp = peak(plan(shard_map(Strategy::TpSp, "tp=4"), CpOrder::Contiguous));
    assert!(sp < tp, "tp {tp}, tp_sp {sp}");
}

/// Gradient accumulation with dropout over a split sequence: between its forward and backward a
/// microbatch holds what a batch of B / K holds, its masks' bits included (they are drawn over
/// the microbatch's arrays), plus the device's token ids and targets of the whole batch, which
/// the later microbatches slice.
#[test]
fn a_microbatch_holds_what_a_batch_of_b_over_k_holds_plus_the_batchs_token_ids() {
    let (b, k) = (8, 2);
    for (strategy, mesh, dp, split) in [
        (Strategy::Cp, "cp=2", 1, 2),
        (Strategy::DpCp, "dp=2,cp=2", 2, 2),
        (Strategy::TpSp, "tp=2", 1, 2),
    ] {
        for (mode, parallel) in [("shard_map", shard_map(strategy, mesh)), ("auto", auto(strategy, mesh))] {
            let held_at = |batch, microbatches| {
                held(
                    &build(&TrainerOptions {
                        cp_order: CpOrder::Contiguous,
                        schedule: Default::default(),
                        microbatches,
                        ..TrainerOptions::new(
                            GptConfig {
                                batch,
                                dropout: 0.1,
                                ..config()
                            },
                            parallel.clone(),
                        )
                    })
                    .unwrap(),
                )
            };
            let ids = 2 * (b / dp) * (config().seq / split);
            assert_eq!(held_at(b, k), held_at(b / k, 1) + ids, "{mode} {mesh}");
        }
    }
}
