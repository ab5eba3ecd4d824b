// The sharding editor (automatic mode's PartitionSpecs per parameter group, per block and for the
// token batch), with_sharding_constraint from the inspector, the sharding picture of any named
// value, and the mesh diagram of the selected collective. Every name, check and block layout is
// the wasm's (the core's parser and NamedSharding); this module only renders and reads fields.
// Specs live in settings.specs ({name: "P(None, 'tp')"}) and in the hash as spec.NAME=P(...).

import { pageWords } from './format.js';

let api = null; // {wasm, lab(), el, deviceColor, coordText, changeSettings, settings(), programs(), devices()}
let groups = null; // the last editor::groups answer
let groupsKey = '';
let constraints = {}; // intermediates' with_sharding_constraints, {name: spec}
let selected = null; // {mode, name} of the pictured value
let pending = null; // the automatic program before a spec edit: {param, collectives, step_ms}

const PREFIX = 'spec.';
const $ = (id) => document.getElementById(id);
const fieldNames = () => (groups && groups.ok
  ? new Set([groups.batch.name, ...groups.groups.flatMap((g) => [g.name, ...g.layers.map((l) => l.name)])])
  : new Set());

export function init(hooks) {
  api = hooks;
  $('spec-reset').addEventListener('click', () => {
    constraints = {};
    for (const input of document.querySelectorAll('#spec-fields input')) input.value = '';
    api.changeSettings({ specs: {} });
  });
  const box = $('spec-fields');
  box.addEventListener('input', (e) => {
    const input = e.target.closest('input[data-spec]');
    if (input) explainField(input);
  });
  // Before the page re-plans (its handler is on an ancestor): what the edit will be compared to.
  box.addEventListener('change', (e) => {
    const input = e.target.closest('input[data-spec]');
    const before = input && automatic();
    pending = before ? { param: input.dataset.param, ...before } : null;
  });
  $('program-aligned').addEventListener('click', (e) => {
    if (e.target.closest('a.ssa')) return;
    const td = e.target.closest('td.src');
    if (td && !td.classList.contains('gap')) pickLine(td);
  });
  $('constraints').addEventListener('click', (e) => {
    const b = e.target.closest('button[data-remove]');
    if (!b) return;
    const specs = { ...(api.settings().specs || {}) };
    delete specs[b.dataset.remove];
    delete constraints[b.dataset.remove];
    api.changeSettings({ specs });
  });
}

/** The hash's spec entries, sorted so a link is stable: spec.w_fc=P(None, 'tp'). */
export function writeHash(params, s) {
  for (const [name, spec] of Object.entries(s.specs || {}).sort(([a], [b]) => (a < b ? -1 : 1))) {
    params.set(PREFIX + name, spec);
  }
}

export const isSpecKey = (k) => k.startsWith(PREFIX);

/** The specs of a link, each checked by the core against the link's other settings: the valid
 * ones (`specs`), and for each refused one its text (`bad`, by control name) and error. */
export function readHash(settings, raw) {
  const specs = {};
  const bad = {};
  const errors = [];
  for (const [k, text] of Object.entries(raw)) {
    const name = k.slice(PREFIX.length);
    const r = JSON.parse(api.wasm.Shardlab.check_spec(JSON.stringify({ ...settings, specs: {} }), name, text));
    if (r.ok) specs[name] = r.spec;
    else {
      bad[k] = text;
      errors.push({ field: k, message: r.error });
    }
  }
  return { specs, bad, errors };
}

/** The fields for the settings `s` (rebuilt when the parameters or mesh change), set to its specs. */
export function write(s) {
  const specs = s.specs || {};
  const answer = JSON.parse(api.wasm.Shardlab.spec_groups(JSON.stringify({ ...s, specs })));
  const key = JSON.stringify([answer.ok && answer.groups, answer.ok && answer.batch, answer.error]);
  groups = answer;
  if (key !== groupsKey) {
    groupsKey = key;
    build();
  }
  const names = fieldNames();
  constraints = Object.fromEntries(Object.entries(specs).filter(([n]) => !names.has(n)));
  for (const input of document.querySelectorAll('#spec-fields input[data-spec]')) {
    input.value = specs[input.dataset.param] || '';
    // Checked against the settings being written: the page's own may not be applied yet.
    explainField(input, s);
  }
  renderConstraints();
}

