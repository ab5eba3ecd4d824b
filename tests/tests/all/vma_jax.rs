//! check_vma against JAX: small shard_map bodies, each written once for shardlab's builder and
//! once in JAX (the same collective, in_spec and out_spec), on a dp=2, tp=2 mesh. shardlab must
//! refuse exactly the bodies JAX 0.10 refuses. The verdicts JAX gave are written in the table
//! so that shardlab's check is held to them without Python too; `under_jax::` runs JAX itself.
use shardlab::ir::{Builder, DType, Role, ValueId};
use shardlab::partition::{shard_map, Arg, PartitionError};
use shardlab::sharding::{Mesh, PartitionSpec};

/// A body's one argument: an f32[4,4] array, or a raw u32[2] PRNG key.
#[derive(Clone, Copy)]
enum Input {
    Array,
    Key,
}

struct Case {
    name: &'static str,
    input: Input,
    in_spec: &'static str,
    out_spec: &'static str,
    /// The body for shardlab's builder.
    body: fn(&mut Builder, ValueId) -> ValueId,
    /// The same body in JAX, a lambda of `a` (with `L = jax.lax`).
    jax: &'static str,
    /// JAX 0.10.2's verdict: true when shard_map(check_vma=True) refuses the body.
    refused: bool,
}

const RING: &[(usize, usize)] = &[(0, 1), (1, 0)];

