// The page: checks for WebGPU first, then loads the wasm handle (pkg/, built by
// `cargo xtask serve`), and drives it: settings in, steps, programs and summaries out (JSON).
// All model and partitioning logic lives in the wasm; this file renders and keeps the URL hash.
// State for tests: document.body.dataset.state (loading | no-webgpu | ready | error),
// document.body.dataset.run (the session's phase), document.body.dataset.selftest
// (running | done), and window.shardlab.

import {
  LEARN_FIELDS, initLearn, learnFacts, parseLr, renderExamplePrediction, renderSample, renderTask,
} from './learn.js';
import * as editor from './editor.js';
import { setupThisGpu } from './calibrate.js';

const $ = (id) => document.getElementById(id);
const state = {
  adapter: null, report: null, error: null, settings: null, configured: null, programs: null,
  last: null, steps: 0, playing: false, busy: false, charts: {}, hashNotice: null,
  // The session: one phase at a time, and the actions waiting for the next step boundary.
  phase: 'idle', queue: [], driving: false, deviceLost: false,
  // Story measurements, per settings (minus mode and RNG layout), then per RNG layout.
  story: { measured: {}, profiles: {}, overlap: null },
};
window.shardlab = state;

let lab = null; // the wasm handle
let wasm = null;
let presets = null; // {default, presets: {name: settings}, devices: [...]}
const MODES = ['auto', 'shard_map'];
const MODE_LABEL = { auto: 'automatic', shard_map: 'shard_map' };
const MODE_COLOR = { auto: '#4f46e5', shard_map: '#d97706' };
/** Steps per mode and RNG layout that "Run the story" trains; the first is warm-up. */
const STORY_STEPS = 4;
let uPlot = null;

function setState(s, status) {
  document.body.dataset.state = s;
  if (status !== undefined) document.querySelector('[data-testid="status"]').textContent = status;
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-') || k.startsWith('aria-') || k === 'title' || k === 'role') e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// ---- errors -------------------------------------------------------------------------------

/** The banner: for real failures only (a step, the GPU, an export), never for settings. */
function showError(message, hint) {
  const text = String(message && message.message ? message.message : message);
  state.error = text;
  const box = document.querySelector('[data-testid="error"]');
  box.replaceChildren(el('h2', {}, 'Something went wrong'), el('pre', {}, text),
    el('p', { class: 'hint' }, hint || 'Change the settings or press Reset to train again; nothing needs a reload.'));
  box.hidden = false;
}

function clearError() {
  state.error = null;
  const box = document.querySelector('[data-testid="error"]');
  box.replaceChildren();
  box.hidden = true;
}

function fatal(message) {
  showError(message, 'Reload the page to try again. If it keeps failing, the message above names the part that failed.');
  setState('error', 'Error');
}

window.addEventListener('error', (e) => fatal(e.error || e.message));
window.addEventListener('unhandledrejection', (e) => fatal(e.reason));

function noWebGpu(reason) {
  if (reason) $('no-webgpu-reason').textContent = reason;
  $('no-webgpu').hidden = false;
  setState('no-webgpu', 'WebGPU unavailable');
}

// ---- formatting ---------------------------------------------------------------------------

const fmtBytes = (n) => (n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(1)} GiB` : n >= 2 ** 20 ? `${(n / 2 ** 20).toFixed(1)} MiB`
  : n >= 2 ** 10 ? `${(n / 2 ** 10).toFixed(1)} KiB` : `${n} B`);
const fmtErr = (x) => (x === null || x === undefined ? '—' : x === 0 ? '0' : x.toExponential(1));
const fmtMs = (ms) => (ms < 1 ? `${(ms * 1000).toFixed(0)} µs` : ms < 1000 ? `${ms.toFixed(1)} ms` : `${(ms / 1000).toFixed(2)} s`);
const fmtInt = (n) => Number(n).toLocaleString('en-US');
const fmtRate = (x) => (x >= 1e6 ? `${(x / 1e6).toFixed(2)} M` : x >= 1e3 ? `${(x / 1e3).toFixed(1)} k` : x.toFixed(0));
/** 44.5 MFLOP, 1.20 GFLOP: SI prefixes, three significant digits. */
function fmtFlops(x) {
  const units = [[1e15, 'PFLOP'], [1e12, 'TFLOP'], [1e9, 'GFLOP'], [1e6, 'MFLOP'], [1e3, 'kFLOP']];
  for (const [size, unit] of units) if (x >= size) return `${Number((x / size).toPrecision(3))} ${unit}`;
  return `${x} FLOP`;
}
/** The core's notes name CLI flags in parentheses, e.g. "(--dropout-key fold_in)": the page
 * has controls instead, so the flags are dropped. */
const pageWords = (text) => String(text).replace(/\s*\(--[^)]*\)/g, '');
const fmtPct = (x) => `${(100 * x).toFixed(1)}%`;
const plural = (n, word) => `${fmtInt(n)} ${word}${n === 1 ? '' : 's'}`;
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)] : NaN;
};
const frame = () => new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));

// ---- settings, controls and the URL hash ---------------------------------------------------

// The one grammar of every setting: the hash reader and the form both parse with it, so a link
// the page writes always reopens, and a value the form accepts is one a link may carry. The
// preset names and the numeric bounds are the core's (shardlab::plan::Preset and PAGE_LIMITS),
// filled in by applyCoreLimits before any setting is read.
const FIELDS = {
  preset: { kind: 'enum', values: [] },
  mode: { kind: 'enum', values: ['auto', 'shard_map', 'both'] },
  mesh: { kind: 'mesh' },
  layers: { kind: 'int' },
  d_model: { kind: 'int' },
  heads: { kind: 'int' },
  seq: { kind: 'int' },
  batch: { kind: 'int' },
  vocab: { kind: 'int' },
  dropout: { kind: 'float' },
  rng: { kind: 'enum', values: ['original', 'partitionable'] },
  dropout_key: { kind: 'enum', values: ['same', 'fold_in'] },
  combine: { kind: 'bool' },
  device: { kind: 'enum', values: [] }, // filled from the core's device presets
  ...LEARN_FIELDS, // task, optimizer, lr (learn.js)
};

/** One value from its text, or throws a message naming the problem (in the page's words). */
function parseField(name, text) {
  const f = FIELDS[name];
  if (!f) throw new Error(`unknown setting “${name}”`);
  const bad = (why) => new Error(`${name} “${text.slice(0, 40)}” ${why}`);
  switch (f.kind) {
    case 'enum':
      if (!f.values.includes(text)) throw bad(`is not one of ${f.values.join(', ')}`);
      return text;
    case 'mesh':
      if (/^[A-Za-z_]\w{0,15}=\d{1,3}(,[A-Za-z_]\w{0,15}=\d{1,3}){2,}$/.test(text)) {
        throw bad('has more than two axes: a mesh here has one or two (dp, tp), like dp=4 or dp=2,tp=2');
      }
      if (!/^[A-Za-z_]\w{0,15}=\d{1,3}(,[A-Za-z_]\w{0,15}=\d{1,3})?$/.test(text)) throw bad('is not a mesh like dp=4 or dp=2,tp=2');
      return text;
    case 'int': {
      if (!/^\d{1,6}$/.test(text)) throw bad('is not a whole number');
      const n = Number(text);
      if (n < f.min || n > f.max) throw bad(`is outside ${f.min} to ${f.max}`);
      return n;
    }
    case 'float': {
      // Plain decimals only (no exponent): what String() writes for every value in range.
      if (!/^\d{1,3}(\.\d{1,17})?$/.test(text)) throw bad('is not a decimal number like 0.1');
      const x = Number(text);
      if (!(x >= f.min && x <= f.max)) throw bad(`is outside ${f.min} to ${f.max}`);
      if (String(x).includes('e')) throw bad(`is too small to write as a decimal: use 0 or at least 0.000001`);
      return x;
    }
    case 'lr':
      return parseLr(text);
    case 'bool':
      if (!['0', '1', 'true', 'false'].includes(text)) throw bad('is not 0 or 1');
      return text === '1' || text === 'true';
    default:
      throw bad('is not understood');
  }
}

/** A value as the hash and the controls write it: numbers in their shortest round-trip form. */
const fieldText = (k, v) => (FIELDS[k].kind === 'bool' ? (v ? '1' : '0') : String(v));

function defaultSettings() {
  return { ...presets.presets[presets.default] };
}

/** Settings from the hash, or defaults (with the reason) when the hash is malformed. */
function settingsFromHash() {
  const raw = location.hash.replace(/^#/, '');
  if (!raw) return { settings: defaultSettings(), problem: null };
  try {
    if (raw.length > 8000) throw new Error('it is too long');
    const params = new URLSearchParams(raw);
    const given = {};
    const specs = {};
    for (const [k, v] of params) {
      if (k in given || k in specs) throw new Error(`“${k.slice(0, 40)}” appears twice`);
      if (editor.isSpecKey(k)) specs[k] = v;
      else given[k] = parseField(k, v);
    }
    const base = presets.presets[given.preset || presets.default];
    const settings = { ...base, ...given };
    return { settings: { ...settings, specs: editor.readHash(settings, specs) }, problem: null };
  } catch (e) {
    return { settings: defaultSettings(), problem: e.message };
  }
}

function hashOf(s) {
  const p = new URLSearchParams();
  for (const k of Object.keys(FIELDS)) p.set(k, fieldText(k, s[k]));
  editor.writeHash(p, s);
  return `#${p.toString()}`;
}