/** The fields' specs (checked by the core) and, for each field it refuses, its error. With
 * `skipChecks` (another setting is already refused), the texts are kept as typed. */
export function read(s, skipChecks) {
  const specs = { ...constraints };
  const errors = [];
  for (const input of document.querySelectorAll('#spec-fields input[data-spec]')) {
    const text = input.value.trim();
    if (!text) continue;
    const name = input.dataset.param;
    if (skipChecks) {
      specs[name] = text;
      continue;
    }
    const r = check(s, name, text);
    if (r.ok) specs[name] = r.spec;
    else {
      specs[name] = text;
      // Marked at the field, which names the value already.
      errors.push({ field: input.name, message: r.error });
    }
  }
  return { specs, errors };
}

const check = (s, name, text) => JSON.parse(api.wasm.Shardlab.check_spec(JSON.stringify({ ...s, specs: {} }), name, text));

/** Validates a field as it is typed: the reason appears at the field. */
function explainField(input, s = api.settings()) {
  const reason = input.closest('.spec-field').querySelector('.spec-reason');
  const text = input.value.trim();
  const r = text && s ? check(s, input.dataset.param, text) : { ok: true };
  input.classList.toggle('invalid', !r.ok);
  reason.textContent = r.ok ? '' : pageWords(r.error);
  reason.hidden = r.ok;
}

function field(name, shape, placeholder, testid, listId) {
  const { el } = api;
  const input = el('input', { name: PREFIX + name, 'data-spec': '', 'data-param': name, 'data-testid': testid, autocomplete: 'off', placeholder });
  // Attributes without a writable property of the same name.
  input.setAttribute('list', listId);
  input.setAttribute('spellcheck', 'false');
  return el('div', { class: 'spec-field' },
    el('label', {}, el('code', {}, name), el('span', { class: 'muted small' }, ` [${shape.join(',')}]`), input),
    el('span', { class: 'spec-reason', 'data-testid': 'spec-reason', 'data-param': name, 'aria-live': 'polite', hidden: true }),
    el('span', { class: 'spec-effect small', 'data-testid': 'spec-effect', 'data-param': name, 'aria-live': 'polite', hidden: true }));
}

function build() {
  const { el } = api;
  const box = $('spec-fields');
  if (!groups.ok) {
    box.replaceChildren(el('p', { class: 'muted small' }, `Fix the mesh to edit shardings: ${groups.error}`));
    return;
  }
  const list = (id, options) => el('datalist', { id }, options.map((o) => el('option', { value: o })));
  const rows = groups.groups.map((g) => {
    const listId = `spec-options-${g.name}`;
    const layers = g.layers.length
      ? el('details', { class: 'spec-layers' }, el('summary', { class: 'small' }, `per block (${g.layers.length})`),
        g.layers.map((l) => field(l.name, g.shape, `as ${g.name}`, 'spec-input', listId)))
      : null;
    return el('div', { class: 'spec-row' }, field(g.name, g.shape, `${g.preset} (preset)`, 'spec-input', listId), list(listId, g.options), layers);
  });
  const b = groups.batch;
  rows.push(el('div', { class: 'spec-row' }, field(b.name, b.shape, `${b.preset} (preset)`, 'spec-input', 'spec-options-tokens'),
    list('spec-options-tokens', b.options)));
  box.replaceChildren(...rows);
  $('spec-axes').textContent = `mesh axes: ${groups.axes.map(([a, n]) => `'${a}' (${n})`).join(', ')}`;
}

