//! Device profiles: what one accelerator and its links can do, as the cost model prices
//! them. `this` is calibrated by microbenchmarks ([`super::calibrate`]); the presets come from
//! public specifications, each figure's source in a comment and every estimate named in
//! `estimated`.

/// How the devices of a mesh are wired, which decides how many hops a collective takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    /// Devices in a ring of point-to-point links (PCIe peers, Thunderbolt, a 1-D slice).
    Ring,
    /// A 2-D torus of bidirectional links (TPU ICI): a group runs its collective as rings
    /// along both torus dimensions, two links per dimension.
    Torus2d,
    /// Every device one hop from a switch (NVLink with NVSwitch): a ring over the switch at the
    /// device's full link bandwidth.
    Switch,
}

/// One kind of accelerator. Rates are per device; seconds are per event.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceProfile {
    /// Short name for `--device` (`this`, `tpu_v4`, `h100`, ...).
    pub name: String,
    pub label: String,
    /// Matmul peak at the precision JAX uses for f32 dots by default on that device
    /// (bf16 passes on TPU, TF32 on NVIDIA tensor cores, f32 elsewhere), FLOP/s.
    pub matmul_flops: f64,
    /// Matmul peak with bf16 operands and f32 accumulation (mixed precision's dots), FLOP/s;
    /// None where bf16 dots run no faster than `matmul_flops` (`this`: the sandbox's kernels
    /// compute in f32). Dense figures: a datasheet's "with sparsity" peak is twice this.
    #[serde(default)]
    pub matmul_flops_bf16: Option<f64>,
    /// The share of the matmul peak that large, well-shaped matmuls sustain on the real part
    /// (clocks under load, not the datasheet's boost): Maximum Achievable Matmul FLOPS (MAMF)
    /// over the peak, as measured. 1 where unmeasured (named in `estimated`) and on `this`,
    /// whose peak is itself measured.
    #[serde(default = "unit")]
    pub matmul_sustained: f64,
    /// Output tile (m, n) and contraction step (k) of the matmul unit: a dimension that is
    /// not a multiple wastes the padded remainder.
    pub matmul_tile: [usize; 3],
    /// Output tiles the device works on at once (MXUs, SMs, cores): fewer tiles than this
    /// leave units idle, a partial last wave wastes the rest.
    pub matmul_units: usize,
    /// FLOPs of one matmul at which it reaches half the peak (start-up and tail costs of a
    /// kernel beyond the launch itself); 0 for none.
    pub matmul_half_flops: f64,
    /// Batched matmuls (one kernel over many independent products: attention's dots, and on
    /// `this` every dot of a mesh simulated on one adapter, batched over its devices) where they
    /// run on other kernels than single ones, as the autotuner picks per shape class; None: at
    /// the single-matmul figures (the presets: their libraries batch natively).
    pub matmul_batched: Option<MatmulFit>,
    /// The sandbox's fused attention kernels, forward and backward: FLOP/s over all their FLOPs
    /// (dot products and the rest), seconds per (batch, head) product and per op. Calibrated on
    /// `this`, where they run as the sandbox's own kernels do (composed through the tuned
    /// matmuls on CPU adapters), far below its matmul rate. None on the presets, whose
    /// platforms run FlashAttention-style kernels on their matrix units (priced as their dot
    /// products).
    #[serde(default)]
    pub attention: Option<MatmulFit>,
    /// Non-matmul f32 arithmetic (vector / CUDA cores), FLOP/s.
    pub vector_flops: f64,
    /// 32-bit integer operations per second (Threefry's adds, rotates and xors).
    pub int_ops: f64,
    /// Sustained memory bandwidth, bytes/s.
    pub mem_bandwidth: f64,
    /// A collective simulated as shardlab runs it on one adapter (copy-and-add kernels between
    /// the devices' blocks of its memory, strided per device), bytes/s as the cost model counts
    /// them: calibrated on `this`, where it runs well below `mem_bandwidth`; None on the
    /// presets, whose collectives cross real links (priced by the topology). Without it a
    /// simulated collective moves at `mem_bandwidth`.
    #[serde(default)]
    pub sim_collective_bandwidth: Option<f64>,
    /// Seconds per kernel launch (dispatch) beyond its work, inside a train step: on `this`
    /// fitted to whole reference steps, never below what a launch costs in a chain of one kernel.
    pub launch_s: f64,
    /// Fixed seconds per step: submitting the step and reading the loss back.
    pub step_s: f64,
    /// Device memory, bytes.
    pub memory_bytes: u64,
    pub topology: Topology,
    /// One-way bandwidth of one link, bytes/s.
    pub link_bandwidth: f64,
    /// Seconds per hop (alpha).
    pub link_latency: f64,
    /// Where a mesh outgrows the fast links: the devices of one server share them (NVLink
    /// through NVSwitch), servers talk over a slower scale-out network (InfiniBand, RoCE).
    /// None: one fabric joins every device (a TPU slice's ICI torus, a ring of PCIe peers).
    #[serde(default)]
    pub scale_out: Option<ScaleOut>,
    /// Which figures are estimates rather than published specifications or measurements.
    pub estimated: Vec<String>,
    /// Where the figures come from.
    pub source: String,
}