fn cases() -> Vec<Case> {
    let case = |name, input, in_spec, out_spec, body, jax, refused| Case {
        name,
        input,
        in_spec,
        out_spec,
        body,
        jax,
        refused,
    };
    use Input::{Array, Key};
    vec![
        case(
            "psum of a varying value is invariant",
            Array,
            "P('dp')",
            "P()",
            |b, a| b.psum(a, &["dp"]),
            "L.psum(a, 'dp')",
            false,
        ),
        case(
            "psum of an invariant value is invariant",
            Array,
            "P()",
            "P()",
            |b, a| b.psum(a, &["dp"]),
            "L.psum(a, 'dp')",
            false,
        ),
        case(
            "psum over another axis keeps dp varying",
            Array,
            "P('dp')",
            "P()",
            |b, a| b.psum(a, &["tp"]),
            "L.psum(a, 'tp')",
            true,
        ),
        case(
            "psum over tp, out over dp",
            Array,
            "P('dp')",
            "P('dp')",
            |b, a| b.psum(a, &["tp"]),
            "L.psum(a, 'tp')",
            false,
        ),
        case(
            "psum over a varying and an invariant axis",
            Array,
            "P('dp')",
            "P()",
            |b, a| b.psum(a, &["dp", "tp"]),
            "L.psum(a, ('dp', 'tp'))",
            true,
        ),
        case(
            "psum over two varying axes",
            Array,
            "P('dp', 'tp')",
            "P()",
            |b, a| b.psum(a, &["dp", "tp"]),
            "L.psum(a, ('dp', 'tp'))",
            false,
        ),
        case(
            "pmean of a varying value is invariant",
            Array,
            "P('dp')",
            "P()",
            |b, a| b.pmean(a, &["dp"]),
            "L.pmean(a, 'dp')",
            false,
        ),
        case(
            "all_gather keeps its axis varying",
            Array,
            "P('dp')",
            "P()",
            |b, a| b.all_gather(a, &["dp"], 0, true),
            "L.all_gather(a, 'dp', axis=0, tiled=True)",
            true,
        ),
        case(
            "all_gather, out over dp",
            Array,
            "P('dp')",
            "P('dp')",
            |b, a| b.all_gather(a, &["dp"], 0, true),
            "L.all_gather(a, 'dp', axis=0, tiled=True)",
            false,
        ),
        case(
            "all_gather of an invariant value varies",
            Array,
            "P()",
            "P()",
            |b, a| b.all_gather(a, &["dp"], 0, true),
            "L.all_gather(a, 'dp', axis=0, tiled=True)",
            true,
        ),
        case(
            "psum after all_gather is invariant",
            Array,
            "P('dp')",
            "P()",
            |b, a| {
                let g = b.all_gather(a, &["dp"], 0, true);
                b.psum(g, &["dp"])
            },
            "L.psum(L.all_gather(a, 'dp', axis=0, tiled=True), 'dp')",
            false,
        ),
        case(
            "all_gather to invarying is invariant along its axis",
            Array,
            "P('dp')",
            "P()",
            |b, a| b.all_gather_invarying(a, &["dp"], 0),
            "L.all_gather(a, 'dp', axis=0, tiled=True, to='invarying')",
            false,
        ),
        case(
            "all_gather to invarying over tp keeps dp varying",
            Array,
            "P('dp')",
            "P()",
            |b, a| b.all_gather_invarying(a, &["tp"], 0),
            "L.all_gather(a, 'tp', axis=0, tiled=True, to='invarying')",
            true,
        ),
        case(
            "all_gather to invarying of a slice by axis_index is invariant (ZeRO's update)",
            Array,
            "P()",
            "P()",
            |b, a| {
                let block = b.emit1(
                    shardlab::ir::Op::ShardSlice {
                        dim: 0,
                        axes: vec!["dp".into()],
                        parts: 2,
                    },
                    &[a],
                );
                b.all_gather_invarying(block, &["dp"], 0)
            },
            "L.all_gather(L.dynamic_slice_in_dim(a, L.axis_index('dp') * 2, 2, 0), 'dp', axis=0, tiled=True, to='invarying')",
            false,
        ),
        case(
            "a slice by axis_index varies",
            Array,
            "P()",
            "P()",
            |b, a| {
                b.emit1(
                    shardlab::ir::Op::ShardSlice {
                        dim: 0,
                        axes: vec!["dp".into()],
                        parts: 2,
                    },
                    &[a],
                )
            },
            "L.dynamic_slice_in_dim(a, L.axis_index('dp') * 2, 2, 0)",
            true,
        ),
        case(
            "psum_scatter varies",
            Array,
            "P('dp')",
            "P()",
            |b, a| b.psum_scatter(a, &["dp"], 0, true),
            "L.psum_scatter(a, 'dp', scatter_dimension=0, tiled=True)",
            true,
        ),
        case(
            "psum_scatter, out over dp",
            Array,
            "P('dp')",
            "P('dp')",
            |b, a| b.psum_scatter(a, &["dp"], 0, true),
            "L.psum_scatter(a, 'dp', scatter_dimension=0, tiled=True)",
            false,
        ),
        case(
            "psum_scatter of an invariant value varies",
            Array,
            "P()",
            "P()",
            |b, a| b.psum_scatter(a, &["dp"], 0, true),
            "L.psum_scatter(a, 'dp', scatter_dimension=0, tiled=True)",
            true,
        ),
        case(
            "all_to_all varies",
            Array,
            "P('dp')",
            "P()",
            |b, a| b.all_to_all(a, &["dp"], 0, 1),
            "L.all_to_all(a, 'dp', 0, 1, tiled=True)",
            true,
        ),
        case(
            "all_to_all, out over dp",
            Array,
            "P('dp')",
            "P('dp')",
            |b, a| b.all_to_all(a, &["dp"], 0, 1),
            "L.all_to_all(a, 'dp', 0, 1, tiled=True)",
            false,
        ),
        case(
            "all_to_all of an invariant value varies",
            Array,
            "P()",
            "P()",
            |b, a| b.all_to_all(a, &["dp"], 0, 1),
            "L.all_to_all(a, 'dp', 0, 1, tiled=True)",
            true,
        ),
        case(
            "ppermute varies",
            Array,
            "P('dp')",
            "P()",
            |b, a| b.ppermute(a, "dp", RING),
            "L.ppermute(a, 'dp', [(0, 1), (1, 0)])",
            true,
        ),
        case(
            "ppermute, out over dp",
            Array,
            "P('dp')",
            "P('dp')",
            |b, a| b.ppermute(a, "dp", RING),
            "L.ppermute(a, 'dp', [(0, 1), (1, 0)])",
            false,
        ),
        case(
            "ppermute of an invariant value varies",
            Array,
            "P()",
            "P()",
            |b, a| b.ppermute(a, "dp", RING),
            "L.ppermute(a, 'dp', [(0, 1), (1, 0)])",
            true,
        ),
        case(
            "a key folded with axis_index varies",
            Key,
            "P()",
            "P()",
            |b, k| b.fold_in_axis_index(k, &["dp"]),
            "jax.random.fold_in(a, L.axis_index('dp'))",
            true,
        ),
        case(
            "a key folded with axis_index, out over dp",
            Key,
            "P()",
            "P('dp')",
            |b, k| b.fold_in_axis_index(k, &["dp"]),
            "jax.random.fold_in(a, L.axis_index('dp'))",
            false,
        ),
        case(
            "pcast to varying varies",
            Array,
            "P()",
            "P()",
            |b, a| b.pcast(a, &["dp"]),
            "L.pcast(a, 'dp', to='varying')",
            true,
        ),
        case(
            "pcast to varying, out over dp",
            Array,
            "P()",
            "P('dp')",
            |b, a| b.pcast(a, &["dp"]),
            "L.pcast(a, 'dp', to='varying')",
            false,
        ),
        case(
            "pcast of a value already varying",
            Array,
            "P('dp')",
            "P('dp')",
            |b, a| b.pcast(a, &["dp"]),
            "L.pcast(a, 'dp', to='varying')",
            true,
        ),
        case(
            "pcast over tp of a value varying over dp",
            Array,
            "P('dp')",
            "P('dp', 'tp')",
            |b, a| b.pcast(a, &["tp"]),
            "L.pcast(a, 'tp', to='varying')",
            false,
        ),
        case(
            "psum of a pcast value is invariant",
            Array,
            "P()",
            "P()",
            |b, a| {
                let v = b.pcast(a, &["dp"]);
                b.psum(v, &["dp"])
            },
            "L.psum(L.pcast(a, 'dp', to='varying'), 'dp')",
            false,
        ),
    ]
}