function renderConstraints() {
  const { el } = api;
  const entries = Object.entries(constraints);
  $('constraints').replaceChildren(...(entries.length
    ? [el('p', { class: 'small' }, 'with_sharding_constraint on:'), el('ul', {}, entries.map(([n, s]) => el('li', { 'data-testid': 'constraint', 'data-name': n },
      el('code', {}, `jax.lax.with_sharding_constraint(${n}, ${s})`), ' ',
      el('button', { type: 'button', class: 'small', 'data-remove': n, 'data-testid': 'constraint-remove' }, 'remove'))))]
    : [el('p', { class: 'muted small' }, 'No with_sharding_constraint: click a value in the automatic program to add one.')]));
}

/** The automatic program's collectives (count per kind) and its modelled step, or null. */
function automatic() {
  const p = api.programs();
  const pr = api.prediction();
  if (!p || !p.ok || !p.modes.auto || !pr || !pr.modes.auto) return null;
  const counts = Object.fromEntries(Object.entries(p.modes.auto.summary.collectives).map(([k, t]) => [k, t.count]));
  return { collectives: counts, step_ms: pr.modes.auto.step_ms, on: `${pr.devices} × ${pr.label}` };
}

const fmtMs = (ms) => (ms < 1 ? `${(ms * 1000).toFixed(0)} µs` : ms < 1000 ? `${ms.toFixed(1)} ms` : `${(ms / 1000).toFixed(2)} s`);
const count = (n, kind) => `${n} ${kind}${n === 1 ? '' : 's'}`;

/** Beside the spec field just edited: the collectives the edit added and removed, and the
 * modelled step before and after. */
function showEffect() {
  const before = pending;
  pending = null;
  const after = automatic();
  const box = document.querySelector(`.spec-effect[data-param="${CSS.escape(before.param)}"]`);
  if (!box || !after) return;
  const kinds = [...new Set([...Object.keys(before.collectives), ...Object.keys(after.collectives)])];
  const diff = kinds.map((k) => [k, (after.collectives[k] || 0) - (before.collectives[k] || 0)]).filter(([, d]) => d !== 0);
  const added = diff.filter(([, d]) => d > 0).map(([k, d]) => `+${count(d, k)}`);
  const removed = diff.filter(([, d]) => d < 0).map(([k, d]) => `−${count(-d, k)}`);
  const change = after.step_ms / before.step_ms - 1;
  box.textContent = `${diff.length ? [...added, ...removed].join(', ') : 'No collective added or removed'}; `
    + `modelled step on ${after.on} ${fmtMs(before.step_ms)} → ${fmtMs(after.step_ms)}`
    + `${Math.abs(change) < 0.0005 ? ' (unchanged)' : ` (${change > 0 ? '+' : '−'}${Math.abs(100 * change).toFixed(1)}%)`}.`;
  box.dataset.added = added.join(', ');
  box.dataset.removed = removed.join(', ');
  box.hidden = false;
}

/** After the programs render: constrained values are marked in the automatic program, the
 * pictured value is drawn again for the new plan, and a spec edit's effect shows at its field. */
export function afterPrograms() {
  for (const e of document.querySelectorAll('.spec-effect')) e.hidden = true;
  if (pending) showEffect();
  for (const td of document.querySelectorAll('#program-aligned td.src[data-mode="auto"]')) {
    const name = lineName(td.textContent);
    if (name && Object.hasOwn(constraints, name) && !name.startsWith('parameter ')) {
      td.append(api.el('span', { class: 'constraint-badge', 'data-testid': 'constraint-badge' }, ` with_sharding_constraint ${constraints[name]}`));
    }
  }
  drawMesh(null);
  if (selected) showPicture(selected.mode, selected.name);
  else $('value-picture').replaceChildren(api.el('p', { class: 'muted small' }, 'Click a line of either program to see where its value lives.'));
}

/** The value a program line defines: a parameter's name, or the name after `#`. */
function lineName(text) {
  const param = /=\s*parameter\s+(\S+)/.exec(text);
  if (param) return param[1];
  const named = /\s#\s+([^,\s]+)/.exec(text.replace(/ with_sharding_constraint .*$/, ''));
  return named ? named[1] : null;
}