function showHashNotice(problem) {
  const box = $('hash-notice');
  state.hashNotice = problem;
  if (!problem) {
    box.hidden = true;
    return;
  }
  box.replaceChildren(el('strong', {}, 'The link’s settings could not be read, so the defaults are shown. '),
    el('span', {}, `(${problem})`));
  box.hidden = false;
}

const form = () => $('settings');

function writeControls(s) {
  const f = form();
  for (const k of Object.keys(FIELDS)) {
    const input = f.elements[k];
    if (!input) continue;
    if (input.type === 'checkbox') input.checked = !!s[k];
    else input.value = fieldText(k, s[k]);
  }
  editor.write(s);
}

/** The controls' settings and, for each control whose text the grammar refuses, its error. */
function readControls() {
  const f = form();
  const s = {};
  const errors = [];
  for (const k of Object.keys(FIELDS)) {
    const input = f.elements[k];
    if (input.type === 'checkbox') {
      s[k] = input.checked;
      continue;
    }
    try {
      s[k] = parseField(k, input.value.trim());
    } catch (e) {
      s[k] = input.value;
      errors.push({ field: k, message: e.message });
    }
  }
  const specs = editor.read(s, errors.length > 0);
  s.specs = specs.specs;
  errors.push(...specs.errors);
  return { settings: s, errors };
}

function markFieldErrors(errors) {
  for (const old of form().querySelectorAll('.field-error')) old.remove();
  for (const old of form().querySelectorAll('.invalid')) old.classList.remove('invalid');
  for (const old of form().querySelectorAll('[aria-invalid]')) old.removeAttribute('aria-invalid');
  for (const e of errors) {
    const input = e.field && form().elements[e.field];
    const label = input ? input.closest('label') : form().querySelector('label');
    const id = `error-${e.field || 'settings'}`;
    if (input) {
      input.classList.add('invalid');
      input.setAttribute('aria-invalid', 'true');
      input.setAttribute('aria-describedby', id);
    }
    label.after(el('p', { class: 'field-error', id, 'data-testid': 'field-error', 'data-field': e.field || '' }, e.message));
  }
  $('settings-blocked').hidden = errors.length === 0;
}

// ---- the session: one phase at a time ----------------------------------------------------------
// idle (configured, no step yet) → building (the first step builds the trainers) → stepping →
// paused; error after a failed step. Setting changes, story buttons and Reset are actions: made
// while a step runs, they wait for its end (the step boundary) and replace whatever waited.

function setPhase(p) {
  state.phase = p;
  document.body.dataset.run = p;
  updateButtons();
}

/** A step joins the line; anything else (configure, reset, a story run) replaces it. */
function request(...actions) {
  if (actions.every((a) => a.kind === 'step')) state.queue.push(...actions);
  else state.queue = actions;
  drive();
}

/** The one loop that talks to the wasm: actions first, then Play's steps. */
async function drive() {
  if (state.driving) return;
  state.driving = true;
  try {
    for (;;) {
      let action = state.queue.shift();
      if (!action && state.playing && state.configured) action = { kind: 'step' };
      if (!action) break;
      if (action.kind === 'configure') {
        writeControls(action.settings);
        if (!applySettings(action.settings, action)) {
          state.queue = [];
          state.playing = false;
        }
      } else if (action.kind === 'reset') {
        await doReset();
      } else if (action.kind === 'step') {
        if (!state.configured) {
          state.queue = [];
          state.playing = false;
          continue;
        }
        if (!(await stepOnce(action.profiled))) {
          state.queue = [];
          state.playing = false;
        } else {
          // A frame between steps keeps input and painting responsive.
          await frame();
        }
      }
    }
  } finally {
    state.driving = false;
    setPhase(state.error ? 'error' : state.steps > 0 ? 'paused' : 'idle');
  }
}

/** What a failed step means for the learner: a lost device, no memory, or the core's words. */
function stepFailed(message) {
  const gpu = lab.take_error();
  const text = [message, gpu].filter(Boolean).join('\n');
  if (/device (was )?lost|destroyed/i.test(text)) {
    state.deviceLost = true;
    showError(`The GPU device was lost: ${text}`,
      'The browser took the GPU away (a driver reset, another tab, or the GPU going to sleep). Press Reset: the page opens a new device and trains again; nothing needs a reload.');
  } else if (/out of memory|outofmemory/i.test(text)) {
    const mem = state.configured && state.configured.memory;
    const per = mem ? Math.max(...Object.values(mem.per_device)) : null;
    showError(`The GPU ran out of memory for this run${per ? ` (${fmtBytes(per)} per simulated device)` : ''}: ${text}`,
      'Lower batch, seq, d_model or layers, then press Reset.');
  } else {
    showError(text);
  }
}

async function stepOnce(profiled = false) {
  state.busy = true;
  setPhase(state.steps === 0 ? 'building' : 'stepping');
  try {
    const r = JSON.parse(await (profiled ? lab.step_profiled() : lab.step()));
    if (r.discarded) return true; // the run was replaced meanwhile: nothing to show
    if (!r.ok) {
      stepFailed(r.error);
      return false;
    }
    const gpuError = lab.take_error();
    if (gpuError) {
      stepFailed(gpuError);
      return false;
    }
    // The core refuses a non-finite loss; JSON carries NaN as null, so check here too.
    const diverged = MODES.find((m) => r.modes[m] && !r.modes[m].profiled && !Number.isFinite(r.modes[m].loss));
    if (diverged) {
      showError(`The ${MODE_LABEL[diverged]} loss is not a finite number at step ${r.step + 1}: training stopped.`,
        'Lower the dropout or the model size, then press Reset.');
      return false;
    }
    clearError();
    record(r);
    return true;
  } finally {
    state.busy = false;
  }
}

async function doReset() {
  state.playing = false;
  setPhase('building');
  const r = JSON.parse(await lab.reset(state.deviceLost));
  if (!r.ok) {
    showError(r.error, 'Reload the page if a new GPU device cannot be opened.');
    return;
  }
  state.deviceLost = false;
  clearError();
  // A fresh run from the controls' settings (also after an error or a lost device).
  const { settings, errors } = readControls();
  if (errors.length) {
    markFieldErrors(errors);
    state.configured = null;
    return;
  }
  applySettings(settings);
}

// ---- configure and train ------------------------------------------------------------------

/** Key of the story's measurements: the settings except the mode and the RNG layout. */
const storyKey = (s) => hashOf({ ...s, mode: 'both', rng: 'original' });

function applySettings(s, { updateHash = true } = {}) {
  state.settings = s;
  if (updateHash) history.replaceState(null, '', hashOf(s));
  const r = JSON.parse(lab.configure(JSON.stringify(s)));
  if (!r.ok) {
    state.configured = null;
    state.programs = null;
    markFieldErrors(r.errors);
    resetView();
    renderStory();
    renderTask(null);
    return false;
  }
  markFieldErrors([]);
  if (!state.deviceLost) clearError();
  state.configured = r;
  resetView();
  state.programs = JSON.parse(lab.programs());
  state.story.overlap = JSON.parse(lab.mask_overlap());
  renderPrograms(state.programs);
  editor.afterPrograms();
  renderStory();
  renderTask(JSON.parse(lab.example()));
  const perDevice = Math.max(...Object.values(r.memory.per_device));
  $('run-facts').textContent = `${s.preset} preset · ${r.devices} simulated devices · ${fmtInt(r.params)} parameters · ${fmtInt(r.tokens_per_step)} tokens per step · ${fmtBytes(perDevice)} per device · ${learnFacts(s)}`;
  renderPrediction(r.prediction);
  return true;
}

