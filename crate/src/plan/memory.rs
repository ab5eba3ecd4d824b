//! The memory plan: what a step holds per device, from shapes alone, and the checks that run
//! before anything is allocated or initialised.
//!
//! Two levels, both in u64 with checked arithmetic (so a size cannot wrap, natively or on
//! wasm32 where usize has 32 bits):
//! - [`check_config`]: closed-form bounds from a [`GptConfig`] and a device count, cheap
//!   enough to run before the program is traced (a million layers never gets traced);
//! - [`MemoryPlan::of`] on the traced per-device program: every tensor's bytes and the peak
//!   per device by liveness, then [`MemoryPlan::check`] against [`MemoryLimits`].
use thiserror::Error;

use crate::ir::{Op, Precision, Program, Role, ValueId};
use crate::model::{GptConfig, Optimizer, MAX_LAYERS};

/// Every element is 4 bytes (f32 or u32).
const ELEMENT_BYTES: u64 = 4;

/// Simulated devices a step may run on at once (the mesh itself may be larger, up to
/// [`crate::sharding::Mesh::MAX_DEVICES`], for plans that only price the program). Each
/// simulated device holds its own copy of every replicated tensor in the one real GPU, so past
/// a few hundred the run measures copies rather than the strategy.
pub const MAX_SIMULATED_DEVICES: usize = 256;

/// What all simulated devices of a run may hold at once when nothing else is known: the
/// sandbox shares one GPU (or the host, on the reference executor) with everything else, and
/// wgpu does not report how much memory a GPU has.
pub const DEFAULT_BUDGET_BYTES: u64 = 4 << 30;

/// The wasm32 heap the page's host-side copies of the state must fit in (2 GiB: what
/// browsers reliably grant a wasm32 module, half of its 4 GiB address space).
pub const WASM_HEAP_BYTES: u64 = 2 << 30;

/// A size the plan rejects, with the tensor and the fix in one message.
#[derive(Debug, Error, Clone, PartialEq)]
#[error("{0}")]
pub struct MemoryError(pub String);

/// One tensor's size on one device.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct TensorBytes {
    /// The value's name (`h0.w_fc`, `logits`), or its SSA number and op (`%57 (dot_general)`).
    pub name: String,
    /// Local (per-device) shape.
    pub shape: Vec<usize>,
    /// Bytes on one device.
    pub bytes: u64,
}

/// Bytes per device of one step of a (per-device) program, from its shapes alone.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct MemoryPlan {
    /// Devices the program runs on (1 for a global program).
    pub devices: u64,
    /// Parameters held by each device (replicated ones in full, sharded ones by block).
    pub params: u64,
    /// Optimizer state (AdamW m and v) held by each device.
    pub optimizer_state: u64,
    /// The parameters' gradients each device holds for the update, as ZeRO counts them
    /// (Rajbhandari et al. 2020): per parameter, the one buffer its gradient is accumulated
    /// and reduced in (the values named `dNAME`), whole under dp and ZeRO-1, one block under
    /// ZeRO-2 and FSDP.
    pub gradients: u64,
    /// Under mixed precision, the bf16 copy of each device's parameters that the step computes
    /// with, beside the f32 masters in `params` (0 in f32: the step computes with the masters).
    pub compute_params: u64,
    /// Peak bytes of everything else alive at once (activations, a microbatch's gradients
    /// before they reach their buffer, data, random bits), by liveness over the program
    /// order: values die after their last use, reshapes alias their operand and optimizer
    /// updates write into their parameter.
    pub activations: u64,
    /// What the step holds at its busiest point, gradients included, by the same liveness:
    /// `params + optimizer_state + compute_params` and the peak of everything else together. What must fit.
    /// The four parts above add up to at least this (each is counted at its own largest, the
    /// gradients as if held the whole step, as ZeRO and frameworks with gradient buffers
    /// count them); with microbatches the accumulated gradients are held from the first
    /// microbatch's backward pass on, and the two meet.
    pub total: u64,
    /// In a pipelined program, each stage's `activations`: what its devices hold of the values
    /// its own work makes and everyone's (the largest is `activations`); empty otherwise.
    pub stage_activations: Vec<u64>,
    /// The largest tensor on one device.
    pub largest: TensorBytes,
    /// Every value that owns memory (aliases excluded), in program order.
    pub tensors: Vec<TensorBytes>,
}

/// What a plan must fit. Buffer limits apply to a tensor of all simulated devices together:
/// the GPU executor stores a sharded value as one buffer holding every device's block.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MemoryLimits {
    /// The adapter's `max_buffer_size` (None: no GPU buffers, e.g. the reference executor).
    pub max_buffer_bytes: Option<u64>,
    /// The adapter's `max_storage_buffer_binding_size`.
    pub max_binding_bytes: Option<u64>,
    /// What all simulated devices of the run may hold at once.
    pub budget_bytes: u64,
    /// The wasm heap that the host-side copies of parameters and optimizer state go through
    /// (the page); None natively.
    pub heap_bytes: Option<u64>,
    /// The flag that sets `budget_bytes` where the run's user has one (the native CLI's
    /// `--memory-budget`), which the budget errors then name as a fix; None where nothing
    /// raises it (the page). Not a limit, so not serialized.
    #[serde(skip)]
    pub budget_flag: Option<&'static str>,
}

