use std::fmt;

use super::shape::fmt_shape;
use super::{varying_axes, Program, Role, ValueId};

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

impl Program {
    fn type_of(&self, v: ValueId) -> String {
        let info = self.info(v);
        format!("{}{}", info.dtype.name(), fmt_shape(&info.shape))
    }

    /// One line per instruction, jaxpr/HLO style:
    /// `%12 = dot_general(%3, %7) contracting=([2],[0]) : f32[8,16,64]  # h0.qkv`.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let vma = self.mesh.as_ref().map(|_| varying_axes(self));
        // Per-device programs: inputs show their sharding, other values the mesh axes
        // along which devices hold different data (shard_map's varying axes).
        let sharding = |v: ValueId| -> String {
            let Some(vma) = &vma else { return String::new() };
            let axes: Vec<&str> = vma[v.index()].iter().map(String::as_str).collect();
            if axes.is_empty() {
                " {replicated}".into()
            } else {
                format!(" {{varies along {}}}", axes.join(","))
            }
        };
        if let Some(mesh) = &self.mesh {
            out += &format!("# per-device program on {mesh}; shapes are local\n");
        }
        for (pos, (v, role)) in self.inputs.iter().enumerate() {
            let role = match role {
                Role::Param(i) => format!("param {i}"),
                Role::OptState { param, slot } => format!("optimizer state {slot} of param {param}"),
                Role::ParamStack(s) => format!("params {} stacked", stack_rows(s)),
                Role::OptStateStack { stack: s, slot } => {
                    format!("optimizer state {slot} of params {} stacked", stack_rows(s))
                }
                Role::Tokens => "tokens".into(),
                Role::Targets => "targets".into(),
                Role::RngKey => "rng key".into(),
                Role::Other => "input".into(),
            };
            let name = self.info(*v).name.clone().unwrap_or_default();
            let spec = match (self.mesh.is_some(), self.in_specs.get(pos)) {
                (true, Some(spec)) => format!(" sharding={spec}"),
                _ => String::new(),
            };
            out += &format!("{v} = parameter {name} : {}{spec}  # {role}\n", self.type_of(*v));
        }
        for (i, ins) in self.instrs.iter().enumerate() {
            let lhs: Vec<String> = ins.outputs.iter().map(|v| v.to_string()).collect();
            let args: Vec<String> = ins.inputs.iter().map(|v| v.to_string()).collect();
            let types: Vec<String> = ins.outputs.iter().map(|v| self.type_of(*v)).collect();
            let attrs = ins.op.attrs();
            let mut line = format!("{} = {}({})", lhs.join(", "), ins.op.name(), args.join(", "));
            if !attrs.is_empty() {
                line += " ";
                line += &attrs;
            }
            line += &format!(" : {}", types.join(", "));
            if let Some(o) = ins.outputs.first() {
                line += &sharding(*o);
            }
            let mut names: Vec<String> = ins.outputs.iter().filter_map(|v| self.info(*v).name.clone()).collect();
            if self.is_recomputed(i) {
                names.push("recomputed (jax.checkpoint)".into());
            }
            if !names.is_empty() {
                line += &format!("  # {}", names.join(", "));
            }
            out += &line;
            out.push('\n');
        }
        let outs: Vec<String> = self.outputs.iter().map(|v| v.to_string()).collect();
        out += &format!("return ({})\n", outs.join(", "));
        out
    }
}

/// A stack's rows as `[2, 26, zeros]`.
fn stack_rows(s: &super::Stack) -> String {
    let rows: Vec<String> = s
        .rows
        .iter()
        .map(|r| r.map_or_else(|| "zeros".to_string(), |i| i.to_string()))
        .collect();
    format!("[{}]", rows.join(", "))
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}
