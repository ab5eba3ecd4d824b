//! Types as JAX prints them (`f32[8@dp,4,16@(dp,tp)]`) and the explicit part of a sharding.
use crate::ir::DType;
use crate::sharding::AxisTypes;

/// Per dimension, the mesh axes that shard it (major first): one entry per dimension.
pub type Dims = Vec<Vec<String>>;

/// `f32[8@dp,128]`, as `jax.typeof(x)` prints it with short dtypes.
pub fn type_text(dtype: DType, shape: &[usize], dims: &[Vec<String>]) -> String {
    let entries: Vec<String> = shape
        .iter()
        .enumerate()
        .map(|(d, n)| match dims.get(d).map(Vec::as_slice).unwrap_or(&[]) {
            [] => n.to_string(),
            [one] => format!("{n}@{one}"),
            many => format!("{n}@({})", many.join(",")),
        })
        .collect();
    format!("{}[{}]", dtype.name(), entries.join(","))
}

/// The part of a layout a type shows: its Explicit axes only (JAX's
/// `modify_spec_for_auto_manual`; Auto axes are the compiler's to place).
pub fn explicit_only(dims: &[Vec<String>], types: &AxisTypes) -> Dims {
    dims.iter()
        .map(|axes| {
            axes.iter()
                .filter(|a| types.of(a) == crate::sharding::AxisType::Explicit)
                .cloned()
                .collect()
        })
        .collect()
}

/// A spec as a Python tuple of its partitions, as JAX's messages print one: `('dp', None)`,
/// `('tp',)`, `(('dp', 'tp'), None)`.
pub(super) fn py_tuple(dims: &[Vec<String>]) -> String {
    let entries: Vec<String> = dims.iter().map(|axes| py_entry(axes)).collect();
    match entries.as_slice() {
        [one] => format!("({one},)"),
        many => format!("({})", many.join(", ")),
    }
}

/// One partition: `None`, `'dp'` or `('dp', 'tp')`.
pub(super) fn py_entry(axes: &[String]) -> String {
    match axes {
        [] => "None".into(),
        [one] => format!("'{one}'"),
        many => format!(
            "({})",
            many.iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The first mesh axis that shards two dimensions (a layout no device can hold).
pub(super) fn duplicate_axis(dims: &[Vec<String>]) -> Option<&str> {
    let all: Vec<&str> = dims.iter().flatten().map(String::as_str).collect();
    all.iter()
        .enumerate()
        .find(|(i, a)| all[..*i].contains(a))
        .map(|(_, a)| *a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(d: &[&[&str]]) -> Dims {
        d.iter().map(|a| a.iter().map(|s| s.to_string()).collect()).collect()
    }

    #[test]
    fn types_print_as_jax_prints_them() {
        assert_eq!(
            type_text(DType::F32, &[8, 128], &dims(&[&["dp"], &[]])),
            "f32[8@dp,128]"
        );
        assert_eq!(
            type_text(DType::U32, &[8, 4], &dims(&[&["dp", "tp"]])),
            "u32[8@(dp,tp),4]"
        );
        assert_eq!(py_tuple(&dims(&[&["tp"]])), "('tp',)");
        assert_eq!(py_tuple(&dims(&[&["dp", "tp"], &[]])), "(('dp', 'tp'), None)");
        assert_eq!(duplicate_axis(&dims(&[&["dp"], &["tp", "dp"]])), Some("dp"));
    }
}