function resetView() {
  state.steps = 0;
  state.last = null;
  state.history = { step: [], measured: { auto: [], shard_map: [] }, loss: { auto: [], shard_map: [] } };
  $('step').textContent = '0';
  for (const id of ['step-ms', 'loss', 'tokens-per-s']) $(id).textContent = '—';
  $('breakdown').hidden = true;
  // A new run has not predicted anything yet.
  if (state.example) renderTask(state.example);
  makeCharts();
}

function record(r) {
  state.last = r;
  state.steps = r.step + 1;
  const h = state.history;
  h.step.push(r.step);
  for (const m of MODES) {
    const s = r.modes[m];
    // A profiled step waits after every phase: its time is not a step time, so it is neither
    // charted nor shown as the last step time.
    h.measured[m].push(s && !s.profiled ? s.step_ms : null);
    // The loss a profiled step reads back is not reliable in automatic mode (the step re-runs
    // forward and backward under timestamp queries): it is neither charted nor shown.
    h.loss[m].push(s && !s.profiled ? s.loss : null);
  }
  const ran = MODES.filter((m) => r.modes[m]);
  const profiled = ran.some((m) => r.modes[m].profiled);
  const per = (id, f) => $(id).replaceChildren(...ran.map((m) =>
    el('span', { 'data-mode': m }, ran.length > 1 ? `${MODE_LABEL[m]} ${f(r.modes[m])}` : f(r.modes[m]))));
  $('step').textContent = String(state.steps);
  if (!profiled) {
    per('step-ms', (s) => fmtMs(s.step_ms));
    per('loss', (s) => s.loss.toFixed(4));
    per('tokens-per-s', (s) => fmtRate(s.tokens_per_s));
  }
  updateCharts();
  for (const m of ran) if (r.modes[m].example_prediction) renderExamplePrediction(state.steps, r.modes[m].example_prediction);
  for (const m of ran) if (r.modes[m].sample) renderSample(state.steps, r.modes[m].sample, r.modes[m].loss);
  const key = storyKey(state.settings);
  if (profiled) {
    state.story.profiles[key] = { ...(state.story.profiles[key] || {}), [state.settings.rng]: r.modes };
    renderBreakdown(r);
  }
  // The story's gap: medians of this run's own plain steps, after the first (warm-up).
  const recent = (m) => h.measured[m].slice(1).filter((x) => x != null);
  if (ran.length === 2 && recent('auto').length >= STORY_STEPS - 1 && recent('shard_map').length >= STORY_STEPS - 1) {
    state.story.measured[key] = { ...(state.story.measured[key] || {}), [state.settings.rng]: { auto: median(recent('auto')), shard_map: median(recent('shard_map')) } };
  }
  renderStory();
}

/**
 * Measured: one stacked bar per mode, its profiled step split by category plus the one
 * submission the step pays (the profile scales each op to its phase's wall time, so the
 * segments add up to the step); then the phases and the most expensive ops.
 */
function renderBreakdown(r) {
  const ran = MODES.filter((m) => r.modes[m] && r.modes[m].breakdown);
  const b = (m) => r.modes[m].breakdown;
  const scale = Math.max(...ran.map((m) => b(m).step_ms), 1e-9);
  const bars = el('div', { class: 'bars' }, ran.map((m) => {
    const x = b(m);
    const parts = { ...x.categories_ms, submit: x.submit_ms };
    return barRow(m, parts, MEASURED_CATEGORIES, scale, 'measured-bar', x.step_ms, { 'data-sum-ms': String(x.categories_sum_ms) });
  }));
  const offBy = (x) => fmtPct(Math.abs(x.categories_sum_ms - x.step_ms) / x.step_ms);
  const row = (label, f) => el('tr', {}, el('th', {}, label), ran.map((m) => el('td', { class: 'num' }, f(b(m)))));
  const phases = el('table', { class: 'compact' },
    el('thead', {}, el('tr', {}, el('th'), ran.map((m) => el('th', { class: 'num' }, MODE_LABEL[m])))),
    el('tbody', {}, [
      ...['forward', 'backward', 'update'].map((p) => row(p, (x) => fmtMs(x.phases_ms[p]))),
      row('one submission', (x) => fmtMs(x.submit_ms)),
      row('step, measured whole', (x) => fmtMs(x.step_ms)),
      row('categories off the step by', offBy),
      // The floor: what no kernel gets below on this GPU (see floorNote).
      el('tr', { 'data-testid': 'floor-row' }, el('th', {}, 'floor on this GPU'), ran.map((m) => el('td', {
        class: 'num', 'data-mode': m, 'data-floor-ms': String(b(m).floor ? b(m).floor.step_ms : ''),
      }, b(m).floor ? fmtMs(b(m).floor.step_ms) : '–'))),
      row('step over its floor', (x) => (x.floor ? `${fmtTimes(x.step_ms / x.floor.step_ms)}` : '–')),
    ]));
  const top = el('div', {}, ran.map((m) => el('div', { 'data-testid': 'top-ops', 'data-mode': m },
    el('p', { class: 'small' }, el('strong', {}, `${MODE_LABEL[m]}: the most expensive ops`)),
    el('ol', { class: 'small' }, b(m).top_ops.map((o) => el('li', {},
      el('code', {}, o.op), ` ${o.phase}, ${o.category}: ${fmtMs(o.ms)} `, el('span', { class: 'muted' }, o.shape)))))));
  $('breakdown').replaceChildren(
    el('h3', {}, el('span', { class: 'tag measured' }, 'measured'), ` where step ${r.step + 1}'s time went`),
    el('p', { class: 'muted small' }, 'Each op timed alone by wall clock (split submissions), shared out over its phase’s measured time. Profiling re-runs the step many times, so this step is not charted and its time is not a step time.'),
    bars, measuredLegend(), phases, floorNote(ran.map((m) => [m, b(m)])), top);
  $('breakdown').hidden = false;
}

/** "3.3×": how many times one time is another. */
function fmtTimes(x) {
  return `${x < 10 ? x.toFixed(1) : x.toFixed(0)}×`;
}

/**
 * What the floor is, and each category's time over its floor per mode: where the step is far from
 * what this GPU allows (a kernel to improve) and where it is at it (only fewer bytes or FLOPs help).
 */
function floorNote(modes) {
  const f = modes.map(([, x]) => x.floor).find((x) => x);
  if (!f) {
    const why = modes.map(([, x]) => x.floor_error).find((x) => x);
    return el('p', { class: 'muted small', 'data-testid': 'floor-note' },
      `No floor: this GPU’s ceilings could not be measured${why ? ` (${why})` : ''}. The profile above does not need them.`);
  }
  const perMode = modes.filter(([, x]) => x.floor).map(([m, x]) => {
    const parts = Object.entries(x.floor.categories_ms)
      .filter(([c, floor]) => floor > 0 && x.categories_ms[c] > 0)
      .map(([c, floor]) => `${c} ${fmtTimes(x.categories_ms[c] / floor)}`);
    return el('span', { 'data-testid': 'floor-categories', 'data-mode': m }, ` ${MODE_LABEL[m]}: ${parts.join(', ')}.`);
  });
  return el('p', { class: 'small', 'data-testid': 'floor-note' },
    `Floor: every op at the larger of its FLOPs at ${f.fma_gflops.toFixed(1)} GFLOP/s and its bytes at ${f.copy_gbps.toFixed(2)} GB/s, `
    + 'both measured on this GPU (FMAs alone, and a storage-buffer copy); launches not counted. No kernel gets below it here. '
    + 'Each category’s time over its floor:', ...perMode);
}

// ---- the cost model: modelled steps on real devices ----------------------------------------

/** The breakdown's categories in the order the bars stack them. */
const CATEGORIES = ['matmul', 'attention', 'rng', 'collectives', 'optimizer', 'other', 'launch'];
const CATEGORY_COLOR = {
  matmul: '#4f46e5', attention: '#0891b2', rng: '#dc2626', collectives: '#16a34a',
  optimizer: '#9333ea', other: '#64748b', launch: '#ca8a04', submit: '#a8a29e',
};

/** The measured bars' segments: the categories, then the one submission a step pays. */
const MEASURED_CATEGORIES = ['matmul', 'attention', 'rng', 'collectives', 'optimizer', 'other', 'submit'];

