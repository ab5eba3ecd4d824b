// The program inspector: both modes' per-device programs side by side, aligned op by op, with
// collectives and replicated random-bit generation highlighted and explained (hover, focus or tap
// an op), their summaries (collectives, random bits, memory, FLOPs) and which device holds which
// block of each parameter. Split out of app.js: it renders what it is given (the wasm's programs
// answer, the running modes and the mesh) and holds none of the run's state (only which op the
// popover is pinned to). The device colours and coordinates are exported for the sharding editor.

import { $, el } from './dom.js';
import { MODES, MODE_LABEL, fmtBytes, fmtFlops, fmtInt, pageWords, sentence } from './format.js';

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
export const coordText = (d, axes) => deviceCoords(d, axes).map(([n, i]) => `${n}=${i}`).join(', ');
const PALETTE = ['#4f46e5', '#d97706', '#059669', '#db2777', '#0891b2', '#7c3aed', '#65a30d', '#dc2626'];
export const deviceColor = (d, n) => (n <= PALETTE.length ? PALETTE[d] : `hsl(${Math.round((360 * d) / n)} 65% 45%)`);
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
  if (m.recomputed) {
    parts.push('Recomputed in the backward pass: the block runs under jax.checkpoint, so instead of holding this value from the forward pass, the backward makes it again from what the remat policy saved (the same inputs and keys give the same bits).');
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
    class: `line ${mark.kind}${mark.recomputed ? ' recomputed' : ''}`, 'data-kind': mark.kind, 'data-op': mark.op, tabIndex: 0,
    'data-explain': explanation(mark, mode), 'aria-describedby': 'explain',
  }, parts);
}

function renderAligned(views) {
  // A mode the core could not plan has no text: its column is all gaps.
  const texts = MODES.map((m) => (views[m] ? views[m].text.split('\n').filter((l, i, all) => i < all.length - 1 || l !== '') : []));
  const marks = MODES.map((m) => new Map(views[m] ? views[m].marks.map((k) => [k.line, k]) : []));
  const rows = align(texts[0].map(lineKey), texts[1].map(lineKey))
    || [...Array(Math.max(texts[0].length, texts[1].length)).keys()].map((i) => [i < texts[0].length ? i : null, i < texts[1].length ? i : null]);
  const cell = (k, i) => {
    const mode = MODES[k];
    if (i === null) return el('td', { class: 'src gap', 'data-mode': mode });
    const line = texts[k][i];
    const td = el('td', { class: 'src', 'data-mode': mode, 'data-line': String(i) }, renderLine(mode, line, marks[k].get(i)));
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
      el('dt', {}, 'memory per device'), el('dd', {}, `${fmtBytes(mem.total)} (params ${fmtBytes(mem.params)}, optimizer ${fmtBytes(mem.optimizer_state)}, gradients ${fmtBytes(mem.gradients)}, activations ${fmtBytes(mem.activations)})`),
      el('dt', {}, 'compute per device'), el('dd', { 'data-testid': 'flops' }, fmtFlops(s.flops_per_device)),
      el('dt', {}, 'instructions'), el('dd', {}, fmtInt(s.instructions))),
    collectiveTable(s), ...warnings, inserted, layouts);
}

/**
 * Both per-device programs (a planned `p`, with `ok`), side by side with their summaries; `running`
 * names the modes this run trains, `mesh` is the settings' mesh text ("dp=2,tp=2").
 */
/** Each mode's text line of its first instruction (instruction i is on line first + i). */
const firstInstrLine = {};

/**
 * Shows instruction `instr` of `mode`'s program in the aligned text (the timeline's spans select
 * their op this way): scrolled to, flashed and focused. False when the text does not have it.
 */
let jumped = false;

export function selectInstr(mode, instr) {
  const first = firstInstrLine[mode];
  if (first === undefined) return false;
  const td = $('program-aligned').querySelector(`td.src[data-mode="${mode}"][data-line="${first + instr}"]`);
  if (!td) return false;
  for (const old of $('program-aligned').querySelectorAll('td.selected')) old.classList.remove('selected');
  td.classList.add('selected');
  td.tabIndex = -1;
  td.scrollIntoView({ block: 'center' });
  // The pointer stays where it pressed: the lines scrolled under it are not hovered (no box
  // over the selected line) until it moves.
  jumped = true;
  $('explain').hidden = true;
  td.focus({ preventScroll: true });
  td.classList.remove('flash');
  void td.offsetWidth;
  td.classList.add('flash');
  return true;
}

