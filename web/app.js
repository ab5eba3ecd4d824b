// The page: checks for WebGPU first, then loads the wasm handle (pkg/, built by
// `cargo xtask serve`), and drives it: settings in, steps, programs and summaries out (JSON).
// All model and partitioning logic lives in the wasm; this file renders and keeps the URL hash.
// State for tests: document.body.dataset.state (loading | no-webgpu | ready | error),
// document.body.dataset.selftest (running | done), and window.shardlab.

const $ = (id) => document.getElementById(id);
const state = {
  adapter: null, report: null, error: null, settings: null, configured: null, programs: null,
  last: null, steps: 0, playing: false, busy: false, charts: {}, hashNotice: null,
  story: { ratios: {} },
};
window.shardlab = state;

let lab = null; // the wasm handle
let wasm = null;
let presets = null; // {default, presets: {name: settings}, interconnects: [...]}
const MODES = ['auto', 'shard_map'];
const MODE_LABEL = { auto: 'automatic', shard_map: 'shard_map' };
const MODE_COLOR = { auto: '#4f46e5', shard_map: '#d97706' };
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
    else if (k.startsWith('data-') || k === 'title') e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// ---- errors -------------------------------------------------------------------------------

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
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)] : NaN;
};

// ---- settings, controls and the URL hash ---------------------------------------------------

const FIELDS = {
  preset: { kind: 'enum', values: ['seed', 'dp', 'fsdp', 'tp', 'dp_tp'] },
  mode: { kind: 'enum', values: ['auto', 'shard_map', 'both'] },
  mesh: { kind: 'mesh' },
  layers: { kind: 'int', min: 1, max: 12 },
  d_model: { kind: 'int', min: 1, max: 1024 },
  heads: { kind: 'int', min: 1, max: 64 },
  seq: { kind: 'int', min: 1, max: 512 },
  batch: { kind: 'int', min: 1, max: 512 },
  vocab: { kind: 'int', min: 2, max: 4096 },
  dropout: { kind: 'float', min: 0, max: 0.95 },
  rng: { kind: 'enum', values: ['original', 'partitionable'] },
  dropout_key: { kind: 'enum', values: ['same', 'fold_in'] },
  combine: { kind: 'bool' },
  interconnect: { kind: 'enum', values: [] }, // filled from the core's presets
};

/** One value from its text, or throws a message naming the problem. */
function parseField(name, text) {
  const f = FIELDS[name];
  if (!f) throw new Error(`unknown setting “${name}”`);
  const bad = (why) => new Error(`${name}=“${text.slice(0, 40)}” ${why}`);
  switch (f.kind) {
    case 'enum':
      if (!f.values.includes(text)) throw bad(`is not one of ${f.values.join(', ')}`);
      return text;
    case 'mesh':
      if (!/^[A-Za-z_]\w{0,15}=\d{1,3}(,[A-Za-z_]\w{0,15}=\d{1,3})?$/.test(text)) throw bad('is not a mesh like dp=4 or dp=2,tp=2');
      return text;
    case 'int': {
      if (!/^\d{1,6}$/.test(text)) throw bad('is not a whole number');
      const n = Number(text);
      if (n < f.min || n > f.max) throw bad(`is outside ${f.min}..${f.max}`);
      return n;
    }
    case 'float': {
      if (!/^\d{0,3}(\.\d{1,6})?$/.test(text) || text === '' || text === '.') throw bad('is not a number');
      const x = Number(text);
      if (!(x >= f.min && x <= f.max)) throw bad(`is outside ${f.min}..${f.max}`);
      return x;
    }
    case 'bool':
      if (!['0', '1', 'true', 'false'].includes(text)) throw bad('is not 0 or 1');
      return text === '1' || text === 'true';
    default:
      throw bad('is not understood');
  }
}

function defaultSettings() {
  return { ...presets.presets[presets.default] };
}

/** Settings from the hash, or defaults (with the reason) when the hash is malformed. */
function settingsFromHash() {
  const raw = location.hash.replace(/^#/, '');
  if (!raw) return { settings: defaultSettings(), problem: null };
  try {
    if (raw.length > 1000) throw new Error('it is too long');
    const params = new URLSearchParams(raw);
    const given = {};
    for (const [k, v] of params) {
      if (k in given) throw new Error(`“${k}” appears twice`);
      given[k] = parseField(k, v);
    }
    const base = presets.presets[given.preset || presets.default];
    return { settings: { ...base, ...given }, problem: null };
  } catch (e) {
    return { settings: defaultSettings(), problem: e.message };
  }
}

function hashOf(s) {
  const p = new URLSearchParams();
  for (const k of Object.keys(FIELDS)) p.set(k, k === 'combine' ? (s[k] ? '1' : '0') : String(s[k]));
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
    else input.value = String(s[k]);
  }
}

