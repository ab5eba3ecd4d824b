//! The collectives of gradient accumulation and ZeRO against XLA's: each exported script's
//! step is compiled by JAX 0.10 on simulated CPU devices (`jit(...).lower(...).compile()`),
//! the arrays its all-reduces, reduce-scatters and all-gathers carry are counted, and shardlab's
//! program for the same options is held to them.
//!
//! What JAX says, and where shardlab differs on purpose:
//! - shard_map: the same collectives as shardlab's body, microbatches or not.
//! - jit, data parallelism, K microbatches: GSPMD all-reduces each microbatch's gradient (K per
//!   parameter), and XLA's CPU pipeline keeps them; its GPU and TPU pipelines run
//!   AllReduceReassociate, which makes `all-reduce(a) + all-reduce(b)` one `all-reduce(a + b)`.
//!   shardlab's partitioner does that fold (an add of partial sums stays a partial sum), so it
//!   has exactly 1/K of the CPU's count.
//! - jit, ZeRO-2: XLA's CPU pipeline all-reduces and then slices each device's block; its GPU
//!   and TPU pipelines (ReduceScatterCreator) make that one reduce-scatter, as shardlab's
//!   partitioner does: its reduce-scatters are the CPU's all-reduces.
//! - jit, microbatches sliced contiguously (`x.reshape(K, B/K, ...)[j]`) make XLA move rows
//!   between devices; strided (`x.reshape(B/K, K, ...)[:, j]`, shardlab's) move nothing.
use std::collections::BTreeMap;

use serde_json::Value;
use shardlab::exec::{Parallel, TrainerOptions};
use shardlab::export::jax_script;
use shardlab::ir::Program;
use shardlab::model::Optimizer;
use shardlab::plan::{build, Strategy};

use crate::accumulation::{auto, options, shard_map};

/// Replaces the exported script's `main()` call: compile the step (its state and batch placed
/// as main() places them) and print, per collective kind, how many non-scalar arrays its
/// instructions carry in one step: an instruction inside a loop (the layers' scan, GPipe's
/// ticks) counts once per trip, as shardlab's unrolled program has it once per layer or tick.
const COUNT_COLLECTIVES: &str = r#"
import re
host = init_params()
params = place(host, PARAM_LAYOUT)
opt_state = tuple(place(s, STATE_LAYOUT) for s in init_opt_state(host))
inputs, targets = batch_arrays(Dataset(), 0)
compiled = make_train_step().lower(params, opt_state, inputs, targets, np.asarray(step_key(0)), adamw_hyper(1)).compile()
own, loops, entry, comp = {}, {}, None, None
for line in compiled.as_text().splitlines():
    head = re.match(r"(ENTRY )?%?([\w.\-]+) .*\{$", line)
    if head and not line.startswith(" "):
        comp = head.group(2)
        entry = comp if head.group(1) else entry
        own[comp], loops[comp] = {}, []
        continue
    m = re.search(r"= (\(.*?\)|\S+) (all-reduce|reduce-scatter|all-gather|all-to-all|collective-permute)(-start)?\(", line)
    if m:
        arrays = [s for s in re.findall(r"[a-z0-9]+\[[0-9,]*\]", m.group(1)) if not s.endswith("[]")]
        own[comp][m.group(2)] = own[comp].get(m.group(2), 0) + len(arrays)
    w = re.search(r" while\(.*body=%?([\w.\-]+)", line)
    if w:
        trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
        assert trips, f"a loop without a known trip count: {line}"
        loops[comp].append((w.group(1), int(trips.group(1))))


def total(comp):
    counts = dict(own[comp])
    for body, trips in loops[comp]:
        for kind, n in total(body).items():
            counts[kind] = counts.get(kind, 0) + trips * n
    return counts


say({k: n for k, n in total(entry).items() if n > 0})
"#;

/// The arrays each collective kind carries in XLA's compiled step for the exported script.
pub fn xla_counts(name: &str, opts: &TrainerOptions, rewrite: Option<(&str, &str)>) -> BTreeMap<String, usize> {
    let mut script = jax_script(opts, 1).unwrap();
    let call = "if __name__ == \"__main__\":\n    main()";
    assert!(script.contains(call), "the script ends by calling main()");
    script = script.replace(call, COUNT_COLLECTIVES);
    if let Some((from, to)) = rewrite {
        assert!(script.contains(from), "{name}: the script has no `{from}`");
        script = script.replace(from, to);
    }
    let stdout = shardlab_tests::run_jax_script("levers-jax", name, &script, opts.parallel.devices());
    let last = stdout.lines().last().unwrap_or_default();
    let v: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{name}: `{last}`: {e}"));
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, n)| (k.clone(), n.as_u64().unwrap() as usize))
        .collect()
}

