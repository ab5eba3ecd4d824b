//! The collectives that tell the long-sequence story, counted in the planned programs (what
//! `shardlab inspect` reports): ring attention's collective-permutes per attention, the K and V
//! all-gathers jit inserts for a sequence-sharded attention (as many as XLA emits, checked
//! against JAX itself), and sequence parallelism's reduce-scatter and all-gather where Megatron
//! tp has an all-reduce, with the same bytes over the wire (and beside them the backward's
//! gathers of the layer norms' outputs again, Megatron-LM's).
use shardlab::ir::{CpOrder, Op, Program};
use shardlab::model::GptConfig;
use shardlab::plan::{build, DropoutKey, Parallel, Planned, Strategy, TrainerOptions};
use shardlab::profile::{summarize, CollectiveKind};
use shardlab::sharding::Mesh;

fn config(layers: usize) -> GptConfig {
    GptConfig {
        layers,
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

fn plan(auto: bool, strategy: Strategy, mesh: &str, layers: usize, order: CpOrder) -> Planned {
    let mesh = Mesh::parse(mesh).unwrap();
    let parallel = if auto {
        Parallel::Auto {
            par: strategy.compose(&mesh).unwrap(),
            specs: vec![],
        }
    } else {
        Parallel::ShardMap {
            par: strategy.compose(&mesh).unwrap(),
            dropout_key: DropoutKey::Same,
        }
    };
    let opts = TrainerOptions {
        cp_order: order,
        schedule: Default::default(),
        ..TrainerOptions::new(config(layers), parallel)
    };
    build(&opts).unwrap()
}

fn count(prog: &Program, range: std::ops::Range<usize>, pred: impl Fn(&Op) -> bool) -> usize {
    prog.instrs[range].iter().filter(|i| pred(&i.op)).count()
}

#[test]
fn ring_attention_permutes_k_and_v_2_cp_minus_1_times_forward_and_4_cp_minus_1_plus_2_backward() {
    for order in CpOrder::ALL {
        for (mesh, cp) in [("cp=2", 2), ("cp=4", 4), ("dp=2,cp=2", 2)] {
            let strategy = if mesh.starts_with("dp") {
                Strategy::DpCp
            } else {
                Strategy::Cp
            };
            let layers = 2;
            let p = plan(false, strategy, mesh, layers, order);
            let prog = &p.step.program;
            let permute = |op: &Op| matches!(op, Op::Ppermute { .. });
            let forward = count(prog, 0..p.step.forward_end, permute);
            let all = count(prog, 0..prog.instrs.len(), permute);
            let what = format!("{} on {mesh}", order.name());
            assert_eq!(forward, layers * 2 * (cp - 1), "{what}: forward permutes");
            assert_eq!(all - forward, layers * (4 * (cp - 1) + 2), "{what}: backward permutes");
            // No all-gather: K and V travel the ring instead.
            assert_eq!(
                count(prog, 0..prog.instrs.len(), |op| matches!(op, Op::AllGather { .. })),
                0
            );
        }
    }
}

#[test]
fn automatic_cp_gathers_k_and_v_once_per_attention_and_reduces_their_gradients() {
    for mesh in ["cp=2", "cp=4", "dp=2,cp=2"] {
        let strategy = if mesh.starts_with("dp") {
            Strategy::DpCp
        } else {
            Strategy::Cp
        };
        let layers = 2;
        let p = plan(true, strategy, mesh, layers, CpOrder::Contiguous);
        let inserted = p.inserted.as_ref().unwrap();
        let gathers: Vec<_> = inserted.iter().filter(|r| r.op == "all_gather").collect();
        // K and V of every attention, in the forward; the backward reuses them.
        assert_eq!(gathers.len(), 2 * layers, "{mesh}: {gathers:#?}");
        for g in &gathers {
            assert_eq!(g.source_op, "dot_product_attention", "{mesh}");
            assert!(
                g.rule.contains("operand 1 of") || g.rule.contains("operand 2 of"),
                "{mesh}: {}",
                g.rule
            );
            assert!(g.instr < p.step.forward_end, "{mesh}: gathered in the forward");
        }
        // dK and dV of a device's queries are partial sums over cp: reduce-scattered back.
        let partial = inserted
            .iter()
            .filter(|r| r.op == "psum_scatter" && r.rule.contains("partial-sum over (cp)"))
            .count();
        assert_eq!(partial, 2 * layers, "{mesh}");
        // The queries stay sharded: no collective permutes, and the attention op knows its block.
        let prog = &p.step.program;
        let blocks = prog
            .instrs
            .iter()
            .filter(|i| matches!(&i.op, Op::Attention { seq, .. } if !seq.is_whole()))
            .count();
        assert_eq!(blocks, layers, "{mesh}: every attention on its block of the queries");
    }
}

/// Under jit's zig-zag order, explicit mode as automatic: K's and V's cotangents pass the
/// reorder's split and concatenation as partial sums and are reduce-scattered back, never
/// all-reduced whole (split and concatenate move elements, and a sum commutes with them).
#[test]
fn under_zigzag_both_jit_modes_reduce_scatter_k_and_v_cotangents() {
    let layers = 2;
    let mesh = Mesh::parse("cp=2").unwrap();
    let par = Strategy::Cp.compose(&mesh).unwrap();
    for parallel in [
        Parallel::Auto {
            par: par.clone(),
            specs: vec![],
        },
        Parallel::Explicit {
            par: par.clone(),
            axis_types: vec![],
            specs: vec![],
        },
    ] {
        let mode = parallel.mode_name();
        let opts = TrainerOptions {
            cp_order: CpOrder::Zigzag,
            ..TrainerOptions::new(config(layers), parallel)
        };
        let prog = build(&opts).unwrap().step.program;
        let all = 0..prog.instrs.len();
        let scatters = count(&prog, all.clone(), |op| matches!(op, Op::PsumScatter { .. }));
        assert_eq!(scatters, 2 * layers, "{mode}: dK and dV of every attention");
        let whole_sums = prog
            .instrs
            .iter()
            .filter(|i| matches!(i.op, Op::Psum { .. }) && prog.shape(i.outputs[0]).len() == 4)
            .count();
        assert_eq!(whole_sums, 0, "{mode}: no (B, H, T, D) all-reduce");
    }
}

/// Activation collectives (rank >= 3) of a program, by kind: (count, bytes over the wire);
/// `recomputed` picks those the backward recomputes (jax.checkpoint's), or the others.
fn activation_collectives(prog: &Program, recomputed: bool) -> std::collections::BTreeMap<&'static str, (usize, f64)> {
    let mut out = std::collections::BTreeMap::new();
    for c in summarize(prog).collectives {
        if prog.shape(prog.instrs[c.instr].inputs[0]).len() < 3 || prog.is_recomputed(c.instr) != recomputed {
            continue;
        }
        let e = out.entry(c.kind.hlo_name()).or_insert((0, 0.0));
        e.0 += 1;
        e.1 += c.kind.wire_bytes(c.bytes, c.group);
    }
    out
}

#[test]
fn sequence_parallelism_turns_each_all_reduce_into_a_reduce_scatter_and_an_all_gather_with_the_same_bytes() {
    for mesh in ["tp=2", "tp=4"] {
        let layers = 2;
        let tp_prog = plan(false, Strategy::Tp, mesh, layers, CpOrder::Contiguous)
            .step
            .program;
        let sp_prog = plan(false, Strategy::TpSp, mesh, layers, CpOrder::Contiguous)
            .step
            .program;
        let tp = activation_collectives(&tp_prog, false);
        let sp = activation_collectives(&sp_prog, false);
        // Megatron: an all-reduce after each row-parallel matmul forward, and one before each
        // column-parallel matmul backward: 4 per layer.
        let (ar, ar_bytes) = tp["all-reduce"];
        assert_eq!(ar, 4 * layers, "{mesh}: {tp:?}");
        assert!(!tp.contains_key("all-gather") && !tp.contains_key("reduce-scatter"));
        let (ag, ag_bytes) = sp["all-gather"];
        let (rs, rs_bytes) = sp["reduce-scatter"];
        assert_eq!((ag, rs), (4 * layers, 4 * layers), "{mesh}: {sp:?}");
        assert!(!sp.contains_key("all-reduce"), "{mesh}: {sp:?}");
        let same = (ag_bytes + rs_bytes - ar_bytes).abs() <= 1e-9 * ar_bytes;
        assert!(same, "{mesh}: {ag_bytes} + {rs_bytes} bytes vs {ar_bytes}");
        // Beside them, Megatron-LM's: each column-parallel matmul's input gathered again in the
        // backward for its weight's gradient (a device holds its rows between the passes), two
        // a layer, each the forward's gather again; Megatron tp recomputes nothing.
        let again = activation_collectives(&sp_prog, true);
        assert_eq!(again.keys().collect::<Vec<_>>(), [&"all-gather"], "{mesh}: {again:?}");
        let (n, bytes) = again["all-gather"];
        assert_eq!(n, 2 * layers, "{mesh}: {again:?}");
        assert!(
            (2.0 * bytes - ag_bytes).abs() <= 1e-9 * ag_bytes,
            "{mesh}: {bytes} vs {ag_bytes}"
        );
        assert!(activation_collectives(&tp_prog, true).is_empty(), "{mesh}");
    }
}

#[test]
fn automatic_sequence_parallelism_gathers_before_and_reduce_scatters_after_each_matmul_pair() {
    let layers = 2;
    let p = plan(true, Strategy::TpSp, "tp=2", layers, CpOrder::Contiguous);
    let forward: Vec<_> = p
        .inserted
        .as_ref()
        .unwrap()
        .iter()
        .filter(|r| r.instr < p.step.forward_end && r.source_op == "with_sharding_constraint")
        .collect();
    let gathered: Vec<&str> = forward
        .iter()
        .filter(|r| r.op == "all_gather")
        .map(|r| r.value.as_str())
        .collect();
    let scattered: Vec<&str> = forward
        .iter()
        .filter(|r| r.op == "psum_scatter")
        .map(|r| r.value.as_str())
        .collect();
    assert_eq!(gathered, ["h0.ln1", "h0.ln2", "h1.ln1", "h1.ln2"], "{forward:#?}");
    assert_eq!(scattered, ["h0.proj", "h0.mlp", "h1.proj", "h1.mlp"], "{forward:#?}");
    // And no all-reduce of an activation in the forward, where tp has one per matmul pair.
    let prog = &p.step.program;
    let all_reduces = prog.instrs[..p.step.forward_end]
        .iter()
        .filter(|i| matches!(i.op, Op::Psum { .. }) && prog.shape(i.inputs[0]).len() >= 3)
        .count();
    assert_eq!(all_reduces, 0);
}

#[test]
fn wire_bytes_of_an_all_reduce_are_a_reduce_scatter_and_an_all_gather() {
    for n in [2, 4, 8] {
        let b = 1 << 20;
        let ar = CollectiveKind::AllReduce.wire_bytes(b, n);
        let rs = CollectiveKind::ReduceScatter.wire_bytes(b, n);
        let ag = CollectiveKind::AllGather.wire_bytes(b, n);
        assert_eq!(ar, rs + ag);
        assert_eq!(rs, b as f64 * (n - 1) as f64 / n as f64);
    }
}
