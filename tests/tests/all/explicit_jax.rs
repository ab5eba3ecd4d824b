//! Explicit sharding against JAX: small global programs, each written once for shardlab's
//! builder and once in JAX (the same ops on operands of the same types), on a dp=2, tp=2 mesh
//! of Explicit axes. shardlab must refuse exactly the programs JAX 0.10 refuses, naming the
//! same fix, and give every other program's result the type JAX gives it. The cases are JAX's
//! own (its explicit-sharding guide and tests: broadcasting, dot_general, reshape, gather,
//! random bits) and the model's ops as the JAX compositions they stand for. The verdicts JAX
//! gave are written in the table, so shardlab is held to them without Python too;
//! `under_jax::` runs JAX itself, one script for every case.
use std::collections::BTreeMap;

use shardlab::ir::{Builder, DType, RngLayout, Role, ValueId};
use shardlab::partition::auto::dims_of_spec;
use shardlab::partition::explicit::{annotate, type_text, FixKind, ShardingTypeError, Want, WantDims};
use shardlab::sharding::{Mesh, PartitionSpec};

/// An operand: its shape, dtype and sharding.
type Input = (&'static [usize], DType, &'static str);

const F: DType = DType::F32;
const U: DType = DType::U32;

/// What JAX 0.10.2 does with a program: the result's type, or the fix its error names.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Verdict {
    Type(&'static str),
    Refused(FixKind),
}

struct Case {
    name: &'static str,
    inputs: Vec<Input>,
    /// The program for shardlab's builder, on the inputs in order.
    body: fn(&mut Builder, &[ValueId]) -> ValueId,
    /// The out_sharding the program gives its result (written in `jax` too).
    out_sharding: Option<&'static str>,
    /// The same program in JAX, a lambda of `a, b, c, ...` (with the compositions of the
    /// script's prelude).
    jax: &'static str,
    verdict: Verdict,
}

