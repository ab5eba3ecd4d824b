//! Collectives priced over a mesh topology: each algorithm step crosses one hop and costs
//! alpha (the hop's latency) plus the bytes it sends over the link bandwidth (beta).
//!
//! Where the devices sit in servers ([`super::device::ScaleOut`]), the mesh's axes are placed
//! on them innermost first in [`PLACEMENT`]'s order, whatever order the mesh lists them in
//! (as `jax.make_mesh` lays a mesh onto the physical devices for you): tensor parallelism on
//! the fastest links, then context parallelism's ring, FSDP's gathers, data parallelism's
//! gradient reduction, and the pipeline's point-to-point sends outermost. It is Megatron-LM's
//! order of process groups (tp, cp, dp, pp from the fastest-varying rank; Narayanan et al.
//! 2021, section 3.3: tensor parallelism inside a server, pipeline parallelism across them),
//! with FSDP, which gathers every layer's weights, inside plain data parallelism, as MaxText
//! puts fsdp on ICI and data on DCN. A collective then runs a ring inside each server and a
//! ring across servers on each device's own scale-out link.
use super::collective::CollectiveKind;
use super::device::{DeviceProfile, Topology};
use crate::plan::AxisKind;
use crate::sharding::Mesh;

/// The order mesh axes take the devices' links, innermost (fastest links) first: the axes
/// whose collectives block every layer inside, those that move data once a step or a
/// microbatch outside (ep's two all-to-alls a block inside fsdp's gathers, as DeepSeek-V3
/// keeps its expert groups' traffic on NVLink first).
pub const PLACEMENT: [AxisKind; 6] = [
    AxisKind::Tp,
    AxisKind::Cp,
    AxisKind::Ep,
    AxisKind::Fsdp,
    AxisKind::Dp,
    AxisKind::Pp,
];

/// One mesh axis placed on the devices.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AxisPlace {
    pub axis: String,
    pub size: usize,
    /// Devices between neighbours along it: the product of the sizes placed inside it.
    pub stride: usize,
    /// Of its `size` positions, how many share one server (all of them without servers).
    pub in_node: usize,
}

/// A mesh laid onto a device kind's servers, innermost axis first.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MeshLayout {
    pub node_devices: Option<usize>,
    pub axes: Vec<AxisPlace>,
}

impl MeshLayout {
    /// `mesh`'s axes placed by [`PLACEMENT`] (axes it does not name after them, the mesh's
    /// last axis innermost, as its row-major numbering has it).
    pub fn of(mesh: &Mesh, device: &DeviceProfile) -> Self {
        let node = device.scale_out.map(|s| s.node_devices.max(1));
        let mut order: Vec<(usize, &str, usize)> = mesh
            .axes()
            .iter()
            .enumerate()
            .map(|(i, (name, size))| {
                let rank = AxisKind::parse(name)
                    .and_then(|k| PLACEMENT.iter().position(|p| *p == k))
                    .unwrap_or(PLACEMENT.len() + mesh.axes().len() - i);
                (rank, name.as_str(), *size)
            })
            .collect();
        order.sort_by_key(|(rank, _, _)| *rank);
        let mut stride = 1usize;
        let axes = order
            .into_iter()
            .map(|(_, name, size)| {
                // Positions along the axis whose devices fall in one server: all where the
                // axis lies inside it, one where even neighbours sit in different servers.
                let in_node = match node {
                    None => size,
                    Some(n) if stride >= n => 1,
                    Some(n) => size.min((n / stride).max(1)),
                };
                let place = AxisPlace {
                    axis: name.to_string(),
                    size,
                    stride,
                    in_node,
                };
                stride = stride.saturating_mul(size);
                place
            })
            .collect();
        Self {
            node_devices: node,
            axes,
        }
    }

    /// Of a group over `axes` (the devices that differ only along them), how many share one
    /// server.
    pub fn in_node(&self, axes: &[&str]) -> usize {
        self.axes
            .iter()
            .filter(|a| axes.contains(&a.axis.as_str()))
            .map(|a| a.in_node)
            .product()
    }