impl MemoryLimits {
    /// A run on the CPU reference executor: no buffer limits, the default budget.
    pub fn host() -> Self {
        Self {
            max_buffer_bytes: None,
            max_binding_bytes: None,
            budget_bytes: DEFAULT_BUDGET_BYTES,
            heap_bytes: Self::this_heap(),
            budget_flag: None,
        }
    }

    /// A run on an adapter with these limits (`wgpu::Limits::max_buffer_size` and
    /// `max_storage_buffer_binding_size`), with the default budget.
    pub fn adapter(max_buffer_size: u64, max_storage_buffer_binding_size: u64) -> Self {
        Self {
            max_buffer_bytes: Some(max_buffer_size),
            max_binding_bytes: Some(max_storage_buffer_binding_size),
            budget_bytes: DEFAULT_BUDGET_BYTES,
            heap_bytes: Self::this_heap(),
            budget_flag: None,
        }
    }

    /// These limits with the budget `flag` sets: `budget_bytes` if given, else the default.
    pub fn with_budget_flag(self, flag: &'static str, budget_bytes: Option<u64>) -> Self {
        Self {
            budget_bytes: budget_bytes.unwrap_or(DEFAULT_BUDGET_BYTES),
            budget_flag: Some(flag),
            ..self
        }
    }

    /// The fixes a budget error names: the model's and the run's `fixes` ("a, b or c"), and
    /// raising the budget where a flag does.
    fn budget_fixes(&self, fixes: &[&str]) -> String {
        let Some(flag) = self.budget_flag else {
            return match fixes.split_last() {
                Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
                _ => fixes.join(""),
            };
        };
        let memory = if self.max_buffer_bytes.is_some() {
            "this GPU"
        } else {
            "this machine"
        };
        format!(
            "{} or, if {memory} has more memory, raise {flag} ({} unless given: wgpu does not report a GPU's memory)",
            fixes.join(", "),
            binary_bytes(DEFAULT_BUDGET_BYTES)
        )
    }

    /// The wasm heap when this code runs as wasm32, else None.
    fn this_heap() -> Option<u64> {
        cfg!(target_arch = "wasm32").then_some(WASM_HEAP_BYTES)
    }

    /// The tightest limit on one buffer, with the name to quote.
    fn buffer_limit(&self) -> Option<(u64, &'static str)> {
        let limits = [
            self.max_buffer_bytes.map(|b| (b, "max_buffer_size")),
            self.max_binding_bytes.map(|b| (b, "max_storage_buffer_binding_size")),
            // Kernels count elements of a buffer in u32.
            self.max_buffer_bytes
                .map(|_| (u64::from(u32::MAX) * ELEMENT_BYTES, "u32 element indices")),
        ];
        limits.into_iter().flatten().min_by_key(|(b, _)| *b)
    }
}

/// A number of bytes as a reader takes it in: `268.4 MB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "kB", "MB", "GB", "TB", "PB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A number of bytes in the binary units `--memory-budget` reads: `4 GiB`, `1.5 MiB`.
pub fn binary_bytes(b: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The binary and decimal units a size may be written in, by the multiple of a byte they
/// stand for; a letter alone is the binary unit (`G` is GiB), as GNU `dd` reads it.
const SIZE_UNITS: [(&str, u64); 14] = [
    ("", 1),
    ("b", 1),
    ("k", 1 << 10),
    ("kib", 1 << 10),
    ("kb", 1_000),
    ("m", 1 << 20),
    ("mib", 1 << 20),
    ("mb", 1_000_000),
    ("g", 1 << 30),
    ("gib", 1 << 30),
    ("gb", 1_000_000_000),
    ("t", 1 << 40),
    ("tib", 1 << 40),
    ("tb", 1_000_000_000_000),
];

/// A size as a user writes it (`80GiB`, `100G`, `512MiB`, `80GB`, `1.5TiB`, `4294967296`) in
/// bytes: decimal units (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB,
/// or K, M, G, T alone) powers of 1024, any case, a space allowed before the unit; a fraction
/// rounds down to whole bytes. Refuses an empty, zero, negative or non-numeric size, an
/// unknown unit and one past 2^64 - 1 bytes, each with a size that would do.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let example = "give a size such as 80GiB, 100G, 512MiB, 80GB or a number of bytes";
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("the size is empty: {example}"));
    }
    let digits_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(format!("`{text}` is not a size: {example}"));
    }
    let unit = unit.trim();
    let Some(&(_, scale)) = SIZE_UNITS.iter().find(|(u, _)| u.eq_ignore_ascii_case(unit)) else {
        return Err(format!(
            "`{unit}` is not a unit of size (B, K/KiB, M/MiB, G/GiB, T/TiB or kB, MB, GB, TB): {example}"
        ));
    };
    let too_large = || format!("`{text}` is more bytes than 64 bits hold: {example}");
    // Digits exactly, in u128: the whole part times the unit, then the fraction's share of it.
    let mut bytes: u128 = 0;
    for d in whole.bytes() {
        bytes = bytes
            .checked_mul(10)
            .and_then(|b| b.checked_add(u128::from(d - b'0')))
            .filter(|&b| b <= u128::from(u64::MAX))
            .ok_or_else(too_large)?;
    }
    bytes *= u128::from(scale);
    let (mut share, mut denominator) = (0u128, 1u128);
    // Digits past the 20th add under a byte, even to a TiB.
    for d in fraction.bytes().take(20) {
        share = share * 10 + u128::from(d - b'0');
        denominator *= 10;
    }
    bytes += share * u128::from(scale) / denominator;
    let bytes = u64::try_from(bytes).map_err(|_| too_large())?;
    if bytes == 0 {
        return Err(format!("`{text}` is no memory at all: {example}"));
    }
    Ok(bytes)
}

