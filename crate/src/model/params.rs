use super::GptConfig;

/// One parameter of docs/MODEL.md's list; `index` is its `param_index`.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    pub index: usize,
    pub name: String,
    pub shape: Vec<usize>,
}

impl ParamSpec {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// AdamW's weight decay applies to weight matrices only (2-D, and a mixture of experts'
    /// stacks of them), not to biases and layer-norm gains.
    pub fn decays(&self) -> bool {
        self.shape.len() >= 2
    }
}

/// The parameters in docs/MODEL.md's order (block l's names are prefixed `h{l}.`).
pub fn param_specs(cfg: &GptConfig) -> Vec<ParamSpec> {
    let (d, v, t) = (cfg.d_model, cfg.vocab, cfg.seq);
    let mut specs: Vec<(String, Vec<usize>)> = vec![("wte".into(), vec![v, d]), ("wpe".into(), vec![t, d])];
    for l in 0..cfg.layers {
        let block: [(&str, Vec<usize>); 12] = [
            ("ln1_g", vec![d]),
            ("ln1_b", vec![d]),
            ("w_qkv", vec![d, 3 * d]),
            ("b_qkv", vec![3 * d]),
            ("w_proj", vec![d, d]),
            ("b_proj", vec![d]),
            ("ln2_g", vec![d]),
            ("ln2_b", vec![d]),
            ("w_fc", vec![d, 4 * d]),
            ("b_fc", vec![4 * d]),
            ("w_out", vec![4 * d, d]),
            ("b_out", vec![d]),
        ];
        // A mixture of experts: the router and the experts' stacked weights in the dense MLP's
        // places (its experts have no biases, as Switch's and Mixtral's).
        let block = match &cfg.moe {
            None => block,
            Some(m) => {
                let (e, f) = (m.experts, m.width);
                let [ln1_g, ln1_b, w_qkv, b_qkv, w_proj, b_proj, ln2_g, ln2_b, _, _, _, b_out] = block;
                [
                    ln1_g,
                    ln1_b,
                    w_qkv,
                    b_qkv,
                    w_proj,
                    b_proj,
                    ln2_g,
                    ln2_b,
                    ("w_router", vec![d, e]),
                    ("w_fc", vec![e, d, f]),
                    ("w_out", vec![e, f, d]),
                    b_out,
                ]
            }
        };
        specs.extend(block.into_iter().map(|(n, s)| (format!("h{l}.{n}"), s)));
    }
    specs.push(("lnf_g".into(), vec![d]));
    specs.push(("lnf_b".into(), vec![d]));
    if !cfg.tied {
        specs.push(("w_head".into(), vec![d, v]));
    }
    specs
        .into_iter()
        .enumerate()
        .map(|(index, (name, shape))| ParamSpec { index, name, shape })
        .collect()
}

/// How parameters start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// docs/MODEL.md's `init = formula`: needs no random numbers, so any implementation agrees.
    Formula,
    /// GPT-2 style N(0, 0.02), residual projections scaled by 1/sqrt(2 layers), from `seed`.
    Random { seed: u64 },
}

/// Initial values of every parameter, in `param_specs` order.
pub fn init_params(cfg: &GptConfig, init: Init) -> Vec<Vec<f32>> {
    let mut rng = SplitMix64(match init {
        Init::Random { seed } => seed,
        Init::Formula => 0,
    });
    param_specs(cfg)
        .iter()
        .map(|p| {
            let gain = p.name.ends_with("_g");
            match (p.shape.len(), init) {
                (1, _) => vec![if gain { 1.0 } else { 0.0 }; p.numel()],
                (_, Init::Formula) => {
                    // A 3-D parameter (an MoE's experts' weights): slice e as a matrix, offset
                    // by 0.5 e.
                    let (rows, cols) = (p.shape[p.shape.len() - 2], p.shape[p.shape.len() - 1]);
                    (0..p.numel())
                        .map(|k| {
                            let (e, i, j) = (
                                (k / (rows * cols)) as f64,
                                ((k / cols) % rows) as f64,
                                (k % cols) as f64,
                            );
                            (0.02 * (1.3 * i + 0.7 * j + 0.5 * e + p.index as f64).sin()) as f32
                        })
                        .collect()
                }
                (_, Init::Random { .. }) => {
                    let residual = p.name.ends_with("w_proj") || p.name.ends_with("w_out");
                    let std = if residual {
                        0.02 / (2.0 * cfg.layers as f64).sqrt()
                    } else {
                        0.02
                    };
                    (0..p.numel()).map(|_| (rng.normal() * std) as f32).collect()
                }
            }
        })
        .collect()
}

/// A small, well-known generator for the random init (no need for JAX parity here).
pub(crate) struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Box-Muller.
    pub fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}
