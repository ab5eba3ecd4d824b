use super::Op;
use crate::sharding::{Mesh, NamedSharding, PartitionSpec, ShardingError};

/// An SSA value: defined once, by a program input or by one instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    U32,
}

impl DType {
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::U32 => "u32",
        }
    }
}

/// What a program input stands for, so executors know what to feed and keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Parameter `index` of docs/MODEL.md's list.
    Param(usize),
    /// Optimizer state slot `slot` (0 = AdamW m, 1 = AdamW v) of parameter `param`.
    OptState { param: usize, slot: usize },
    /// Parameters of equal shape stacked on a new leading axis (a pipeline's stage axis, as
    /// MaxText stacks its stages' weights): row `s` is parameter `stack.param(s)`.
    ParamStack(Stack),
    /// Optimizer state slot `slot` of a [`Role::ParamStack`]'s parameters, stacked the same way.
    OptStateStack { stack: Stack, slot: usize },
    /// Token ids fed to the model (B, T).
    Tokens,
    /// Next-token targets (B, T).
    Targets,
    /// The step's PRNG key (2 x u32).
    RngKey,
    /// Anything else (tests, hand-built programs).
    Other,
}

/// Parameters stacked on a new leading axis, one per row: a pipeline's stages' copies of one
/// block parameter (row s is stage s's). A stage with fewer blocks than another (uneven stages)
/// holds a row of zeros in the place of the block it lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    /// Per row, the parameter it holds (None: zeros).
    pub rows: Vec<Option<usize>>,
}

impl Stack {
    /// Parameters `first`, `first + stride`, ... (`count` of them), stacked in that order.
    pub fn strided(first: usize, stride: usize, count: usize) -> Self {
        Self {
            rows: (0..count).map(|r| Some(first + r * stride)).collect(),
        }
    }

    /// The parameters the stack holds, in row order.
    pub fn params(&self) -> impl Iterator<Item = usize> + '_ {
        self.rows.iter().flatten().copied()
    }
}

impl Role {
    /// The parameters an input holds (one, a stack's, or none), each with the optimizer slot
    /// it holds of them (None: the parameter itself).
    pub fn params(&self) -> Vec<(usize, Option<usize>)> {
        self.rows().into_iter().flatten().collect()
    }

    /// What each row of the input holds: [`Role::params`] with a stack's zero rows as None.
    pub fn rows(&self) -> Vec<Option<(usize, Option<usize>)>> {
        match self {
            Role::Param(i) => vec![Some((*i, None))],
            Role::OptState { param, slot } => vec![Some((*param, Some(*slot)))],
            Role::ParamStack(s) => s.rows.iter().map(|r| r.map(|i| (i, None))).collect(),
            Role::OptStateStack { stack, slot } => stack.rows.iter().map(|r| r.map(|i| (i, Some(*slot)))).collect(),
            _ => vec![],
        }
    }

    /// Whether the input holds parameters (whole or stacked).
    pub fn is_param(&self) -> bool {
        matches!(self, Role::Param(_) | Role::ParamStack(_))
    }

