//! The dtype policy a train step is priced and exported under: all f32, or mixed precision as
//! real runs use it (jmp's `params=float32,compute=bfloat16`, flax's `param_dtype=float32,
//! dtype=bfloat16`): f32 master weights and optimizer state, a bf16 copy of the weights to
//! compute with, and bf16 activations and gradients. The sandbox executes f32 only; the
//! policy decides what a value costs on a real device (bytes, dot throughput) and what the
//! exported script computes in.
use super::{DType, Op, Program};

/// Bytes of one f32 (or u32) element.
const WORD: u64 = 4;
/// Bytes of one bf16 element.
const HALF: u64 = 2;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// Every floating-point value in f32 (what the sandbox trains in).
    #[default]
    F32,
    /// Mixed precision: bf16 compute, activations and gradients; f32 master weights and
    /// optimizer state, which the optimizer update reads and writes (and with them the bf16
    /// copy of the updated weights).
    Bf16,
}

impl Precision {
    pub const ALL: [Precision; 2] = [Precision::F32, Precision::Bf16];

    /// The name `--precision` takes.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }

    pub fn parse(name: &str) -> Option<Precision> {
        Precision::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Bytes of one element of a `dtype` value that is computed with (not master state):
    /// 2 for floating-point values under bf16, else 4 (integers stay 32-bit).
    pub fn compute_bytes(self, dtype: DType) -> u64 {
        match (self, dtype) {
            (Precision::Bf16, DType::F32) => HALF,
            _ => WORD,
        }
    }

    /// Bytes of one element of master state (f32 weights and optimizer state), whatever the
    /// policy.
    pub fn master_bytes(self) -> u64 {
        WORD
    }

    /// The policy in jmp's words, as plans and exported scripts state it.
    pub fn describe(self) -> &'static str {
        match self {
            Precision::F32 => "f32: parameters, activations, gradients and optimizer state in float32",
            Precision::Bf16 => {
                "bf16 mixed precision: float32 master weights and optimizer state; bfloat16 weights to compute \
                 with, activations and gradients (jmp policy params=float32,compute=bfloat16)"
            }
        }
    }
}

impl Program {
    /// For every value, whether it is master state: a parameter or optimizer-state input, or
    /// what an optimizer update writes back (the new parameter and moments). Under bf16 these
    /// stay f32; a parameter is read for compute through its bf16 copy.
    pub fn master_values(&self) -> Vec<bool> {
        let mut master = vec![false; self.values.len()];
        for (v, role) in &self.inputs {
            if role.is_param() || role.is_opt_state() {
                master[v.index()] = true;
            }
        }
        for ins in &self.instrs {
            if matches!(ins.op, Op::SgdUpdate { .. } | Op::AdamWUpdate { .. }) {
                for o in &ins.outputs {
                    master[o.index()] = true;
                }
            }
        }
        master
    }

    /// Bytes per element of every value as a real device holds it under the program's
    /// precision: master state 4, other floating-point values at the compute width, integers 4.
    pub fn element_bytes(&self) -> Vec<u64> {
        self.master_values()
            .into_iter()
            .zip(&self.values)
            .map(|(master, info)| {
                if master {
                    self.precision.master_bytes()
                } else {
                    self.precision.compute_bytes(info.dtype)
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Builder, Role};

    #[test]
    fn bf16_halves_activations_and_keeps_master_state_and_integers_at_four_bytes() {
        let mut b = Builder::new();
        let w = b.input("w", &[4, 4], DType::F32, Role::Param(0));
        let m = b.input("m", &[4, 4], DType::F32, Role::OptState { param: 0, slot: 0 });
        let v = b.input("v", &[4, 4], DType::F32, Role::OptState { param: 0, slot: 1 });
        let x = b.input("x", &[2, 4], DType::F32, Role::Other);
        let key = b.input("key", &[2], DType::U32, Role::RngKey);
        let y = b.matmul(x, w);
        let xt = b.transpose(x, &[1, 0]);
        let g = b.matmul(xt, y);
        let adamw = Op::AdamWUpdate {
            lr: 1e-3,
            b1: 0.9,
            b2: 0.999,
            eps: 1e-8,
            wd: 0.0,
        };
        for o in b.emit(adamw, &[w, g, m, v]) {
            b.output(o);
        }
        b.output(key);
        let mut prog = b.finish().unwrap();
        assert!(prog.element_bytes().iter().all(|&w| w == 4), "f32 everywhere");
        prog.precision = Precision::Bf16;
        let widths = prog.element_bytes();
        for (v, want) in [(w, 4), (m, 4), (v, 4), (key, 4), (x, 2), (y, 2), (g, 2)] {
            assert_eq!(widths[v.index()], want, "{v:?}");
        }
        let updated = prog.instrs.last().unwrap().outputs.clone();
        assert!(
            updated.iter().all(|o| widths[o.index()] == 4),
            "updates write master state"
        );
    }

    #[test]
    fn names_round_trip() {
        for p in Precision::ALL {
            assert_eq!(Precision::parse(p.name()), Some(p));
        }
        assert_eq!(Precision::parse("fp16"), None);
    }
}
