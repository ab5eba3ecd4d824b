//! Where a device's rows of attention sit in the global sequence, under context parallelism.
//!
//! A causal mask compares global positions, and dropout bits are indexed by them, so an
//! attention op that sees only part of the sequence (its query block, or the key/value block a
//! ring step brought) must know which part. Each side is a [`SeqBlock`]: the whole sequence, or
//! one of `parts` blocks cut in a [`CpOrder`], picked by the device's index along mesh axes
//! (shifted back by `shift` ring steps: at step s a device holds the block of the device s
//! places before it on the ring).

use crate::sharding::ShardingError;

/// How context parallelism lays the sequence's blocks over the devices of its axis.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CpOrder {
    /// Device r holds block r of `parts` equal blocks: with a causal mask the last device has
    /// the most work (its queries see every earlier key).
    #[default]
    Contiguous,
    /// The sequence cut into 2 * parts chunks; device r holds chunk r and chunk 2 * parts - 1 - r,
    /// one early and one late, so every device has the same causal work.
    Zigzag,
}

impl CpOrder {
    pub const ALL: [CpOrder; 2] = [CpOrder::Contiguous, CpOrder::Zigzag];

    /// The name the CLI (`--cp-order`) and the page use.
    pub fn name(self) -> &'static str {
        match self {
            CpOrder::Contiguous => "contiguous",
            CpOrder::Zigzag => "zigzag",
        }
    }

    pub fn parse(name: &str) -> Option<CpOrder> {
        CpOrder::ALL.into_iter().find(|o| o.name() == name)
    }

    /// Chunks of the sequence per device: zig-zag gives each device two.
    pub fn chunks_per_device(self) -> usize {
        match self {
            CpOrder::Contiguous => 1,
            CpOrder::Zigzag => 2,
        }
    }

    /// The sequence's chunks (of `chunks_per_device() * parts`) in the order the devices hold
    /// them: device r's chunks sit at places `2r` and `2r + 1` of the list under zig-zag.
    pub fn chunk_order(self, parts: usize) -> Vec<usize> {
        match self {
            CpOrder::Contiguous => (0..parts).collect(),
            CpOrder::Zigzag => (0..parts).flat_map(|r| [r, 2 * parts - 1 - r]).collect(),
        }
    }
}

/// The rows of one side of a device's attention, as global sequence positions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum SeqBlock {
    /// Local row i is global position i: the whole sequence.
    #[default]
    Whole,
    /// Block `(axis_index(axes) - shift) mod parts` of the sequence cut into `parts` blocks in
    /// `order`.
    Part {
        axes: Vec<String>,
        parts: usize,
        shift: usize,
        order: CpOrder,
    },
    /// The whole sequence in zig-zag order of `parts` blocks ([`CpOrder::chunk_order`]): a
    /// global program's, reordered so that jit's contiguous block r of it over `parts` devices
    /// is zig-zag's `Part` r (as MaxText reorders the tokens under jit). It runs only split so.
    Zigzag { parts: usize },
}

/// A block's rows as at most two runs of consecutive positions: row i < `chunk` sits at
/// `starts[0] + i`, row i >= `chunk` at `starts[1] + i - chunk`. What a kernel reads per device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Runs {
    pub starts: [usize; 2],
    pub chunk: usize,
}

impl Runs {
    /// The global position of local row `i`.
    pub fn pos(&self, i: usize) -> usize {
        if i < self.chunk {
            self.starts[0] + i
        } else {
            self.starts[1] + i - self.chunk
        }
    }
}

impl SeqBlock {
    /// The mesh axes the block depends on (none for the whole sequence).
    pub fn axes(&self) -> &[String] {
        match self {
            SeqBlock::Whole | SeqBlock::Zigzag { .. } => &[],
            SeqBlock::Part { axes, .. } => axes,
        }
    }

    /// The global sequence length of a block of `local` rows.
    pub fn global_len(&self, local: usize) -> usize {
        match self {
            SeqBlock::Whole | SeqBlock::Zigzag { .. } => local,
            SeqBlock::Part { parts, .. } => local * parts,
        }
    }

    /// The rows of the device at `index` along the block's axes, for a block of `local` rows;
    /// an error for a whole sequence in zig-zag order, whose 2 x parts runs no kernel reads.
    pub fn runs(&self, index: usize, local: usize) -> Result<Runs, ShardingError> {
        Ok(match self {
            SeqBlock::Whole => Runs {
                starts: [0, 0],
                chunk: local,
            },
            SeqBlock::Zigzag { parts } => return Err(ShardingError::WholeZigzag { parts: *parts }),
            SeqBlock::Part {
                parts, shift, order, ..
            } => {
                let b = (index + parts - shift % parts) % parts;
                match order {
                    CpOrder::Contiguous => Runs {
                        starts: [b * local, 0],
                        chunk: local,
                    },
                    CpOrder::Zigzag => {
                        let c = local / 2;
                        let order = order.chunk_order(*parts);
                        Runs {
                            starts: [order[2 * b] * c, order[2 * b + 1] * c],
                            chunk: c,
                        }
                    }
                }
            }
        })
    }