/// The network between servers of devices: each server's devices share the fast links, and
/// every device has its own link into the scale-out network.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScaleOut {
    /// Devices per server (on the fast links).
    pub node_devices: usize,
    /// One-way bandwidth of one device's scale-out link, bytes/s.
    pub bandwidth: f64,
    /// Seconds per hop across it (alpha).
    pub latency: f64,
}

/// A matmul kernel's throughput: the peak and the FLOPs of one matmul at which it reaches half
/// of it.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MatmulFit {
    pub flops: f64,
    pub half_flops: f64,
    /// Seconds each independent product of a batched dispatch adds beyond its FLOPs (on
    /// lavapipe many small products run far below the peak); 0 where not calibrated.
    #[serde(default)]
    pub per_product_s: f64,
    /// Seconds a batched dispatch costs beyond its launch and products (its pack passes); 0
    /// where not calibrated.
    #[serde(default)]
    pub fixed_s: f64,
}

use crate::ir::Precision;

const GIB: u64 = 1 << 30;

fn est(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// A [`DeviceProfile`] figure in a learner's words (`launch_s` is "the cost of launching one
/// kernel"), for the page and reports that list which figures are estimates; None for a name
/// that is no figure.
pub fn figure_label(field: &str) -> Option<&'static str> {
    Some(match field {
        "matmul_flops" => "matrix-multiply throughput",
        "matmul_flops_bf16" => "matrix-multiply throughput in bf16",
        "matmul_sustained" => "the share of the matrix-multiply peak that large matmuls sustain",
        "matmul_tile" => "the matrix unit's tile",
        "matmul_units" => "matrix units working at once",
        "matmul_half_flops" => "how large a matmul must be to reach half the throughput",
        "matmul_batched" => "batched matmul throughput",
        "vector_flops" => "arithmetic outside matmuls",
        "int_ops" => "integer arithmetic (the random-bit hash)",
        "mem_bandwidth" => "memory bandwidth",
        "sim_collective_bandwidth" => "collectives between simulated devices",
        "launch_s" => "the cost of launching one kernel",
        "step_s" => "the fixed cost of a step",
        "memory_bytes" => "memory per device",
        "topology" => "how the devices are linked",
        "link_bandwidth" => "bandwidth of a link between devices",
        "link_latency" => "latency of a link between devices",
        "scale_out" => "the network between servers",
        "scale_out.latency" => "latency of the network between servers",
        _ => return None,
    })
}