function readControls() {
  const f = form();
  const s = {};
  for (const k of Object.keys(FIELDS)) {
    const input = f.elements[k];
    if (input.type === 'checkbox') s[k] = input.checked;
    else if (FIELDS[k].kind === 'int') s[k] = Number.parseInt(input.value, 10);
    else if (FIELDS[k].kind === 'float') s[k] = Number.parseFloat(input.value);
    else s[k] = input.value;
  }
  return s;
}

function markFieldErrors(errors) {
  for (const old of form().querySelectorAll('.field-error')) old.remove();
  for (const old of form().querySelectorAll('.invalid')) old.classList.remove('invalid');
  for (const e of errors) {
    const input = e.field && form().elements[e.field];
    const label = input ? input.closest('label') : form().querySelector('label');
    if (input) input.classList.add('invalid');
    label.after(el('p', { class: 'field-error', 'data-testid': 'field-error', 'data-field': e.field || '' }, e.message));
  }
}

// ---- configure and train ------------------------------------------------------------------

function applySettings(s, { updateHash = true } = {}) {
  state.playing = false;
  // Non-numbers would fail serde's parse with a message about JSON; say it in the page's terms.
  for (const k of Object.keys(FIELDS)) {
    if (['int', 'float'].includes(FIELDS[k].kind) && !Number.isFinite(s[k])) {
      markFieldErrors([{ field: k, message: `${k} must be a number` }]);
      state.configured = null;
      updateButtons();
      return false;
    }
  }
  const r = JSON.parse(lab.configure(JSON.stringify(s)));
  state.settings = s;
  if (updateHash) history.replaceState(null, '', hashOf(s));
  if (!r.ok) {
    state.configured = null;
    markFieldErrors(r.errors);
    showError(r.errors.map((e) => (e.field ? `${e.field}: ${e.message}` : e.message)).join('\n'),
      'This combination cannot run; the control it concerns is marked in the settings.');
    updateButtons();
    return false;
  }
  markFieldErrors([]);
  clearError();
  state.configured = r;
  resetView();
  state.programs = JSON.parse(lab.programs());
  renderPrograms(state.programs);
  renderStory();
  $('run-facts').textContent = `${r.devices} simulated devices · ${fmtInt(r.params)} parameters · ${fmtInt(r.tokens_per_step)} tokens per step · AdamW, copy task`;
  $('modelled-n').textContent = String(r.devices);
  $('modelled-net').textContent = r.interconnect.label;
  updateButtons();
  return true;
}

function resetView() {
  state.steps = 0;
  state.last = null;
  state.history = { step: [], measured: { auto: [], shard_map: [] }, modelled: { auto: [], shard_map: [] }, loss: { auto: [], shard_map: [] } };
  $('step').textContent = '0';
  for (const id of ['step-ms', 'loss', 'tokens-per-s']) $(id).textContent = '—';
  $('breakdown').hidden = true;
  makeCharts();
}

async function stepOnce(profiled = false) {
  if (state.busy || !state.configured) return false;
  state.busy = true;
  updateButtons();
  try {
    const r = JSON.parse(await (profiled ? lab.step_profiled() : lab.step()));
    if (!r.ok) {
      state.playing = false;
      showError(r.error);
      return false;
    }
    const gpuError = lab.take_error();
    if (gpuError) {
      state.playing = false;
      showError(gpuError);
      return false;
    }
    record(r);
    return true;
  } finally {
    state.busy = false;
    updateButtons();
  }
}