    /// How the printed program shows it: `whole`, `cp[(i-1)%4]`, `cp[(i)%4] zigzag`.
    pub fn text(&self) -> String {
        match self {
            SeqBlock::Whole => "whole".into(),
            SeqBlock::Zigzag { parts } => format!("whole, zig-zag order of {parts}"),
            SeqBlock::Part {
                axes,
                parts,
                shift,
                order,
            } => {
                let idx = if *shift == 0 {
                    format!("axis_index({})", axes.join(","))
                } else {
                    format!("(axis_index({})-{shift})%{parts}", axes.join(","))
                };
                let order = match order {
                    CpOrder::Contiguous => String::new(),
                    CpOrder::Zigzag => " zigzag".into(),
                };
                format!("block {idx} of {parts}{order}")
            }
        }
    }
}

/// The sequence blocks of an attention's queries and of its keys and values.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct AttnSeq {
    pub q: SeqBlock,
    pub kv: SeqBlock,
}

impl AttnSeq {
    /// Both sides whole: the attention of one device, or of a jit program on global shapes.
    pub fn is_whole(&self) -> bool {
        self.q == SeqBlock::Whole && self.kv == SeqBlock::Whole
    }

    /// Every mesh axis either side depends on.
    pub fn axes(&self) -> Vec<String> {
        let mut a: Vec<String> = self.q.axes().to_vec();
        for x in self.kv.axes() {
            if !a.contains(x) {
                a.push(x.clone());
            }
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(parts: usize, shift: usize, order: CpOrder) -> SeqBlock {
        SeqBlock::Part {
            axes: vec!["cp".into()],
            parts,
            shift,
            order,
        }
    }

    fn positions(b: &SeqBlock, index: usize, local: usize) -> Vec<usize> {
        let r = b.runs(index, local).unwrap();
        (0..local).map(|i| r.pos(i)).collect()
    }

    #[test]
    fn every_order_covers_the_sequence_once() {
        for order in CpOrder::ALL {
            for parts in [1, 2, 4] {
                let local = 4;
                let mut all: Vec<usize> = (0..parts)
                    .flat_map(|r| positions(&part(parts, 0, order), r, local))
                    .collect();
                all.sort();
                assert_eq!(all, (0..parts * local).collect::<Vec<_>>(), "{order:?} {parts}");
            }
        }
    }

    #[test]
    fn zigzag_gives_each_device_one_early_and_one_late_chunk() {
        // T = 16 on 4 devices: chunks of 2; device 1 holds chunks 1 and 6.
        assert_eq!(positions(&part(4, 0, CpOrder::Zigzag), 1, 4), vec![2, 3, 12, 13]);
        assert_eq!(positions(&part(4, 0, CpOrder::Contiguous), 1, 4), vec![4, 5, 6, 7]);
    }

    #[test]
    fn a_whole_sequence_in_zigzag_order_splits_into_each_devices_zigzag_chunks() {
        // What jit's contiguous blocks of the reordered sequence hold: device r's two chunks.
        let (parts, c) = (4, 2);
        let reordered: Vec<usize> = CpOrder::Zigzag
            .chunk_order(parts)
            .into_iter()
            .flat_map(|k| k * c..(k + 1) * c)
            .collect();
        for r in 0..parts {
            let block = &reordered[r * 2 * c..(r + 1) * 2 * c];
            assert_eq!(
                block,
                positions(&part(parts, 0, CpOrder::Zigzag), r, 2 * c),
                "device {r}"
            );
        }
        // Whole, it has 2 x parts runs, which no kernel reads: it runs only split.
        assert!(SeqBlock::Zigzag { parts }.runs(0, 2 * parts * c).is_err());
    }

    #[test]
    fn a_ring_step_holds_the_block_of_the_device_that_many_places_before() {
        // At step 1 device 0 holds device 3's block (the ring sends i -> i + 1).
        assert_eq!(
            positions(&part(4, 1, CpOrder::Contiguous), 0, 2),
            positions(&part(4, 0, CpOrder::Contiguous), 3, 2)
        );
        assert_eq!(positions(&SeqBlock::Whole, 0, 3), vec![0, 1, 2]);
    }
}