/// Google Cloud TPU v4, one chip (two TensorCores as one JAX device, "megacore").
/// Sources: cloud.google.com/tpu/docs/v4 (275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s,
/// 3-D torus ICI); Jouppi et al., "TPU v4", ISCA 2023 (4 MXUs of 128x128 per core, 6 ICI
/// links per chip). A v4-8 is 4 chips; its slice is a 2x2 torus face.
pub fn tpu_v4() -> DeviceProfile {
    DeviceProfile {
        name: "tpu_v4".into(),
        label: "TPU v4".into(),
        matmul_flops: 275e12,
        // The MXUs multiply bf16 (f32 dots run as bf16 passes by default): the same peak.
        matmul_flops_bf16: Some(275e12),
        // Unmeasured: the datasheet peak.
        matmul_sustained: 1.0,
        matmul_tile: [128, 128, 128],
        matmul_units: 8,
        matmul_half_flops: 2e8,
        matmul_batched: None,
        attention: None,
        // VPU: 2 cores x 8 sublanes x 128 lanes x 1.05 GHz, one f32 op per lane per cycle
        // (estimated from the ISCA paper's VPU shape; not a published FLOP/s figure).
        vector_flops: 2.15e12,
        int_ops: 2.15e12,
        mem_bandwidth: 1200e9,
        sim_collective_bandwidth: None,
        // XLA's per-op cost on TPU (a fused kernel's start-up): estimated.
        launch_s: 2e-6,
        step_s: 50e-6,
        memory_bytes: 32 * GIB,
        topology: Topology::Torus2d,
        // ICI: 45 GB/s one way per link (DESIGN.md; derived from the ISCA paper's per-link
        // rate), ~1 us per hop (estimated).
        link_bandwidth: 45e9,
        link_latency: 1e-6,
        // ICI joins a whole pod (4096 chips): no slower network inside a mesh.
        scale_out: None,
        estimated: est(&[
            "matmul_sustained",
            "vector_flops",
            "int_ops",
            "launch_s",
            "step_s",
            "matmul_half_flops",
            "link_latency",
        ]),
        source: "cloud.google.com/tpu/docs/v4; Jouppi et al., ISCA 2023".into(),
    }
}

/// Google Cloud TPU v5e, one chip (one TensorCore).
/// Sources: cloud.google.com/tpu/docs/v5e (197 TFLOP/s bf16, 16 GiB HBM2 at 819 GB/s,
/// 2-D torus, 1600 Gbit/s ICI per chip over 4 links = 50 GB/s per link one way).
pub fn tpu_v5e() -> DeviceProfile {
    DeviceProfile {
        name: "tpu_v5e".into(),
        label: "TPU v5e".into(),
        matmul_flops: 197e12,
        matmul_flops_bf16: Some(197e12),
        matmul_sustained: 1.0,
        matmul_tile: [128, 128, 128],
        matmul_units: 4,
        matmul_half_flops: 2e8,
        matmul_batched: None,
        attention: None,
        // VPU: 8 x 128 lanes at 1.5 GHz (estimated, as for v4).
        vector_flops: 1.5e12,
        int_ops: 1.5e12,
        mem_bandwidth: 819e9,
        sim_collective_bandwidth: None,
        launch_s: 2e-6,
        step_s: 50e-6,
        memory_bytes: 16 * GIB,
        topology: Topology::Torus2d,
        link_bandwidth: 50e9,
        link_latency: 1e-6,
        scale_out: None,
        estimated: est(&[
            "matmul_sustained",
            "vector_flops",
            "int_ops",
            "launch_s",
            "step_s",
            "matmul_half_flops",
            "link_latency",
        ]),
        source: "cloud.google.com/tpu/docs/v5e".into(),
    }
}

/// NVIDIA H100 SXM5 80 GB. Source: NVIDIA H100 Tensor Core GPU datasheet (2023): TF32
/// tensor 494.7 TFLOP/s dense (989 with sparsity), BF16 tensor 989.4 dense (1,979 with
/// sparsity), FP32 66.9 TFLOP/s, 3.35 TB/s HBM3,
/// NVLink 4 900 GB/s per GPU both ways (450 one way) through NVSwitch; 132 SMs.
pub fn h100() -> DeviceProfile {
    DeviceProfile {
        name: "h100".into(),
        label: "H100 SXM".into(),
        matmul_flops: 494.7e12,
        // BF16 tensor 1,979 TFLOP/s with sparsity: 989.4 dense.
        matmul_flops_bf16: Some(989.4e12),
        // MAMF 794.5 of 989 TFLOP/s bf16 (ml-engineering's table, torch 2.7.0+cu126).
        matmul_sustained: 0.803,
        matmul_tile: [128, 128, 32],
        matmul_units: 132,
        matmul_half_flops: 5e8,
        matmul_batched: None,
        attention: None,
        vector_flops: 66.9e12,
        // INT32: 64 lanes per SM per clock, half the FP32 lanes (Hopper whitepaper).
        int_ops: 33.5e12,
        mem_bandwidth: 3.35e12,
        sim_collective_bandwidth: None,
        // CUDA kernel launch as XLA issues them (~4 us): estimated.
        launch_s: 4e-6,
        step_s: 100e-6,
        memory_bytes: 80 * GIB,
        topology: Topology::Switch,
        link_bandwidth: 450e9,
        // NVLink + NVSwitch hop and NCCL step latency: estimated.
        link_latency: 2e-6,
        // DGX H100: 8 GPUs a server, each with a 400 Gbit/s NDR InfiniBand (ConnectX-7) port
        // of its own, 50 GB/s one way (NVIDIA DGX H100 user guide); a hop's latency estimated.
        scale_out: Some(ScaleOut {
            node_devices: 8,
            bandwidth: 50e9,
            latency: 5e-6,
        }),
        estimated: est(&[
            "launch_s",
            "step_s",
            "matmul_half_flops",
            "link_latency",
            "scale_out.latency",
        ]),
        source: "NVIDIA H100 datasheet; NVIDIA DGX H100 user guide; NVIDIA Hopper architecture whitepaper; MAMF: github.com/stas00/ml-engineering, compute/accelerator".into(),
    }
}

