//! The alpha-beta model of collectives on real interconnects, for the *modelled* step time
//! of N real devices (never mixed with measured times).

/// One interconnect: per-device one-way bandwidth and per-hop latency.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Interconnect {
    pub name: &'static str,
    pub label: &'static str,
    /// Bytes per second one way, per device (per link for a ring).
    pub bandwidth: f64,
    /// Seconds per hop (alpha).
    pub latency: f64,
}

/// Presets: TPU v4 ICI (45 GB/s per link one way, ~1 us per hop), H100 NVLink (450 GB/s per
/// GPU one way), PCIe 4.0 x16 (~25 GB/s achieved of 32 GB/s).
pub const PRESETS: [Interconnect; 3] = [
    Interconnect {
        name: "tpu_v4_ici",
        label: "TPU v4 ICI",
        bandwidth: 45e9,
        latency: 1e-6,
    },
    Interconnect {
        name: "h100_nvlink",
        label: "H100 NVLink",
        bandwidth: 450e9,
        latency: 2e-6,
    },
    Interconnect {
        name: "pcie4_x16",
        label: "PCIe 4.0 x16",
        bandwidth: 25e9,
        latency: 5e-6,
    },
];

pub fn preset(name: &str) -> Option<Interconnect> {
    PRESETS.iter().copied().find(|p| p.name == name)
}

/// The collectives, in HLO's spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum CollectiveKind {
    #[serde(rename = "all-reduce")]
    AllReduce,
    #[serde(rename = "all-gather")]
    AllGather,
    #[serde(rename = "reduce-scatter")]
    ReduceScatter,
    #[serde(rename = "collective-permute")]
    CollectivePermute,
    #[serde(rename = "all-to-all")]
    AllToAll,
}

impl CollectiveKind {
    pub const ALL: [CollectiveKind; 5] = [
        CollectiveKind::AllReduce,
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::CollectivePermute,
        CollectiveKind::AllToAll,
    ];

    pub fn hlo_name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all-reduce",
            CollectiveKind::AllGather => "all-gather",
            CollectiveKind::ReduceScatter => "reduce-scatter",
            CollectiveKind::CollectivePermute => "collective-permute",
            CollectiveKind::AllToAll => "all-to-all",
        }
    }
}

impl Interconnect {
    /// Seconds for one collective moving an array of `bytes` (the full, unsharded size of
    /// what is reduced or gathered) over a ring of `n` devices:
    /// all-reduce 2(n-1)/n x bytes/bw, all-gather and reduce-scatter (n-1)/n x bytes/bw,
    /// all-to-all (n-1)/n x bytes/bw, permute bytes/bw; plus one latency per ring step.
    pub fn collective_seconds(&self, kind: CollectiveKind, bytes: u64, n: usize) -> f64 {
        if n <= 1 {
            return 0.0;
        }
        let (n, b) = (n as f64, bytes as f64);
        let (volume, hops) = match kind {
            CollectiveKind::AllReduce => (2.0 * (n - 1.0) / n * b, 2.0 * (n - 1.0)),
            CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::AllToAll => {
                ((n - 1.0) / n * b, n - 1.0)
            }
            CollectiveKind::CollectivePermute => (b, 1.0),
        };
        volume / self.bandwidth + hops * self.latency
    }
}