function record(r) {
  state.last = r;
  state.steps = r.step + 1;
  const h = state.history;
  h.step.push(r.step);
  for (const m of MODES) {
    const s = r.modes[m];
    // A profiled step waits after every phase: its time is not a step time, so it is not charted.
    h.measured[m].push(s && !s.profiled ? s.step_ms : null);
    h.modelled[m].push(s && !s.profiled ? s.modelled_ms : null);
    // The loss a profiled step reads back is not reliable in automatic mode (the step re-runs
    // forward and backward under timestamp queries): it is neither charted nor shown.
    h.loss[m].push(s && !s.profiled ? s.loss : null);
  }
  const ran = MODES.filter((m) => r.modes[m]);
  const per = (id, f) => $(id).replaceChildren(...ran.map((m) =>
    el('span', { 'data-mode': m }, ran.length > 1 ? `${MODE_LABEL[m]} ${f(r.modes[m])}` : f(r.modes[m]))));
  $('step').textContent = String(state.steps);
  per('step-ms', (s) => fmtMs(s.step_ms));
  per('loss', (s) => (s.profiled ? '— (profiled step)' : s.loss.toFixed(4)));
  per('tokens-per-s', (s) => fmtRate(s.tokens_per_s));
  updateCharts();
  renderStory();
  if (ran.some((m) => r.modes[m].breakdown)) renderBreakdown(r);
}

function renderBreakdown(r) {
  const ran = MODES.filter((m) => r.modes[m] && r.modes[m].breakdown);
  const b = (m) => r.modes[m].breakdown;
  const cats = ['matmul', 'attention', 'rng', 'collectives', 'optimizer', 'other'];
  const row = (label, f) => el('tr', {}, el('th', {}, label), ran.map((m) => el('td', { class: 'num' }, f(b(m)))));
  const rows = [
    ...['forward', 'backward', 'update'].map((p) => row(`${p} (wall)`, (x) => fmtMs(x.phases_ms[p]))),
    ...cats.map((c) => row(c, (x) => (x.categories_ms ? fmtMs(x.categories_ms[c]) : '—'))),
  ];
  const noTimestamps = ran.some((m) => !b(m).categories_ms);
  const box = $('breakdown');
  box.replaceChildren(...[
    el('h3', {}, el('span', { class: 'tag measured' }, 'measured'), ` where step ${r.step + 1}'s time went`),
    el('table', { class: 'compact' }, el('thead', {}, el('tr', {}, el('th'), ran.map((m) => el('th', { class: 'num' }, MODE_LABEL[m])))),
      el('tbody', {}, rows)),
    noTimestamps ? el('p', { class: 'muted small' }, 'Per-category times need timestamp queries, which this adapter lacks or reports implausibly; the phases are wall times.') : null,
  ].filter(Boolean));
  box.hidden = false;
}

async function playLoop() {
  while (state.playing) {
    const ok = await stepOnce();
    if (!ok) break;
    // Give the page a frame between steps so input and painting stay responsive.
    await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  }
  state.playing = false;
  updateButtons();
}

function updateButtons() {
  const ready = !!state.configured;
  $('play').textContent = state.playing ? '❚❚ Pause' : '▶ Play';
  $('play').disabled = !ready;
  $('single').disabled = !ready || state.busy || state.playing;
  $('profile').disabled = !ready || state.busy || state.playing;
  $('run-state').textContent = state.playing ? 'training' : state.busy ? 'stepping' : 'paused';
  $('run-state').className = `badge ${state.playing ? 'pass' : ''}`;
}

// ---- charts (uPlot, vendored from npm by xtask) --------------------------------------------

function makeCharts() {
  for (const c of Object.values(state.charts)) c.destroy?.();
  state.charts = {};
  if (!uPlot) {
    for (const id of ['chart-measured', 'chart-modelled', 'chart-loss']) {
      $(id).replaceChildren(el('p', { class: 'muted small' }, 'The chart library (uPlot) was not found: run `npm ci` in tests/browser and rebuild.'));
    }
    return;
  }
  const css = getComputedStyle(document.documentElement);
  const axisColor = css.getPropertyValue('--muted').trim() || '#5d6673';
  const gridColor = css.getPropertyValue('--line').trim() || '#e1e4e8';
  const make = (id, key, unit, label) => {
    const box = $(id);
    box.replaceChildren();
    const width = Math.max(260, box.clientWidth || 320);
    const opts = {
      width, height: 170,
      legend: { show: true },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: false } },
      axes: [
        { stroke: axisColor, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000], grid: { stroke: gridColor, width: 1 }, ticks: { stroke: gridColor } },
        { stroke: axisColor, grid: { stroke: gridColor, width: 1 }, ticks: { stroke: gridColor }, size: 56 },
      ],
      series: [
        { label: 'step' },
        ...MODES.map((m) => ({ label: `${MODE_LABEL[m]} (${label})`, stroke: MODE_COLOR[m], width: 2, spanGaps: true,
          value: (u, v) => (v == null ? '—' : `${v.toFixed(unit === 'ms' ? 2 : 4)}${unit ? ` ${unit}` : ''}`) })),
      ],
    };
    const chart = new uPlot(opts, [[], [], []], box);
    chart.key = key;
    state.charts[key] = chart;
  };
  make('chart-measured', 'measured', 'ms', 'measured');
  make('chart-modelled', 'modelled', 'ms', 'modelled');
  make('chart-loss', 'loss', '', 'loss');
}

