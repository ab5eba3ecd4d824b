//! The mixture-of-experts MLP (Switch, GShard, Mixtral): a linear router with a softmax picks
//! each token's top k of E experts, whose gates are their probabilities renormalised; each
//! expert takes at most a capacity of every sequence's choices (GShard's order, the rest
//! dropped), runs its own GELU MLP on them, and the gated outputs are summed back per token.
//! Switch's load-balancing loss joins the loss. Under expert parallelism each device holds
//! E / ep experts, and two all-to-alls over "ep" move the tokens' slots to their experts and
//! back.
use super::gpt::Activations;
use super::{GptConfig, ModelError};
use crate::ir::{Builder, Op, ValueId};
use crate::setting::{Refusal, Setting};

/// How many of a sequence's choices an expert takes.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capacity {
    /// `ceil(factor * S * k / E)` slots per expert and sequence (at most S): choices past them
    /// are dropped, their token passing the block by the residual alone.
    Factor(f32),
    /// S slots per expert and sequence: no choice is ever dropped.
    Dropless,
}

impl Capacity {
    /// The slots per expert of a sequence of `seq` tokens choosing `k` of `experts`.
    pub fn slots(self, seq: usize, experts: usize, k: usize) -> usize {
        match self {
            Capacity::Factor(f) => {
                let c = (f as f64 * (seq * k) as f64 / experts as f64).ceil();
                (c as usize).clamp(1, seq)
            }
            Capacity::Dropless => seq,
        }
    }

    /// `--capacity`'s text: the factor, or `dropless`.
    pub fn text(self) -> String {
        match self {
            Capacity::Factor(f) => f.to_string(),
            Capacity::Dropless => "dropless".into(),
        }
    }

    pub fn parse(text: &str) -> Option<Capacity> {
        match text {
            "dropless" => Some(Capacity::Dropless),
            t => t.parse().ok().map(Capacity::Factor),
        }
    }
}

/// The busiest expert-parallel device's routed tokens over the mean that pricing assumes where
/// no routing was measured: Switch's capacity factor of 1.25 (Fedus et al. 2022, JMLR 23,
/// section 2.2 and Table 1: factors 1.0 to 1.25, the room its busiest experts need over an
/// even share with few tokens dropped). [`crate::profile::Routing`] applies it.
pub const ASSUMED_IMBALANCE: f32 = 1.25;

fn assumed_imbalance() -> f32 {
    ASSUMED_IMBALANCE
}

/// A mixture-of-experts MLP in every block, in place of the dense one.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Moe {
    pub experts: usize,
    pub top_k: usize,
    /// Each expert's hidden units (the dense MLP has 4 d).
    pub width: usize,
    pub capacity: Capacity,
    /// Switch's load-balancing loss coefficient: the loss adds `aux * E * sum_e f_e P_e`.
    pub aux: f32,
    /// The busiest expert-parallel device's routed tokens over the mean, as pricing assumes
    /// it (a measured run's own where it was measured; 1 for routing forced even). Routing
    /// itself never reads it.
    #[serde(default = "assumed_imbalance")]
    pub imbalance: f32,
}

impl Moe {
    /// `experts` experts of the dense MLP's width, top-2, capacity factor 1.25 and Switch's
    /// coefficient 0.01 (Fedus et al.'s defaults), priced at [`ASSUMED_IMBALANCE`].
    pub fn new(experts: usize, d_model: usize) -> Self {
        Moe {
            experts,
            top_k: 2.min(experts),
            width: 4 * d_model,
            capacity: Capacity::Factor(1.25),
            aux: 0.01,
            imbalance: ASSUMED_IMBALANCE,
        }
    }

    /// The slots per expert of a sequence of `seq` tokens.
    pub fn slots(&self, seq: usize) -> usize {
        self.capacity.slots(seq, self.experts, self.top_k)
    }

    /// Checks what tracing would trip on, each refusal naming the fix.
    pub fn validate(&self) -> Result<(), ModelError> {
        let refuse = |s: Setting, why: String| Err(Refusal::new(s, why).into());
        if self.experts == 0 {
            return refuse(
                Setting::Experts,
                format!("{}: a mixture needs at least 1 expert", Setting::Experts.at(0)),
            );
        }
        if self.top_k == 0 || self.top_k > self.experts {
            return refuse(
                Setting::TopK,
                format!(
                    "{} must be between 1 and {}: each token chooses among the experts",
                    Setting::TopK.at(self.top_k),
                    Setting::Experts.at(self.experts)
                ),
            );
        }
        if self.width == 0 {
            return refuse(
                Setting::ExpertWidth,
                format!(
                    "{}: each expert needs at least 1 hidden unit (the dense MLP has 4 x d_model)",
                    Setting::ExpertWidth.at(0)
                ),
            );
        }
        if let Capacity::Factor(f) = self.capacity {
            if !(f.is_finite() && f > 0.0) {
                return refuse(
                    Setting::Capacity,
                    format!(
                        "{} must be a number above 0 (1.25 is Switch's), or {} to drop nothing",
                        Setting::Capacity.at(f),
                        Setting::Capacity.at("dropless")
                    ),
                );
            }
        }
        if !(self.imbalance.is_finite() && self.imbalance >= 1.0) {
            return refuse(
                Setting::ExpertImbalance,
                format!(
                    "{} must be a number of at least 1: the busiest device's routed tokens over the mean \
                     ({ASSUMED_IMBALANCE} assumed, 1 for even routing)",
                    Setting::ExpertImbalance.at(self.imbalance)
                ),
            );
        }
        if !(self.aux.is_finite() && self.aux >= 0.0) {
            return refuse(
                Setting::AuxLoss,
                format!(
                    "{} must be a number of at least 0 (Switch uses 0.01)",
                    Setting::AuxLoss.at(self.aux)
                ),
            );
        }
        Ok(())
    }

