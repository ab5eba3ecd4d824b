use super::{check_out_specs, PartitionError};
use crate::ir::{Builder, DType, Program, Role, ValueId};
use crate::sharding::{Mesh, NamedSharding, PartitionSpec};

/// One argument of a shard_map'ed function: its global shape and in_spec.
#[derive(Clone, Debug)]
pub struct Arg {
    pub name: String,
    pub global_shape: Vec<usize>,
    pub dtype: DType,
    pub role: Role,
    pub spec: PartitionSpec,
}

/// `jax.shard_map(body, mesh, in_specs, out_specs)`: traces `body` once on the local
/// shapes of `args` with collectives available, and returns the per-device program.
/// `check_vma` runs before anything executes: an out_spec that claims replication along an
/// axis its value varies over is an error naming the value and the axis.
pub fn shard_map(
    mesh: &Mesh,
    args: &[Arg],
    out_specs: &[PartitionSpec],
    body: impl FnOnce(&mut Builder, &[ValueId]) -> Result<Vec<ValueId>, PartitionError>,
) -> Result<Program, PartitionError> {
    let mut b = Builder::with_mesh(mesh.clone());
    let mut in_specs = Vec::with_capacity(args.len());
    let mut vals = Vec::with_capacity(args.len());
    for a in args {
        let sharding = NamedSharding::new(mesh.clone(), a.spec.clone()).map_err(|e| PartitionError::Invalid {
            what: format!("in_spec of `{}`", a.name),
            why: e.to_string(),
        })?;
        let local = sharding
            .shard_shape(&a.global_shape)
            .map_err(|e| PartitionError::Invalid {
                what: format!("`{}` {:?} with {}", a.name, a.global_shape, a.spec),
                why: e.to_string(),
            })?;
        vals.push(b.input(&a.name, &local, a.dtype, a.role.clone()));
        in_specs.push(a.spec.clone());
    }
    let outs = body(&mut b, &vals)?;
    if outs.len() != out_specs.len() {
        return Err(PartitionError::Invalid {
            what: "out_specs".into(),
            why: format!(
                "the body returns {} values but {} out_specs were given",
                outs.len(),
                out_specs.len()
            ),
        });
    }
    for v in &outs {
        b.output(*v);
    }
    let mut prog = b.finish()?;
    prog.in_specs = in_specs;
    prog.out_specs = out_specs.to_vec();
    for (k, spec) in out_specs.iter().enumerate() {
        NamedSharding::new(mesh.clone(), spec.clone()).map_err(|e| PartitionError::Invalid {
            what: format!("out_specs[{k}]"),
            why: e.to_string(),
        })?;
    }
    check_out_specs(&prog)?;
    Ok(prog)
}