function updateCharts() {
  const h = state.history;
  for (const [key, chart] of Object.entries(state.charts)) {
    chart.setData([h.step, h[key].auto, h[key].shard_map]);
  }
}

window.addEventListener('resize', () => {
  for (const c of Object.values(state.charts)) {
    const box = c.root.parentElement;
    if (box && box.clientWidth) c.setSize({ width: box.clientWidth, height: 170 });
  }
});

// ---- program inspector ---------------------------------------------------------------------

function collectiveTable(summary) {
  const rows = Object.entries(summary.collectives).filter(([, t]) => t.count > 0);
  if (!rows.length) return el('p', { class: 'muted small' }, 'no collectives');
  return el('table', { class: 'compact' },
    el('thead', {}, el('tr', {}, el('th', {}, 'collective'), el('th', { class: 'num' }, 'ops'), el('th', { class: 'num' }, 'arrays'), el('th', { class: 'num' }, 'bytes'))),
    el('tbody', {}, rows.map(([kind, t]) => el('tr', { 'data-testid': 'collective-row', 'data-kind': kind },
      el('td', {}, el('mark', { class: 'collective' }, kind)), el('td', { class: 'num' }, t.count),
      el('td', { class: 'num' }, t.operands), el('td', { class: 'num' }, fmtBytes(t.bytes))))));
}

function layoutPicture(layout, devices) {
  // Which device holds which block, as jax.debug.visualize_array_sharding draws a 1D or 2D array.
  const shape = layout.shape;
  const dims = shape.length >= 2 ? [shape.length - 2, shape.length - 1] : [0];
  const rowsOf = (d) => (dims.length === 2 ? layout.blocks[d][dims[0]] : [0, 1]);
  const colsOf = (d) => layout.blocks[d][dims[dims.length - 1]];
  const rowCuts = [...new Set(layout.blocks.map((b, d) => rowsOf(d)[0]))].sort((a, b) => a - b);
  const colCuts = [...new Set(layout.blocks.map((b, d) => colsOf(d)[0]))].sort((a, b) => a - b);
  const grid = el('div', { class: 'blocks', title: `${layout.name}: ${layout.spec}` });
  grid.style.gridTemplateColumns = `repeat(${colCuts.length}, 1fr)`;
  for (const r of rowCuts) {
    for (const c of colCuts) {
      const holders = [...Array(devices).keys()].filter((d) => rowsOf(d)[0] === r && colsOf(d)[0] === c);
      grid.append(el('span', { class: 'block' }, holders.length === devices ? 'all' : holders.join(',')));
    }
  }
  return el('div', { class: 'layout' }, el('code', {}, `${layout.name} [${shape.join(',')}]`), el('span', { class: 'muted small' }, layout.spec), grid);
}

