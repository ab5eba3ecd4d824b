// The in-browser peer benchmark (issue 25): shardlab's page engine against jax-js (@jax-js/jax,
// pinned in package.json) in one headless Chromium, both on its one WebGPU adapter
// (SwiftShader), training docs/MODEL.md's model from the same formula init on the same formula
// batch. web/peers.html holds both sides; web/jaxjs_gpt.js is the model written in jax-js.
//
// Like `shardlab bench peers` (crate/src/bench/peers.rs), each configuration runs WARMUP steps
// of each side, then rounds: in each, two steps in a row of one side, then two of the other,
// the second of each pair timed (neither side is timed straight after the other's work), the
// side that goes first alternating from round to round. Every step's loss is kept, so the two
// sides' losses are compared step by step. A step's time is the page's clock from the call to
// its loss read back on the host, for both sides alike.
//
// Usage: node peers_jaxjs.mjs URL [--steps N] [--configs small,seed,...] [--attention fused|unfused] [--json]
//   --attention: shardlab's attention (the page's control; fused, one op, by default). jax-js's
//   side is always the composition op by op, as MODEL.md writes it.
//   (serve the page first: cargo xtask serve --port 8123, then URL is http://127.0.0.1:8123/)
// Prints a line per configuration and, with --json, one JSON object per configuration.
import os from 'node:os';
import { args, launch } from './bench.mjs';

const WARMUP = 2;
// docs/MODEL.md's criterion: the loss at init and after each of the first 5 updates agree to
// 1e-5 absolute (dropout 0, formula init and data, SGD lr 0.1, one device). At `small`'s sizes
// SGD at lr 0.1 first raises the loss (5.54 -> 5.81) and the trajectory amplifies rounding
// from the third update on: shardlab's CPU reference and JAX's own float32 step drift apart by
// 2e-5 at update 5 and 0.15 at update 10 there (docs/benchmarks/2026-12-04.md). So the script
// reports MODEL.md's six-loss verdict, and separately whether the loss at init and after the
// first update (the forward and one gradient, before any amplification) agree to the same 1e-5.
const MATCHED_STEPS = 6;
const FIRST_STEPS = 2;
const TOLERANCE = 1e-5;
// The goal: shardlab at least 2.5x faster than jax-js (shardlab / jax-js at most 0.4).
const GOAL_SPEEDUP = 2.5;

const model = (over) => ({ layers: 2, d_model: 128, heads: 4, seq: 64, batch: 8, vocab: 256, dropout: 0, ...over });
export const CONFIGS = {
  // bench train's `small`, with MODEL.md's SGD lr 0.1: losses compared step by step.
  small: { spec: model({ optimizer: 'sgd', lr: 0.1 }), compare: true },
  // The seed preset's model (batch 32, dropout 0.1) and optimizer (AdamW, lr 3e-3) on one device:
  // times only. The two sides draw their dropout masks from different generators (shardlab's
  // Threefry counters as JAX lays them out, jax-js's own split keys), so their losses differ by
  // the masks, not by the arithmetic.
  seed: { spec: model({ batch: 32, dropout: 0.1, optimizer: 'adamw', lr: 3e-3 }), compare: false },
  // The seed preset's model without dropout: its losses can be compared (AdamW's updates divide by
  // the root of small second moments, so last-bit differences grow faster than under SGD).
  seed_nodrop: { spec: model({ batch: 32, optimizer: 'adamw', lr: 3e-3 }), compare: true },
  // GptConfig::tiny(), for a quick look.
  tiny: { spec: { layers: 1, d_model: 32, heads: 4, seq: 8, batch: 2, vocab: 64, dropout: 0, optimizer: 'sgd', lr: 0.1 }, compare: true },
};

const quantile = (xs, q) => {
  const s = [...xs].sort((a, b) => a - b);
  const pos = (s.length - 1) * q;
  const lo = Math.floor(pos);
  return s[lo] + (s[Math.min(lo + 1, s.length - 1)] - s[lo]) * (pos - lo);
};
const median = (xs) => quantile(xs, 0.5);