    /// The axes, innermost first, as `tp=8 (in a server), dp=4 (across)`.
    pub fn describe(&self) -> String {
        self.axes
            .iter()
            .map(|a| {
                let at = if a.in_node == a.size {
                    "in a server"
                } else if a.in_node == 1 {
                    "across servers"
                } else {
                    "partly across servers"
                };
                format!("{}={} ({at})", a.axis, a.size)
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

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

/// An all-to-all over a group of `n` on `topology`, each device holding `bytes` and sending
/// `bytes / n` to every other: n - 1 pairwise exchanges. Through a switch each device sends
/// its (n-1)/n over its own link (one all-gather phase); on a ring (both directions of each
/// link in use) a message to the device d away crosses min(d, n - d) links, so a device's
/// links carry `bytes / n x sum_d min(d, n - d)`, about n/8 of its data a direction, where a
/// switch carries (n-1)/n; a 2-D torus exchanges along one side, then the other, each side a
/// ring moving the whole of it.
fn all_to_all(topology: Topology, n: usize, bytes: f64, bw: f64, alpha: f64) -> CollectiveTime {
    let ring = |n: usize| {
        if n <= 1 {
            return CollectiveTime {
                hops: 0.0,
                seconds: 0.0,
            };
        }
        let distance: usize = (1..n).map(|d| d.min(n - d)).sum();
        let steps = (n - 1) as f64;
        CollectiveTime {
            hops: steps,
            seconds: steps * alpha + bytes / n as f64 * distance as f64 / (2.0 * bw),
        }
    };
    match topology {
        Topology::Switch => ring_phase(n, bytes, 1.0, bw, alpha),
        Topology::Ring => ring(n),
        Topology::Torus2d => {
            let (a, b) = torus_sides(n);
            add(ring(a), ring(b))
        }
    }
}

/// The time of one collective of `kind` over a group of `n` devices of `device`, moving
/// `bytes` (the full size of what is reduced or gathered, per group; an all-to-all's operand
/// on each device). All-reduce is a reduce-scatter then an all-gather; all-to-all as
/// `all_to_all` (above) prices it on the device's topology; a permute is one hop.
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
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter => one,
        CollectiveKind::AllToAll => all_to_all(device.topology, n, b, bw, alpha),
        CollectiveKind::CollectivePermute => CollectiveTime {
            hops: 1.0,
            seconds: alpha + b / bw,
        },
    }
}

/// The time of one collective of `kind` over mesh `axes` of `layout`'s mesh, moving `bytes`
/// (as [`collective_time`]). A group inside one server runs on the device's links as
/// [`collective_time`] prices it; one that spans servers runs each phase as a ring inside
/// the server, then a ring across the servers in which each of a server's devices carries its
/// share on its own scale-out link (hierarchical, as NCCL runs a collective over InfiniBand);
/// a permute that crosses servers is one scale-out hop.
pub fn collective_time_on(
    device: &DeviceProfile,
    layout: &MeshLayout,
    kind: CollectiveKind,
    bytes: u64,
    axes: &[&str],
) -> CollectiveTime {
    let n: usize = layout
        .axes
        .iter()
        .filter(|a| axes.contains(&a.axis.as_str()))
        .map(|a| a.size)
        .product();
    let inside = layout.in_node(axes).max(1);
    let Some(so) = device.scale_out.filter(|_| n > inside) else {
        return collective_time(device, kind, bytes, n);
    };
    let nodes = n / inside;
    let b = bytes as f64;
    if kind == CollectiveKind::CollectivePermute {
        return CollectiveTime {
            hops: 1.0,
            seconds: so.latency + b / so.bandwidth,
        };
    }
    if kind == CollectiveKind::AllToAll {
        // Every device sends bytes / n to each other: the share for its own server over the
        // server's links, the rest, (n - inside) / n of it, over its own scale-out link to the
        // other servers' devices, both at once. Each of those n - inside peers is a message of
        // its own (as each peer of the server's is), its latency paid once.
        let intra = all_to_all(
            device.topology,
            inside,
            b * inside as f64 / n as f64,
            device.link_bandwidth,
            device.link_latency,
        );
        let outside = (n - inside) as f64;
        let inter = CollectiveTime {
            hops: outside,
            seconds: outside * so.latency + b * outside / n as f64 / so.bandwidth,
        };
        return CollectiveTime {
            hops: intra.hops + inter.hops,
            seconds: intra.seconds.max(inter.seconds),
        };
    }
    let intra = phase(device.topology, inside, b, device.link_bandwidth, device.link_latency);
    let inter = ring_phase(nodes, b / inside as f64, 1.0, so.bandwidth, so.latency);
    let one = add(intra, inter);
    match kind {
        CollectiveKind::AllReduce => add(one, one),
        _ => one,
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
    fn an_all_to_all_is_one_phase_through_a_switch_and_bisection_bound_on_a_ring() {
        let bytes = 1u64 << 24;
        let switch = h100();
        let (bw, alpha) = (switch.link_bandwidth, switch.link_latency);
        let t = collective_time(&switch, CollectiveKind::AllToAll, bytes, 8);
        let want = 7.0 * alpha + bytes as f64 * 7.0 / 8.0 / bw;
        assert!((t.seconds - want).abs() <= 1e-12 * want, "{t:?} vs {want}");
        // A ring of 16: distances 1..8..1 sum to 64, so each direction carries 2x the data,
        // where a switch's link carries 15/16 of it.
        let ring = DeviceProfile {
            topology: Topology::Ring,
            ..h100()
        };
        let r = collective_time(&ring, CollectiveKind::AllToAll, bytes, 16);
        let want = 15.0 * alpha + bytes as f64 / 16.0 * 64.0 / (2.0 * bw);
        assert!((r.seconds - want).abs() <= 1e-12 * want, "{r:?} vs {want}");
        let s = collective_time(&switch, CollectiveKind::AllToAll, bytes, 16);
        let (r_bw, s_bw) = (r.seconds - 15.0 * alpha, s.seconds - 15.0 * alpha);
        assert!(r_bw > 2.0 * s_bw, "{r:?} {s:?}");
    }

    #[test]
    fn an_all_to_all_across_servers_is_set_by_the_share_that_leaves_each_server() {
        // ep=16 over two 8-GPU servers: half of each device's data leaves its server, over its
        // own InfiniBand link, while the other half crosses NVLink.
        let h = h100();
        let so = h.scale_out.expect("an H100 server has a scale-out network");
        let layout = MeshLayout::of(&Mesh::parse("ep=16").unwrap(), &h);
        let bytes = 1u64 << 26;
        let t = collective_time_on(&h, &layout, CollectiveKind::AllToAll, bytes, &["ep"]);
        // A message to each of the other server's 8 devices: every peer once, 15 in all.
        let want = 8.0 * so.latency + bytes as f64 / 2.0 / so.bandwidth;
        assert!((t.seconds - want).abs() <= 1e-12 * want, "{t:?} vs {want}");
        assert_eq!(t.hops, 15.0);
        // ep=64 over 8 servers: 7/8 of the data leaves, to 56 peers.
        let wide = MeshLayout::of(&Mesh::parse("ep=64").unwrap(), &h);
        let w = collective_time_on(&h, &wide, CollectiveKind::AllToAll, bytes, &["ep"]);
        let want = 56.0 * so.latency + bytes as f64 * 56.0 / 64.0 / so.bandwidth;
        assert!((w.seconds - want).abs() <= 1e-12 * want, "{w:?} vs {want}");
        let inside = collective_time_on(
            &h,
            &MeshLayout::of(&Mesh::parse("ep=8").unwrap(), &h),
            CollectiveKind::AllToAll,
            bytes,
            &["ep"],
        );
        assert!(t.seconds > 4.0 * inside.seconds, "{t:?} {inside:?}");
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
    fn tensor_parallelism_takes_the_servers_links_and_the_pipeline_spans_servers() {
        // Megatron's 3-D mesh as its paper runs it on DGX A100s, listed in any order: tp
        // fills each server, dp and pp cross them.
        let mesh = Mesh::parse("pp=4,dp=2,tp=8").unwrap();
        let a100 = crate::profile::device::a100();
        let layout = MeshLayout::of(&mesh, &a100);
        let names: Vec<&str> = layout.axes.iter().map(|a| a.axis.as_str()).collect();
        assert_eq!(names, ["tp", "dp", "pp"]);
        assert_eq!(
            (
                layout.in_node(&["tp"]),
                layout.in_node(&["dp"]),
                layout.in_node(&["pp"])
            ),
            (8, 1, 1)
        );
        // The same bytes all-reduced over tp (NVLink) and over dp (InfiniBand, one hop of 8x
        // less bandwidth a device).
        let bytes = 1 << 28;
        let tp = collective_time_on(&a100, &layout, CollectiveKind::AllReduce, bytes, &["tp"]);
        assert_eq!(tp, collective_time(&a100, CollectiveKind::AllReduce, bytes, 8));
        let dp = collective_time_on(&a100, &layout, CollectiveKind::AllReduce, bytes, &["dp"]);
        let so = a100.scale_out.unwrap();
        let want = 2.0 * (so.latency + bytes as f64 / 2.0 / so.bandwidth);
        assert!((dp.seconds - want).abs() < 1e-12 * want, "{dp:?}");
        let permute = collective_time_on(&a100, &layout, CollectiveKind::CollectivePermute, bytes, &["pp"]);
        assert!((permute.seconds - (so.latency + bytes as f64 / so.bandwidth)).abs() < 1e-12);
        // Smaller than a server, dp shares it with tp: both on NVLink.
        let small = MeshLayout::of(&Mesh::parse("dp=2,tp=4").unwrap(), &a100);
        assert_eq!((small.in_node(&["tp"]), small.in_node(&["dp"])), (4, 2));
        let dp_in = collective_time_on(&a100, &small, CollectiveKind::AllReduce, bytes, &["dp"]);
        assert_eq!(dp_in, collective_time(&a100, CollectiveKind::AllReduce, bytes, 2));
    }

    #[test]
    fn an_axis_partly_in_a_server_rings_inside_then_across() {
        // tp=4 leaves each server room for 2 of dp's 8 positions: a dp group spans 4 servers.
        let a100 = crate::profile::device::a100();
        let layout = MeshLayout::of(&Mesh::parse("dp=8,tp=4").unwrap(), &a100);
        assert_eq!(layout.in_node(&["dp"]), 2);
        assert_eq!(layout.in_node(&["dp", "tp"]), 8);
        let bytes = 1u64 << 26;
        let t = collective_time_on(&a100, &layout, CollectiveKind::ReduceScatter, bytes, &["dp"]);
        let so = a100.scale_out.unwrap();
        let intra = a100.link_latency + bytes as f64 / 2.0 / a100.link_bandwidth;
        let inter = 3.0 * (so.latency + bytes as f64 / 2.0 / 4.0 / so.bandwidth);
        assert_eq!(t.hops, 4.0);
        assert!((t.seconds - (intra + inter)).abs() < 1e-9 * t.seconds, "{t:?}");
        // Without servers (a TPU slice), every axis is priced on the one fabric.
        let tpu = tpu_v4();
        let flat = MeshLayout::of(&Mesh::parse("dp=8,tp=4").unwrap(), &tpu);
        let f = collective_time_on(&tpu, &flat, CollectiveKind::ReduceScatter, bytes, &["dp"]);
        assert_eq!(f, collective_time(&tpu, CollectiveKind::ReduceScatter, bytes, 8));
    }

    #[test]
    fn one_device_moves_nothing() {
        let t = collective_time(&tpu_v4(), CollectiveKind::AllReduce, 1 << 24, 1);
        assert_eq!(t.seconds, 0.0);
    }
}