function renderPane(box, view, running) {
  const s = view.summary;
  const lines = view.text.split('\n');
  const marks = new Map(view.marks.map((m) => [m.line, m]));
  const code = el('pre', { class: 'program', 'data-testid': 'program-text' });
  lines.forEach((line, i) => {
    const m = marks.get(i);
    if (!m) {
      code.append(`${line}\n`);
      return;
    }
    const why = m.inserted ? `inserted for ${m.inserted.source_op} of ${m.inserted.value}: ${m.inserted.rule}` : undefined;
    code.append(el('span', { class: `line ${m.kind}`, 'data-kind': m.kind, 'data-op': m.op, title: why }, line), '\n');
  });
  const inserted = view.inserted
    ? el('details', { class: 'inserted-list', 'data-testid': 'inserted' },
      el('summary', {}, `ops the partitioner inserted (${view.inserted.length})`),
      el('ol', {}, view.inserted.map((r) => el('li', {}, el('code', {}, `[${r.instr}] ${r.op}`), ` of ${r.value} for ${r.source_op}`,
        r.source_instr != null ? ` (#${r.source_instr})` : '', el('div', { class: 'muted small' }, r.rule)))))
    : el('p', { class: 'muted small' }, 'shard_map: every collective is written in the body by hand.');
  const mem = s.peak_bytes_per_device;
  const warnings = s.warnings.map((w) => el('p', { class: 'warning', 'data-testid': 'warning' }, `⚠ ${w}`));
  const layouts = el('details', { class: 'layouts' }, el('summary', {}, 'which device holds which block'),
    el('div', { class: 'layout-grid' }, view.layouts.map((l) => layoutPicture(l, s.devices))));
  box.replaceChildren(
    el('h3', {}, `${MODE_LABEL[view.mode]}${running ? '' : ' (not running in this mode)'}`),
    el('dl', { class: 'facts compact' },
      el('dt', {}, 'random bits per device'), el('dd', { 'data-testid': 'rng-bits' }, fmtInt(s.rng_bits_per_device)),
      el('dt', {}, 'memory per device'), el('dd', {}, `${fmtBytes(mem.total)} (params ${fmtBytes(mem.params)}, optimizer ${fmtBytes(mem.optimizer_state)}, activations ${fmtBytes(mem.activations)})`),
      el('dt', {}, 'FLOPs per device'), el('dd', {}, s.flops_per_device.toExponential(2)),
      el('dt', {}, 'instructions'), el('dd', {}, fmtInt(s.instructions))),
    collectiveTable(s), ...warnings, inserted, layouts, code);
  // Open the text at its first highlighted line: the parameters above it are all alike.
  const first = code.querySelector('.line');
  if (first) requestAnimationFrame(() => { code.scrollTop = Math.max(0, first.offsetTop - code.offsetTop - 40); });
}

function renderPrograms(p) {
  if (!p.ok) return showError(p.error);
  const running = state.configured ? state.configured.modes : [];
  renderPane($('program-auto'), p.modes.auto, running.includes('auto'));
  renderPane($('program-shard-map'), p.modes.shard_map, running.includes('shard_map'));
}

// ---- the seed story ------------------------------------------------------------------------

function renderStory() {
  const ol = $('story-steps');
  const p = state.programs;
  const s = state.settings;
  if (!p || !p.ok || !s) return;
  const a = p.modes.auto.summary;
  const m = p.modes.shard_map.summary;
  const h = state.history || { measured: { auto: [], shard_map: [] } };
  // Medians of the measured step times after the first two steps (pipeline warm-up).
  const recent = (xs) => xs.slice(2).filter((x) => x != null);
  const am = median(recent(h.measured.auto));
  const sm = median(recent(h.measured.shard_map));
  const haveGap = Number.isFinite(am) && Number.isFinite(sm);
  if (haveGap) state.story.ratios[s.rng] = am / sm;
  const ar = a.collectives['all-reduce'].count;
  const sr = m.collectives['all-reduce'].count;
  const button = (label, change) => el('button', { type: 'button', class: 'inline', onclick: () => {
    const next = { ...readControls(), ...change };
    writeControls(next);
    applySettings(next);
  } }, label);
  const ratioText = (rng) => (state.story.ratios[rng] ? `${state.story.ratios[rng].toFixed(2)}×` : 'not measured yet');
  const steps = [
    el('li', {}, el('strong', {}, 'The gap. '),
      haveGap
        ? `On your GPU the automatic step takes ${fmtMs(am)} and the shard_map step ${fmtMs(sm)} (medians, measured): automatic is ${(am / sm).toFixed(2)}× the shard_map time.`
        : s.mode === 'both' ? 'Press Play: both modes train, one step of each in turn, and their measured step times appear here after a few steps.'
          : button('Switch to both modes', { mode: 'both' }), ' ',
      el('span', { class: 'muted' }, '(The JAX report: 2.7× on a TPU v4-8.)')),
    el('li', {}, el('strong', {}, 'Not the all-reduces. '),
      `The automatic program issues ${ar} all-reduce${ar === 1 ? '' : 's'}, shard_map ${sr}: the slower program does not have more of them.`,
      s.combine ? ' (All-reduce combining is on.)' : ' ', s.combine ? '' : button('Combine all-reduces', { combine: true })),
    el('li', {}, el('strong', {}, 'The cause: random bits. '),
      `Each device generates ${fmtInt(a.rng_bits_per_device)} random bits per step in automatic mode and ${fmtInt(m.rng_bits_per_device)} in shard_map`,
      m.rng_bits_per_device > 0 ? ` (${(a.rng_bits_per_device / m.rng_bits_per_device).toFixed(1)}×). ` : '. ',
      s.rng === 'original'
        ? 'With the original Threefry layout no device can make its own block, so the partitioner has every device generate the whole global array and slice its part: the lines marked in the automatic program below.'
        : 'With the partitionable layout each device makes only its block.'),
    el('li', {}, el('strong', {}, 'The flag. '),
      `jax_threefry_partitionable (the RNG layout here) is now ${s.rng === 'partitionable' ? 'True' : 'False'}. Measured ratio automatic/shard_map: original ${ratioText('original')}, partitionable ${ratioText('partitionable')}. `,
      button(s.rng === 'original' ? 'Flip to partitionable' : 'Back to original', { rng: s.rng === 'original' ? 'partitionable' : 'original' })),
    el('li', {}, el('strong', {}, 'The same-key caveat. '),
      m.warnings.length ? `${m.warnings.join(' ')} ` : s.dropout === 0 ? 'Dropout is off, so no masks are drawn. ' : 'Each device now draws its own dropout mask. ',
      s.dropout_key === 'same' ? button('Use fold_in', { dropout_key: 'fold_in' }) : button('Back to the same key', { dropout_key: 'same' })),
  ];
  ol.replaceChildren(...steps);
}

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
  const mode = readControls().mode === 'shard_map' ? 'shard_map' : 'auto';
  const r = JSON.parse(lab.export_jax(mode, 20));
  if (!r.ok) return showError(r.error);
  clearError();
  window.shardlab.lastExport = { filename: r.filename, script: r.script };
  const url = URL.createObjectURL(new Blob([r.script], { type: 'text/x-python' }));
  const a = el('a', { href: url, download: r.filename });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