/** Runs `name` in `page` (web/peers.html, ready) for `rounds` rounds; returns its row. */
export async function measure(page, name, rounds, attention = 'fused') {
  const { compare } = CONFIGS[name];
  const spec = { ...CONFIGS[name].spec, attention };
  const loadBefore = os.loadavg()[0];
  const opened = await page.evaluate((s) => window.peers.open(s), spec);
  const losses = { shardlab: [], jaxjs: [] };
  const first = {};
  const step = async (side) => {
    const r = await page.evaluate((s) => window.peers.step(s), side);
    losses[side].push(r.loss);
    return r;
  };
  for (let i = 0; i < WARMUP; i++) {
    for (const side of ['shardlab', 'jaxjs']) {
      const r = await step(side);
      if (i === 0) first[side] = r;
    }
  }
  const times = { shardlab: [], jaxjs: [], core: [] };
  for (let r = 0; r < rounds; r++) {
    const order = r % 2 === 0 ? ['shardlab', 'jaxjs'] : ['jaxjs', 'shardlab'];
    for (const side of order) {
      await step(side);
      const timed = await step(side);
      times[side].push(timed.ms);
      if (side === 'shardlab') times.core.push(timed.core_ms);
    }
  }
  const diffs = losses.shardlab.map((l, i) => Math.abs(l - losses.jaxjs[i]));
  const paired = times.shardlab.map((ms, i) => times.jaxjs[i] / ms);
  const [shardlabMs, peerMs] = [median(times.shardlab), median(times.jaxjs)];
  const speedup = peerMs / shardlabMs;
  return {
    config: name,
    peer: 'jax-js',
    model: spec,
    params: opened.params,
    // peers.rs's shape: medians of the timed steps, shardlab / peer, the goal as a ratio not to exceed.
    shardlab_ms: shardlabMs,
    peer_ms: peerMs,
    ratio: shardlabMs / peerMs,
    goal_max_ratio: 1 / GOAL_SPEEDUP,
    met: speedup >= GOAL_SPEEDUP,
    samples: rounds,
    // How many times faster shardlab is, as the goal says it; the spread is that of the rounds'
    // paired ratios (jax-js's step over shardlab's in the same round).
    speedup,
    speedup_rounds: { median: median(paired), q1: quantile(paired, 0.25), q3: quantile(paired, 0.75), min: Math.min(...paired), max: Math.max(...paired) },
    shardlab_core_ms: median(times.core),
    // The 1-minute load average before and after: other work on a shared machine.
    load: [loadBefore, os.loadavg()[0]],
    // What the first step cost each side: shardlab builds its trainer (autotuning its matmuls),
    // jax-js traces and compiles its jit step.
    first_step_ms: { shardlab: first.shardlab.ms, shardlab_build: first.shardlab.build_ms, jaxjs: first.jaxjs.ms, jaxjs_setup: opened.jaxjs_setup_ms },
    losses: {
      compared: compare,
      shardlab: losses.shardlab,
      jaxjs: losses.jaxjs,
      max_abs_diff: Math.max(...diffs),
      matched_steps_max_abs_diff: Math.max(...diffs.slice(0, MATCHED_STEPS)),
      first_steps_max_abs_diff: Math.max(...diffs.slice(0, FIRST_STEPS)),
      tolerance: TOLERANCE,
      // MODEL.md's criterion (six losses), and the first two alone.
      agree: compare ? Math.max(...diffs.slice(0, MATCHED_STEPS)) <= TOLERANCE : null,
      first_agree: compare ? Math.max(...diffs.slice(0, FIRST_STEPS)) <= TOLERANCE : null,
    },
  };
}

export function describe(row) {
  const f = (x, d = 2) => x.toFixed(d);
  const s = row.speedup_rounds;
  const l = row.losses;
  const e = (x) => x.toExponential(1);
  const losses = l.compared
    ? `losses: first ${FIRST_STEPS} within ${e(l.first_steps_max_abs_diff)} (${l.first_agree ? 'agree' : 'DISAGREE'} to ${l.tolerance}), `
      + `first ${MATCHED_STEPS} within ${e(l.matched_steps_max_abs_diff)} (MODEL.md's criterion, ${l.tolerance}: ${l.agree ? 'met' : 'not met'}), `
      + `all ${l.shardlab.length} within ${e(l.max_abs_diff)}`
    : 'losses not compared (the dropout masks differ)';
  return `${row.config} (shardlab's attention ${row.model.attention}): shardlab ${f(row.shardlab_ms, 1)} ms, jax-js ${f(row.peer_ms, 1)} ms a step (medians): `
    + `jax-js / shardlab ${f(row.speedup)}x (rounds' paired ratios: median ${f(s.median)}x, IQR ${f(s.q1)}-${f(s.q3)}, `
    + `range ${f(s.min)}-${f(s.max)}, ${row.samples} rounds); goal >= ${GOAL_SPEEDUP}x: ${row.met ? 'met' : 'not met'}; ${losses}; `
    + `load ${row.load.map((x) => f(x)).join(' -> ')}`;
}

/** The two sides' losses step by step, a line each. */
export function lossTable(row) {
  const { shardlab, jaxjs } = row.losses;
  return shardlab.map((l, k) => `  step ${String(k).padStart(2)}: shardlab ${l.toFixed(7)}  jax-js ${jaxjs[k].toFixed(7)}  |diff| ${Math.abs(l - jaxjs[k]).toExponential(1)}`).join('\n');
}

async function main() {
  const [url, ...rest] = args('node peers_jaxjs.mjs URL [--steps N] [--configs small,seed] [--attention fused|unfused] [--json]');
  let rounds = 10;
  let names = ['small', 'seed'];
  let attention = 'fused';
  let json = false;
  for (let i = 0; i < rest.length; i++) {
    if (rest[i] === '--steps') rounds = Number(rest[++i]);
    else if (rest[i] === '--configs') names = rest[++i].split(',');
    else if (rest[i] === '--attention') attention = rest[++i];
    else if (rest[i] === '--json') json = true;
    else throw new Error(`unknown argument ${rest[i]}`);
  }
  if (!(rounds >= 1) || names.some((n) => !CONFIGS[n])) {
    throw new Error(`--steps needs a number >= 1 and --configs names from ${Object.keys(CONFIGS).join(', ')}`);
  }
  const browser = await launch();
  try {
    const page = await browser.newPage();
    page.on('console', (m) => m.type() === 'error' && console.error(`page: ${m.text()}`));
    await page.goto(new URL('web/peers.html', url).href);
    await page.waitForFunction(() => document.body.dataset.state !== 'loading', null, { timeout: 120_000 });
    const env = await page.evaluate(() => window.peers.ready);
    const cpus = os.cpus();
    console.log(`adapter: ${env.adapter}; shardlab ${env.shardlab.version}; Chromium ${browser.version()}; `
      + `${cpus.length} x ${cpus[0]?.model}`);
    for (const name of names) {
      const row = await measure(page, name, rounds, attention);
      console.log(describe(row));
      console.log(lossTable(row));
      if (json) console.log(JSON.stringify(row));
    }
  } finally {
    await browser.close();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