/** One mode's stacked bar: a segment per category of `parts` (ms), scaled to `scale` ms. */
function barRow(mode, parts, categories, scale, testid, totalMs, extra = {}) {
  const segs = categories.filter((c) => parts[c] > 0).map((c) => el('span', {
    class: 'seg', 'data-category': c, 'data-ms': String(parts[c]),
    style: `width:${(100 * parts[c] / scale).toFixed(3)}%;background:${CATEGORY_COLOR[c]}`,
    title: `${c}: ${fmtMs(parts[c])}`,
  }));
  return el('div', { class: 'bar-row', 'data-testid': testid, 'data-mode': mode, 'data-step-ms': String(totalMs), ...extra },
    el('span', { class: 'bar-label' }, MODE_LABEL[mode]),
    el('span', { class: 'bar' }, segs),
    el('span', { class: 'bar-total num' }, fmtMs(totalMs)));
}

/** One stacked bar per mode: its modelled step split by category, the segments summing to it. */
function predictionBars(modes, scale, testid) {
  return el('div', { class: 'bars' }, MODES.filter((m) => modes[m]).map((m) =>
    barRow(m, modes[m].breakdown_ms, CATEGORIES, scale, testid, modes[m].step_ms)));
}

function measuredLegend() {
  return el('p', { class: 'legend small' }, MEASURED_CATEGORIES.map((c) =>
    el('span', {}, el('i', { style: `background:${CATEGORY_COLOR[c]}` }), c === 'submit' ? 'one submission' : c)));
}

function categoryLegend() {
  return el('p', { class: 'legend small' }, CATEGORIES.map((c) =>
    el('span', {}, el('i', { style: `background:${CATEGORY_COLOR[c]}` }), c)));
}

/** The modelled figure: both modes' steps on N real devices of the chosen kind. */
function renderPrediction(pr) {
  // web/calibrate.js shows its recalibrate button when the prediction is for this GPU.
  window.dispatchEvent(new CustomEvent('shardlab:prediction', { detail: pr }));
  $('modelled-n').textContent = String(pr.devices);
  $('modelled-device').textContent = pr.label;
  const scale = Math.max(...MODES.map((m) => pr.modes[m].step_ms));
  const fits = MODES.every((m) => pr.modes[m].fits);
  $('chart-modelled').replaceChildren(
    predictionBars(pr.modes, scale, 'modelled-bar'),
    categoryLegend(),
    el('p', { class: 'muted small' }, `From each mode’s per-device program priced op by op on ${pr.label} (the cost model; nothing here ran on one). `,
      fits ? 'Both fit in its memory.' : 'It does not fit in one device’s memory.',
      pr.estimated.length ? ` Estimated figures: ${pr.estimated.join(', ')}.` : ''),
  );
}

/** The JAX report's experiment at full size, predicted (computed once, on demand). */
function renderScaleUp() {
  const box = $('scale-up-result');
  box.replaceChildren(el('p', { class: 'muted small' }, 'Building and pricing four programs…'));
  // Yield once so the line above paints before the (synchronous) work.
  setTimeout(() => showScaleUp(box, JSON.parse(wasm.Shardlab.scale_up())), 30);
}

function showScaleUp(box, r) {
  if (!r.ok) {
    box.replaceChildren(el('p', { class: 'field-error' }, r.error));
    return;
  }
  const rows = ['original', 'partitionable'].map((rng) => {
    const l = r.layouts[rng];
    return el('tr', { 'data-testid': 'scale-up-row', 'data-rng': rng },
      el('th', {}, rng),
      el('td', { class: 'num', 'data-testid': 'scale-up-ms', 'data-mode': 'auto' }, fmtMs(l.modes.auto.step_ms)),
      el('td', { class: 'num', 'data-testid': 'scale-up-ms', 'data-mode': 'shard_map' }, fmtMs(l.modes.shard_map.step_ms)),
      el('td', { class: 'num', 'data-testid': 'scale-up-ratio' }, `${l.ratio.toFixed(2)}×`),
      el('td', { 'data-testid': 'scale-up-fits' }, l.fits ? 'fits' : 'does not fit'));
  });
  const c = r.config;
  box.replaceChildren(...[
    el('p', { class: 'small' }, `${c.layers} layers, d_model ${c.d_model}, ${c.heads} heads, seq ${c.seq}, batch ${c.batch}, vocab ${fmtInt(c.vocab)} (${fmtInt(r.params)} parameters), dropout ${c.dropout}, ${c.mesh} on ${r.devices} × ${r.label}. `,
      el('span', { class: 'tag modelled' }, 'modelled'), ' per step:'),
    el('table', { class: 'compact' },
      el('thead', {}, el('tr', {}, el('th', {}, 'RNG layout'), el('th', { class: 'num' }, 'automatic'), el('th', { class: 'num' }, 'shard_map'), el('th', { class: 'num' }, 'ratio'), el('th', {}, 'memory'))),
      el('tbody', {}, rows)),
    c.batch < r.report_batch ? el('p', { class: 'small', 'data-testid': 'scale-up-batch-note' }, `Batch ${c.batch}, not the report’s ${r.report_batch}: at batch ${r.report_batch} the global logits have more elements than a ${r.address_bits}-bit WebAssembly page can index. \`shardlab plan\` predicts batch ${r.report_batch} natively.`) : null,
    el('p', { class: 'muted small' }, 'The JAX report measured 2.95 s/it (automatic) vs 1.09 s/it (shard_map) on a TPU v4-8 with the original layout: 2.7×.'),
  ].filter(Boolean));
}

function updateButtons() {
  const ready = !!state.configured;
  const play = $('play');
  if (!play) return;
  play.textContent = state.playing ? '❚❚ Pause' : '▶ Play';
  play.setAttribute('aria-pressed', String(state.playing));
  play.disabled = !ready && !state.playing;
  const stepping = state.driving && (state.busy || state.queue.length > 0);
  $('single').disabled = !ready || state.playing;
  $('profile').disabled = !ready || state.playing;
  $('story-run').disabled = !ready;
  const label = state.playing ? 'training' : { idle: 'ready', building: 'building', stepping: 'stepping', paused: 'paused', error: 'error' }[state.phase];
  $('run-state').textContent = stepping && !state.playing ? (state.phase === 'building' ? 'building' : 'stepping') : label;
  $('run-state').className = `badge ${state.playing ? 'pass' : state.phase === 'error' ? 'fail' : ''}`;
}

// ---- charts (uPlot, vendored from npm by xtask) --------------------------------------------

const CHARTS = [
  ['chart-measured', 'measured', 'ms'],
  ['chart-loss', 'loss', ''],
];

/** Before the first step each chart is a one-line hint; the charts appear with the first point. */
function makeCharts() {
  for (const c of Object.values(state.charts)) c.destroy?.();
  state.charts = {};
  for (const [id] of CHARTS) {
    $(id).replaceChildren(el('p', { class: 'chart-hint muted small', 'data-testid': 'chart-hint' },
      uPlot ? 'Press Play or Step: each mode that runs gets a line here.'
        : 'The chart library (uPlot) was not found: run `npm ci` in tests/browser and rebuild.'));
  }
}

function createCharts() {
  const running = state.configured ? state.configured.modes : [];
  const css = getComputedStyle(document.documentElement);
  const axisColor = css.getPropertyValue('--muted').trim() || '#5d6673';
  const gridColor = css.getPropertyValue('--line').trim() || '#e1e4e8';
  for (const [id, key, unit] of CHARTS) {
    const box = $(id);
    box.replaceChildren();
    const width = Math.max(260, box.clientWidth || 320);
    const fmt = (v) => (v == null ? '—' : unit === 'ms' ? fmtMs(v) : v.toFixed(3));
    const opts = {
      width, height: 170,
      legend: { show: true },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: false } },
      axes: [
        { stroke: axisColor, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000], grid: { stroke: gridColor, width: 1 }, ticks: { stroke: gridColor } },
        { stroke: axisColor, grid: { stroke: gridColor, width: 1 }, ticks: { stroke: gridColor }, size: 84, values: (u, vals) => vals.map(fmt) },
      ],
      series: [
        { label: 'step' },
        ...running.map((m) => ({ label: MODE_LABEL[m], stroke: MODE_COLOR[m], width: 2, spanGaps: true, value: (u, v) => fmt(v) })),
      ],
    };
    const chart = new uPlot(opts, [[], ...running.map(() => [])], box);
    chart.key = key;
    chart.modes = running;
    state.charts[key] = chart;
  }
}

function updateCharts() {
  if (!uPlot) return;
  if (!Object.keys(state.charts).length) createCharts();
  const h = state.history;
  for (const [key, chart] of Object.entries(state.charts)) {
    chart.setData([h.step, ...chart.modes.map((m) => h[key][m])]);
  }
}