/// NVIDIA A100 SXM4 80 GB. Source: NVIDIA A100 datasheet: TF32 156 TFLOP/s dense, BF16 312
/// dense, FP32
/// 19.5 TFLOP/s, 2.039 TB/s HBM2e, NVLink 3 600 GB/s both ways (300 one way); 108 SMs.
pub fn a100() -> DeviceProfile {
    DeviceProfile {
        name: "a100".into(),
        label: "A100 SXM".into(),
        matmul_flops: 156e12,
        // BF16 tensor 312 TFLOP/s dense (624 with sparsity).
        matmul_flops_bf16: Some(312e12),
        // MAMF 271.2 of 312 TFLOP/s bf16 (ml-engineering's table, torch 2.6.0+cu126).
        matmul_sustained: 0.869,
        matmul_tile: [128, 128, 32],
        matmul_units: 108,
        matmul_half_flops: 3e8,
        matmul_batched: None,
        attention: None,
        vector_flops: 19.5e12,
        // INT32 19.5 TOPS (datasheet: INT32 at the FP32 rate on Ampere's split datapath).
        int_ops: 19.5e12,
        mem_bandwidth: 2.039e12,
        sim_collective_bandwidth: None,
        launch_s: 4e-6,
        step_s: 100e-6,
        memory_bytes: 80 * GIB,
        topology: Topology::Switch,
        link_bandwidth: 300e9,
        link_latency: 2e-6,
        // DGX A100 (as NVIDIA's Selene): 8 GPUs a server, each with a 200 Gbit/s HDR
        // InfiniBand (ConnectX-6) port of its own, 25 GB/s one way (NVIDIA DGX A100 user
        // guide); a hop's latency estimated.
        scale_out: Some(ScaleOut {
            node_devices: 8,
            bandwidth: 25e9,
            latency: 5e-6,
        }),
        estimated: est(&[
            "launch_s",
            "step_s",
            "matmul_half_flops",
            "link_latency",
            "scale_out.latency",
        ]),
        source: "NVIDIA A100 datasheet; NVIDIA DGX A100 user guide; MAMF: github.com/stas00/ml-engineering, compute/accelerator".into(),
    }
}

/// NVIDIA GeForce RTX 4090 (a consumer GPU). Source: NVIDIA Ada Lovelace architecture
/// whitepaper: FP32 82.6 TFLOP/s, TF32 tensor 82.6 TFLOP/s dense, BF16 tensor (FP32 accumulate)
/// 165.2 dense, 1008 GB/s GDDR6X, 24 GB,
/// 128 SMs; no NVLink, so peers talk over PCIe 4.0 x16 (32 GB/s, ~25 achieved).
pub fn rtx4090() -> DeviceProfile {
    DeviceProfile {
        name: "rtx4090".into(),
        label: "GeForce RTX 4090".into(),
        matmul_flops: 82.6e12,
        // BF16 tensor with FP32 accumulate 165.2 TFLOP/s dense (GeForce: half the FP16-accumulate rate).
        matmul_flops_bf16: Some(165.2e12),
        matmul_sustained: 1.0,
        matmul_tile: [128, 128, 32],
        matmul_units: 128,
        matmul_half_flops: 2e8,
        matmul_batched: None,
        attention: None,
        vector_flops: 82.6e12,
        // INT32 at half the FP32 rate (Ada's shared FP32/INT32 datapath): estimated.
        int_ops: 41.3e12,
        mem_bandwidth: 1008e9,
        sim_collective_bandwidth: None,
        launch_s: 4e-6,
        step_s: 100e-6,
        memory_bytes: 24 * GIB,
        topology: Topology::Ring,
        link_bandwidth: 25e9,
        link_latency: 5e-6,
        scale_out: None,
        estimated: est(&[
            "matmul_sustained",
            "int_ops",
            "launch_s",
            "step_s",
            "matmul_half_flops",
            "link_bandwidth",
            "link_latency",
        ]),
        source: "NVIDIA Ada Lovelace architecture whitepaper; PCI-SIG PCIe 4.0".into(),
    }
}