    /// Parameters of one block's MLP: the router, the experts' two weights, the output bias.
    pub fn mlp_params(&self, d: u64) -> Option<u64> {
        let (e, f) = (self.experts as u64, self.width as u64);
        d.checked_mul(e)?
            .checked_add(2u64.checked_mul(e)?.checked_mul(d)?.checked_mul(f)?)?
            .checked_add(d)
    }
}

/// How a shard_map body splits a mixture-of-experts block: the axes its tokens are split over
/// (the load-balancing loss counts every device's choices) and the expert-parallel axis.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MoeSplit {
    pub token_axes: Vec<String>,
    pub ep: Option<String>,
}

/// The block's MLP on `h` (G, S, D), the layer norm's output: the router reads `routed` (the
/// same rows, before tensor parallelism's cast to varying, so that the routing and the loss
/// are the same on every "tp" device); returns the combined experts' outputs (G, S, D) (partial
/// sums over "tp" where the experts' width is split) and the load-balancing loss (a scalar).
pub fn moe_mlp(
    b: &mut Builder,
    moe: &Moe,
    a: &Activations,
    l: usize,
    routed: ValueId,
    h: ValueId,
    w: [ValueId; 3],
) -> (ValueId, ValueId) {
    let [w_router, w_fc, w_out] = w;
    let name = |what: &str| format!("h{l}.moe.{what}");
    let [g, s, d] = <[usize; 3]>::try_from(b.shape(h)).unwrap_or([0; 3]);
    let logits = b.matmul(routed, w_router);
    b.set_name(logits, &name("logits"));
    let capacity = moe.slots(s);
    let r = b.emit(Op::MoeRoute { k: moe.top_k, capacity }, &[logits]);
    let (probs, gates, places, owners, load) = (r[0], r[1], r[2], r[3], r[4]);
    for (v, what) in [
        (probs, "probs"),
        (gates, "gates"),
        (places, "places"),
        (owners, "owners"),
        (load, "load"),
    ] {
        b.set_name(v, &name(what));
    }
    let split = a.local.moe.clone().unwrap_or_default();
    let ep: Vec<&str> = split.ep.iter().map(String::as_str).collect();
    // Every expert's slots of this device's sequences; over "ep", each device's experts'
    // slots of its group's sequences.
    let buf = b.emit1(Op::MoeDispatch, &[h, places, owners]);
    b.set_name(buf, &name("dispatched"));
    let buf = if ep.is_empty() {
        buf
    } else {
        b.all_to_all(buf, &ep, 0, 1)
    };
    let [el, gl, c, _] = <[usize; 4]>::try_from(b.shape(buf)).unwrap_or([0; 4]);
    let rows = b.reshape(buf, &[el, gl * c, d]);
    let up = b.dot_general(rows, w_fc, (&[2], &[1]), (&[0], &[0]), 1.0);
    b.set_name(up, &name("up"));
    let act = b.gelu(up);
    let down = b.dot_general(act, w_out, (&[2], &[1]), (&[0], &[0]), 1.0);
    b.set_name(down, &name("down"));
    let down = b.reshape(down, &[el, gl, c, d]);
    let out = if ep.is_empty() {
        down
    } else {
        b.all_to_all(down, &ep, 1, 0)
    };
    b.set_name(out, &name("expert_out"));
    // The gates weigh the experts' partial sums over "tp": cast to varying there, so that
    // their gradient (a dot with those partial sums) is summed over "tp" in the backward.
    let gates = match &a.local.tp {
        Some(tp) => b.pcast(gates, &[tp]),
        None => gates,
    };
    let y = b.emit1(Op::MoeCombine, &[out, places, owners, gates]);
    let aux = balance_loss(b, moe, &split, (g * s, probs, load));
    b.set_name(aux, &name("aux"));
    (y, aux)
}

/// Switch's load-balancing loss, `aux * E * sum_e f_e P_e`: f_e the fraction of the step's
/// choices (all devices') that chose expert e, P_e this device's tokens' mean probability of
/// it. f is a count (no gradient flows through it), so the loss is linear in P and the mean of
/// the devices' losses is the whole batch's.
fn balance_loss(
    b: &mut Builder,
    moe: &Moe,
    split: &MoeSplit,
    (tokens, probs, load): (usize, ValueId, ValueId),
) -> ValueId {
    let parts = b.split(load, 1, &[1, 1]);
    let routed = b.sum(parts[0], &[0, 1]); // (E)
    let axes: Vec<&str> = split.token_axes.iter().map(String::as_str).collect();
    let (routed, devices) = if axes.is_empty() {
        (routed, 1)
    } else {
        let n = b.mesh().and_then(|m| m.axes_size(&axes).ok()).unwrap_or(1);
        (b.psum(routed, &axes), n)
    };
    let f = b.scale(routed, 1.0 / (tokens * devices * moe.top_k) as f32);
    let p = b.sum(probs, &[0, 1]);
    let p = b.scale(p, 1.0 / tokens as f32);
    let fp = b.dot_general(f, p, (&[0], &[0]), (&[], &[]), 1.0);
    b.scale(fp, moe.aux * moe.experts as f32)
}

/// The MoE's settings checked with the model's: the router sees whole sequences.
pub fn check(cfg: &GptConfig) -> Result<(), ModelError> {
    match &cfg.moe {
        Some(moe) => moe.validate(),
        None => Ok(()),
    }
}