/// The same in shardlab's program, by XLA's names: non-scalar operands of each collective.
pub fn shardlab_counts(opts: &TrainerOptions) -> BTreeMap<String, usize> {
    let prog: Program = build(opts).unwrap().step.program;
    let mut counts = BTreeMap::new();
    for ins in &prog.instrs {
        let kind = match ins.op.name() {
            "psum" => "all-reduce",
            "psum_scatter" => "reduce-scatter",
            "all_gather" => "all-gather",
            "ppermute" => "collective-permute",
            _ => continue,
        };
        let arrays = ins.inputs.iter().filter(|v| !prog.shape(**v).is_empty()).count();
        *counts.entry(kind.to_string()).or_insert(0) += arrays;
    }
    counts.retain(|_, n| *n > 0);
    counts
}

fn adamw(parallel: Parallel, k: usize) -> TrainerOptions {
    options(parallel, Optimizer::AdamW { lr: 1e-3 }, k)
}

fn kinds(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect()
}

/// Named `under_jax::` so that `cargo xtask test` runs it in its JAX step, with the venv.
mod under_jax {
    use super::*;

    #[test]
    fn shard_map_bodies_have_xlas_collectives_with_and_without_microbatches() {
        if shardlab_tests::jax_python().is_none() {
            return;
        }
        for (name, opts) in [
            ("sm_dp_k2", adamw(shard_map(Strategy::Dp, "dp=4"), 2)),
            ("sm_zero1_k2", adamw(shard_map(Strategy::Zero1, "dp=4"), 2)),
            ("sm_zero2_k2", adamw(shard_map(Strategy::Zero2, "dp=4"), 2)),
        ] {
            assert_eq!(xla_counts(name, &opts, None), shardlab_counts(&opts), "{name}");
        }
    }

    #[test]
    fn jit_all_reduces_each_microbatch_on_the_cpu_and_shardlab_once_as_xla_reassociates() {
        if shardlab_tests::jax_python().is_none() {
            return;
        }
        let one = adamw(auto(Strategy::Dp, "dp=4"), 1);
        assert_eq!(xla_counts("auto_dp_k1", &one, None), shardlab_counts(&one));
        let k = 2;
        let two = adamw(auto(Strategy::Dp, "dp=4"), k);
        let xla = xla_counts("auto_dp_k2", &two, None);
        let ours = shardlab_counts(&two);
        assert_eq!(ours, shardlab_counts(&one), "one all-reduce per gradient, whatever K");
        assert_eq!(
            xla["all-reduce"],
            k * ours["all-reduce"],
            "XLA (CPU): {xla:?}, shardlab: {ours:?}"
        );
    }

    #[test]
    fn jit_zero_has_xlas_collectives_with_zero2s_all_reduce_and_slice_as_one_reduce_scatter() {
        if shardlab_tests::jax_python().is_none() {
            return;
        }
        let zero1 = adamw(auto(Strategy::Zero1, "dp=4"), 1);
        assert_eq!(xla_counts("auto_zero1", &zero1, None), shardlab_counts(&zero1));
        let zero2 = adamw(auto(Strategy::Zero2, "dp=4"), 1);
        let (xla, ours) = (xla_counts("auto_zero2", &zero2, None), shardlab_counts(&zero2));
        let n = ours["reduce-scatter"];
        assert_eq!(xla, kinds(&[("all-reduce", n), ("all-gather", n)]), "XLA (CPU)");
        assert_eq!(ours, kinds(&[("reduce-scatter", n), ("all-gather", n)]), "shardlab");
    }

    #[test]
    fn contiguous_microbatches_make_jit_move_rows_between_devices_and_strided_ones_do_not() {
        if shardlab_tests::jax_python().is_none() {
            return;
        }
        let opts = adamw(auto(Strategy::Dp, "dp=4"), 2);
        let moves = |c: &BTreeMap<String, usize>| {
            ["all-gather", "all-to-all", "collective-permute"]
                .iter()
                .any(|k| c.contains_key(*k))
        };
        let strided = xla_counts("auto_dp_strided", &opts, None);
        assert!(!moves(&strided), "{strided:?}");
        let contiguous = xla_counts(
            "auto_dp_contiguous",
            &opts,
            Some((
                "return [grouped[:, j] for j in range(MICROBATCHES)]",
                "return list(x.reshape(MICROBATCHES, x.shape[0] // MICROBATCHES, *x.shape[1:]))",
            )),
        );
        assert!(moves(&contiguous), "{contiguous:?}");
    }
}