fn cases() -> Vec<Case> {
    use Verdict::{Refused, Type};
    let case = |name, inputs, body, jax, verdict| Case {
        name,
        inputs,
        body,
        out_sharding: None,
        jax,
        verdict,
    };
    let mat = |spec| (&[8usize, 16][..], F, spec);
    let stream = |spec| (&[8usize, 4, 16][..], F, spec);
    let heads = |spec| (&[8usize, 2, 4, 4][..], F, spec);
    let key = (&[2usize][..], U, "P()");
    let ids = |spec| (&[8usize, 4][..], U, spec);
    vec![
        // Broadcasting (jax/_src/lax/lax.py broadcasting_sharding_rule).
        case(
            "elementwise of arrays sharded alike",
            vec![mat("P('dp')"), mat("P('dp')")],
            |b, x| b.add(x[0], x[1]),
            "a + b",
            Type("f32[8@dp,16]"),
        ),
        case(
            "a replicated operand takes the other's sharding",
            vec![mat("P('dp')"), mat("P()")],
            |b, x| b.mul(x[0], x[1]),
            "a * b",
            Type("f32[8@dp,16]"),
        ),
        case(
            "incompatible shardings are refused",
            vec![mat("P('dp')"), mat("P('tp')")],
            |b, x| b.add(x[0], x[1]),
            "a + b",
            Refused(FixKind::Reshard),
        ),
        case(
            "a broadcast bias sharded like the last dim",
            vec![stream("P('dp', None, 'tp')"), (&[16], F, "P('tp')")],
            |b, x| b.add(x[0], x[1]),
            "a + b",
            Type("f32[8@dp,4,16@tp]"),
        ),
        case(
            "a broadcast operand sharded over the other's batch axis",
            vec![stream("P('dp')"), (&[16], F, "P('dp')")],
            |b, x| b.mul(x[0], x[1]),
            "a * b",
            Refused(FixKind::Reshard),
        ),
        // dot_general (_dot_general_sharding_rule).
        case(
            "dot with a sharded free dim",
            vec![mat("P('dp')"), (&[16, 32], F, "P(None, 'tp')")],
            |b, x| b.matmul(x[0], x[1]),
            "a @ b",
            Type("f32[8@dp,32@tp]"),
        ),
        case(
            "dot with its contracting dims sharded alike is ambiguous",
            vec![mat("P(None, 'tp')"), (&[16, 8], F, "P('tp')")],
            |b, x| b.matmul(x[0], x[1]),
            "a @ b",
            Refused(FixKind::OutSharding),
        ),
        Case {
            out_sharding: Some("P('dp')"),
            ..case(
                "out_sharding resolves the ambiguous dot",
                vec![mat("P('dp', 'tp')"), (&[16, 8], F, "P('tp')")],
                |b, x| b.matmul(x[0], x[1]),
                "jnp.dot(a, b, out_sharding=P('dp'))",
                Type("f32[8@dp,8]"),
            )
        },
        case(
            "dot with the contracting dim sharded on one side",
            vec![mat("P('dp')"), (&[16, 8], F, "P('tp')")],
            |b, x| b.matmul(x[0], x[1]),
            "a @ b",
            Type("f32[8@dp,8]"),
        ),
        case(
            "dot with its contracting dims sharded differently",
            vec![mat("P(None, 'dp')"), (&[16, 8], F, "P('tp')")],
            |b, x| b.matmul(x[0], x[1]),
            "a @ b",
            Refused(FixKind::Reshard),
        ),
        case(
            "dot whose result would be sharded twice over one axis",
            vec![mat("P('dp')"), (&[16, 8], F, "P(None, 'dp')")],
            |b, x| b.matmul(x[0], x[1]),
            "a @ b",
            Refused(FixKind::Reshard),
        ),
        case(
            "batched dot with its batch dims sharded differently",
            vec![stream("P('dp')"), (&[8, 16, 4], F, "P('tp')")],
            |b, x| b.dot_general(x[0], x[1], (&[2], &[1]), (&[0], &[0]), 1.0),
            "jax.lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,))))",
            Refused(FixKind::Reshard),
        ),
        // Reductions, reshape, transpose, broadcast_in_dim, split, concatenate.
        case(
            "reduce_sum over a sharded axis",
            vec![mat("P('dp', 'tp')")],
            |b, x| b.sum(x[0], &[0]),
            "a.sum(0)",
            Type("f32[16@tp]"),
        ),
        case(
            "reshape splitting a sharded dim",
            vec![mat("P(None, 'tp')")],
            |b, x| b.reshape(x[0], &[8, 2, 8]),
            "a.reshape(8, 2, 8)",
            Type("f32[8,2@tp,8]"),
        ),
        case(
            "reshape splitting a sharded dim the axis does not divide the major part of",
            vec![(&[8, 48], F, "P(None, 'tp')")],
            |b, x| b.reshape(x[0], &[8, 3, 16]),
            "a.reshape(8, 3, 16)",
            Refused(FixKind::OutSharding),
        ),
        case(
            "reshape merging a sharded major dim",
            vec![stream("P('dp')")],
            |b, x| b.reshape(x[0], &[32, 16]),
            "a.reshape(32, 16)",
            Type("f32[32@dp,16]"),
        ),
        case(
            "reshape merging a sharded minor dim",
            vec![stream("P(None, None, 'tp')")],
            |b, x| b.reshape(x[0], &[8, 64]),
            "a.reshape(8, 64)",
            Refused(FixKind::OutSharding),
        ),
        Case {
            out_sharding: Some("P(None, 'tp')"),
            ..case(
                "out_sharding resolves the reshape",
                vec![stream("P(None, None, 'tp')")],
                |b, x| b.reshape(x[0], &[8, 64]),
                "jax.lax.reshape(a, (8, 64), out_sharding=P(None, 'tp'))",
                Type("f32[8,64@tp]"),
            )
        },
        case(
            "reshape dropping a size-1 dim",
            vec![(&[1, 8, 4], F, "P(None, 'dp')")],
            |b, x| b.reshape(x[0], &[8, 4]),
            "a.reshape(8, 4)",
            Type("f32[8@dp,4]"),
        ),
        case(
            "transpose permutes the sharding",
            vec![stream("P('dp', None, 'tp')")],
            |b, x| b.transpose(x[0], &[2, 0, 1]),
            "a.transpose(2, 0, 1)",
            Type("f32[16@tp,8@dp,4]"),
        ),
        case(
            "broadcast_in_dim adds replicated dims",
            vec![(&[8, 4], F, "P('dp')")],
            |b, x| b.broadcast_in_dim(x[0], &[8, 4, 16], &[0, 1]),
            "jax.lax.broadcast_in_dim(a, (8, 4, 16), (0, 1))",
            Type("f32[8@dp,4,16]"),
        ),
        case(
            "split along an unsharded dim keeps the sharding",
            vec![mat("P('dp')")],
            |b, x| b.split(x[0], 1, &[8, 8])[0],
            "jax.lax.split(a, (8, 8), axis=1)[0]",
            Type("f32[8@dp,8]"),
        ),
        case(
            "split of a sharded dim its axis still divides",
            vec![mat("P('dp')")],
            |b, x| b.split(x[0], 0, &[4, 4])[0],
            "jax.lax.split(a, (4, 4), axis=0)[0]",
            Type("f32[4@dp,16]"),
        ),
        case(
            "split of a sharded dim its axis no longer divides",
            vec![(&[6, 4], F, "P('dp')")],
            |b, x| b.split(x[0], 0, &[3, 3])[0],
            "jax.lax.split(a, (3, 3), axis=0)[0]",
            Refused(FixKind::Reshard),
        ),
        case(
            "zig-zag's reorder: a sequence split into chunks and concatenated back keeps its sharding",
            vec![(&[8, 8], U, "P('dp', 'tp')")],
            |b, x| {
                let c = b.split(x[0], 1, &[2, 2, 2, 2]);
                b.concat(&[c[0], c[3], c[1], c[2]], 1)
            },
            "(lambda c: jnp.concatenate([c[0], c[3], c[1], c[2]], 1))(jax.lax.split(a, (2, 2, 2, 2), axis=1))",
            Type("u32[8@dp,8@tp]"),
        ),
        case(
            "concatenate of operands sharded differently",
            vec![mat("P('dp')"), mat("P()")],
            |b, x| b.concat(&[x[0], x[1]], 0),
            "jnp.concatenate([a, b], 0)",
            Refused(FixKind::Reshard),
        ),
        // Gather for the embedding (_gather_sharding_rule) and random bits.
        case(
            "gather with sharded indices needs out_sharding",
            vec![(&[32, 16], F, "P()"), ids("P('dp')")],
            |b, x| b.take(x[0], x[1]),
            "a[b]",
            Refused(FixKind::OutSharding),
        ),
        case(
            "gather with replicated indices keeps the table's embedding sharding",
            vec![(&[32, 16], F, "P(None, 'tp')"), ids("P()")],
            |b, x| b.take(x[0], x[1]),
            "a[b]",
            Type("f32[8,4,16@tp]"),
        ),
        case(
            "gather from a table sharded over its rows needs out_sharding",
            vec![(&[32, 16], F, "P('tp')"), ids("P()")],
            |b, x| b.take(x[0], x[1]),
            "a[b]",
            Refused(FixKind::OutSharding),
        ),
        Case {
            out_sharding: Some("P('dp')"),
            ..case(
                "out_sharding resolves the gather",
                vec![(&[32, 16], F, "P()"), ids("P('dp')")],
                |b, x| b.take(x[0], x[1]),
                "a.at[b].get(out_sharding=P('dp'))",
                Type("f32[8@dp,4,16]"),
            )
        },
        case(
            "random bits are replicated without out_sharding",
            vec![key],
            |b, x| b.random_bits(x[0], &[8, 4], RngLayout::Partitionable),
            "jax.random.bits(jax.random.wrap_key_data(a), (8, 4))",
            Type("u32[8,4]"),
        ),
        Case {
            out_sharding: Some("P('dp')"),
            ..case(
                "random bits with out_sharding",
                vec![key],
                |b, x| b.random_bits(x[0], &[8, 4], RngLayout::Partitionable),
                "jax.random.bits(jax.random.wrap_key_data(a), (8, 4), out_sharding=P('dp'))",
                Type("u32[8@dp,4]"),
            )
        },
        // The model's ops, as the JAX compositions they stand for.
        case(
            "layer_norm of a batch-sharded stream",
            vec![stream("P('dp')"), (&[16], F, "P()"), (&[16], F, "P()")],
            |b, x| b.layer_norm(x[0], x[1], x[2]),
            "layer_norm(a, b, c)",
            Type("f32[8@dp,4,16]"),
        ),
        case(
            "layer_norm over a sharded last axis",
            vec![stream("P('dp', None, 'tp')"), (&[16], F, "P()"), (&[16], F, "P()")],
            |b, x| b.layer_norm(x[0], x[1], x[2]),
            "layer_norm(a, b, c)",
            Type("f32[8@dp,4,16@tp]"),
        ),
        case(
            "layer_norm with its gain sharded over the batch's axis (FSDP's gain, not gathered)",
            vec![stream("P('dp')"), (&[16], F, "P('dp')"), (&[16], F, "P()")],
            |b, x| b.layer_norm(x[0], x[1], x[2]),
            "layer_norm(a, b, c)",
            Refused(FixKind::Reshard),
        ),
        case(
            "gelu keeps the sharding",
            vec![stream("P('dp', None, 'tp')")],
            |b, x| b.gelu(x[0]),
            "jax.nn.gelu(a, approximate=True)",
            Type("f32[8@dp,4,16@tp]"),
        ),
        case(
            "causal softmax keeps the sharding",
            vec![heads("P('dp', 'tp')")],
            |b, x| b.softmax_causal(x[0]),
            "softmax_causal(a)",
            Type("f32[8@dp,2@tp,4,4]"),
        ),
        case(
            "attention with the heads split",
            vec![heads("P('dp', 'tp')"), heads("P('dp', 'tp')"), heads("P('dp', 'tp')")],
            |b, x| b.attention([x[0], x[1], x[2]], 0.5, None),
            "attention(a, b, c)",
            Type("f32[8@dp,2@tp,4,4]"),
        ),
        case(
            "attention with the sequence split on queries and keys",
            vec![
                heads("P('dp', None, 'tp')"),
                heads("P('dp', None, 'tp')"),
                heads("P('dp', None, 'tp')"),
            ],
            |b, x| b.attention([x[0], x[1], x[2]], 0.5, None),
            "attention(a, b, c)",
            Refused(FixKind::Reshard),
        ),
        case(
            "attention with the queries split and the keys whole",
            vec![heads("P('dp', None, 'tp')"), heads("P('dp')"), heads("P('dp')")],
            |b, x| b.attention([x[0], x[1], x[2]], 0.5, None),
            "attention(a, b, c)",
            Type("f32[8@dp,2,4@tp,4]"),
        ),
        case(
            "cross_entropy of batch-sharded logits",
            vec![(&[8, 4, 32], F, "P('dp')"), ids("P('dp')")],
            |b, x| b.cross_entropy(x[0], x[1]),
            "cross_entropy(a, b)",
            Type("f32[8@dp,4]"),
        ),
        case(
            "cross_entropy over a sharded vocabulary",
            vec![(&[8, 4, 32], F, "P('dp', None, 'tp')"), ids("P('dp')")],
            |b, x| b.cross_entropy(x[0], x[1]),
            "cross_entropy(a, b)",
            Type("f32[8@dp,4]"),
        ),
        case(
            "dropout keeps the masked value's sharding",
            vec![mat("P('dp')"), key],
            |b, x| b.dropout(x[0], x[1], 0.5, RngLayout::Partitionable),
            "dropout(a, b)",
            Type("f32[8@dp,16]"),
        ),
    ]
}

