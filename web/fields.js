// The settings' one grammar, which the link and the controls both read with (so a link the page
// writes always reopens, and a value the form accepts is one a link may carry), and the link's
// reading and writing: every key that parses and is valid is kept, each that is not is handed
// back with its text and error for its control, and what no control can show is a notice. Split
// out of app.js; `init` hands over, once, the core's presets (their names and bounds fill FIELDS,
// app.js's applyCoreLimits) and the sharding editor, which reads and writes the spec keys.

import { LEARN_FIELDS, parseLr } from './learn.js';
import { meshAxes } from './mesh.js';
import { fmtInt } from './format.js';

let presets = null;
let editor = null;

export function init(page) {
  ({ presets, editor } = page);
}

// The one grammar of every setting: the hash reader and the form both parse with it, so a link
// the page writes always reopens, and a value the form accepts is one a link may carry. The
// preset names and the numeric bounds are the core's (shardlab::plan::Preset and PAGE_LIMITS),
// filled in by applyCoreLimits before any setting is read.
export const FIELDS = {
  preset: { kind: 'enum', values: [] },
  mode: { kind: 'enum', values: ['auto', 'shard_map', 'explicit', 'both', 'auto+explicit', 'explicit+shard_map', 'all'] },
  mesh: { kind: 'mesh' },
  axis_types: { kind: 'axis_types' },
  zero: { kind: 'enum', values: [] }, // the core's ZeRO stages (applyCoreLimits)
  sequence_parallel: { kind: 'bool' },
  layers: { kind: 'int' },
  d_model: { kind: 'int' },
  heads: { kind: 'int' },
  seq: { kind: 'int' },
  batch: { kind: 'int' },
  vocab: { kind: 'int' },
  dropout: { kind: 'float' },
  attention: { kind: 'enum', values: ['fused', 'unfused'] },
  remat: { kind: 'enum', values: ['none', 'full', 'dots'] },
  experts: { kind: 'int' },
  top_k: { kind: 'int' },
  expert_width: { kind: 'int' },
  capacity: { kind: 'capacity' },
  aux_loss: { kind: 'float' },
  microbatches: { kind: 'int' },
  cp_order: { kind: 'enum', values: ['contiguous', 'zigzag'] },
  schedule: { kind: 'enum', values: [] }, // the core's pipeline schedules (applyCoreLimits)
  virtual_stages: { kind: 'int' },
  stage_layers: { kind: 'stages' },
  rng: { kind: 'enum', values: ['original', 'partitionable'] },
  dropout_key: { kind: 'enum', values: ['same', 'fold_in', 'global'] },
  combine: { kind: 'bool' },
  device: { kind: 'enum', values: [] }, // filled from the core's device presets
  ...LEARN_FIELDS, // task, optimizer, lr (learn.js)
};