window.addEventListener('resize', () => {
  for (const c of Object.values(state.charts)) {
    const box = c.root.parentElement;
    if (box && box.clientWidth) c.setSize({ width: box.clientWidth, height: 170 });
  }
});

// ---- program inspector ---------------------------------------------------------------------

/** The mesh's axes from its text: [[name, size], ...] (already checked by the core). */
const meshAxes = (text) => String(text).split(',').map((p) => p.split('=')).map(([n, s]) => [n.trim(), Number(s)]);
/** Device d's mesh coordinates, row-major as JAX lays out mesh.devices: {dp: 0, tp: 1}. */
function deviceCoords(d, axes) {
  const out = [];
  let rest = d;
  for (let i = axes.length - 1; i >= 0; i--) {
    out[i] = [axes[i][0], rest % axes[i][1]];
    rest = Math.floor(rest / axes[i][1]);
  }
  return out;
}
const coordText = (d, axes) => deviceCoords(d, axes).map(([n, i]) => `${n}=${i}`).join(', ');
const PALETTE = ['#4f46e5', '#d97706', '#059669', '#db2777', '#0891b2', '#7c3aed', '#65a30d', '#dc2626'];
const deviceColor = (d, n) => (n <= PALETTE.length ? PALETTE[d] : `hsl(${Math.round((360 * d) / n)} 65% 45%)`);
const deviceChip = (d, axes, n) => el('span', { class: 'dev', style: `--dev:${deviceColor(d, n)}`, title: `device ${d}: ${coordText(d, axes)}` },
  `${d} (${coordText(d, axes)})`);

function deviceLegend(n, axes) {
  return el('div', { class: 'device-legend', 'data-testid': 'device-legend' },
    el('span', { class: 'muted small' }, `${n} simulated devices on the mesh ${axes.map(([a, s]) => `${a}=${s}`).join(', ')}: `),
    [...Array(n).keys()].map((d) => deviceChip(d, axes, n)));
}

function collectiveTable(summary) {
  const rows = Object.entries(summary.collectives).filter(([, t]) => t.count > 0);
  if (!rows.length) return el('p', { class: 'muted small' }, 'no collectives');
  return el('table', { class: 'compact' },
    el('thead', {}, el('tr', {}, el('th', {}, 'collective'), el('th', { class: 'num' }, 'ops'), el('th', { class: 'num' }, 'arrays'), el('th', { class: 'num' }, 'bytes'))),
    el('tbody', {}, rows.map(([kind, t]) => el('tr', { 'data-testid': 'collective-row', 'data-kind': kind },
      el('td', {}, el('mark', { class: 'collective' }, kind)), el('td', { class: 'num' }, t.count),
      el('td', { class: 'num' }, t.operands), el('td', { class: 'num' }, fmtBytes(t.bytes))))));
}

function layoutPicture(layout, devices, axes) {
  // Which device holds which block, as jax.debug.visualize_array_sharding draws a 1D or 2D array.
  const shape = layout.shape;
  const dims = shape.length >= 2 ? [shape.length - 2, shape.length - 1] : [0];
  const rowsOf = (d) => (dims.length === 2 ? layout.blocks[d][dims[0]] : [0, 1]);
  const colsOf = (d) => layout.blocks[d][dims[dims.length - 1]];
  const rowCuts = [...new Set(layout.blocks.map((b, d) => rowsOf(d)[0]))].sort((a, b) => a - b);
  const colCuts = [...new Set(layout.blocks.map((b, d) => colsOf(d)[0]))].sort((a, b) => a - b);
  const grid = el('div', { class: 'blocks' });
  grid.style.gridTemplateColumns = `repeat(${colCuts.length}, 1fr)`;
  for (const r of rowCuts) {
    for (const c of colCuts) {
      const holders = [...Array(devices).keys()].filter((d) => rowsOf(d)[0] === r && colsOf(d)[0] === c);
      grid.append(el('span', { class: 'block' }, holders.length === devices && devices > 1
        ? el('span', { class: 'dev all' }, `all ${devices} devices`)
        : holders.map((d) => deviceChip(d, axes, devices))));
    }
  }
  return el('div', { class: 'layout' }, el('code', {}, `${layout.name} [${shape.join(',')}]`), el('span', { class: 'muted small' }, layout.spec), grid);
}

// What each highlighted op does, in words (the popover's first sentence).
const OP_WORDS = {
  'all-reduce': 'An all-reduce: every device ends with the sum of the array over the devices of the axis.',
  'all-gather': 'An all-gather: every device ends with the whole array, its blocks collected from every device of the axis.',
  'reduce-scatter': 'A reduce-scatter: the array is summed over the devices of the axis, and each device keeps one block of the sum.',
  'all-to-all': 'An all-to-all: each device sends one block to every other device of the axis, re-splitting the array along another dimension.',
  'collective-permute': 'A collective-permute: each device sends its block to one other device.',
  psum: 'An all-reduce (psum): every device ends with the sum of the array over the devices of the axis.',
  all_gather: 'An all-gather: every device ends with the whole array, its blocks collected from every device of the axis.',
  psum_scatter: 'A reduce-scatter (psum_scatter): the array is summed over the axis, and each device keeps one block of the sum.',
  all_to_all: 'An all-to-all: each device sends one block to every other device of the axis.',
  dynamic_slice: 'A dynamic-slice: each device keeps only its own block of an array it holds whole.',
  random_bits: 'Random bits for the whole global array, made on every device.',
};

function explanation(m, mode) {
  const what = OP_WORDS[m.op] || OP_WORDS[m.inserted && m.inserted.op] || `A ${m.op} op.`;
  const parts = [what];
  if (m.kind === 'rng_replicated') {
    parts.push('With the original Threefry layout no device can make just its own block, so every device makes all the bits of the global array and then keeps its block: the device count times the work.');
  } else if (m.kind === 'rng') {
    parts.push('Each device makes only the bits of its own block.');
  }
  if (m.inserted) {
    const r = m.inserted;
    const of = r.value && !r.value.startsWith('%') ? ` of ${r.value}` : '';
    parts.push(`The partitioner inserted it${of} for the ${r.source_op === 'output' ? 'program output' : `${r.source_op} op`}: ${r.rule}.`);
  } else if (mode === 'shard_map' && m.kind === 'collective') {
    parts.push('In shard_map it is written in the body by hand.');
  }
  return parts.join(' ');
}

/** Lines to compare across the programs: the op (and a parameter's name), not the SSA ids. */
function lineKey(line) {
  const m = /^\s*%[\d, %]+=\s*([A-Za-z_][\w.-]*)(?:\s+([\w.]+))?/.exec(line);
  if (!m) return line.trim();
  return m[1] === 'parameter' ? `parameter ${m[2]}` : m[1];
}

/** Rows pairing the lines of two programs where their ops correspond (longest common
 * subsequence of the ops); [i, null] or [null, j] where one program has a line the other lacks. */
function align(a, b) {
  const n = a.length;
  const m = b.length;
  if (n * m > 16e6 || n > 65000 || m > 65000) return null;
  const ids = new Map();
  const id = (k) => (ids.has(k) ? ids.get(k) : (ids.set(k, ids.size), ids.size - 1));
  const ka = a.map(id);
  const kb = b.map(id);
  const w = m + 1;
  const L = new Uint16Array((n + 1) * w);
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      L[i * w + j] = ka[i] === kb[j] ? L[(i + 1) * w + j + 1] + 1 : Math.max(L[(i + 1) * w + j], L[i * w + j + 1]);
    }
  }
  const rows = [];
  let i = 0;
  let j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && ka[i] === kb[j]) rows.push([i++, j++]);
    else if (j >= m || (i < n && L[(i + 1) * w + j] >= L[i * w + j + 1])) rows.push([i++, null]);
    else rows.push([null, j++]);
  }
  return rows;
}

/** One program line: marked ops get their explanation; SSA ids link to their defining line. */
function renderLine(mode, line, mark) {
  const parts = [];
  let last = 0;
  for (const match of line.matchAll(/%\d+/g)) {
    parts.push(line.slice(last, match.index));
    parts.push(el('a', { class: 'ssa', href: '#', 'data-target': `${mode}-v${match[0].slice(1)}` }, match[0]));
    last = match.index + match[0].length;
  }
  parts.push(line.slice(last));
  if (!mark) return el('span', { class: 'src-line' }, parts);
  return el('span', {
    class: `line ${mark.kind}`, 'data-kind': mark.kind, 'data-op': mark.op, tabIndex: 0,
    'data-explain': explanation(mark, mode), 'aria-describedby': 'explain',
  }, parts);
}

