//! JAX's mesh axis types (`jax.sharding.AxisType`): how a program sees each mesh axis. Explicit
//! axes are part of every value's type (`f32[8@dp,128]`) and sharding rules run op by op at
//! trace time; Auto axes are left to the compiler's propagation (jit with shardings); Manual
//! axes are those a `shard_map` body is written per device over. Since JAX 0.9
//! `jax.make_mesh` makes Explicit axes unless told otherwise.
use std::fmt;

use super::Mesh;

/// One mesh axis's type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AxisType {
    /// In the type: sharding rules run op by op; an ambiguous result is an error naming the fix.
    #[default]
    Explicit,
    /// Left to the compiler: the type does not mention the axis, propagation places it.
    Auto,
    /// Per device, inside `jax.shard_map` only.
    Manual,
}

impl AxisType {
    pub const ALL: [AxisType; 3] = [AxisType::Explicit, AxisType::Auto, AxisType::Manual];

    /// The name `--axis-types` and the page use: `explicit`, `auto`, `manual`.
    pub fn name(self) -> &'static str {
        match self {
            AxisType::Explicit => "explicit",
            AxisType::Auto => "auto",
            AxisType::Manual => "manual",
        }
    }

    /// As JAX writes it: `AxisType.Explicit`.
    pub fn jax_name(self) -> &'static str {
        match self {
            AxisType::Explicit => "AxisType.Explicit",
            AxisType::Auto => "AxisType.Auto",
            AxisType::Manual => "AxisType.Manual",
        }
    }

    pub fn parse(name: &str) -> Option<AxisType> {
        AxisType::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// The type of every axis of a mesh, in the mesh's order (what `jax.make_mesh(...,
/// axis_types=...)` is given).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct AxisTypes {
    axes: Vec<(String, AxisType)>,
}

impl AxisTypes {
    /// Every axis of `mesh` `Explicit` (JAX's default), except those `given` names, which take
    /// their type. A name the mesh lacks is returned as the error.
    pub fn new(mesh: &Mesh, given: &[(String, AxisType)]) -> Result<Self, String> {
        if let Some((name, _)) = given.iter().find(|(n, _)| mesh.axis_size(n).is_err()) {
            return Err(name.clone());
        }
        let axes = mesh
            .axis_names()
            .into_iter()
            .map(|n| {
                let t = given
                    .iter()
                    .rev()
                    .find(|(g, _)| g == n)
                    .map_or(AxisType::Explicit, |(_, t)| *t);
                (n.to_string(), t)
            })
            .collect();
        Ok(Self { axes })
    }

    /// Every axis of `mesh` of type `t`.
    pub fn all(mesh: &Mesh, t: AxisType) -> Self {
        Self {
            axes: mesh.axis_names().into_iter().map(|n| (n.to_string(), t)).collect(),
        }
    }

    /// (axis, type) in the mesh's order.
    pub fn axes(&self) -> &[(String, AxisType)] {
        &self.axes
    }

    /// The type of `axis` (Explicit for an axis the mesh lacks: it never shards anything).
    pub fn of(&self, axis: &str) -> AxisType {
        self.axes
            .iter()
            .find(|(n, _)| n == axis)
            .map_or(AxisType::Explicit, |(_, t)| *t)
    }

    /// The axes of type `t`, in the mesh's order.
    pub fn with_type(&self, t: AxisType) -> Vec<&str> {
        self.axes
            .iter()
            .filter(|(_, a)| *a == t)
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// `dp=explicit,tp=auto`, as `--axis-types` takes it.
    pub fn text(&self) -> String {
        self.axes
            .iter()
            .map(|(n, t)| format!("{n}={}", t.name()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// As JAX's `axis_types=` tuple: `(AxisType.Explicit, AxisType.Auto)`.
    pub fn jax_tuple(&self) -> String {
        let names: Vec<&str> = self.axes.iter().map(|(_, t)| t.jax_name()).collect();
        match names.as_slice() {
            [one] => format!("({one},)"),
            many => format!("({})", many.join(", ")),
        }
    }
}

impl fmt::Display for AxisTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_are_explicit_unless_given_a_type() {
        let mesh = Mesh::parse("dp=2,tp=2").unwrap();
        let t = AxisTypes::new(&mesh, &[("tp".into(), AxisType::Auto)]).unwrap();
        assert_eq!(t.text(), "dp=explicit,tp=auto");
        assert_eq!(t.with_type(AxisType::Explicit), vec!["dp"]);
        assert_eq!(t.jax_tuple(), "(AxisType.Explicit, AxisType.Auto)");
        assert_eq!(
            AxisTypes::new(&mesh, &[("cp".into(), AxisType::Auto)]).unwrap_err(),
            "cp"
        );
    }
}