/** One value from its text, or throws a message naming the problem (in the page's words). */
export function parseField(name, text) {
  // Own properties only: `constructor` or `__proto__` in a link is an unknown setting.
  const f = Object.hasOwn(FIELDS, name) ? FIELDS[name] : null;
  if (!f) throw new Error(`unknown setting “${name.slice(0, 40)}”`);
  const bad = (why) => new Error(`${name} “${text.slice(0, 40)}” ${why}`);
  switch (f.kind) {
    case 'enum':
      if (!f.values.includes(text)) throw bad(`is not one of ${f.values.join(', ')}`);
      return text;
    case 'mesh':
      // The grammar only; which axes compose, and how many devices the page simulates, the core says.
      if (!meshAxes(text)) throw bad('is not a mesh like dp=2,tp=2,pp=2 (axes NAME=SIZE, separated by commas)');
      return text;
    case 'int': {
      if (!/^\d+$/.test(text)) throw bad('is not a whole number');
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
    case 'axis_types':
      // `--axis-types`' grammar: AXIS=TYPE pairs; which axes and types, the core says.
      if (text !== '' && !/^[a-z_]{1,16}=[a-z]{1,16}(,[a-z_]{1,16}=[a-z]{1,16}){0,7}$/.test(text)) {
        throw bad('is not axis types like tp=auto (AXIS=TYPE, separated by commas; empty: every axis explicit)');
      }
      return text;
    case 'stages': {
      // Blocks per pipeline stage, first stage first; empty for equal stages. Whether they fit
      // the mesh and the model, the core says at the control.
      if (text === '') return [];
      // COUNT*TIMES writes a run of one count, as the core writes long runs (0,1*126,0).
      const entry = '\\d{1,4}(\\*\\d{1,3})?';
      const counts = new RegExp(`^${entry}(,${entry}){0,63}$`).test(text)
        && text.split(',').flatMap((e) => { const [c, n = '1'] = e.split('*'); return Array(Number(n)).fill(Number(c)); });
      if (!counts || counts.length === 0 || counts.length > 256) {
        throw bad('is not blocks per stage like 3,5 or per virtual stage like 0,1*6,0 (empty: equal stages)');
      }
      return counts;
    }
    case 'lr':
      return parseLr(text);
    case 'capacity':
      // A factor as the flag takes it, or dropless; which factors the model takes (not 0, not
      // NaN) the core says at the control, in the flag's words.
      if (!/^(dropless|-?\d{0,6}(\.\d{0,17})?|NaN|-?inf)$/.test(text) || text === '' || text === '-') {
        throw bad('is neither a factor like 1.25 nor dropless');
      }
      return text;
    case 'bool':
      if (!['0', '1', 'true', 'false'].includes(text)) throw bad('is not 0 or 1');
      return text === '1' || text === 'true';
    default:
      throw bad('is not understood');
  }
}

/** A value as the hash and the controls write it: numbers in their shortest round-trip form. */
export const fieldText = (k, v) => (FIELDS[k].kind === 'bool' ? (v ? '1' : '0') : String(v));

export function defaultSettings() {
  return { ...presets.presets[presets.default] };
}

/** The longest hash the page reads: every setting and a spec for each parameter fit in far less. */
const MAX_HASH = 8000;

/**
 * What a link holds: its settings, every key that parses and is valid kept; for each setting
 * whose text does not parse, its text (`bad`, shown in its control) and error (`errors`, marked
 * there); the story's results (`story`: their text); and `problem`, what no control can show (an
 * unknown key, a hash too long to read: then the defaults).
 */
export function readLink(hash) {
  const raw = hash.replace(/^#/, '');
  const none = { bad: {}, errors: [], story: null, problem: null };
  if (!raw) return { ...none, settings: defaultSettings() };
  if (raw.length > MAX_HASH) {
    return { ...none, settings: defaultSettings(), problem: `it is ${fmtInt(raw.length)} characters long, and a link here has at most ${fmtInt(MAX_HASH)}` };
  }
  const given = {};
  const specs = {};
  const bad = {};
  const errors = [];
  const unknown = [];
  let story = null;
  const seen = new Set();
  for (const [k, v] of new URLSearchParams(raw)) {
    if (seen.has(k)) {
      unknown.push(`“${k.slice(0, 40)}” appears twice: the first is kept`);
      continue;
    }
    seen.add(k);
    if (editor.isSpecKey(k)) specs[k] = v;
    else if (k === 'story') story = v;
    else if (!Object.hasOwn(FIELDS, k)) unknown.push(`unknown setting “${k.slice(0, 40)}”`);
    else {
      try {
        given[k] = parseField(k, v);
      } catch (e) {
        bad[k] = v;
        errors.push({ field: k, message: e.message });
      }
    }
  }
  // Links from before fsdp was an axis of its own named its data axis dp.
  if (given.preset === 'fsdp' && /^dp=\d+$/.test(given.mesh || '')) given.mesh = given.mesh.replace('dp=', 'fsdp=');
  const base = presets.presets[given.preset || presets.default];
  const settings = { ...base, ...given };
  const read = editor.readHash(settings, specs);
  settings.specs = read.specs;
  Object.assign(bad, read.bad);
  errors.push(...read.errors);
  return { settings, bad, errors, story, problem: unknown.length ? unknown.join('; ') : null };
}

/** The settings as the link writes them (every setting and each changed spec). */
export function settingsHash(s) {
  const p = new URLSearchParams();
  for (const k of Object.keys(FIELDS)) p.set(k, fieldText(k, s[k]));
  editor.writeHash(p, s);
  return p;
}