function renderAligned(views) {
  const texts = MODES.map((m) => views[m].text.split('\n').filter((l, i, all) => i < all.length - 1 || l !== ''));
  const marks = MODES.map((m) => new Map(views[m].marks.map((k) => [k.line, k])));
  const rows = align(texts[0].map(lineKey), texts[1].map(lineKey))
    || [...Array(Math.max(texts[0].length, texts[1].length)).keys()].map((i) => [i < texts[0].length ? i : null, i < texts[1].length ? i : null]);
  const cell = (k, i) => {
    const mode = MODES[k];
    if (i === null) return el('td', { class: 'src gap', 'data-mode': mode });
    const line = texts[k][i];
    const td = el('td', { class: 'src', 'data-mode': mode }, renderLine(mode, line, marks[k].get(i)));
    const defined = /^\s*(%[\d, %]+)=/.exec(line);
    if (defined) td.id = `${mode}-v${defined[1].match(/\d+/)[0]}`;
    for (const v of defined ? defined[1].match(/\d+/g).slice(1) : []) td.prepend(el('span', { id: `${mode}-v${v}` }));
    return td;
  };
  const table = el('table', { class: 'aligned' },
    el('thead', {}, el('tr', {}, MODES.map((m) => el('th', {}, MODE_LABEL[m])))),
    el('tbody', {}, rows.map(([i, j]) => el('tr', {}, cell(0, i), cell(1, j)))));
  const box = el('div', { class: 'program-scroll', 'data-testid': 'program-text' }, table);
  // Open the text at its first highlighted line: the parameters above it are all alike.
  const first = table.querySelector('.line');
  if (first) {
    requestAnimationFrame(() => {
      box.scrollTop = Math.max(0, first.getBoundingClientRect().top - box.getBoundingClientRect().top - 40);
    });
  }
  return box;
}

function renderPane(box, view, running, axes) {
  const s = view.summary;
  const inserted = view.inserted
    ? el('details', { class: 'inserted-list', 'data-testid': 'inserted' },
      el('summary', {}, `ops the partitioner inserted (${view.inserted.length})`),
      el('ol', {}, view.inserted.map((r) => el('li', {}, el('code', {}, r.op), ` for ${r.source_op}${r.value && !r.value.startsWith('%') ? ` of ${r.value}` : ''}`,
        el('div', { class: 'muted small' }, r.rule)))))
    : el('p', { class: 'muted small' }, 'shard_map: every collective is written in the body by hand.');
  const mem = s.peak_bytes_per_device;
  const warnings = s.warnings.map((w) => el('p', { class: 'warning', 'data-testid': 'warning' }, `⚠ ${pageWords(w)}`));
  const layouts = el('details', { class: 'layouts' }, el('summary', {}, 'which device holds which block'),
    el('div', { class: 'layout-grid' }, view.layouts.map((l) => layoutPicture(l, s.devices, axes))));
  box.replaceChildren(
    el('h3', {}, `${MODE_LABEL[view.mode]}${running ? '' : ' (not running in this mode)'}`),
    el('dl', { class: 'facts compact' },
      el('dt', {}, 'random bits per device'), el('dd', { 'data-testid': 'rng-bits' }, fmtInt(s.rng_bits_per_device)),
      el('dt', {}, 'memory per device'), el('dd', {}, `${fmtBytes(mem.total)} (params ${fmtBytes(mem.params)}, optimizer ${fmtBytes(mem.optimizer_state)}, activations ${fmtBytes(mem.activations)})`),
      el('dt', {}, 'compute per device'), el('dd', { 'data-testid': 'flops' }, fmtFlops(s.flops_per_device)),
      el('dt', {}, 'instructions'), el('dd', {}, fmtInt(s.instructions))),
    collectiveTable(s), ...warnings, inserted, layouts);
}

function renderPrograms(p) {
  if (!p.ok) return showError(p.error);
  const running = state.configured ? state.configured.modes : [];
  const axes = meshAxes(state.settings.mesh);
  const devices = p.modes.auto.summary.devices;
  $('device-legend').replaceChildren(deviceLegend(devices, axes));
  renderPane($('program-auto'), p.modes.auto, running.includes('auto'), axes);
  renderPane($('program-shard-map'), p.modes.shard_map, running.includes('shard_map'), axes);
  $('program-aligned').replaceChildren(renderAligned(p.modes));
}

// The explanation popover: the same words on hover, keyboard focus and tap.
function wireInspector() {
  const tip = $('explain');
  let pinned = null;
  const show = (target) => {
    tip.textContent = target.dataset.explain;
    tip.hidden = false;
    const r = target.getBoundingClientRect();
    tip.style.left = `${Math.max(8, Math.min(window.scrollX + r.left, window.scrollX + document.documentElement.clientWidth - tip.offsetWidth - 8))}px`;
    tip.style.top = `${window.scrollY + r.bottom + 6}px`;
  };
  const hide = () => {
    if (!pinned) tip.hidden = true;
  };
  const box = $('program-aligned');
  box.addEventListener('mouseover', (e) => {
    const t = e.target.closest('[data-explain]');
    if (t) show(t);
  });
  box.addEventListener('mouseout', (e) => {
    if (e.target.closest('[data-explain]')) hide();
  });
  box.addEventListener('focusin', (e) => {
    const t = e.target.closest('[data-explain]');
    if (t) show(t);
  });
  box.addEventListener('focusout', () => {
    pinned = null;
    hide();
  });
  box.addEventListener('click', (e) => {
    const link = e.target.closest('a.ssa');
    if (link) {
      // Follow an SSA id to the line that defines it, without touching the settings' hash.
      e.preventDefault();
      const def = document.getElementById(link.dataset.target);
      if (def) {
        const row = def.closest('td');
        row.scrollIntoView({ block: 'center' });
        row.classList.remove('flash');
        void row.offsetWidth;
        row.classList.add('flash');
      }
      return;
    }
    const t = e.target.closest('[data-explain]');
    if (t) {
      pinned = pinned === t ? null : t;
      if (pinned) show(t);
      else tip.hidden = true;
    }
  });
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape') {
      pinned = null;
      tip.hidden = true;
    }
  });
}

// ---- the seed, as a story --------------------------------------------------------------------

/** A settings change from a button: it takes effect at the next step boundary. */
function changeSettings(change) {
  const { settings, errors } = readControls();
  if (errors.length) {
    markFieldErrors(errors);
    return;
  }
  const next = { ...settings, ...change };
  writeControls(next);
  showHashNotice(null);
  request({ kind: 'configure', settings: next });
}

/** Trains both modes under both RNG layouts for a few steps each, from `base` (the current
 * settings unless given), so the story's ratios are measured on this run's own settings. */
function runStory(base) {
  const { settings, errors } = readControls();
  if (errors.length && !base) {
    markFieldErrors(errors);
    return;
  }
  const start = { ...(base || settings), mode: 'both' };
  const steps = () => Array.from({ length: STORY_STEPS }, () => ({ kind: 'step' }));
  state.playing = false;
  writeControls(start);
  showHashNotice(null);
  request({ kind: 'configure', settings: { ...start, rng: 'original' } }, ...steps(),
    { kind: 'configure', settings: { ...start, rng: 'partitionable' } }, ...steps());
}

/** "29 all-gathers, 29 reduce-scatters" from a summary's per-kind totals. */
function collectiveWords(summary) {
  const rows = Object.entries(summary.collectives).filter(([, t]) => t.count > 0);
  return rows.length ? rows.map(([kind, t]) => plural(t.count, kind)).join(', ') : 'no collectives';
}