fn mesh() -> Mesh {
    Mesh::parse("dp=2,tp=2").unwrap()
}

/// shardlab's verdict on a case: its result's type, or its refusal.
fn shardlab_types(c: &Case) -> Result<String, ShardingTypeError> {
    let mut b = Builder::new();
    let args: Vec<ValueId> = c
        .inputs
        .iter()
        .enumerate()
        .map(|(k, (shape, dtype, _))| b.input(&format!("x{k}"), shape, *dtype, Role::Other))
        .collect();
    let out = (c.body)(&mut b, &args);
    b.output(out);
    let prog = b.finish().unwrap();
    let in_types: Vec<_> = c
        .inputs
        .iter()
        .map(|(shape, _, spec)| dims_of_spec(&PartitionSpec::parse(spec).unwrap(), shape.len()))
        .collect();
    let mut wants = BTreeMap::new();
    if let Some(spec) = c.out_sharding {
        let dims = dims_of_spec(&PartitionSpec::parse(spec).unwrap(), prog.shape(out).len());
        let why = "the case's out_sharding".to_string();
        wants.insert(
            out,
            Want {
                dims: WantDims::Spec(dims),
                why,
            },
        );
    }
    let a = annotate(&prog, &mesh(), &in_types, &wants, None)?;
    let v = a.program.outputs[0];
    Ok(type_text(
        a.program.info(v).dtype,
        a.program.shape(v),
        &a.types[v.index()],
    ))
}