    /// Whether the input holds optimizer state (whole or stacked).
    pub fn is_opt_state(&self) -> bool {
        matches!(self, Role::OptState { .. } | Role::OptStateStack { .. })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ValueInfo {
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// A readable name (`wte`, `h0.w_qkv`, `dwte`); printed beside the SSA number.
    pub name: Option<String>,
}

impl ValueInfo {
    pub fn numel(&self) -> usize {
        super::numel(&self.shape)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Instr {
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

/// A whole program: typed values, inputs with roles, instructions in order, outputs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Program {
    pub values: Vec<ValueInfo>,
    pub inputs: Vec<(ValueId, Role)>,
    pub instrs: Vec<Instr>,
    pub outputs: Vec<ValueId>,
    /// (output position, input position) pairs whose buffers may be shared: the output
    /// is the updated input (jit's donated arguments), e.g. a parameter after its update.
    pub donations: Vec<(usize, usize)>,
    /// A per-device (SPMD) program runs on every device of this mesh, on local shapes;
    /// None for a program on global shapes (one device).
    pub mesh: Option<Mesh>,
    /// With a mesh: how each input (in `inputs` order) and output is laid out over it, as
    /// shard_map's in_specs / out_specs (or jit's shardings) say.
    pub in_specs: Vec<PartitionSpec>,
    pub out_specs: Vec<PartitionSpec>,
    /// Instructions (ascending) that recompute forward values for the backward pass instead of
    /// reading them saved (`jax.checkpoint`); the program view marks them.
    pub recomputed: Vec<usize>,
    /// The dtype policy a real device runs the program under (what it costs and what the
    /// exported script computes in); the sandbox executes f32 whatever it says.
    pub precision: super::Precision,
    /// A pipelined program: which stage's work each value is (None for every other program).
    pub stages: Option<super::StageWork>,
    /// A mixture of experts' routing as pricing assumes it: the busiest expert-parallel
    /// device's routed tokens over the mean (`Moe::imbalance`; None: the assumed default).
    /// Like `precision`, it changes what the program costs on a real device, not what it computes.
    pub expert_imbalance: Option<f32>,
    /// Values JAX's transpose rules type like a primal value: the cotangents autodiff made
    /// (explicit sharding types them so; nothing else reads this).
    pub like_primal: Vec<LikePrimal>,
}

/// A value typed like a primal value of the forward pass, as JAX's transpose rules give a
/// cotangent the primal's sharding (`out_sharding=x.aval.sharding`, in the value's own dim
/// order where the rule transposes afterwards, as dot_general's does).
#[derive(Clone, Debug, PartialEq)]
pub struct LikePrimal {
    pub value: ValueId,
    pub primal: ValueId,
    /// Dim `d` of `value` is dim `dims[d]` of `primal`.
    pub dims: Vec<usize>,
}

impl Program {
    /// Devices the program runs on (1 without a mesh).
    pub fn devices(&self) -> usize {
        self.mesh.as_ref().map_or(1, |m| m.devices())
    }

    /// The sharding of input `pos` (replicated without a mesh or spec).
    pub fn input_sharding(&self, pos: usize) -> Result<NamedSharding, ShardingError> {
        let mesh = self.mesh.clone().unwrap_or(Mesh::new(&[])?);
        let spec = self
            .in_specs
            .get(pos)
            .cloned()
            .unwrap_or_else(PartitionSpec::replicated);
        NamedSharding::new(mesh, spec)
    }

    /// The sharding of output `pos`.
    pub fn output_sharding(&self, pos: usize) -> Result<NamedSharding, ShardingError> {
        let mesh = self.mesh.clone().unwrap_or(Mesh::new(&[])?);
        let spec = self
            .out_specs
            .get(pos)
            .cloned()
            .unwrap_or_else(PartitionSpec::replicated);
        NamedSharding::new(mesh, spec)
    }

    /// The global shape of a value of local shape `local` laid out by `spec` over the mesh.
    pub fn global_shape(&self, local: &[usize], spec: &PartitionSpec) -> Vec<usize> {
        let Some(mesh) = &self.mesh else { return local.to_vec() };
        local
            .iter()
            .enumerate()
            .map(|(d, &n)| {
                n * spec
                    .dim_axes(d)
                    .iter()
                    .map(|a| mesh.size_of(a).unwrap_or(1))
                    .product::<usize>()
            })
            .collect()
    }

    /// Whether instruction `i` recomputes a forward value for the backward pass.
    pub fn is_recomputed(&self, i: usize) -> bool {
        self.recomputed.binary_search(&i).is_ok()
    }

    pub fn info(&self, v: ValueId) -> &ValueInfo {
        &self.values[v.index()]
    }

    pub fn shape(&self, v: ValueId) -> &[usize] {
        &self.values[v.index()].shape
    }

    /// The input with this role, if any.
    pub fn input_with_role(&self, role: &Role) -> Option<ValueId> {
        self.inputs.iter().find(|(_, r)| r == role).map(|(v, _)| *v)
    }

    /// For every value, the instruction making it when it is random bits that fused attention
    /// draws inside its kernels: made by `random_bits` straight from a key, and read only as the
    /// dropout bits of `dot_product_attention` and its gradient. No buffer holds such bits (the
    /// kernels hash the same counters), so the GPU lowering skips their launch and the memory
    /// plan counts no bytes for them. Bits sliced first (automatic mode's replicated generation
    /// in the original layout) are held, as JAX holds them.
    pub fn bits_drawn_in_attention(&self) -> Vec<Option<usize>> {
        use super::Op;
        let mut drawn = vec![None; self.values.len()];
        for (i, ins) in self.instrs.iter().enumerate() {
            if let Op::RandomBits { .. } | Op::RandomBitsBlock { .. } = ins.op {
                drawn[ins.outputs[0].index()] = Some(i);
            }
        }
        for v in &self.outputs {
            drawn[v.index()] = None;
        }
        for ins in &self.instrs {
            let bits_at = match ins.op {
                Op::Attention { rate, .. } if rate > 0.0 => Some(3),
                Op::AttentionGrad { rate, .. } if rate > 0.0 => Some(6),
                _ => None,
            };
            for (k, v) in ins.inputs.iter().enumerate() {
                if bits_at != Some(k) {
                    drawn[v.index()] = None;
                }
            }
        }
        drawn
    }

    /// For every value, the index of the instruction that makes it (`None` for an input).
    pub fn producers(&self) -> Vec<Option<usize>> {
        let mut producer = vec![None; self.values.len()];
        for (i, ins) in self.instrs.iter().enumerate() {
            for o in &ins.outputs {
                producer[o.index()] = Some(i);
            }
        }
        producer
    }

    /// For every value, the index of the last instruction that reads it (outputs live to the end).
    pub fn last_uses(&self) -> Vec<Option<usize>> {
        let mut last = vec![None; self.values.len()];
        for (i, ins) in self.instrs.iter().enumerate() {
            for v in &ins.inputs {
                last[v.index()] = Some(i);
            }
        }
        for v in self.outputs.iter().chain(self.routing_counts().iter().map(|(_, v)| v)) {
            last[v.index()] = Some(usize::MAX);
        }
        last
    }

    /// Every router's counts (`moe_route`'s `load`, a few numbers per sequence) with the
    /// instruction that makes them, in program order, less a rematerialised backward's repeats:
    /// they live to the end of the step, as outputs do, so that a trainer reads the step's
    /// routing back after it (`Trainer::routing`).
    pub fn routing_counts(&self) -> Vec<(usize, ValueId)> {
        self.instrs
            .iter()
            .enumerate()
            .filter(|(i, ins)| matches!(ins.op, Op::MoeRoute { .. }) && !self.is_recomputed(*i))
            .filter_map(|(i, ins)| ins.outputs.get(4).map(|v| (i, *v)))
            .collect()
    }
}
