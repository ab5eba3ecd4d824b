// docs/MODEL.md's transformer written in jax-js (the npm package @jax-js/jax), for the in-browser
// peer benchmark (tests/browser/peers_jaxjs.mjs) and its correctness test: the same formula init
// and formula batch, the forward and loss of the text, gradients by jax-js's valueAndGrad, and
// SGD or AdamW as the text specifies, in one jit-compiled train step. This is the peer's
// program, not shardlab's: the page never loads it, and shardlab's side of the comparison runs
// in the core (wasm), as the page trains.
//
// jax-js counts references: every function consumes its array arguments, so a value used twice
// is passed as `x.ref` the first time (see the package's README). The module takes the jax-js
// module as an argument, so the same code runs in the browser (WebGPU) and in Node (Wasm).

/** The parameter list of docs/MODEL.md, in order: [name, shape] (w_head: the model is untied). */
export function paramSpecs(c) {
  const d = c.d_model;
  const specs = [['wte', [c.vocab, d]], ['wpe', [c.seq, d]]];
  for (let l = 0; l < c.layers; l++) {
    specs.push(
      [`h${l}.ln1_g`, [d]], [`h${l}.ln1_b`, [d]], [`h${l}.w_qkv`, [d, 3 * d]], [`h${l}.b_qkv`, [3 * d]],
      [`h${l}.w_proj`, [d, d]], [`h${l}.b_proj`, [d]], [`h${l}.ln2_g`, [d]], [`h${l}.ln2_b`, [d]],
      [`h${l}.w_fc`, [d, 4 * d]], [`h${l}.b_fc`, [4 * d]], [`h${l}.w_out`, [4 * d, d]], [`h${l}.b_out`, [d]],
    );
  }
  specs.push(['lnf_g', [d]], ['lnf_b', [d]], ['w_head', [d, c.vocab]]);
  return specs;
}

/** `init = formula`: W[i, j] = 0.02 sin(1.3 i + 0.7 j + param_index) in float64, rounded to
 * float32; LayerNorm gains 1, every bias 0. Host arrays, in paramSpecs order. */
export function formulaInit(c) {
  return paramSpecs(c).map(([name, shape], index) => {
    const out = new Float32Array(shape.reduce((a, b) => a * b, 1));
    if (shape.length === 2) {
      const cols = shape[1];
      for (let i = 0; i < shape[0]; i++) {
        for (let j = 0; j < cols; j++) out[i * cols + j] = 0.02 * Math.sin(1.3 * i + 0.7 * j + index);
      }
    } else if (/ln.?_g$/.test(name)) {
      out.fill(1);
    }
    return { name, shape, data: out };
  });
}

/** `data = formula`: tokens[b, t] = (7 b + 3 t^2 + 1) % V for t in [0, T]; inputs are columns
 * 0..T-1, targets 1..T. */
export function formulaBatch(c) {
  const inputs = new Int32Array(c.batch * c.seq);
  const targets = new Int32Array(c.batch * c.seq);
  const token = (b, t) => (7 * b + 3 * t * t + 1) % c.vocab;
  for (let b = 0; b < c.batch; b++) {
    for (let t = 0; t < c.seq; t++) {
      inputs[b * c.seq + t] = token(b, t);
      targets[b * c.seq + t] = token(b, t + 1);
    }
  }
  return { inputs, targets };
}

/**
 * A trainer of `c` ({layers, d_model, heads, seq, batch, vocab, dropout, optimizer: 'sgd' |
 * 'adamw', lr, seed}) on jax-js's default device. `step()` runs one jit-compiled train step
 * and resolves, once the device has finished it, to the loss at the parameters before the
 * update, as shardlab's `Trainer::step` reports it.
 */