fn overflow(what: &str) -> MemoryError {
    MemoryError(format!(
        "{what} does not fit in 64 bits: make the model smaller (--layers, --d-model, --vocab, --seq, --batch)"
    ))
}

/// Product of `dims` in u64, None if it overflows.
fn product(dims: &[u64]) -> Option<u64> {
    dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// Elements of a tensor of `shape`, checked.
fn elements(shape: &[usize]) -> Option<u64> {
    let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    product(&dims)
}

/// Bytes of an f32 (or u32) tensor of `shape`, checked.
pub fn shape_bytes(shape: &[usize]) -> Option<u64> {
    elements(shape)?.checked_mul(ELEMENT_BYTES)
}

/// Closed-form checks of a configuration on `devices` simulated devices, before the program
/// is traced: the depth and device caps, then lower bounds that no partitioning can beat (all
/// devices together hold at least one copy of the parameters and optimizer state, and every
/// GPU buffer at least the global tensor, since it holds every device's block).
pub fn check_config(
    cfg: &GptConfig,
    optimizer: Optimizer,
    devices: usize,
    limits: &MemoryLimits,
) -> Result<(), MemoryError> {
    if cfg.layers > MAX_LAYERS {
        return Err(MemoryError(format!(
            "--layers {} is more than shardlab traces (at most {MAX_LAYERS}): use fewer layers",
            cfg.layers
        )));
    }
    if devices > MAX_SIMULATED_DEVICES {
        return Err(MemoryError(format!(
            "the mesh has {devices} devices; a run simulates at most {MAX_SIMULATED_DEVICES} devices on one GPU: use a \
             smaller mesh"
        )));
    }
    let params = cfg.param_count().ok_or_else(|| overflow("the parameter count"))?;
    let state = params
        .checked_mul(1 + optimizer.slots() as u64)
        .and_then(|n| n.checked_mul(ELEMENT_BYTES))
        .ok_or_else(|| overflow("the parameters and optimizer state"))?;
    let (b, t, d, v, h) = (cfg.batch, cfg.seq, cfg.d_model, cfg.vocab, cfg.heads);
    let d4 = d.checked_mul(4).ok_or_else(|| overflow("4 * --d-model"))?;
    // The largest global tensors: each is one GPU buffer of at least this size, and all
    // devices together hold at least one copy of the largest activation next to the state.
    let largest: [(&str, Vec<usize>, &str); 5] = [
        ("wte", vec![v, d], "lower --vocab or --d-model"),
        ("w_fc", vec![d, d4], "lower --d-model"),
        ("logits", vec![b, t, v], "lower --batch, --seq or --vocab"),
        ("attention scores", vec![b, h, t, t], "lower --batch, --heads or --seq"),
        ("MLP hidden", vec![b, t, d4], "lower --batch, --seq or --d-model"),
    ];
    let mut sized = Vec::with_capacity(largest.len());
    for (name, shape, fix) in largest {
        let bytes = shape_bytes(&shape).ok_or_else(|| overflow(name))?;
        sized.push((name, shape, fix, bytes));
    }
    let (act_name, act_shape, act_fix, act_bytes) = sized[2..].iter().max_by_key(|s| s.3).expect("three activations");
    let need = state
        .checked_add(*act_bytes)
        .ok_or_else(|| overflow("the bytes of one step"))?;
    if need > limits.budget_bytes {
        let fix = if state >= *act_bytes {
            "make the model smaller (--layers, --d-model, --vocab)"
        } else {
            act_fix
        };
        let fix = limits.budget_fixes(&[fix]);
        return Err(MemoryError(format!(
            "the model's {params} parameters with their optimizer state take {}, and its largest activation {act_name} \
             {} takes {}: {} on the devices together, more than the memory budget of {}: {fix}",
            human_bytes(state),
            crate::ir::fmt_shape(act_shape),
            human_bytes(*act_bytes),
            human_bytes(need),
            human_bytes(limits.budget_bytes)
        )));
    }
    let Some((limit, limit_name)) = limits.buffer_limit() else {
        return Ok(());
    };
    for (name, shape, fix, bytes) in sized {
        if bytes > limit {
            return Err(MemoryError(format!(
                "{name} {} needs {} in one GPU buffer (global size; every device's block lives in it), more than this \
                 adapter's {limit_name} of {}: {fix}",
                crate::ir::fmt_shape(&shape),
                human_bytes(bytes),
                human_bytes(limit)
            )));
        }
    }
    Ok(())
}

impl MemoryPlan {
    /// The plan of `prog`: parameters and optimizer state by role, the rest by liveness, each
    /// value at its width under the program's precision ([`Program::element_bytes`]: bf16
    /// activations and gradients take 2 bytes an element, master state 4, and bf16 parameters
    /// hold a 2-byte compute copy beside their masters). Errors only when a size does not fit
    /// in 64 bits.
    pub fn of(prog: &Program) -> Result<Self, MemoryError> {
        let widths = prog.element_bytes();
        let bytes_of = |v: ValueId| -> Result<u64, MemoryError> {
            elements(prog.shape(v))
                .and_then(|n| n.checked_mul(widths[v.index()]))
                .ok_or_else(|| overflow(&format!("the size of {}", value_name(prog, v))))
        };
        let add = |a: u64, b: u64| a.checked_add(b).ok_or_else(|| overflow("the bytes per device"));
        let mut plan = MemoryPlan {
            devices: prog.devices() as u64,
            ..Default::default()
        };
        let mut pinned = vec![false; prog.values.len()];
        let buffers = gradient_buffers(prog);
        let mut gradient_bytes = vec![0u64; buffers.iter().flatten().max().map_or(0, |&i| i + 1)];
        // Bytes alive now: of every value, and of every value but the gradients' buffers.
        let (mut live, mut rest) = (0u64, 0u64);
        for (v, role) in &prog.inputs {
            let b = bytes_of(*v)?;
            match role {
                Role::Param(_) | Role::ParamStack(_) => {
                    plan.params = add(plan.params, b)?;
                    if prog.precision != Precision::F32 {
                        let copy = elements(prog.shape(*v))
                            .and_then(|n| n.checked_mul(prog.precision.compute_bytes(prog.info(*v).dtype)))
                            .ok_or_else(|| overflow("the compute copies of the parameters"))?;
                        plan.compute_params = add(plan.compute_params, copy)?;
                    }
                }
                Role::OptState { .. } | Role::OptStateStack { .. } => {
                    plan.optimizer_state = add(plan.optimizer_state, b)?
                }
                _ => {
                    live = add(live, b)?;
                    rest = add(rest, b)?;
                }
            }
            pinned[v.index()] = true;
            plan.push(prog, *v, b, "input");
        }
        let last = prog.last_uses();
        // Bits fused attention draws in its kernels: no buffer holds them.
        let drawn = prog.bits_drawn_in_attention();
        // A pipeline's stages each hold what their own work makes and what every stage makes:
        // the device's peak is its stage's, the plan's the largest stage's.
        let stages: Vec<Option<usize>> = match &prog.stages {
            Some(st) => (0..st.stages).map(Some).collect(),
            None => vec![None],
        };
        let (live0, rest0) = (live, rest);
        let (mut peak, mut peak_rest) = (live, rest);
        for (pass, &stage) in stages.iter().enumerate() {
            let holds = |v: &ValueId| match (stage, &prog.stages) {
                (Some(s), Some(st)) => st.owner(*v).active(s),
                _ => true,
            };
            let (mut live, mut rest) = (live0, rest0);
            let (mut stage_peak, mut stage_rest) = (live, rest);
            let mut owns = vec![true; prog.values.len()];
            for (i, ins) in prog.instrs.iter().enumerate() {
                let aliases = matches!(
                    ins.op,
                    Op::Reshape { .. }
                        | Op::Pcast { .. }
                        | Op::Reshard { .. }
                        | Op::SgdUpdate { .. }
                        | Op::AdamWUpdate { .. }
                );
                for o in &ins.outputs {
                    if aliases || drawn[o.index()].is_some() || !holds(o) {
                        owns[o.index()] = false;
                        // A gradient's buffer viewed in another shape (w_qkv's) is still its size.
                        if let (Some(p), true) = (buffers[o.index()], holds(o)) {
                            gradient_bytes[p] = gradient_bytes[p].max(bytes_of(*o)?);
                        }
                    } else {
                        let b = bytes_of(*o)?;
                        live = add(live, b)?;
                        match buffers[o.index()] {
                            Some(p) => gradient_bytes[p] = gradient_bytes[p].max(b),
                            None => rest = add(rest, b)?,
                        }
                    }
                    if pass == 0 && !aliases && drawn[o.index()].is_none() {
                        plan.push(prog, *o, bytes_of(*o)?, ins.op.name());
                    }
                }
                stage_peak = stage_peak.max(live);
                stage_rest = stage_rest.max(rest);
                for v in ins.inputs.iter().chain(&ins.outputs) {
                    let dead = match last[v.index()] {
                        Some(l) => l == i && ins.inputs.contains(v),
                        None => ins.outputs.contains(v),
                    };
                    if dead && owns[v.index()] && !pinned[v.index()] {
                        let b = bytes_of(*v)?;
                        live -= b;
                        if buffers[v.index()].is_none() {
                            rest -= b;
                        }
                        owns[v.index()] = false;
                    }
                }
            }
            if stage.is_some() {
                plan.stage_activations.push(stage_rest);
            }
            (peak, peak_rest) = (peak.max(stage_peak), peak_rest.max(stage_rest));
        }
        plan.activations = peak_rest;
        plan.gradients = gradient_bytes.into_iter().try_fold(0, add)?;
        plan.total = add(add(add(plan.params, plan.optimizer_state)?, plan.compute_params)?, peak)?;
        Ok(plan)
    }

    /// Records value `v`, made by an op named `made_by` (`input` for an input).
    fn push(&mut self, prog: &Program, v: ValueId, bytes: u64, made_by: &str) {
        let t = TensorBytes {
            name: prog.info(v).name.clone().unwrap_or_else(|| format!("{v} ({made_by})")),
            shape: prog.shape(v).to_vec(),
            bytes,
        };
        if t.bytes > self.largest.bytes || self.tensors.is_empty() {
            self.largest = t.clone();
        }
        self.tensors.push(t);
    }

    /// Bytes of all simulated devices together at the peak.
    pub fn all_devices_total(&self) -> Option<u64> {
        self.total.checked_mul(self.devices)
    }

    /// Host bytes to set the state up: the global parameters and optimizer state as
    /// initialised, and their blocks for every device.
    pub fn host_init_bytes(&self, global_state_bytes: u64) -> Option<u64> {
        self.params
            .checked_add(self.optimizer_state)?
            .checked_mul(self.devices)?
            .checked_add(global_state_bytes)
    }

    /// Checks the plan against `limits`: each tensor's buffer (all devices' blocks) against
    /// the adapter, the peak of all devices against the budget, and the host-side state
    /// against the wasm heap. The error names the tensor and the fix.
    pub fn check(&self, limits: &MemoryLimits) -> Result<(), MemoryError> {
        let shard = if self.devices > 1 {
            ", or shard it over more devices (--strategy fsdp or tp)"
        } else {
            ""
        };
        if let Some((limit, limit_name)) = limits.buffer_limit() {
            for t in &self.tensors {
                let buffer = t
                    .bytes
                    .checked_mul(self.devices)
                    .ok_or_else(|| overflow(&format!("the buffer of {}", t.name)))?;
                if buffer > limit {
                    let blocks = if self.devices > 1 {
                        format!(" (the blocks of all {} devices)", self.devices)
                    } else {
                        String::new()
                    };
                    return Err(MemoryError(format!(
                        "{} {} needs {} in one GPU buffer{blocks}, more than this adapter's {limit_name} of {}: make \
                         the model smaller (--d-model, --vocab, --seq, --batch){shard}",
                        t.name,
                        crate::ir::fmt_shape(&t.shape),
                        human_bytes(buffer),
                        human_bytes(limit)
                    )));
                }
            }
        }
        let all = self
            .all_devices_total()
            .ok_or_else(|| overflow("the bytes of all devices"))?;
        if all > limits.budget_bytes {
            return Err(MemoryError(format!(
                "the step needs {} per device (params {}, optimizer state {}, gradients {}, activations {}; largest \
                 tensor {} {} of {}), {} on all {} devices together, more than the memory budget of {}: {}",
                human_bytes(self.total),
                human_bytes(self.params),
                human_bytes(self.optimizer_state),
                human_bytes(self.gradients),
                human_bytes(self.activations),
                self.largest.name,
                crate::ir::fmt_shape(&self.largest.shape),
                human_bytes(self.largest.bytes),
                human_bytes(all),
                self.devices,
                human_bytes(limits.budget_bytes),
                limits.budget_fixes(&[
                    "make the model smaller (--layers, --d-model, --vocab, --seq, --batch)",
                    "use fewer devices"
                ])
            )));
        }
        Ok(())
    }

    /// [`MemoryPlan::check`], then the host-side copies of the state (`global_state_bytes`:
    /// the parameters and optimizer state as initialised, before sharding) against the heap.
    pub fn check_with_host(&self, limits: &MemoryLimits, global_state_bytes: u64) -> Result<(), MemoryError> {
        self.check(limits)?;
        if let Some(heap) = limits.heap_bytes {
            let host = self
                .host_init_bytes(global_state_bytes)
                .ok_or_else(|| overflow("the host copies of the state"))?;
            if host > heap {
                return Err(MemoryError(format!(
                    "setting up the parameters and optimizer state takes {} of host memory, more than the wasm heap of \
                     {}: make the model smaller (--layers, --d-model, --vocab) or use fewer devices",
                    human_bytes(host),
                    human_bytes(heap)
                )));
            }
        }
        Ok(())
    }
}

/// Per value, the parameter (by input position among the parameters) whose gradient buffer it
/// is: the values named `dNAME` for a parameter `NAME` of the program's inputs.
fn gradient_buffers(prog: &Program) -> Vec<Option<usize>> {
    let names: Vec<String> = prog
        .inputs
        .iter()
        .filter(|(_, role)| role.is_param())
        .filter_map(|(v, _)| prog.info(*v).name.as_ref().map(|n| format!("d{n}")))
        .collect();
    prog.values
        .iter()
        .map(|info| info.name.as_ref().and_then(|n| names.iter().position(|g| g == n)))
        .collect()
}

/// How a value is named in a message: its name, else `%N (op)`.
fn value_name(prog: &Program, v: ValueId) -> String {
    if let Some(name) = &prog.info(v).name {
        return name.clone();
    }
    let op = prog
        .instrs
        .iter()
        .find(|ins| ins.outputs.contains(&v))
        .map_or("input", |ins| ins.op.name());
    format!("{v} ({op})")
}

/// The plan of a traced train step of `cfg` and its checks against `limits` (buffers, budget,
/// heap): what a run does after tracing and before it initialises any parameter. Run
/// [`check_config`] first, before tracing.
pub fn plan_and_check(
    prog: &Program,
    cfg: &GptConfig,
    optimizer: Optimizer,
    limits: &MemoryLimits,
) -> Result<MemoryPlan, MemoryError> {
    // The global state as initialised, before it is laid out per device.
    let global_state = cfg
        .param_count()
        .and_then(|n| n.checked_mul(ELEMENT_BYTES * (1 + optimizer.slots() as u64)))
        .ok_or_else(|| overflow("the parameters and optimizer state"))?;
    let plan = MemoryPlan::of(prog)?;
    plan.check_with_host(limits, global_state)?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{param_specs, train_step_program, Attention};

    fn tiny() -> GptConfig {
        GptConfig::tiny()
    }

    #[test]
    fn closed_form_param_count_matches_the_param_list() {
        for tied in [false, true] {
            let cfg = GptConfig { tied, ..tiny() };
            let listed: usize = param_specs(&cfg).iter().map(|p| p.numel()).sum();
            assert_eq!(cfg.param_count(), Some(listed as u64));
        }
    }

    #[test]
    fn fused_attention_holds_activations_linear_in_the_sequence() {
        // Quadrupling T quadruples a fused step's activations (no (T, T) array outlives the
        // op); the unfused step's grow with T^2 (the goal: at most 5x from 1024 to 4096).
        let activations = |attention, seq| {
            let cfg = GptConfig {
                layers: 2,
                d_model: 64,
                heads: 4,
                seq,
                batch: 1,
                vocab: 64,
                attention,
                ..tiny()
            };
            let step = train_step_program(&cfg, Optimizer::Sgd { lr: 0.1 }, crate::ir::RngLayout::Partitionable)
                .expect("step");
            MemoryPlan::of(&step.program).expect("plan").activations as f64
        };
        let growth = |a| activations(a, 1024) / activations(a, 256);
        let (fused, unfused) = (growth(Attention::Fused), growth(Attention::Unfused));
        assert!(
            fused <= 4.0 + 1e-9,
            "fused activations grow {fused}x for 4x the sequence"
        );
        assert!(unfused > 10.0, "unfused activations grow {unfused}x");
    }

    #[test]
    fn param_count_overflow_is_none_not_a_wrapped_number() {
        let cfg = GptConfig {
            d_model: usize::MAX / 2,
            ..tiny()
        };
        assert_eq!(cfg.param_count(), None);
    }

    #[test]
    fn plan_of_a_global_step_counts_params_and_adamw_state() {
        let cfg = tiny();
        let step = train_step_program(&cfg, Optimizer::AdamW { lr: 1e-3 }, crate::ir::RngLayout::Partitionable)
            .expect("tiny step");
        let plan = MemoryPlan::of(&step.program).expect("plan");
        let params = cfg.param_count().unwrap() * 4;
        assert_eq!(plan.params, params);
        assert_eq!(plan.optimizer_state, 2 * params);
        assert!(plan.activations > 0);
        assert_eq!(plan.gradients, params);
        // At once, the total is at most the parts (each at its largest) and at least the state
        // with the larger of the activations and the gradients.
        assert!(plan.total <= plan.params + plan.optimizer_state + plan.gradients + plan.activations);
        assert!(plan.total >= plan.params + plan.optimizer_state + plan.activations.max(plan.gradients));
        assert_eq!(plan.devices, 1);
        let max = plan.tensors.iter().map(|t| t.bytes).max().unwrap();
        assert_eq!(plan.largest.bytes, max);
    }

    #[test]
    fn bf16_holds_f32_masters_and_moments_a_bf16_compute_copy_and_half_the_float_activations() {
        // Mixed precision in closed form: 4 bytes a parameter for the f32 master, 8 for AdamW's
        // f32 moments, 2 for the bf16 copy computed with (14 a parameter, plus the bf16
        // gradients among the activations). Activations are the same values at half the width,
        // but for the integer inputs (tokens, targets, the key), held whole for the step.
        let cfg = GptConfig { dropout: 0.0, ..tiny() };
        let plan = |precision| {
            let cfg = GptConfig {
                precision,
                ..cfg.clone()
            };
            let step = train_step_program(&cfg, Optimizer::AdamW { lr: 1e-3 }, crate::ir::RngLayout::Partitionable)
                .expect("tiny step");
            MemoryPlan::of(&step.program).expect("plan")
        };
        let (f32, bf16) = (plan(Precision::F32), plan(Precision::Bf16));
        let n = cfg.param_count().unwrap();
        assert_eq!((f32.params, f32.optimizer_state, f32.compute_params), (4 * n, 8 * n, 0));
        assert_eq!(
            (bf16.params, bf16.optimizer_state, bf16.compute_params),
            (4 * n, 8 * n, 2 * n)
        );
        // The gradient buffers are bf16 too: half of f32's 4 bytes a parameter.
        assert_eq!((f32.gradients, bf16.gradients), (4 * n, 2 * n));
        let ints = 4 * (2 * (cfg.batch * cfg.seq) as u64 + 2);
        assert_eq!(bf16.activations, (f32.activations - ints) / 2 + ints);
        // What must fit: the state, and the liveness peak of everything else (gradients
        // included) at half the width.
        let peak = |p: &MemoryPlan| p.total - p.params - p.optimizer_state - p.compute_params;
        assert_eq!(peak(&bf16), (peak(&f32) - ints) / 2 + ints);
        assert_eq!(bf16.total, 14 * n + peak(&bf16));
    }

    #[test]
    fn a_tensor_over_the_binding_limit_is_named_with_a_fix() {
        let cfg = tiny();
        let step = train_step_program(&cfg, Optimizer::Sgd { lr: 0.1 }, crate::ir::RngLayout::Partitionable)
            .expect("tiny step");
        let plan = MemoryPlan::of(&step.program).expect("plan");
        let limits = MemoryLimits::adapter(1 << 30, plan.largest.bytes - 1);
        let err = plan.check(&limits).unwrap_err().0;
        assert!(err.contains(&plan.largest.name), "{err}");
        assert!(err.contains("max_storage_buffer_binding_size"), "{err}");
        assert!(err.contains("make the model smaller"), "{err}");
    }

    #[test]
    fn the_budget_covers_all_devices_together() {
        let cfg = tiny();
        let step = train_step_program(&cfg, Optimizer::Sgd { lr: 0.1 }, crate::ir::RngLayout::Partitionable)
            .expect("tiny step");
        let plan = MemoryPlan::of(&step.program).expect("plan");
        let limits = MemoryLimits {
            budget_bytes: plan.total - 1,
            ..MemoryLimits::host()
        };
        let err = plan.check(&limits).unwrap_err().0;
        assert!(err.contains("memory budget"), "{err}");
        assert!(plan.check(&MemoryLimits::host()).is_ok());
    }

    #[test]
    fn config_check_refuses_a_huge_width_without_tracing() {
        let cfg = GptConfig {
            d_model: 4096,
            heads: 4,
            layers: 2,
            ..tiny()
        };
        let err = check_config(&cfg, Optimizer::AdamW { lr: 1e-3 }, 1, &MemoryLimits::host())
            .unwrap_err()
            .0;
        assert!(err.contains("memory budget"), "{err}");
    }

    #[test]
    fn config_check_bounds_every_buffer_by_its_global_size() {
        // The page's case: 2^33 attention scores, which wrapped to 0 elements in 32 bits.
        let cfg = GptConfig {
            layers: 1,
            d_model: 64,
            heads: 64,
            seq: 512,
            batch: 512,
            vocab: 32,
            tied: false,
            dropout: 0.0,
            attention: Default::default(),
            remat: Default::default(),
            precision: Default::default(),
            moe: None,
        };
        let sgd = Optimizer::Sgd { lr: 0.1 };
        let err = check_config(&cfg, sgd, 4, &MemoryLimits::host()).unwrap_err().0;
        assert!(err.contains("attention scores [512,64,512,512]"), "{err}");
        assert!(err.contains("memory budget"), "{err}");
        // With room in the budget, the adapter's buffer limit still refuses it.
        let limits = MemoryLimits {
            budget_bytes: u64::MAX,
            ..MemoryLimits::adapter(1 << 30, 1 << 27)
        };
        let err = check_config(&cfg, sgd, 4, &limits).unwrap_err().0;
        assert!(err.starts_with("attention scores [512,64,512,512]"), "{err}");
        assert!(err.contains("max_storage_buffer_binding_size"), "{err}");
    }

    #[test]
    fn config_check_caps_layers_and_simulated_devices() {
        let deep = GptConfig {
            layers: MAX_LAYERS + 1,
            ..tiny()
        };
        let sgd = Optimizer::Sgd { lr: 0.1 };
        assert!(check_config(&deep, sgd, 1, &MemoryLimits::host())
            .unwrap_err()
            .0
            .contains("--layers"));
        let err = check_config(&tiny(), sgd, MAX_SIMULATED_DEVICES + 1, &MemoryLimits::host())
            .unwrap_err()
            .0;
        assert!(err.contains("smaller mesh"), "{err}");
        assert!(check_config(&tiny(), sgd, MAX_SIMULATED_DEVICES, &MemoryLimits::host()).is_ok());
    }

    #[test]
    fn the_heap_check_counts_every_device_copy() {
        let cfg = tiny();
        let step = train_step_program(&cfg, Optimizer::Sgd { lr: 0.1 }, crate::ir::RngLayout::Partitionable)
            .expect("tiny step");
        let plan = MemoryPlan::of(&step.program).expect("plan");
        let limits = MemoryLimits {
            heap_bytes: Some(plan.params),
            ..MemoryLimits::host()
        };
        let err = plan.check_with_host(&limits, plan.params).unwrap_err().0;
        assert!(err.contains("wasm heap"), "{err}");
    }

    /// A tiny step's plan and the limits it just fits: the budget at its total.
    fn tiny_plan() -> MemoryPlan {
        let step = train_step_program(&tiny(), Optimizer::Sgd { lr: 0.1 }, crate::ir::RngLayout::Partitionable)
            .expect("tiny step");
        MemoryPlan::of(&step.program).expect("plan")
    }

    #[test]
    fn a_plan_over_budget_names_the_budget_flag_where_the_limits_have_one() {
        let plan = tiny_plan();
        for (limits, memory) in [
            (MemoryLimits::host(), "this machine"),
            (MemoryLimits::adapter(1 << 30, 1 << 30), "this GPU"),
        ] {
            let cli = limits.with_budget_flag("--memory-budget", Some(plan.total - 1));
            let err = plan.check(&cli).unwrap_err().0;
            assert!(err.contains("memory budget"), "{err}");
            assert!(
                err.contains(&format!(
                    "use fewer devices or, if {memory} has more memory, raise --memory-budget (4 GiB unless given"
                )),
                "{err}"
            );
            // Where nothing raises the budget (the page), the error does not offer it.
            let page = MemoryLimits {
                budget_bytes: plan.total - 1,
                ..limits
            };
            let err = plan.check(&page).unwrap_err().0;
            assert!(
                err.ends_with(
                    "make the model smaller (--layers, --d-model, --vocab, --seq, --batch) or use fewer devices"
                ),
                "{err}"
            );
            assert!(!err.contains("--memory-budget"), "{err}");
        }
    }

    #[test]
    fn a_config_over_budget_names_the_budget_flag_where_the_limits_have_one() {
        let cfg = GptConfig {
            d_model: 4096,
            heads: 4,
            layers: 2,
            ..tiny()
        };
        let adamw = Optimizer::AdamW { lr: 1e-3 };
        let cli = MemoryLimits::host().with_budget_flag("--memory-budget", None);
        let err = check_config(&cfg, adamw, 1, &cli).unwrap_err().0;
        assert!(
            err.contains("make the model smaller (--layers, --d-model, --vocab) or, if this machine has more memory, raise --memory-budget"),
            "{err}"
        );
        let err = check_config(&cfg, adamw, 1, &MemoryLimits::host()).unwrap_err().0;
        assert!(
            err.ends_with("make the model smaller (--layers, --d-model, --vocab)"),
            "{err}"
        );
    }

    #[test]
    fn a_step_refused_under_a_budget_runs_under_a_larger_one() {
        // The flag's budget replaces the default whole: just under the plan's total refuses
        // it, the total admits it, and so does a budget far past the default.
        let plan = tiny_plan();
        let budget = |bytes| MemoryLimits::host().with_budget_flag("--memory-budget", Some(bytes));
        assert!(plan.check(&budget(plan.total - 1)).is_err());
        assert!(plan.check(&budget(plan.total)).is_ok());
        let cfg = GptConfig {
            d_model: 4096,
            heads: 4,
            layers: 2,
            ..tiny()
        };
        let adamw = Optimizer::AdamW { lr: 1e-3 };
        assert!(check_config(&cfg, adamw, 1, &budget(DEFAULT_BUDGET_BYTES)).is_err());
        assert!(check_config(&cfg, adamw, 1, &budget(100 << 30)).is_ok());
        // Without a value the flag keeps the one default.
        assert_eq!(
            MemoryLimits::host()
                .with_budget_flag("--memory-budget", None)
                .budget_bytes,
            DEFAULT_BUDGET_BYTES
        );
    }

    #[test]
    fn sizes_read_in_binary_and_decimal_units_as_written() {
        for (text, bytes) in [
            ("100GiB", 100u64 << 30),
            ("100G", 100 << 30),
            ("100g", 100 << 30),
            ("512MiB", 512 << 20),
            ("512M", 512 << 20),
            ("80GB", 80_000_000_000),
            ("80gb", 80_000_000_000),
            ("500MB", 500_000_000),
            ("2TiB", 2 << 40),
            ("2T", 2 << 40),
            ("1TB", 1_000_000_000_000),
            ("64KiB", 64 << 10),
            ("64kB", 64_000),
            ("4294967296", 4 << 30),
            ("4096B", 4096),
            (" 80 GiB ", 80 << 30),
            ("1.5GiB", 3 << 29),
            ("0.5K", 512),
            ("18446744073709551615", u64::MAX),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn sizes_that_are_no_memory_or_no_number_are_refused_with_an_example() {
        for (text, why) in [
            ("0", "no memory"),
            ("0GiB", "no memory"),
            ("0.1B", "no memory"),
            ("", "empty"),
            ("   ", "empty"),
            ("-1G", "not a size"),
            ("-5", "not a size"),
            ("NaN", "not a size"),
            ("inf", "not a size"),
            ("GiB", "not a size"),
            (".", "not a size"),
            ("1.2.3G", "not a size"),
            ("10XB", "not a unit"),
            ("1e9", "not a unit"),
            ("10 GiB extra", "not a unit"),
            ("18446744073709551616", "64 bits"),
            ("16777216TiB", "64 bits"),
            ("99999999999999999999999999999", "64 bits"),
        ] {
            let err = parse_size(text).unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
            assert!(err.contains("such as 80GiB"), "{text:?}: {err}");
        }
    }

    #[test]
    fn binary_bytes_reads_the_default_budget_as_written() {
        assert_eq!(binary_bytes(DEFAULT_BUDGET_BYTES), "4 GiB");
        assert_eq!(binary_bytes(3 << 29), "1.5 GiB");
        assert_eq!(binary_bytes(512), "512 B");
    }

    #[test]
    fn human_bytes_reads_like_a_size() {
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(268_435_456), "268.4 MB");
    }
}
