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