async function runSelftest() {
  state.playing = false;
  while (state.busy) await new Promise((r) => setTimeout(r, 50));
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

function wireControls() {
  const ics = $('interconnect');
  ics.replaceChildren(...presets.interconnects.map((n) => el('option', { value: n.name }, n.label)));
  FIELDS.interconnect.values = presets.interconnects.map((n) => n.name);
  form().addEventListener('change', (e) => {
    let s = readControls();
    if (e.target.name === 'preset') {
      // A preset sets the model and mesh; the mode and interconnect stay as chosen.
      s = { ...presets.presets[s.preset], mode: s.mode, interconnect: s.interconnect };
      writeControls(s);
    }
    showHashNotice(null);
    applySettings(s);
  });
  $('play').addEventListener('click', () => {
    state.playing = !state.playing;
    updateButtons();
    if (state.playing) playLoop();
  });
  $('single').addEventListener('click', () => stepOnce());
  $('profile').addEventListener('click', () => stepOnce(true));
  $('export').addEventListener('click', () => exportJax());
  $('reset').addEventListener('click', async () => {
    state.playing = false;
    while (state.busy) await new Promise((r) => setTimeout(r, 20));
    const r = JSON.parse(await lab.reset());
    if (!r.ok) return showError(r.error);
    clearError();
    // A fresh run from the controls' settings (also after an error or a lost device).
    applySettings(readControls());
  });
  $('story-load').addEventListener('click', () => {
    const s = { ...presets.presets.seed, mode: 'both', interconnect: readControls().interconnect };
    writeControls(s);
    applySettings(s);
  });
  $('selftest-run').addEventListener('click', () => runSelftest().catch(fatal));
  window.addEventListener('hashchange', () => {
    if (location.hash === hashOf(state.settings || {})) return;
    const { settings, problem } = settingsFromHash();
    showHashNotice(problem);
    writeControls(settings);
    applySettings(settings, { updateHash: !problem });
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

  setState('loading', 'Opening the GPU…');
  lab = await wasm.Shardlab.create();
  state.adapter = JSON.parse(lab.adapter());
  renderAdapter(state.adapter, probe.info);

  wireControls();
  for (const id of ['controls', 'live', 'story', 'inspector', 'selftest']) $(id).hidden = false;
  const { settings, problem } = settingsFromHash();
  showHashNotice(problem);
  writeControls(settings);
  applySettings(settings, { updateHash: !problem });
  setState('ready', 'Ready: press Play');
}

main().catch(fatal);