fn mesh() -> Mesh {
    Mesh::parse("dp=2,tp=2").unwrap()
}

/// shardlab's verdict: Some(why) when shard_map refuses the body.
fn shardlab_refuses(c: &Case) -> Option<String> {
    let (global_shape, dtype, role) = match c.input {
        Input::Array => (vec![4, 4], DType::F32, Role::Other),
        Input::Key => (vec![2], DType::U32, Role::RngKey),
    };
    let arg = Arg {
        name: "a".into(),
        global_shape,
        dtype,
        role,
        spec: PartitionSpec::parse(c.in_spec).unwrap(),
    };
    let out = PartitionSpec::parse(c.out_spec).unwrap();
    match shard_map(&mesh(), &[arg], &[out], |b, vals| Ok(vec![(c.body)(b, vals[0])])) {
        Ok(_) => None,
        Err(e @ (PartitionError::Vma { .. } | PartitionError::VmaOp { .. })) => Some(e.to_string()),
        Err(e) => panic!("{}: not a check_vma verdict: {e}", c.name),
    }
}

#[test]
fn check_vma_refuses_exactly_the_bodies_jax_refuses() {
    let mut wrong = Vec::new();
    for c in cases() {
        let got = shardlab_refuses(&c);
        if got.is_some() != c.refused {
            wrong.push(format!("{}: JAX refused={}, shardlab: {got:?}", c.name, c.refused));
        }
    }
    assert!(
        wrong.is_empty(),
        "check_vma disagrees with JAX 0.10:\n{}",
        wrong.join("\n")
    );
}

/// The script: every case under jax.shard_map(check_vma=True), one `name<TAB>ok|refused` line each.
fn script() -> String {
    let mut s = String::from(
        "import jax, jax.numpy as jnp\n\
         from jax.sharding import PartitionSpec as P, NamedSharding\n\
         L = jax.lax\n\
         mesh = jax.make_mesh((2, 2), ('dp', 'tp'))\n\
         inputs = {'array': jnp.arange(16.0, dtype=jnp.float32).reshape(4, 4), 'key': jnp.array([0, 7], dtype=jnp.uint32)}\n\
         cases = [\n",
    );
    for c in cases() {
        let input = match c.input {
            Input::Array => "array",
            Input::Key => "key",
        };
        s += &format!(
            "    ({:?}, {input:?}, {}, {}, lambda a: {}),\n",
            c.name, c.in_spec, c.out_spec, c.jax
        );
    }
    s += "]\n\
          for name, input, i, o, f in cases:\n\
          \x20   x = jax.device_put(inputs[input], NamedSharding(mesh, i))\n\
          \x20   try:\n\
          \x20       jax.jit(jax.shard_map(f, mesh=mesh, in_specs=i, out_specs=o, check_vma=True))(x).block_until_ready()\n\
          \x20       print(name + '\\tok')\n\
          \x20   except (ValueError, TypeError) as e:\n\
          \x20       print(name + '\\trefused\\t' + str(e).splitlines()[0])\n";
    s
}

/// Named `under_jax::` so that `cargo xtask test` runs it in its JAX step, with the venv.
mod under_jax {
    use super::*;

    #[test]
    fn jax_refuses_exactly_the_bodies_the_table_and_shardlab_refuse_under_jax() {
        if shardlab_tests::jax_python().is_none() {
            return;
        }
        let stdout = shardlab_tests::run_jax_script("vma-jax", "vma", &script(), 4);
        let cases = cases();
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), cases.len(), "one line per case:\n{stdout}");
        let mut wrong = Vec::new();
        for (c, line) in cases.iter().zip(lines) {
            let mut cells = line.split('\t');
            assert_eq!(cells.next(), Some(c.name), "{line}");
            let jax_refused = cells.next() == Some("refused");
            let why = cells.next().unwrap_or("");
            let shardlab = shardlab_refuses(c);
            if jax_refused != c.refused || shardlab.is_some() != jax_refused {
                wrong.push(format!(
                    "{}: JAX refused={jax_refused} ({why}), the table says {}, shardlab: {shardlab:?}",
                    c.name, c.refused
                ));
            }
        }
        assert!(wrong.is_empty(), "check_vma disagrees with JAX:\n{}", wrong.join("\n"));
    }
}