/// Apple M2 Max (38-core GPU). Source: Apple newsroom, January 2023: 13.6 TFLOP/s FP32,
/// 400 GB/s unified memory, up to 96 GB; several Macs talk over Thunderbolt 4 (40 Gbit/s,
/// ~4 GB/s achieved).
pub fn m2_max() -> DeviceProfile {
    DeviceProfile {
        name: "m2_max".into(),
        label: "Apple M2 Max".into(),
        matmul_flops: 13.6e12,
        // No published bf16 matmul rate; Apple GPUs run half precision at the f32 rate: estimated.
        matmul_flops_bf16: Some(13.6e12),
        matmul_sustained: 1.0,
        matmul_tile: [64, 64, 16],
        matmul_units: 38,
        matmul_half_flops: 1e8,
        matmul_batched: None,
        attention: None,
        vector_flops: 13.6e12,
        // INT32 at the FP32 rate: estimated.
        int_ops: 13.6e12,
        mem_bandwidth: 400e9,
        sim_collective_bandwidth: None,
        // Metal command encoding per kernel: estimated.
        launch_s: 5e-6,
        step_s: 150e-6,
        memory_bytes: 96 * GIB,
        topology: Topology::Ring,
        link_bandwidth: 4e9,
        link_latency: 10e-6,
        scale_out: None,
        estimated: est(&[
            "matmul_sustained",
            "matmul_flops_bf16",
            "int_ops",
            "launch_s",
            "step_s",
            "matmul_half_flops",
            "link_bandwidth",
            "link_latency",
        ]),
        source: "Apple newsroom (M2 Max, 2023); Thunderbolt 4 specification".into(),
    }
}

/// Every preset, in the order they are listed.
pub fn presets() -> Vec<DeviceProfile> {
    vec![tpu_v4(), tpu_v5e(), h100(), a100(), rtx4090(), m2_max()]
}

/// The preset called `name`, if any.
pub fn device_preset(name: &str) -> Option<DeviceProfile> {
    presets().into_iter().find(|p| p.name == name)
}

fn unit() -> f64 {
    1.0
}

impl DeviceProfile {
    /// The profile a program of `precision` runs at: under bf16 its dots at the device's bf16
    /// matmul peak (the single and the batched kernels alike, scaled by the same ratio).
    pub fn at_precision(&self, precision: Precision) -> std::borrow::Cow<'_, DeviceProfile> {
        match (precision, self.matmul_flops_bf16) {
            (Precision::Bf16, Some(bf16)) if bf16 != self.matmul_flops => {
                let ratio = bf16 / self.matmul_flops;
                let mut d = self.clone();
                d.matmul_flops = bf16;
                d.matmul_half_flops *= ratio;
                if let Some(b) = &mut d.matmul_batched {
                    b.flops *= ratio;
                    b.half_flops *= ratio;
                }
                std::borrow::Cow::Owned(d)
            }
            _ => std::borrow::Cow::Borrowed(self),
        }
    }
}

#[cfg(test)]
mod labels {
    use super::*;

    #[test]
    fn every_estimated_figure_of_every_preset_has_a_learners_label() {
        for p in presets() {
            for f in &p.estimated {
                assert!(figure_label(f).is_some(), "{}: `{f}` has no label", p.name);
            }
        }
        assert_eq!(figure_label("launch_s"), Some("the cost of launching one kernel"));
        assert_eq!(figure_label("nonsense"), None);
    }
}