function pickLine(td) {
  const mode = td.dataset.mode;
  const text = td.textContent.replace(/ with_sharding_constraint .*$/, '');
  const name = lineName(text);
  if (name) {
    selected = { mode, name };
    showPicture(mode, name);
  }
  // A collective: draw its groups on the mesh.
  const view = api.programs() && api.programs().modes[mode];
  if (!view) return;
  const index = view.text.split('\n').indexOf(text);
  const mark = view.marks.find((m) => m.line === index && m.kind === 'collective');
  if (mark) {
    const r = JSON.parse(api.lab().collective_groups(mode, mark.instr));
    drawMesh(r.ok ? { ...r, label: mark.op, mode } : null);
  }
}

function showPicture(mode, name) {
  const { el } = api;
  const box = $('value-picture');
  const r = JSON.parse(api.lab().picture(mode, name));
  if (!r.ok) {
    box.replaceChildren(el('p', { class: 'muted small', 'data-testid': 'picture-missing' }, r.error));
    return;
  }
  const p = r.picture;
  const n = api.devices();
  const axes = groups && groups.ok ? groups.axes : [];
  const grid = el('div', { class: 'picture-grid', 'data-testid': 'picture-grid' });
  grid.style.gridTemplateColumns = `repeat(${p.col_count}, minmax(3.5rem, 1fr))`;
  for (const b of p.blocks) {
    const colours = b.devices.map((d) => api.deviceColor(d, n));
    const fill = colours.length === 1 ? colours[0]
      : `repeating-linear-gradient(135deg, ${colours.map((c, i) => `${c} ${i * 8}px ${(i + 1) * 8}px`).join(', ')})`;
    const label = b.devices.length === n && n > 1 ? [`replicated: all ${n} devices`] : b.coords;
    grid.append(el('div', {
      class: 'picture-block', 'data-testid': 'picture-block', 'data-devices': b.devices.join(','), style: `--fill:${fill}`,
      title: `rows ${b.rows[0]}:${b.rows[1]}, columns ${b.cols[0]}:${b.cols[1]}; devices ${b.devices.join(', ')}`,
    }, label.map((t) => el('span', {}, t))));
  }
  const dims = [p.row_dim !== null ? `rows: dim ${p.row_dim}` : null, p.col_dim !== null ? `columns: dim ${p.col_dim}` : null].filter(Boolean).join(', ');
  const notes = [
    p.replicated_over.length ? `replicated over ${p.replicated_over.map((a) => `'${a}'`).join(', ')}: each block is held by every device along it` : null,
    p.unreduced_over.length ? `differs along ${p.unreduced_over.map((a) => `'${a}'`).join(', ')} without being split: each device holds its own partial or per-device value` : null,
  ].filter(Boolean);
  const children = [
    el('p', {}, el('code', {}, `${p.name} [${p.shape.join(',')}]`), ' ', el('code', { 'data-testid': 'picture-spec' }, p.spec),
      el('span', { class: 'muted small' }, ` · ${r.mode === 'auto' ? 'automatic' : 'shard_map'}, ${r.how}${dims ? ` · ${dims}` : ''}`)),
    grid, ...notes.map((t) => el('p', { class: 'muted small' }, t)),
  ];
  if (mode === 'auto' && !fieldNames().has(name) && !/\.(m|v)$/.test(name) && name !== 'targets') children.push(constraintForm(name, axes));
  box.replaceChildren(el('div', { 'data-testid': 'value-picture-body', 'data-name': p.name, 'data-mode': r.mode }, children));
}

