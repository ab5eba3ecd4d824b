//! `Mesh`: named axes with sizes over which the simulated devices are laid out.
use std::fmt;

use super::error::{py_axes, ShardingError};

/// Named mesh axes with sizes, e.g. `{dp: 4, tp: 2}`. Devices are numbered row-major over the
/// axes, as `np.arange(n).reshape(sizes)` lays them out: on `dp=4,tp=2` device 5 sits at
/// `dp=2, tp=1`, and the last axis varies fastest.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mesh {
    axes: Vec<(String, usize)>,
}

impl Mesh {
    /// The most devices a mesh may have. Llama 3 405B trained on 16,384 H100s (Dubey et al.
    /// 2024, Table 4), so plans (which only price the per-device program) reach the largest
    /// published meshes; running on simulated devices has its own, lower cap
    /// ([`crate::plan::MAX_SIMULATED_DEVICES`]).
    pub const MAX_DEVICES: usize = 16384;

    /// A mesh from `(name, size)` pairs in major-to-minor order: `Mesh::new(&[("dp", 4), ("tp", 2)])`.
    /// No axes at all is a mesh of one device.
    pub fn new(axes: &[(&str, usize)]) -> Result<Self, ShardingError> {
        let mut out: Vec<(String, usize)> = Vec::with_capacity(axes.len());
        for &(name, size) in axes {
            if !is_axis_name(name) {
                return Err(ShardingError::AxisName { name: name.to_string() });
            }
            if size == 0 {
                return Err(ShardingError::ZeroAxisSize { axis: name.to_string() });
            }
            if out.iter().any(|(n, _)| n == name) {
                return Err(ShardingError::DuplicateMeshAxis { axis: name.to_string() });
            }
            out.push((name.to_string(), size));
        }
        // Checked: a product that wraps (dp=2,x=2^63+1 is 2 devices in u64) must not pass.
        let mut devices: usize = 1;
        for (name, size) in &out {
            devices = match devices.checked_mul(*size) {
                Some(d) if d <= Self::MAX_DEVICES => d,
                _ => {
                    return Err(ShardingError::TooManyDevices {
                        axis: name.clone(),
                        max: Self::MAX_DEVICES,
                    })
                }
            };
        }
        Ok(Self { axes: out })
    }