fn verdict(got: &Result<String, ShardingTypeError>) -> String {
    match got {
        Ok(t) => t.clone(),
        Err(e) => format!("refused ({:?}): {}", e.fix.kind, e.message),
    }
}

fn agrees(c: &Case, got: &Result<String, ShardingTypeError>) -> bool {
    match (c.verdict, got) {
        (Verdict::Type(t), Ok(got)) => t == got,
        (Verdict::Refused(fix), Err(e)) => e.fix.kind == fix,
        _ => false,
    }
}

#[test]
fn explicit_types_and_refusals_are_the_ones_jax_gives() {
    let mut wrong = Vec::new();
    for c in cases() {
        let got = shardlab_types(&c);
        if !agrees(&c, &got) {
            wrong.push(format!("{}: JAX: {:?}, shardlab: {}", c.name, c.verdict, verdict(&got)));
        }
    }
    assert!(
        wrong.is_empty(),
        "explicit sharding disagrees with JAX 0.10:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_refusal_says_jaxs_error_and_the_fix_at_the_op() {
    let cases = cases();
    let c = cases
        .iter()
        .find(|c| c.name == "dot with its contracting dims sharded alike is ambiguous")
        .unwrap();
    let e = shardlab_types(c).unwrap_err();
    assert_eq!(e.op, "dot_general");
    assert!(
        e.message.starts_with("Contracting dimensions are sharded"),
        "{}",
        e.message
    );
    assert!(
        e.line.contains("f32[8,16@tp]") && e.line.contains("f32[16@tp,8]"),
        "{}",
        e.line
    );
    assert_eq!(e.fix.spec.as_deref(), Some("P()"), "the all-reduce's choice");
    assert!(e.fix.code.contains("out_sharding=P()"), "{}", e.fix.code);
}

/// The script: the prelude's compositions, then every case traced under `jax.set_mesh` on
/// Explicit axes, one `name<TAB>type` or `name<TAB>refused<TAB>message` line each.
fn script() -> String {
    let mut s = String::from(
        "import jax, jax.numpy as jnp\n\
         from jax.sharding import PartitionSpec as P, NamedSharding, AxisType\n\
         from jax._src.core import ShardingTypeError  # not exported by JAX 0.10\n\
         mesh = jax.make_mesh((2, 2), ('dp', 'tp'), axis_types=(AxisType.Explicit, AxisType.Explicit))\n\
         jax.set_mesh(mesh)\n\
         def layer_norm(x, g, b):\n\
         \x20   m = x.mean(-1, keepdims=True)\n\
         \x20   v = ((x - m) ** 2).mean(-1, keepdims=True)\n\
         \x20   return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b\n\
         def softmax_causal(s):\n\
         \x20   t = s.shape[-1]\n\
         \x20   return jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e30), -1)\n\
         def attention(q, k, v):\n\
         \x20   return jnp.einsum('bhts,bhsd->bhtd', softmax_causal(jnp.einsum('bhtd,bhsd->bhts', q, k) * 0.5), v)\n\
         def cross_entropy(logits, t):\n\
         \x20   hot = jax.nn.one_hot(t, logits.shape[-1])\n\
         \x20   return jax.nn.logsumexp(logits, -1) - (logits * hot).sum(-1)\n\
         def dropout(x, key):\n\
         \x20   return x * (jax.random.bits(jax.random.wrap_key_data(key), x.shape) > jnp.uint32(2**31))\n\
         def arg(shape, dtype, spec):\n\
         \x20   return jax.device_put(jnp.zeros(shape, dtype), NamedSharding(mesh, spec))\n\
         cases = [\n",
    );
    for c in cases() {
        let args: Vec<String> = c
            .inputs
            .iter()
            .map(|(shape, dtype, spec)| {
                let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
                let dt = if *dtype == F { "jnp.float32" } else { "jnp.uint32" };
                format!("arg(({},), {dt}, {spec})", dims.join(", "))
            })
            .collect();
        let params: Vec<&str> = ["a", "b", "c"][..c.inputs.len()].to_vec();
        s += &format!(
            "    ({:?}, [{}], lambda {}: {}),\n",
            c.name,
            args.join(", "),
            params.join(", "),
            c.jax
        );
    }
    s += "]\n\
          for name, args, f in cases:\n\
          \x20   out = []\n\
          \x20   def traced(*a):\n\
          \x20       r = f(*a)\n\
          \x20       out.append(jax.typeof(r).str_short(short_dtypes=True))\n\
          \x20       return r\n\
          \x20   try:\n\
          \x20       jax.eval_shape(traced, *args)\n\
          \x20       print(name + '\\t' + out[0])\n\
          \x20   except ShardingTypeError as e:\n\
          \x20       print(name + '\\trefused\\t' + str(e).splitlines()[0])\n";
    s
}

/// Named `under_jax::` so that `cargo xtask test` runs it in its JAX step, with the venv.
mod under_jax {
    use super::*;

    #[test]
    fn jax_gives_the_types_and_refusals_the_table_and_shardlab_give_under_jax() {
        if shardlab_tests::jax_python().is_none() {
            return;
        }
        let stdout = shardlab_tests::run_jax_script("explicit-jax", "explicit", &script(), 4);
        let cases = cases();
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), cases.len(), "one line per case:\n{stdout}");
        let mut wrong = Vec::new();
        for (c, line) in cases.iter().zip(lines) {
            let cells: Vec<&str> = line.split('\t').collect();
            assert_eq!(cells[0], c.name, "{line}");
            let got = shardlab_types(c);
            let jax_ok = match (c.verdict, cells[1]) {
                (Verdict::Type(t), jax) => t == jax,
                // The fix JAX names: its message's kind is shardlab's (the same rule raised).
                (Verdict::Refused(_), "refused") => got.as_ref().is_err_and(|e| {
                    let cut = |m: &str| m.chars().take(24).collect::<String>();
                    cut(&e.message) == cut(cells.get(2).unwrap_or(&""))
                }),
                _ => false,
            };
            if !jax_ok || !agrees(c, &got) {
                wrong.push(format!(
                    "{}: JAX gave `{}`, the table says {:?}, shardlab: {}",
                    c.name,
                    cells[1..].join(" "),
                    c.verdict,
                    verdict(&got)
                ));
            }
        }
        assert!(
            wrong.is_empty(),
            "explicit sharding disagrees with JAX:\n{}",
            wrong.join("\n")
        );
    }
}