/** jax.lax.with_sharding_constraint(name, spec) from the inspector. */
function constraintForm(name) {
  const { el } = api;
  const input = el('input', { 'data-testid': 'constraint-input', placeholder: "P('dp', None)", value: constraints[name] || '' });
  input.setAttribute('spellcheck', 'false');
  const reason = el('span', { class: 'field-error', 'data-testid': 'constraint-reason', hidden: true });
  const apply = el('button', { type: 'button', 'data-testid': 'constraint-apply' }, constraints[name] ? 'change' : 'apply');
  apply.addEventListener('click', () => {
    const r = check(api.settings(), name, input.value);
    reason.hidden = r.ok;
    reason.textContent = r.ok ? '' : pageWords(r.error);
    if (r.ok) api.changeSettings({ specs: { ...(api.settings().specs || {}), [name]: r.spec } });
  });
  return el('div', { class: 'constraint-form' },
    el('label', { class: 'small' }, `jax.lax.with_sharding_constraint(${name}, `, input, ')'), ' ', apply, reason,
    el('p', { class: 'muted small' }, 'Pins this value to the spec where it is made: the partitioner reshards into and out of it, and re-plans at once. Automatic mode only.'));
}

/** The devices on the mesh's axes (SVG), with the selected collective's groups drawn between them. */
function drawMesh(collective) {
  const { el } = api;
  const box = $('mesh-diagram');
  const axes = groups && groups.ok ? groups.axes : [];
  if (!axes.length) {
    box.replaceChildren();
    return;
  }
  // Rows over the leading axes, columns over the last, whatever the number of axes.
  const n = axes.reduce((d, [, s]) => d * s, 1);
  const cols = axes[axes.length - 1][1];
  const rows = n / cols;
  const step = 64;
  const [w, h] = [cols * step + 40, rows * step + 40];
  const NS = 'http://www.w3.org/2000/svg';
  const svg = (tag, attrs = {}, ...kids) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    for (const k of kids) e.append(k);
    return e;
  };
  const at = (d) => [30 + (d % cols) * step + step / 2 - 10, 30 + Math.floor(d / cols) * step + step / 2 - 10];
  const root = svg('svg', { viewBox: `0 0 ${w} ${h}`, width: w, height: h, role: 'img', 'data-testid': 'mesh-svg' });
  const lead = axes.slice(0, -1).map(([a]) => `'${a}'`).join(' × ');
  root.append(svg('text', { x: 4, y: 14, class: 'axis' }, `${lead ? `↓ ${lead}  ` : ''}→ '${axes[axes.length - 1][0]}'`));
  const groupColours = ['#e11d48', '#0d9488', '#9333ea', '#ca8a04', '#2563eb', '#16a34a', '#ea580c', '#db2777'];
  for (const [k, group] of (collective ? collective.groups : []).entries()) {
    const colour = groupColours[k % groupColours.length];
    const points = group.map((d) => at(d).join(',')).join(' ');
    root.append(svg('polyline', {
      points: group.length > 1 ? `${points} ${at(group[0]).join(',')}` : points, fill: 'none', stroke: colour, 'stroke-width': 4,
      'stroke-opacity': 0.7, 'stroke-linejoin': 'round', 'data-testid': 'mesh-group', 'data-devices': group.join(','),
    }, svg('title', {}, `group ${k}: devices ${group.join(', ')}`)));
  }
  for (let d = 0; d < n; d++) {
    const [x, y] = at(d);
    root.append(svg('g', { 'data-testid': 'mesh-device', 'data-device': d },
      svg('circle', { cx: x, cy: y, r: 14, fill: api.deviceColor(d, n) }),
      svg('text', { x, y: y + 4, 'text-anchor': 'middle', class: 'dev-num' }, String(d)),
      svg('text', { x, y: y + 28, 'text-anchor': 'middle', class: 'dev-coord' }, api.coordText(d, axes).replace(/ /g, '')),
      svg('title', {}, `device ${d}: ${api.coordText(d, axes)}`)));
  }
  const caption = collective
    ? `${collective.label} over ${collective.axes.map((a) => `'${a}'`).join(', ')} in the ${collective.mode === 'auto' ? 'automatic' : 'shard_map'} program: ${collective.groups.length} group${collective.groups.length === 1 ? '' : 's'} (${collective.groups.map((g) => `{${g.join(', ')}}`).join(' ')}); each group runs it among its own devices.`
    : 'Click a collective in either program to draw its device groups.';
  box.replaceChildren(root, el('p', { class: 'muted small', 'data-testid': 'mesh-caption' }, caption));
}
