use thiserror::Error;

/// Every way a mesh, a partition spec, a sharding or a collective's arguments can be wrong,
/// each with a message that says how to fix it.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ShardingError {
    #[error("cannot parse mesh `{text}`: {reason}; write the axes as NAME=SIZE separated by commas, e.g. `dp=4,tp=2`")]
    MeshSyntax { text: String, reason: String },
    #[error("mesh axis name `{name}` is not valid; use letters, digits and `_`, starting with a letter or `_`")]
    AxisName { name: String },
    #[error("mesh axis '{axis}' has size 0; every mesh axis needs at least 1 device")]
    ZeroAxisSize { axis: String },
    #[error("mesh axis '{axis}' is given twice; each mesh axis name must be unique")]
    DuplicateMeshAxis { axis: String },
    #[error(
        "the mesh has more than {max} devices (at mesh axis '{axis}'); shardlab plans at most {max} devices: use smaller \
         axis sizes"
    )]
    TooManyDevices { axis: String, max: usize },
    #[error("unknown mesh axis '{axis}'; the mesh {mesh} has axes {names}")]
    UnknownAxis { axis: String, mesh: String, names: String },
    #[error("mesh axis '{axis}' is used twice in {context}; each mesh axis can appear at most once")]
    AxisUsedTwice { axis: String, context: String },
    #[error(
        "cannot parse partition spec `{text}`: {reason}; write it like P('dp', None), P(('dp', 'tp'), None) or P()"
    )]
    SpecSyntax { text: String, reason: String },
    #[error(
        "{spec} has {entries} entries but the array of shape {shape:?} has rank {rank}; give at most one entry per \
         dimension"
    )]
    SpecTooLong {
        spec: String,
        entries: usize,
        rank: usize,
        shape: Vec<usize>,
    },
    #[error(
        "dimension {dim} of size {size} is not divisible by {axes} of size {axes_size}; make the dimension a multiple \
         of {axes_size}, or shard it over other mesh axes"
    )]
    NotDivisible {
        dim: usize,
        size: usize,
        /// `mesh axis 'dp'` or `mesh axes ('dp', 'tp')`.
        axes: String,
        axes_size: usize,
    },
    #[error("device {device} is out of range: the mesh has {devices} devices, numbered 0..{devices}")]
    DeviceOutOfRange { device: usize, devices: usize },
    #[error("coordinates {coords:?} do not lie on the mesh {mesh}; give one per axis, each below the axis size")]
    Coordinates { coords: Vec<usize>, mesh: String },
    #[error("{what} holds {len} elements but {expected} are needed ({why})")]
    Length {
        what: String,
        len: usize,
        expected: usize,
        why: String,
    },
    #[error("{op}: {reason}")]
    Collective { op: String, reason: String },
    #[error(
        "a sequence in zig-zag order of {parts} blocks has no device rows until it is split over a 'cp' axis of \
         {parts} devices: shard its queries over 'cp'"
    )]
    WholeZigzag { parts: usize },
}

impl ShardingError {
    pub(crate) fn collective(op: &str, reason: impl Into<String>) -> Self {
        ShardingError::Collective {
            op: op.to_string(),
            reason: reason.into(),
        }
    }
}

/// `'dp'` or `('dp', 'tp')`, as Python prints a name or a tuple of names.
pub(crate) fn py_axes<S: AsRef<str>>(axes: &[S]) -> String {
    match axes {
        [one] => format!("'{}'", one.as_ref()),
        _ => {
            let names: Vec<String> = axes.iter().map(|a| format!("'{}'", a.as_ref())).collect();
            format!("({})", names.join(", "))
        }
    }
}
