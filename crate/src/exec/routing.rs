//! A step's routing as its routers computed it: for every router (a block's, once per
//! microbatch), every device and every expert, the choices that device's sequences made and
//! those the expert's capacity kept. Read back from the step's own buffers after it (a few
//! numbers per sequence), as the loss is.
use super::Tensor;

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Routing {
    pub experts: usize,
    /// Per router, in program order: per device, per expert, the choices routed there.
    pub routed: Vec<Vec<Vec<u32>>>,
    /// The same for the choices kept (the rest were dropped).
    pub kept: Vec<Vec<Vec<u32>>>,
}

impl Routing {
    /// The counts of routers whose `load` values (each device's `(G, 2, E)` block, one after
    /// the other) are `loads`, on `devices` devices.
    pub fn of_loads(loads: &[Tensor], devices: usize, experts: usize) -> Routing {
        let mut routing = Routing {
            experts,
            routed: vec![],
            kept: vec![],
        };
        for load in loads {
            let all = load.f32();
            let per_device = all.len() / devices.max(1);
            let (mut routed, mut kept) = (vec![], vec![]);
            for block in all.chunks(per_device.max(1)).take(devices) {
                let (mut r, mut k) = (vec![0u32; experts], vec![0u32; experts]);
                for group in block.chunks(2 * experts) {
                    for e in 0..experts {
                        // Counts of at most a batch's choices: exact in f32.
                        r[e] += group[e] as u32;
                        k[e] += group[experts + e] as u32;
                    }
                }
                routed.push(r);
                kept.push(k);
            }
            routing.routed.push(routed);
            routing.kept.push(kept);
        }
        routing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_devices_groups_are_summed_per_expert_routed_and_kept() {
        // 2 devices, 2 groups each, 2 experts: [routed e0, e1, kept e0, e1] per group.
        let load = Tensor::F32(vec![
            3.0, 1.0, 2.0, 1.0, /**/ 0.0, 4.0, 0.0, 2.0, //
            2.0, 2.0, 2.0, 2.0, /**/ 4.0, 0.0, 2.0, 0.0,
        ]);
        let r = Routing::of_loads(&[load], 2, 2);
        assert_eq!(r.routed, vec![vec![vec![3, 5], vec![6, 2]]]);
        assert_eq!(r.kept, vec![vec![vec![2, 3], vec![4, 2]]]);
    }
}