/** A mode's pane when the core could not plan the settings in it: its refusal, in its words. */
function renderRefused(box, mode, why) {
  box.replaceChildren(
    el('h3', {}, `${MODE_LABEL[mode]} (not planned)`),
    el('p', { class: 'field-error', 'data-testid': 'program-refused', 'data-mode': mode }, sentence(why)));
}

/**
 * Explicit mode's pane, shown when it runs: its facts as the other panes give them, then the
 * global program typed op by op as `shardlab inspect --mode explicit` prints it (each value's
 * type, `f32[8@dp,128]`; the lines that write `out_sharding=` or `reshard` marked).
 */
function renderExplicit(box, view, axes) {
  box.hidden = !view;
  if (!view) return box.replaceChildren();
  const facts = el('div');
  renderPane(facts, view, true, axes);
  const x = view.explicit;
  const line = (l) => el('div', { class: l.choice === null ? 'typed-line' : 'typed-line choice', 'data-testid': 'typed-line' }, l.text);
  box.replaceChildren(facts,
    el('p', { class: 'muted small' }, `The global program as explicit mode types it, every value with its sharding (mesh axes ${x.axis_types}); marked lines write the program’s `,
      el('code', {}, 'out_sharding='), ' and ', el('code', {}, 'reshard'), ' choices.'),
    el('pre', { class: 'typed-program', 'data-testid': 'typed-program', tabIndex: 0 }, x.lines.map(line)));
}

export function renderPrograms(p, { running, mesh }) {
  for (const m of MODES) firstInstrLine[m] = p.modes[m] ? p.modes[m].first_instr_line : undefined;
  const axes = meshAxes(mesh);
  const devices = p.modes[MODES.find((m) => p.modes[m])].summary.devices;
  $('device-legend').replaceChildren(deviceLegend(devices, axes));
  for (const [m, id] of [['auto', 'program-auto'], ['shard_map', 'program-shard-map']]) {
    if (p.modes[m]) renderPane($(id), p.modes[m], running.includes(m), axes);
    else renderRefused($(id), m, p.refused[m]);
  }
  renderExplicit($('program-explicit'), p.modes.explicit, axes);
  $('program-aligned').replaceChildren(renderAligned(p.modes));
}

// The explanation popover: the same words on hover, keyboard focus and tap.
export function wireInspector() {
  const tip = $('explain');
  let pinned = null;
  const show = (target) => {
    tip.textContent = target.dataset.explain;
    tip.hidden = false;
    const r = target.getBoundingClientRect();
    tip.style.left = `${Math.max(8, Math.min(window.scrollX + r.left, window.scrollX + document.documentElement.clientWidth - tip.offsetWidth - 8))}px`;
    // Below the op, or above it where below would cover the selected line.
    const sel = $('program-aligned').querySelector('td.selected');
    const s = sel && !sel.contains(target) ? sel.getBoundingClientRect() : null;
    const below = r.bottom + 6;
    const covers = s && below < s.bottom && below + tip.offsetHeight > s.top;
    tip.style.top = `${window.scrollY + (covers ? r.top - 6 - tip.offsetHeight : below)}px`;
  };
  const hide = () => {
    if (!pinned) tip.hidden = true;
  };
  const box = $('program-aligned');
  document.addEventListener('mousemove', () => {
    jumped = false;
  });
  box.addEventListener('mouseover', (e) => {
    const t = e.target.closest('[data-explain]');
    if (t && !jumped) show(t);
  });
  box.addEventListener('mouseout', (e) => {
    if (e.target.closest('[data-explain]')) hide();
  });
  box.addEventListener('focusin', (e) => {
    // The jump's own focus on the selected line opens no box; a focus the learner moves does.
    if (e.target.closest('td.selected') && jumped) return;
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
