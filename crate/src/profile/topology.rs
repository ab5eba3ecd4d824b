//! Collectives priced over a mesh topology: each algorithm step crosses one hop and costs
//! alpha (the hop's latency) plus the bytes it sends over the link bandwidth (beta).
use super::collective::CollectiveKind;
use super::device::{DeviceProfile, Topology};

/// Hops and seconds of one collective.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct CollectiveTime {
    /// Algorithm steps, each one hop.
    pub hops: f64,
    pub seconds: f64,
}

/// The two sides of a 2-D torus face holding `n` devices: as square as `n` allows.
fn torus_sides(n: usize) -> (usize, usize) {
    let mut a = (n as f64).sqrt() as usize;
    while a > 1 && !n.is_multiple_of(a) {
        a -= 1;
    }
    (n / a.max(1), a.max(1))
}

/// Ring steps (reduce-scatter or all-gather) over `n` devices moving `bytes` in all, each
/// step sending `bytes / n` over `links` links at once.
fn ring_phase(n: usize, bytes: f64, links: f64, bw: f64, alpha: f64) -> CollectiveTime {
    if n <= 1 {
        return CollectiveTime {
            hops: 0.0,
            seconds: 0.0,
        };
    }
    let steps = (n - 1) as f64;
    CollectiveTime {
        hops: steps,
        seconds: steps * (alpha + bytes / n as f64 / (links * bw)),
    }
}

fn add(a: CollectiveTime, b: CollectiveTime) -> CollectiveTime {
    CollectiveTime {
        hops: a.hops + b.hops,
        seconds: a.seconds + b.seconds,
    }
}

/// One reduce-scatter (or all-gather) phase over a group of `n` on `topology`: a ring, a
/// switch (a ring at the device's link rate), or a 2-D torus (rings along each side with
/// both directions of a link in use; the second side moves what the first left).
fn phase(topology: Topology, n: usize, bytes: f64, bw: f64, alpha: f64) -> CollectiveTime {
    match topology {
        Topology::Ring | Topology::Switch => ring_phase(n, bytes, 1.0, bw, alpha),
        Topology::Torus2d => {
            let (a, b) = torus_sides(n);
            let first = ring_phase(a, bytes, 2.0, bw, alpha);
            let second = ring_phase(b, bytes / a as f64, 2.0, bw, alpha);
            add(first, second)
        }
    }
}

/// The time of one collective of `kind` over a group of `n` devices of `device`, moving
/// `bytes` (the full size of what is reduced or gathered, per group). All-reduce is a
/// reduce-scatter then an all-gather; all-to-all is priced as one all-gather phase (each
/// device sends (n-1)/n of its data); a permute is one hop.
pub fn collective_time(device: &DeviceProfile, kind: CollectiveKind, bytes: u64, n: usize) -> CollectiveTime {
    if n <= 1 {
        return CollectiveTime {
            hops: 0.0,
            seconds: 0.0,
        };
    }
    let (b, bw, alpha) = (bytes as f64, device.link_bandwidth, device.link_latency);
    let one = phase(device.topology, n, b, bw, alpha);
    match kind {
        CollectiveKind::AllReduce => add(one, one),
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::AllToAll => one,
        CollectiveKind::CollectivePermute => CollectiveTime {
            hops: 1.0,
            seconds: alpha + b / bw,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::device::{h100, tpu_v4};

    #[test]
    fn all_reduce_time_grows_with_bytes() {
        let d = tpu_v4();
        let small = collective_time(&d, CollectiveKind::AllReduce, 1 << 20, 8);
        let big = collective_time(&d, CollectiveKind::AllReduce, 1 << 26, 8);
        assert!(big.seconds > 10.0 * small.seconds, "{small:?} {big:?}");
        assert_eq!(small.hops, big.hops);
    }

    #[test]
    fn larger_groups_take_more_hops_and_more_latency() {
        let d = h100();
        let four = collective_time(&d, CollectiveKind::AllGather, 1024, 4);
        let eight = collective_time(&d, CollectiveKind::AllGather, 1024, 8);
        assert_eq!((four.hops, eight.hops), (3.0, 7.0));
        assert!(eight.seconds > four.seconds);
    }

    #[test]
    fn a_torus_needs_fewer_hops_than_a_ring_of_the_same_devices() {
        let torus = tpu_v4();
        let ring = DeviceProfile {
            topology: Topology::Ring,
            ..tpu_v4()
        };
        let t = collective_time(&torus, CollectiveKind::AllReduce, 1 << 24, 16);
        let r = collective_time(&ring, CollectiveKind::AllReduce, 1 << 24, 16);
        assert_eq!(t.hops, 12.0);
        assert_eq!(r.hops, 30.0);
        assert!(t.seconds < r.seconds);
    }

    #[test]
    fn one_device_moves_nothing() {
        let t = collective_time(&tpu_v4(), CollectiveKind::AllReduce, 1 << 24, 1);
        assert_eq!(t.seconds, 0.0);
    }
}
