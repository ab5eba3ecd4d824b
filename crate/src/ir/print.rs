use std::fmt;

use super::shape::fmt_shape;
use super::{Program, Role, ValueId};

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
        for (v, role) in &self.inputs {
            let role = match role {
                Role::Param(i) => format!("param {i}"),
                Role::OptState { param, slot } => format!("optimizer state {slot} of param {param}"),
                Role::Tokens => "tokens".into(),
                Role::Targets => "targets".into(),
                Role::RngKey => "rng key".into(),
                Role::Other => "input".into(),
            };
            let name = self.info(*v).name.clone().unwrap_or_default();
            out += &format!("{v} = parameter {name} : {}  # {role}\n", self.type_of(*v));
        }
        for ins in &self.instrs {
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
            let names: Vec<String> = ins.outputs.iter().filter_map(|v| self.info(*v).name.clone()).collect();
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

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}
