//! The collectives a per-device program holds, by kind, in HLO's spelling.

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

    /// Bytes each device of a group of `n` sends, on a ring, for a collective of `bytes` (the
    /// full size reduced or gathered): an all-reduce is a reduce-scatter then an all-gather,
    /// each moving (n-1)/n of it; a permute sends its whole operand.
    pub fn wire_bytes(self, bytes: u64, n: usize) -> f64 {
        if n <= 1 {
            return 0.0;
        }
        let phase = bytes as f64 * (n - 1) as f64 / n as f64;
        match self {
            CollectiveKind::AllReduce => 2.0 * phase,
            CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::AllToAll => phase,
            CollectiveKind::CollectivePermute => bytes as f64,
        }
    }

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