export async function makeTrainer(jax, c) {
  const { numpy: np, nn, random } = jax;
  const [B, T, d, H, V] = [c.batch, c.seq, c.d_model, c.heads, c.vocab];
  const Dh = d / H;
  const rate = c.dropout;
  const adamw = c.optimizer === 'adamw';
  if (!['sgd', 'adamw'].includes(c.optimizer)) throw new Error(`unknown optimizer ${c.optimizer}: sgd or adamw`);
  const specs = paramSpecs(c);

  // dropout(x) = keep ? x / (1 - rate) : 0, keep ~ bernoulli(1 - rate); identity at rate 0.
  const dropout = (x, keys, site) => {
    if (rate === 0) return x;
    const keep = random.bernoulli(keys.ref.slice(site), 1 - rate, x.shape);
    return np.where(keep, x.mul(1 / (1 - rate)), 0);
  };

  // LN(x; g, b) = (x - mean) / sqrt(var + 1e-5) * g + b, biased variance over the last axis.
  const layerNorm = (x, g, b) => {
    const xc = x.ref.sub(x.mean(-1, { keepdims: true }));
    const variance = xc.ref.mul(xc.ref).mean(-1, { keepdims: true });
    return xc.div(np.sqrt(variance.add(1e-5))).mul(g).add(b);
  };

  // The loss of docs/MODEL.md's forward. inputs and targets come one-hot ([B, T, V]): jax-js's
  // gather has no gradient inside jit (its transpose, scatter, is not jit-compiled), so the
  // embedding is a matmul with the one-hot inputs, which is the same sum.
  const lossFn = (params, inputs, targets, causal, keys) => {
    let i = 0;
    const p = () => params[i++];
    const wte = p();
    const wpe = p();
    let x = np.matmul(inputs, wte).add(wpe);
    for (let l = 0; l < c.layers; l++) {
      const [ln1g, ln1b, wqkv, bqkv, wproj, bproj, ln2g, ln2b, wfc, bfc, wout, bout] =
        Array.from({ length: 12 }, p);
      const h = layerNorm(x.ref, ln1g, ln1b);
      // [B, T, 3d] -> [3, B, H, T, Dh]: q, k and v with head h in columns h*Dh:(h+1)*Dh.
      const qkv = np.matmul(h, wqkv).add(bqkv).reshape([B, T, 3, H, Dh]).transpose([2, 0, 3, 1, 4]);
      const q = qkv.ref.slice(0);
      const k = qkv.ref.slice(1);
      const v = qkv.slice(2);
      let s = np.matmul(q, k.transpose([0, 1, 3, 2])).mul(1 / Math.sqrt(Dh));
      s = np.where(causal.ref, s, -1e30);
      const a = dropout(nn.softmax(s, -1), keys, 3 * l);
      const heads = np.matmul(a, v).transpose([0, 2, 1, 3]).reshape([B, T, d]);
      x = x.add(dropout(np.matmul(heads, wproj).add(bproj), keys, 3 * l + 1));
      const h2 = layerNorm(x.ref, ln2g, ln2b);
      const mlp = np.matmul(nn.gelu(np.matmul(h2, wfc).add(bfc), { approximate: true }), wout).add(bout);
      x = x.add(dropout(mlp, keys, 3 * l + 2));
    }
    const lnfg = p();
    const lnfb = p();
    const whead = p();
    const logits = np.matmul(layerNorm(x, lnfg, lnfb), whead);
    const picked = logits.ref.mul(targets).sum(-1);
    const loss = nn.logsumexp(logits, -1).sub(picked).mean();
    causal.dispose();
    keys.dispose();
    return loss;
  };

  const is2d = specs.map(([, shape]) => shape.length === 2);
  const [b1, b2, eps] = [0.9, 0.999, 1e-8];
  // One step: the loss and gradients at `params`, then the optimizer's update, and the key of
  // the next step. `hyper` holds AdamW's bias corrections 1 / (1 - b1^t) and 1 / (1 - b2^t) for
  // this update t.
  const trainStep = jax.jit((params, opt, inputs, targets, causal, key, hyper) => {
    // Row 0 is the next step's key; rows 1.. the dropout sites' (three per block).
    const keys = random.split(key, 1 + 3 * c.layers);
    const next = keys.ref.slice(0);
    const siteKeys = keys.slice([1, 1 + 3 * c.layers]);
    const [loss, grads] = jax.valueAndGrad(lossFn)(jax.tree.ref(params), inputs, targets, causal, siteKeys);
    if (!adamw) {
      const updated = params.map((w, k) => w.sub(grads[k].mul(c.lr)));
      hyper.dispose();
      return [loss, updated, opt, next];
    }
    const c1 = hyper.ref.slice(0);
    const c2 = hyper.slice(1);
    const updated = [];
    const m2 = [];
    const v2 = [];
    for (let k = 0; k < params.length; k++) {
      const g = grads[k];
      const m = opt.m[k].mul(b1).add(g.ref.mul(1 - b1));
      const v = opt.v[k].mul(b2).add(g.ref.mul(g).mul(1 - b2));
      const mhat = m.ref.mul(c1.ref);
      const vhat = v.ref.mul(c2.ref);
      let u = mhat.div(np.sqrt(vhat).add(eps));
      const w = params[k];
      if (is2d[k]) u = u.add(w.ref.mul(0.01));
      updated.push(w.sub(u.mul(c.lr)));
      m2.push(m);
      v2.push(v);
    }
    c1.dispose();
    c2.dispose();
    return [loss, updated, { m: m2, v: v2 }, next];
  });

  let params = formulaInit(c).map(({ shape, data }) => np.array(data, { shape }));
  let opt = adamw
    ? { m: specs.map(([, shape]) => np.zeros(shape)), v: specs.map(([, shape]) => np.zeros(shape)) }
    : {};
  const { inputs, targets } = formulaBatch(c);
  const oneHot = (ids) => nn.oneHot(np.array(ids, { dtype: np.int32, shape: [B, T] }), V);
  const inputsOneHot = oneHot(inputs);
  const targetsOneHot = oneHot(targets);
  // causal[i, j]: whether query i attends to key j (j <= i).
  const causal = np.tri(T, T, 0, { dtype: np.bool });
  let key = random.key(c.seed ?? 0);
  await jax.blockUntilReady([params, opt, inputsOneHot, targetsOneHot, causal, key]);
  let steps = 0;

  return {
    async step() {
      const t = steps + 1;
      let loss;
      const hyper = np.array(new Float32Array([1 / (1 - b1 ** t), 1 / (1 - b2 ** t)]));
      [loss, params, opt, key] = trainStep(params, opt, inputsOneHot.ref, targetsOneHot.ref, causal.ref, key, hyper);
      // Every output of a jit call shares its pending kernels: reading the loss submits and
      // awaits the whole step, updates included (one readback, as shardlab's step has).
      const value = (await loss.data())[0];
      steps = t;
      return value;
    },
    /** The parameters as host arrays, in paramSpecs order. */
    async params() {
      return Promise.all(params.map(async (w) => Float32Array.from(await w.ref.data())));
    },
    dispose() {
      jax.tree.dispose([params, opt, inputsOneHot, targetsOneHot, causal, key]);
      trainStep.dispose();
    },
  };
}
