//! `bench model --ops`: a few configurations of the sweep profiled op by op, each op kind's and
//! category's predicted time beside its measured one.
use super::configs::{held_out, sweep};
use crate::exec::{Backend, ExecError, Trainer, TrainerOptions};
use crate::profile::{compare_ops, DeviceProfile, OpComparison, Placement};

/// The configurations `bench model --ops` profiles when none is named: one device, data
/// parallel with its all-reduces, FSDP with its gathers and tensor parallel with its inserted
/// copies, at both sizes.
pub const OPS_DEFAULT: [&str; 4] = [
    "xs single",
    "xs auto dp dp=8 original",
    "s auto fsdp dp=8 partitionable",
    "s shard_map tp tp=4 partitionable",
];

/// One configuration's step, predicted on `device` beside its measured per-op profile.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OpsCheck {
    pub name: String,
    pub comparison: OpComparison,
}

/// The configurations `names` pick, of the sweep and the held-out block (where the errors
/// left are): a name as `bench model` prints it, else every configuration whose name contains
/// it. A name that picks none is an error that says so.
pub fn pick_configs(names: &[String]) -> Result<Vec<(String, TrainerOptions)>, ExecError> {
    let mut all = sweep()?;
    all.extend(held_out()?);
    let mut picked = vec![];
    for n in names {
        let hits: Vec<_> = match all.iter().find(|c| &c.name == n) {
            Some(e) => vec![e],
            None => all.iter().filter(|c| c.name.contains(n.as_str())).collect(),
        };
        if hits.is_empty() {
            return Err(ExecError::Input(format!(
                "--config {n}: no configuration of the sweep or the held-out block is named like it; `shardlab bench \
                 model` lists them"
            )));
        }
        picked.extend(hits.into_iter().map(|c| (c.name.clone(), c.options.clone())));
    }
    Ok(picked)
}

/// Profiles `configs` (from [`pick_configs`]) op by op and compares each op's measured time
/// with the model's price on `device`.
pub async fn run_ops(
    backend: Backend,
    device: &DeviceProfile,
    configs: Vec<(String, TrainerOptions)>,
    mut progress: impl FnMut(&OpsCheck),
) -> Result<Vec<OpsCheck>, ExecError> {
    let mut out = vec![];
    for (name, opts) in configs {
        let mut t = Trainer::new(backend.clone(), opts).await?;
        for _ in 0..2 {
            t.step().await?;
        }
        let (_, profile) = t.profile_step().await?;
        let profile = profile.ok_or_else(|| ExecError::Input("--ops needs the GPU backend".into()))?;
        let check = OpsCheck {
            name,
            comparison: compare_ops(t.program(), device, Placement::Simulated, &profile),
        };
        progress(&check);
        out.push(check);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_configs_are_picked_by_exact_name_or_part_of_one() {
        let exact = pick_configs(&["xs single".to_string()]).unwrap();
        assert_eq!(exact.len(), 1);
        assert_eq!(exact[0].0, "xs single");
        // "s single" is a configuration of its own, not every name containing it.
        assert_eq!(pick_configs(&["s single".to_string()]).unwrap().len(), 1);
        let tp = pick_configs(&["s shard_map tp tp=4".to_string()]).unwrap();
        assert_eq!(tp.len(), 2, "both RNG layouts");
        for name in OPS_DEFAULT {
            assert_eq!(pick_configs(&[name.to_string()]).unwrap()[0].0, name);
        }
        let e = pick_configs(&["xl single".to_string()]).unwrap_err().to_string();
        assert!(e.contains("--config xl single") && e.contains("bench model"), "{e}");
    }
}
