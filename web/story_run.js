// The story's measurement: which run it measures on this adapter (the core's `story_choice`),
// its paired rounds as session actions, each round's pair of step times as it arrives, one
// profiled step for the random bits' share, cancel, and the results in the link. story.js
// renders what this module keeps in `state.story.result`; app.js owns the session and hands
// over, once (`init`), what this module calls.

import { RUN_MODES, median, quantile } from './format.js';

let page = null;

/** app.js's page: { state, wasm, request, readControls, writeControls, showHashNotice,
 * writeHash, render, thisGpu, adapter } (adapter: what the page knows of its adapter). */
export function init(p) {
  page = p;
}

/** How every ratio of the story is computed, said where it is shown. */
export const PAIRED_RATIO = 'Each ratio here is the median of the rounds’ paired ratios: a round runs one step of each mode back to back, and its ratio is automatic’s (or explicit’s) step over shard_map’s; the middle half of those ratios is its spread, and the times are the median round’s.';

/** The modes whose steps form a round, in RUN_MODES order: every mode, each priced against
 * shard_map's step of the same round (a mode added to RUN_MODES adds a time to each round). */
export const pairedModes = () => RUN_MODES;

/** The modes the link's rounds held before explicit joined the story: its older links reopen. */
const BEFORE_EXPLICIT = ['auto', 'shard_map'];

/** Pairs a layout needs before its ratio is shown. */
const MIN_PAIRS = 3;

/** A round's step of `mode` over its step of shard_map (NaN where the round has no such step). */
export const ratioOf = (pair, mode = 'auto') => (pair[RUN_MODES.indexOf(mode)] ?? NaN) / pair[RUN_MODES.indexOf('shard_map')];

/** A layout's statistics for `mode` (over shard_map) from its rounds: the median ratio (one
 * round's own, so its times are that round's), the interquartile range, the rounds, and the
 * median round's times. Rounds without a step of `mode` (older links') are left out. */
export function pairStats(pairs, mode = 'auto') {
  const rounds = (pairs || []).filter((p) => Number.isFinite(ratioOf(p, mode)));
  if (rounds.length < MIN_PAIRS) return null;
  const ratios = rounds.map((p) => ratioOf(p, mode));
  const ratio = median(ratios);
  return {
    ratio, q1: quantile(ratios, 0.25), q3: quantile(ratios, 0.75), steps: rounds.length,
    pair: rounds[ratios.indexOf(ratio)],
  };
}

// ---- which run -------------------------------------------------------------------------

/**
 * The story's run for this adapter, with why. A GPU's choice is read off its calibrated profile,
 * so `calibrate` measures it first where it has none (a few seconds); without `calibrate` a GPU
 * not yet calibrated gets `pending` (shown before the first run).
 */
export async function choose({ calibrate = false } = {}) {
  const { wasm, adapter, thisGpu, state } = page;
  const device = (state.settings && state.settings.device) || 'tpu_v4';
  const cpu = JSON.parse(wasm.Shardlab.story_choice(JSON.stringify(adapter), device)).basis === 'cpu';
  if (!cpu && !thisGpu.isCalibrated()) {
    if (!calibrate) {
      return { pending: true, rounds: null, reason: 'On a GPU the story first calibrates it (a few seconds), then measures the smallest size whose steps are bound by work rather than launches, so the random bits show.' };
    }
    await thisGpu.calibrate();
  }
  const c = JSON.parse(wasm.Shardlab.story_choice(JSON.stringify(adapter), device));
  if (c.ok === false) throw new Error(c.error);
  return c;
}

// ---- the run ------------------------------------------------------------------------------

const mark = (f) => ({ kind: 'call', fn: f });

/** "Run the story", or its cancel while it runs. */
export async function runOrCancel() {
  const { state } = page;
  const r = state.story.result;
  if (r && r.running) return cancel();
  const { settings, errors } = page.readControls();
  const choice = await choose({ calibrate: true });
  state.story.choice = choice;
  // The story's run, priced on the device kind the controls chose.
  const start = { ...choice.settings, device: errors.some((e) => e.field === 'device') ? choice.settings.device : settings.device };
  state.playing = false;
  state.story.result = {
    settings: start, size: choice.size, rounds: choice.rounds, round: 0, running: true, cancelled: false,
    pairs: { original: [], partitionable: [] }, shares: null,
  };
  page.writeControls(start);
  page.showHashNotice(null);
  const configure = (rng, fresh = false) => ({ kind: 'configure', settings: { ...start, rng }, fresh });
  const actions = [configure('original', true), { kind: 'step' }, configure('partitionable', true), { kind: 'step' }];
  let last = 'partitionable';
  for (let i = 0; i < choice.rounds; i++) {
    const round = i + 1;
    actions.push(mark(() => setRound(round)));
    // The layouts' order alternates, so drift in the machine's speed falls on both alike.
    for (const rng of i % 2 ? ['partitionable', 'original'] : ['original', 'partitionable']) {
      if (rng !== last) actions.push(configure(rng));
      actions.push({ kind: 'step', story: { rng } });
      last = rng;
    }
  }
  if (last !== 'original') actions.push(configure('original'));
  actions.push(mark(() => setRound(choice.rounds + 1)), { kind: 'step', profiled: true, story: { profile: true } }, mark(finish));
  page.request(...actions);
  page.render();
}