    /// Parses the CLI form `dp=4,tp=2` (spaces allowed around names, sizes and commas).
    pub fn parse(text: &str) -> Result<Self, ShardingError> {
        let syntax = |reason: String| ShardingError::MeshSyntax {
            text: text.to_string(),
            reason,
        };
        if text.trim().is_empty() {
            return Err(syntax("it is empty".into()));
        }
        let mut axes: Vec<(&str, usize)> = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            let (name, size) = part
                .split_once('=')
                .ok_or_else(|| syntax(format!("`{part}` is not of the form NAME=SIZE")))?;
            let (name, size) = (name.trim(), size.trim());
            if name.is_empty() {
                return Err(syntax(format!("`{part}` has no axis name before `=`")));
            }
            let size: usize = match size.parse() {
                Ok(n) => n,
                // Digits only, yet no usize: too large for any mesh, not a typo.
                Err(_) if !size.is_empty() && size.bytes().all(|c| c.is_ascii_digit()) => {
                    return Err(ShardingError::TooManyDevices {
                        axis: name.to_string(),
                        max: Self::MAX_DEVICES,
                    })
                }
                Err(_) => {
                    return Err(syntax(format!(
                        "the size `{size}` of axis '{name}' is not a whole number"
                    )))
                }
            };
            axes.push((name, size));
        }
        Self::new(&axes)
    }

    /// `(name, size)` of every axis, major first.
    pub fn axes(&self) -> &[(String, usize)] {
        &self.axes
    }

    pub fn axis_names(&self) -> Vec<&str> {
        self.axes.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The axis sizes, major first (`mesh.devices.shape` in JAX).
    pub fn shape(&self) -> Vec<usize> {
        self.axes.iter().map(|(_, s)| *s).collect()
    }

    /// The number of devices: the product of the axis sizes (at most [`Mesh::MAX_DEVICES`],
    /// checked when the mesh is made, so this cannot overflow).
    pub fn devices(&self) -> usize {
        self.axes.iter().map(|(_, s)| s).product()
    }

    /// Where `axis` sits among the mesh axes (0 = major).
    pub fn axis_position(&self, axis: &str) -> Result<usize, ShardingError> {
        self.axes
            .iter()
            .position(|(n, _)| n == axis)
            .ok_or_else(|| self.unknown(axis))
    }

    pub fn axis_size(&self, axis: &str) -> Result<usize, ShardingError> {
        Ok(self.axes[self.axis_position(axis)?].1)
    }

    /// The product of the sizes of `axes` (the group size of a collective over them); checks
    /// that each is known and given once.
    pub fn axes_size(&self, axes: &[&str]) -> Result<usize, ShardingError> {
        self.check_axes(axes)?;
        axes.iter().map(|a| self.axis_size(a)).product()
    }

    /// The coordinates of `device` along every axis, major first.
    pub fn device_coords(&self, device: usize) -> Result<Vec<usize>, ShardingError> {
        let devices = self.devices();
        if device >= devices {
            return Err(ShardingError::DeviceOutOfRange { device, devices });
        }
        let mut coords = vec![0; self.axes.len()];
        let mut rest = device;
        for (k, (_, size)) in self.axes.iter().enumerate().rev() {
            coords[k] = rest % size;
            rest /= size;
        }
        Ok(coords)
    }

    /// The device at `coords` (one per axis, major first).
    pub fn device_at(&self, coords: &[usize]) -> Result<usize, ShardingError> {
        if coords.len() != self.axes.len() || coords.iter().zip(&self.axes).any(|(c, (_, s))| c >= s) {
            return Err(ShardingError::Coordinates {
                coords: coords.to_vec(),
                mesh: self.to_string(),
            });
        }
        Ok(coords.iter().zip(&self.axes).fold(0, |d, (c, (_, s))| d * s + c))
    }

    /// `jax.lax.axis_index(axis)` on `device`: its position along `axis`.
    pub fn axis_index(&self, device: usize, axis: &str) -> Result<usize, ShardingError> {
        let k = self.axis_position(axis)?;
        Ok(self.device_coords(device)?[k])
    }

    /// `jax.lax.axis_index(axes)` for a tuple of axes: the position along them with the first
    /// axis major, e.g. `dp * size(tp) + tp` for `("dp", "tp")`. Also the device's rank within its
    /// group of [`Mesh::axis_groups`].
    pub fn axes_index(&self, device: usize, axes: &[&str]) -> Result<usize, ShardingError> {
        self.check_axes(axes)?;
        let coords = self.device_coords(device)?;
        let mut index = 0;
        for a in axes {
            let k = self.axis_position(a)?;
            index = index * self.axes[k].1 + coords[k];
        }
        Ok(index)
    }

    /// [`Mesh::axes_index`] of every device, in device order: the axes checked once and each
    /// index computed from strides (what pricing every device of a large mesh needs).
    pub fn axes_indices(&self, axes: &[&str]) -> Result<Vec<usize>, ShardingError> {
        self.check_axes(axes)?;
        // Each axis's (stride in device numbers, size): mesh order is row-major.
        let strides: Vec<(usize, usize)> = axes
            .iter()
            .map(|a| {
                let k = self.axis_position(a)?;
                let stride: usize = self.axes[k + 1..].iter().map(|(_, n)| n).product();
                Ok((stride, self.axes[k].1))
            })
            .collect::<Result<_, ShardingError>>()?;
        Ok((0..self.devices())
            .map(|d| strides.iter().fold(0, |index, &(stride, n)| index * n + d / stride % n))
            .collect())
    }

    /// The device groups a collective over `axes` forms (JAX's replica groups): devices that share
    /// their coordinates on every other axis. Each group is ordered by [`Mesh::axes_index`];
    /// groups are ordered by their coordinates on the other axes, row-major (so by their first device).
    /// On `dp=2,tp=4`: over `tp` `[[0,1,2,3],[4,5,6,7]]`, over `dp` `[[0,4],[1,5],[2,6],[3,7]]`.
    pub fn axis_groups(&self, axes: &[&str]) -> Result<Vec<Vec<usize>>, ShardingError> {
        let group_size = self.axes_size(axes)?;
        let in_axes: Vec<usize> = axes.iter().map(|a| self.axis_position(a)).collect::<Result<_, _>>()?;
        let groups = self.devices() / group_size;
        let mut out = vec![vec![0; group_size]; groups];
        for d in 0..self.devices() {
            let coords = self.device_coords(d)?;
            // The group: the other axes' coordinates, row-major in mesh order.
            let group = (0..self.axes.len())
                .filter(|k| !in_axes.contains(k))
                .fold(0, |g, k| g * self.axes[k].1 + coords[k]);
            out[group][self.axes_index(d, axes)?] = d;
        }
        Ok(out)
    }

    /// Errors unless every axis of `axes` is a mesh axis, and none is given twice.
    pub fn check_axes(&self, axes: &[&str]) -> Result<(), ShardingError> {
        for (i, a) in axes.iter().enumerate() {
            self.axis_position(a)?;
            if axes[..i].contains(a) {
                return Err(ShardingError::AxisUsedTwice {
                    axis: a.to_string(),
                    context: format!("the axes {}", py_axes(axes)),
                });
            }
        }
        Ok(())
    }

    fn unknown(&self, axis: &str) -> ShardingError {
        let names = self.axis_names();
        ShardingError::UnknownAxis {
            axis: axis.to_string(),
            mesh: self.to_string(),
            names: if names.is_empty() {
                "none".into()
            } else {
                py_axes(&names)
            },
        }
    }
}

/// As JAX prints a mesh: `Mesh('dp': 4, 'tp': 2)`.
impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let axes: Vec<String> = self.axes.iter().map(|(n, s)| format!("'{n}': {s}")).collect();
        write!(f, "Mesh({})", axes.join(", "))
    }
}

/// Letters, digits and `_`, not starting with a digit: a name that P('...') and the CLI can carry.
pub(crate) fn is_axis_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