function renderStory() {
  const ol = $('story-steps');
  const s = state.settings;
  const p = state.programs;
  if (!p || !p.ok || !s) {
    ol.replaceChildren(el('li', { class: 'muted' }, 'Fix the marked settings to see this run’s story.'));
    return;
  }
  const a = p.modes.auto.summary;
  const m = p.modes.shard_map.summary;
  const key = storyKey(s);
  const measured = state.story.measured[key] || {};
  const cur = measured[s.rng];
  const toggle = (label, change) => el('button', { type: 'button', class: 'inline', 'data-testid': 'story-toggle', onclick: () => changeSettings(change) }, label);
  const ratio = (rng) => (measured[rng]
    ? el('strong', { 'data-testid': 'story-ratio', 'data-rng': rng }, `${(measured[rng].auto / measured[rng].shard_map).toFixed(2)}×`)
    : el('em', { class: 'muted' }, 'not measured yet'));
  const runIt = 'press “Run the story” above to train both modes under both RNG layouts for a few steps';

  const gap = el('li', {}, el('strong', {}, 'The gap. '),
    cur
      ? [`On your GPU, with these settings, the automatic step takes ${fmtMs(cur.auto)} and the shard_map step ${fmtMs(cur.shard_map)} (medians of this run’s steps, measured): automatic is `, ratio(s.rng), ' the shard_map time. ']
      : [`Not measured yet for these settings: ${runIt}, or train in both modes. `],
    s.mode === 'both' ? toggle('Train automatic only', { mode: 'auto' }) : toggle('Train both modes', { mode: 'both' }), ' ',
    el('span', { class: 'muted' }, '(The JAX report: 2.95 s/it automatic against 1.09 s/it with shard_map, 2.7×, on a TPU v4-8.)'));

  const aw = collectiveWords(a);
  const mw = collectiveWords(m);
  const hasAllReduce = a.collectives['all-reduce'].count + m.collectives['all-reduce'].count > 0;
  const comm = el('li', {}, el('strong', {}, 'Not the collectives. '),
    aw === mw
      ? `Both programs issue the same collectives: ${aw}. The same communication cannot explain a gap. `
      : `The automatic program issues ${aw}; shard_map issues ${mw}. `,
    hasAllReduce ? (s.combine ? toggle('Stop combining all-reduces', { combine: false }) : toggle('Combine all-reduces', { combine: true })) : null);

  const bitsRatio = m.rng_bits_per_device > 0 ? a.rng_bits_per_device / m.rng_bits_per_device : null;
  const prof = (state.story.profiles[key] || {})[s.rng];
  const rngShare = (mode) => {
    const x = prof && prof[mode] && prof[mode].breakdown;
    if (!x) return null;
    const total = x.step_ms;
    return total > 0 ? `${fmtMs(x.categories_ms.rng)} of ${fmtMs(total)} (${fmtPct(x.categories_ms.rng / total)}) in ${MODE_LABEL[mode]}` : null;
  };
  const shares = MODES.map(rngShare).filter(Boolean);
  const pr = state.configured.prediction;
  const modelledShare = (mode) => {
    const p = pr.modes[mode];
    return el('span', { 'data-testid': 'rng-modelled', 'data-mode': mode, 'data-rng-ms': String(p.rng_ms), 'data-step-ms': String(p.step_ms) },
      `${fmtMs(p.rng_ms)} of ${fmtMs(p.step_ms)} (${fmtPct(p.rng_share)}) in ${MODE_LABEL[mode]}`);
  };
  const modelled = el('span', {}, ` On ${pr.devices} × ${pr.label} the cost model gives the random bits `,
    modelledShare('auto'), ' and ', modelledShare('shard_map'), ' (modelled); the JAX report measured ',
    el('span', { 'data-testid': 'report-times' }, '2.95 vs 1.09 s/it on a TPU v4-8'), '. ');
  const cause = el('li', {}, el('strong', {}, 'The cause: random bits. '),
    `Each device generates ${fmtInt(a.rng_bits_per_device)} random bits per step in automatic mode and ${fmtInt(m.rng_bits_per_device)} in shard_map`,
    bitsRatio ? ` (${bitsRatio.toFixed(1)}×). ` : '. ',
    s.rng === 'original'
      ? 'With the original Threefry layout no device can make its own block, so the partitioner has every device generate the whole global array and slice its part: the lines marked in the automatic program below. '
      : 'With the partitionable layout each device makes only its block. ',
    shares.length
      ? el('span', { 'data-testid': 'rng-time' }, `In a profiled step the random bits took ${shares.join(', and ')} (measured).`)
      : 'Press “Where does the time go?” to measure the random bits’ share of each mode’s step.',
    modelled);

  const flag = el('li', {}, el('strong', {}, 'The flag. '),
    `jax_threefry_partitionable (the RNG layout here) is now ${s.rng === 'partitionable' ? 'True' : 'False'}. Measured ratio automatic/shard_map on these settings: original `, ratio('original'),
    ', partitionable ', ratio('partitionable'), '. ',
    toggle(s.rng === 'original' ? 'Flip to partitionable' : 'Back to original', { rng: s.rng === 'original' ? 'partitionable' : 'original' }));

  const o = state.story.overlap;
  let masks;
  if (s.dropout === 0) masks = 'Dropout is off, so no masks are drawn. ';
  else if (!o || o.same_key === undefined) masks = 'This mesh has one data-parallel device, so there is no mask to repeat. ';
  else {
    const chance = (1 - s.dropout) ** 2 + s.dropout ** 2;
    masks = [`In shard_map, with the same key on every device, `,
      el('strong', { 'data-testid': 'mask-share', 'data-key': 'same' }, fmtPct(o.same_key)),
      ` of the dropout mask bits are identical across the ${o.devices} data-parallel devices: every device drops the same positions of different examples. With fold_in(key, axis_index('dp')), `,
      el('strong', { 'data-testid': 'mask-share', 'data-key': 'fold_in' }, fmtPct(o.fold_in)),
      ` are: what independent masks share by chance at dropout ${s.dropout} (${fmtPct(chance)}). (From the first ${fmtInt(o.elements)} bits of each device’s first mask.) `];
  }
  const caveat = el('li', {}, el('strong', {}, 'The same-key caveat. '), masks,
    s.dropout_key === 'same' ? toggle('Use fold_in', { dropout_key: 'fold_in' }) : toggle('Back to the same key', { dropout_key: 'same' }));

  ol.replaceChildren(gap, comm, cause, flag, caveat);
}

// ---- the task: renderTask, renderExamplePrediction and renderSample live in learn.js -----

// ---- adapter and self-test -----------------------------------------------------------------

// Browsers often leave the adapter's name empty; GPUAdapterInfo's vendor and architecture say more.
function adapterName(a, info) {
  if (a.name) return a.name;
  const parts = info ? [info.vendor, info.architecture, info.device, info.description] : [];
  return [...new Set(parts.filter(Boolean))].join(' · ') || '(the browser does not say)';
}