function setRound(k) {
  const r = page.state.story.result;
  if (r && r.running) r.round = k;
  page.render();
}

function finish() {
  const r = page.state.story.result;
  if (!r || !r.running) return;
  r.running = false;
  page.writeHash();
  page.render();
}

function cancel() {
  const { state } = page;
  const r = state.story.result;
  state.queue = [];
  r.running = false;
  r.cancelled = true;
  page.writeHash();
  page.render();
}

/** The session went idle: a story whose actions were dropped (a setting refused, an error)
 * stops where it is. */
export function idle() {
  const r = page.state.story.result;
  if (r && r.running && page.state.queue.length === 0) {
    r.running = false;
    r.cancelled = true;
    page.render();
  }
}

/** A step of the session finished: a story round's pair, or its profiled step's shares. */
export function stepped(r, tag) {
  const res = page.state.story.result;
  if (!tag || !res || !res.running) return;
  if (tag.rng) {
    const pair = pairedModes().map((m) => r.modes[m] && !r.modes[m].profiled ? r.modes[m].step_ms : null);
    if (pair.every((x) => x > 0)) res.pairs[tag.rng].push(pair);
  } else if (tag.profile) {
    const shares = {};
    for (const m of pairedModes()) {
      const b = r.modes[m] && r.modes[m].breakdown;
      if (b && b.step_ms > 0) shares[m] = b.categories_ms.rng / b.step_ms;
    }
    if (Object.keys(shares).length === pairedModes().length) res.shares = shares;
  }
}

// ---- the link -----------------------------------------------------------------------------

const LAYOUTS = ['original', 'partitionable'];
const MAX_PAIRS = 64;
const num = (x) => String(Number(x.toPrecision(4)));

/** The story's results as the link writes them, or null when there are none to write: each
 * round's times in RUN_MODES order, then each mode's share of random bits,
 * `original:812.3/790.2/405.1,799/801/410;partitionable:…;share:auto=0.6231,explicit=0.61,shard_map=0.19`. */
export function hashValue() {
  const r = page.state.story.result;
  if (!r || r.running || !LAYOUTS.some((l) => r.pairs[l].length)) return null;
  // A round an older link brought keeps that link's form: its two times.
  const round = (p) => (p.every((x) => x > 0) ? p : BEFORE_EXPLICIT.map((m) => p[pairedModes().indexOf(m)])).map(num).join('/');
  const parts = LAYOUTS.filter((l) => r.pairs[l].length).map((l) => `${l}:${r.pairs[l].map(round).join(',')}`);
  if (r.shares) parts.push(`share:${pairedModes().filter((m) => m in r.shares).map((m) => `${m}=${num(r.shares[m])}`).join(',')}`);
  return parts.join(';');
}

/** The results a link carries for `settings`, or throws naming what is wrong. */
export function readHashValue(text, settings) {
  const pairs = { original: [], partitionable: [] };
  let shares = null;
  const seen = new Set();
  const positive = (t) => {
    if (!/^\d{1,7}(\.\d{1,6})?$/.test(t) || !(Number(t) > 0)) throw new Error(`“${t.slice(0, 20)}” is not a step time in ms`);
    return Number(t);
  };
  for (const part of text.split(';')) {
    const [name, body] = part.split(/:(.*)/s);
    if (seen.has(name)) throw new Error(`“${name.slice(0, 20)}” appears twice`);
    seen.add(name);
    if (LAYOUTS.includes(name)) {
      const rows = (body || '').split(',');
      if (rows.length > MAX_PAIRS) throw new Error(`${name} has more than ${MAX_PAIRS} rounds`);
      pairs[name] = rows.map((row) => {
        const xs = row.split('/');
        if (xs.length !== pairedModes().length && xs.length !== BEFORE_EXPLICIT.length) {
          throw new Error(`a round of ${name} has ${xs.length} times, not ${pairedModes().length}`);
        }
        const times = xs.map(positive);
        // A round of an older link: its modes' times in their places, explicit's left out.
        return xs.length === pairedModes().length ? times : pairedModes().map((m) => times[BEFORE_EXPLICIT.indexOf(m)] ?? null);
      });
    } else if (name === 'share') {
      shares = {};
      for (const kv of (body || '').split(',')) {
        const [m, v] = kv.split('=');
        if (!pairedModes().includes(m)) throw new Error(`“${String(m).slice(0, 20)}” is not a mode`);
        const x = Number(v);
        if (!/^[01](\.\d{1,6})?$/.test(v || '') || !(x >= 0 && x <= 1)) throw new Error(`the share “${String(v).slice(0, 20)}” is not between 0 and 1`);
        shares[m] = x;
      }
      const modes = Object.keys(shares).length;
      if (modes !== pairedModes().length && !(modes === BEFORE_EXPLICIT.length && BEFORE_EXPLICIT.every((m) => m in shares))) {
        throw new Error('a share is missing for a mode');
      }
    } else {
      throw new Error(`“${String(name).slice(0, 20)}” is not a part of the story’s results`);
    }
  }
  const rounds = Math.max(...LAYOUTS.map((l) => pairs[l].length));
  return { settings, size: null, rounds, round: rounds, running: false, cancelled: false, pairs, shares };
}