function renderAdapter(a, info) {
  const facts = [['name', adapterName(a, info)], ['backend', a.backend], ['device type', a.device_type]];
  if (a.driver) facts.push(['driver', a.driver]);
  $('adapter-facts').replaceChildren(...facts.flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
  const features = [['timestamp-query', a.timestamp_query], ['shader-f16', a.shader_f16], ['subgroups', a.subgroups]];
  $('adapter-features').replaceChildren(...features.map(([name, on]) =>
    el('span', { class: on ? 'chip on' : 'chip off', title: on ? 'supported' : 'not supported' }, `${on ? '✓' : '✗'} ${name}`)));
  const limits = [
    ['max buffer size', fmtBytes(a.max_buffer_size)],
    ['max storage buffer binding', fmtBytes(a.max_storage_buffer_binding_size)],
    ['max invocations per workgroup', a.max_compute_invocations_per_workgroup],
    ['max workgroup size x', a.max_compute_workgroup_size_x],
    ['max workgroup storage', fmtBytes(a.max_compute_workgroup_storage_size)],
    ['max workgroups per dimension', a.max_compute_workgroups_per_dimension],
    ['max storage buffers per stage', a.max_storage_buffers_per_shader_stage],
  ];
  $('adapter-limits').replaceChildren(...limits.map(([k, v]) => el('tr', {}, el('th', {}, k), el('td', { class: 'num' }, v))));
  $('adapter').hidden = false;
}

const mark = (status) => el('span', { class: `mark ${status}`, title: status }, status === 'pass' ? '✓' : status === 'fail' ? '✗' : '–');

function renderReport(r) {
  $('kernel-rows').replaceChildren(...r.kernels.map((k) => {
    const row = el('tr', { class: k.status, 'data-testid': 'selftest-row', 'data-kind': 'kernel', 'data-status': k.status },
      el('td', {}, mark(k.status)), el('td', {}, k.name), el('td', { class: 'muted' }, k.shape),
      el('td', { class: 'num' }, fmtErr(k.max_abs_error)), el('td', { class: 'num' }, fmtMs(k.ms)));
    return k.message ? [row, el('tr', { class: 'message' }, el('td'), el('td', { colSpan: 4 }, k.message))] : [row];
  }).flat());
  $('pipeline-rows').replaceChildren(...r.pipelines.map((p) =>
    el('tr', { class: p.status, 'data-testid': 'selftest-row', 'data-kind': 'pipeline', 'data-status': p.status },
      el('td', {}, mark(p.status)), el('td', {}, p.shader), el('td', {}, p.entry), el('td', { class: 'muted' }, p.message || ''))));
  const count = (items) => {
    const pass = items.filter((i) => i.status === 'pass').length;
    const skip = items.filter((i) => i.status === 'skip').length;
    return `${pass}/${items.length} pass${skip ? `, ${skip} skipped` : ''}`;
  };
  $('kernel-count').textContent = count(r.kernels);
  $('pipeline-count').textContent = count(r.pipelines);
  if (r.pipelines.some((p) => p.status === 'fail')) $('pipelines-details').open = true;
  $('selftest-results').hidden = false;
  const badge = $('selftest-status');
  badge.textContent = r.passed ? `passed in ${fmtMs(r.ms)}` : 'FAILED';
  badge.className = `badge ${r.passed ? 'pass' : 'fail'}`;
}


/**
 * Downloads the current settings as a runnable JAX script: the automatic mode's jit with the
 * same shardings, or (in shard_map mode) the same per-device body. It prints one JSON line per
 * step like `shardlab train --json`, and with dropout 0 its losses match shardlab's.
 */
function exportJax() {
  const mode = (state.settings && state.settings.mode) === 'shard_map' ? 'shard_map' : 'auto';
  const r = JSON.parse(lab.export_jax(mode, 20));
  if (!r.ok) return showError(r.error);
  window.shardlab.lastExport = { filename: r.filename, script: r.script };
  const url = URL.createObjectURL(new Blob([r.script], { type: 'text/x-python' }));
  const a = el('a', { href: url, download: r.filename });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

async function copyLink() {
  const url = location.href;
  const box = $('link-box');
  // The link shows at once, selected, so it can be copied by hand: a clipboard that is refused or
  // never answers (no permission, headless, an insecure origin) leaves the person with the link.
  const input = el('input', { readOnly: true, value: url, 'aria-label': 'link to these settings' });
  box.replaceChildren(input);
  box.hidden = false;
  input.select();
  state.lastLink = url;
  try {
    await navigator.clipboard.writeText(url);
    box.append(el('span', { class: 'muted small' }, 'Link copied: it reopens these settings.'));
  } catch {
    // Nothing to add: the link is already shown and selected.
  }
}

async function runSelftest() {
  state.playing = false;
  while (state.driving) await new Promise((r) => setTimeout(r, 50));
  $('selftest-run').disabled = true;
  document.body.dataset.selftest = 'running';
  $('selftest-status').textContent = 'running…';
  try {
    state.report = JSON.parse(await lab.selftest());
    renderReport(state.report);
    const gpuError = lab.take_error();
    if (gpuError) showError(gpuError);
  } finally {
    document.body.dataset.selftest = 'done';
    $('selftest-run').disabled = false;
  }
}

// ---- start ---------------------------------------------------------------------------------

/** The core's preset names and bounds into FIELDS and onto the number inputs; a field the
 * core bounds but the page lacks (or the reverse) is a build mismatch, said at once. */
function applyCoreLimits() {
  FIELDS.preset.values = presets.order;
  for (const [name, { min, max }] of Object.entries(presets.limits)) {
    const f = FIELDS[name];
    if (!f) throw new Error(`the core bounds a setting “${name}” this page does not have`);
    Object.assign(f, { min, max });
    const input = form().elements.namedItem(name);
    if (input && input.type === 'number') Object.assign(input, { min: String(min), max: String(max) });
  }
  const unbounded = Object.entries(FIELDS).filter(([, f]) => ['int', 'float', 'lr'].includes(f.kind) && f.max === undefined);
  if (unbounded.length) throw new Error(`the core sent no bounds for ${unbounded.map(([n]) => n).join(', ')}`);
}

function wireControls() {
  $('device').replaceChildren(...presets.devices.map((d) => el('option', { value: d.name }, d.label)));
  FIELDS.device.values = presets.devices.map((d) => d.name);
  form().addEventListener('change', (e) => {
    const { settings, errors } = readControls();
    showHashNotice(null);
    if (e.target.name === 'preset' && !errors.some((x) => x.field === 'preset')) {
      // A preset sets the model and mesh; the mode and the modelled device stay as chosen.
      // The task and its optimizer stay too.
      const keep = ['mode', 'device', 'task', 'optimizer', 'lr'].filter((k) => !errors.some((x) => x.field === k));
      const s = { ...presets.presets[settings.preset], ...Object.fromEntries(keep.map((k) => [k, settings[k]])) };
      writeControls(s);
      request({ kind: 'configure', settings: s });
      return;
    }
    if (errors.length) {
      // Refused by the page's grammar (the same one links use): said at the control, not run.
      markFieldErrors(errors);
      state.queue = [];
      state.playing = false;
      state.configured = null;
      updateButtons();
      return;
    }
    request({ kind: 'configure', settings });
  });
  $('play').addEventListener('click', () => {
    state.playing = !state.playing;
    updateButtons();
    if (state.playing) drive();
  });
  $('single').addEventListener('click', () => request({ kind: 'step' }));
  $('profile').addEventListener('click', () => request({ kind: 'step', profiled: true }));
  $('export').addEventListener('click', () => exportJax());
  $('copy-link').addEventListener('click', () => copyLink());
  $('reset').addEventListener('click', () => {
    state.playing = false;
    request({ kind: 'reset' });
  });
  const seed = () => ({ ...presets.presets.seed, mode: 'both', device: readControls().settings.device });
  $('story-load').addEventListener('click', () => {
    const s = seed();
    writeControls(s);
    showHashNotice(null);
    request({ kind: 'configure', settings: s });
  });
  $('story-run').addEventListener('click', () => runStory());
  $('scale-up-run').addEventListener('click', () => renderScaleUp());
  $('reproduce').addEventListener('click', () => {
    runStory(seed());
    $('story').scrollIntoView({ behavior: 'smooth', block: 'start' });
  });
  $('selftest-run').addEventListener('click', () => runSelftest().catch(fatal));
  window.addEventListener('hashchange', () => {
    if (location.hash === hashOf(state.settings || {})) return;
    const { settings, problem } = settingsFromHash();
    showHashNotice(problem);
    writeControls(settings);
    request({ kind: 'configure', settings, updateHash: !problem });
  });
  wireInspector();
  editor.init({
    wasm, el, deviceColor, coordText, changeSettings,
    lab: () => lab, settings: () => state.settings, programs: () => state.programs,
    devices: () => (state.programs && state.programs.ok ? state.programs.modes.auto.summary.devices : 1),
  });
}

async function main() {
  // WebGPU first: without it nothing else is loaded.
  if (!window.isSecureContext) {
    return noWebGpu('WebGPU needs a secure context, and this page was not opened in one (plain http on a non-local address).');
  }
  if (!('gpu' in navigator) || !navigator.gpu) return noWebGpu();
  const probe = await navigator.gpu.requestAdapter();
  if (!probe) {
    return noWebGpu('This browser has WebGPU but offers no GPU adapter (the GPU may be blocklisted, or hardware acceleration is off).');
  }

  setState('loading', 'Loading the wasm module…');
  [wasm, uPlot] = await Promise.all([
    import('../pkg/shardlab_web.js'),
    import('./vendor/uplot/uPlot.esm.js').then((m) => m.default).catch(() => null),
  ]);
  await wasm.default();
  $('version').textContent = `shardlab ${wasm.Shardlab.version()}`;
  presets = JSON.parse(wasm.Shardlab.presets());
  applyCoreLimits();

  setState('loading', 'Opening the GPU…');
  lab = await wasm.Shardlab.create();
  // Test hook: loses the GPU device as a driver reset would (issue 10's browser test).
  state.loseDevice = () => lab.lose_device_for_test();
  state.lab = lab;
  state.adapter = JSON.parse(lab.adapter());
  renderAdapter(state.adapter, probe.info);

  // "this GPU" joins the modelled device kinds (web/calibrate.js).
  const thisGpu = setupThisGpu({ wasm, lab, adapter: state.adapter, presets, el });
  wireControls();
  thisGpu.wire($('device'), $('device').closest('label'));
  for (const id of ['controls', 'live', 'story', 'scale-up', 'inspector', 'glossary', 'selftest']) $(id).hidden = false;
  initLearn();
  const { settings, problem } = settingsFromHash();
  showHashNotice(problem);
  writeControls(settings);
  setPhase('idle');
  applySettings(settings, { updateHash: !problem });
  updateButtons();
  setState('ready', 'Ready: press Play');
}

main().catch(fatal);
