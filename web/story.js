// The JAX report's story, as the page tells it: first what holds (the report's run priced on a
// v4-8 against the 2.71x it measured), then the gap measured on the learner's adapter, then why
// the two differ in numbers (the random bits' share of each mode's step there and here), then
// the flip to the partitionable layout, then the same-key caveat, and JAX today. Each mode is a
// row wherever the story compares them (RUN_MODES): explicit stands beside the report's two.
// Rendering only: story_run.js measures (the rounds, the pairs, the link) and app.js owns the
// session. `init` hands over, once, the page state this module reads and `changeSettings`
// (a button's change, applied at the next step boundary).

import { $, el } from './dom.js';
import { MODES, MODE_LABEL, fmtInt, fmtMs, fmtPct, plural } from './format.js';
import { PAIRED_RATIO, pairStats, pairedModes, ratioOf } from './story_run.js';

let state = null; // app.js's page state (window.shardlab): read only
let storyKey = null;
let changeSettings = null;

/** The report: jax-ml/jax#19657, measured on a TPU v4-8 with the original layout. */
const REPORT = { url: 'https://github.com/jax-ml/jax/issues/19657', auto_s: 2.95, shard_map_s: 1.09 };
const REPORT_RATIO = REPORT.auto_s / REPORT.shard_map_s;

/** Called once by app.js, before the first settings are applied. */
export function init(page) {
  ({ state, storyKey, changeSettings } = page);
}

const times = (x) => `${x.toFixed(2)}×`;

/** "29 all-gathers, 29 reduce-scatters" from a summary's per-kind totals. */
function collectiveWords(summary) {
  const rows = Object.entries(summary.collectives).filter(([, t]) => t.count > 0);
  return rows.length ? rows.map(([kind, t]) => plural(t.count, kind)).join(', ') : 'no collectives';
}

const toggle = (label, change) => el('button', { type: 'button', class: 'inline', 'data-testid': 'story-toggle', onclick: () => changeSettings(change) }, label);
const reportLink = (text) => el('a', { href: REPORT.url, target: '_blank', rel: 'noopener', 'data-testid': 'report-link' }, text);

/** A layout's ratio of `mode` over shard_map with its spread: "1.62× (middle half 1.55–1.70×,
 * 7 rounds)". */
function ratioWords(stats, rng, mode = 'auto') {
  if (!stats) return [el('em', { class: 'muted' }, 'not measured yet')];
  return [
    el('strong', { 'data-testid': 'story-ratio', 'data-rng': rng, 'data-mode': mode, 'data-q1': String(stats.q1), 'data-q3': String(stats.q3) }, times(stats.ratio)),
    el('span', { class: 'muted', 'data-testid': 'story-spread', 'data-rng': rng, 'data-mode': mode },
      ` (middle half ${stats.q1.toFixed(2)}–${stats.q3.toFixed(2)}×, ${plural(stats.steps, 'round')})`),
  ];
}

/**
 * What the measured ratios say. A gap opened only where the original layout's spread lies above
 * 1.0×; only then can the flip close it, shrink it, or leave it.
 */
function verdict(orig, part) {
  if (!orig) return null;
  const opened = orig.q1 > 1;
  const apart = opened && part ? orig.q1 > part.q3 || part.q1 > orig.q3 : false;
  const attrs = { 'data-testid': 'story-verdict', 'data-opened': String(opened), 'data-distinguishable': String(apart) };
  if (!opened) {
    return el('p', attrs, orig.q3 < 1
      ? 'With the original layout automatic was the faster mode here: no gap opened, so there is none for the flip to close. '
      : 'With the original layout the spread holds 1.0×: no gap opened here, so there is none for the flip to close. ',
      'The next step says why: on this adapter the random bits are too small a share of the step.');
  }
  if (!part) return el('p', attrs, 'The original layout’s gap stands outside its spread. Flip the layout to see what is left of it.');
  const holdsOne = part.q1 <= 1 && 1 <= part.q3;
  let words;
  if (!apart) words = 'The two spreads overlap: noise could explain the difference. Run the story again.';
  else if (holdsOne) words = 'The gap closed: partitionable’s spread holds 1.0× and lies below the original’s.';
  else if (part.q3 < 1) words = 'The gap closed and reversed: with partitionable, automatic’s step is the shorter one.';
  else words = 'The gap shrank but did not close: the random bits are now made alike in both modes, and the rest differs in other ops (see the programs below).';
  return el('p', attrs, words);
}

/** The measurement's configuration in words, and why the story picked it for this adapter. */
function configWords(s) {
  return `${plural(s.layers, 'layer')}, d_model ${s.d_model} in ${s.heads} heads, seq ${s.seq}, batch ${s.batch}, dropout ${s.dropout}, ${s.mesh}`;
}

/** The story's progress while it runs: the round, and each pair's ratio as it arrives. */
function progress(result) {
  const bar = el('div', { class: 'story-progress', 'data-testid': 'story-progress' });
  if (result.running) {
    bar.append(el('p', { class: 'small', 'data-testid': 'story-round', role: 'status' },
      result.round === 0 ? `Building every mode under both layouts (a warm-up step each)…`
        : result.round > result.rounds ? 'Profiling one step of each mode for the random bits’ share…'
          : `Round ${result.round} of ${result.rounds}`));
  } else if (result.cancelled) {
    bar.append(el('p', { class: 'small', 'data-testid': 'story-round' }, `Cancelled in round ${result.round} of ${result.rounds}: the rounds measured so far are kept.`));
  }
  // One row per layout: a mark per round and mode at its ratio over shard_map (automatic
  // filled, explicit hollow), 1.0× drawn as a line.
  const compared = pairedModes().filter((m) => m !== 'shard_map');
  const all = Object.values(result.pairs).flat().flatMap((p) => compared.map((m) => ratioOf(p, m))).filter(Number.isFinite);
  const hi = Math.max(2, ...all) * 1.05;
  for (const rng of ['original', 'partitionable']) {
    const marks = result.pairs[rng].flatMap((p, i) => compared.filter((m) => Number.isFinite(ratioOf(p, m))).map((m) => el('span', {
      class: `pair ${rng} ${m}`, 'data-testid': 'story-pair', 'data-rng': rng, 'data-mode': m, 'data-ratio': String(ratioOf(p, m)),
      style: `left:${(100 * ratioOf(p, m) / hi).toFixed(2)}%`, title: `round ${i + 1}: ${MODE_LABEL[m]} ${times(ratioOf(p, m))}`,
    })));
    bar.append(el('div', { class: 'pair-row' }, el('span', { class: 'pair-label small' }, rng),
      el('span', { class: 'pair-axis' }, el('span', { class: 'one', style: `left:${(100 / hi).toFixed(2)}%`, title: '1.0×: no gap' }), marks)));
  }
  return bar;
}

/** Step 1: the report's run, priced by the cost model on its v4-8, against what it measured. */
function reportStep() {
  const r = state.story.report;
  const li = el('li', { 'data-testid': 'story-report' }, el('strong', {}, 'What holds. '),
    reportLink('The JAX report'), ` trained a ~400M-parameter model with data parallelism on a TPU v4-8: ${REPORT.auto_s} s a step automatic against ${REPORT.shard_map_s} s with shard_map, `,
    el('strong', {}, times(REPORT_RATIO)), ' (measured there). ');
  if (!r) li.append(el('span', { class: 'muted' }, 'Pricing the same run…'));
  else if (!r.ok) li.append(el('span', { class: 'field-error' }, r.error));
  else {
    const o = r.layouts.original;
    const priced = pairedModes().filter((m) => o.modes[m]).map((m) => `${fmtMs(o.modes[m].step_ms)} ${MODE_LABEL[m]}`);
    li.append(`The cost model prices the same run on ${r.devices} × ${r.label}, with the original layout, at ${listWords(priced)}: automatic over shard_map `,
      el('strong', { 'data-testid': 'report-modelled' }, times(o.ratio)), ' (modelled). The gap is real, and its cause is in the programs.');
  }
  return li;
}

/** "a, b and c". */
const listWords = (xs) => (xs.length > 1 ? `${xs.slice(0, -1).join(', ')} and ${xs[xs.length - 1]}` : xs.join(''));

/** What explicit mode's measured ratio says beside automatic's: its type names each device's
 * block of the bits, but under the original layout every device still makes all of them. */
function explicitWords(auto, explicit) {
  if (!auto || !explicit) return null;
  const nearAuto = Math.abs(explicit.ratio - auto.ratio) < Math.abs(explicit.ratio - 1);
  return el('p', { class: 'small', 'data-testid': 'story-explicit', 'data-near': nearAuto ? 'auto' : 'shard_map' },
    'Explicit mode, JAX’s default since 0.9, writes every value’s sharding in its type, the dropout bits’ too (',
    el('code', {}, 'out_sharding='), ' names each device’s block). ',
    nearAuto
      ? `Yet its step followed automatic’s (${times(explicit.ratio)} against ${times(auto.ratio)}): a type says where the bits live, not what making them costs, and with the original layout each device still makes them all. The flip below is what closes the gap in both jit modes.`
      : `Its step sat nearer shard_map’s (${times(explicit.ratio)} against automatic’s ${times(auto.ratio)}): here the rest of its program, not the random bits, set its pace.`);
}

/** Step 2: the gap measured here, on the configuration the story picked for this adapter. */
function gapStep(result, orig, origExplicit) {
  const c = state.story.choice;
  const li = el('li', { 'data-testid': 'story-gap', 'data-rng': 'original' }, el('strong', {}, 'Your adapter’s gap. '));
  if (!result) {
    li.append(`Not measured yet: press “Run the story”. It trains ${listWords(pairedModes().map((m) => MODE_LABEL[m]))} under both RNG layouts in ${c && c.rounds ? c.rounds : 'a few'} paired rounds`,
      ...(c && c.settings ? [' on ', el('span', { 'data-testid': 'story-config' }, configWords(c.settings)), '. '] : ['. ']),
      ...(c ? [el('span', { class: 'muted', 'data-testid': 'story-why' }, c.reason)] : []));
    return li;
  }
  li.append('Measured on ', el('span', { 'data-testid': 'story-config' }, configWords(result.settings)), ', with the original layout (the report’s): automatic takes ',
    ...ratioWords(orig, 'original'), ' the shard_map step, explicit ', ...ratioWords(origExplicit, 'original', 'explicit'), '. ');
  if (orig) {
    const took = pairedModes().map((m, k) => [m, orig.pair[k]]).filter(([, t]) => t > 0).map(([m, t]) => `${MODE_LABEL[m]} ${fmtMs(t)}`);
    li.append(`In the median round ${listWords(took)}. `);
  }
  li.append(explicitWords(orig, origExplicit) || '');
  li.append(el('span', { class: 'muted small', 'data-testid': 'story-method' }, PAIRED_RATIO, ' '));
  if (c && c.size === result.size) li.append(el('span', { class: 'muted small', 'data-testid': 'story-why' }, c.reason));
  li.append(progress(result));
  return li;
}

/** Step 3: why the gaps differ, in numbers: each mode's random bits and their share of its step
 * on the report's TPU (modelled) and here (measured in one profiled step). */
function causeStep(result, kept) {
  const r = state.story.report;
  const told = kept && (kept.original ? 'original' : state.settings.rng);
  const li = el('li', { 'data-testid': 'story-cause', 'data-rng': told || '' }, el('strong', {}, 'Why they differ: the random bits’ share. '),
    'With the original Threefry layout no device can make its own block of the dropout masks, so the partitioner has every device generate the whole global array and slice its part (the lines marked in the automatic program below); explicit mode types the bits by each device’s block yet makes them the same way; shard_map’s body makes only its own block. ');
  const share = (x) => (x == null ? '–' : fmtPct(x));
  const priced = (m) => r && r.ok && r.layouts.original.modes[m];
  const tpu = (m) => (priced(m) ? priced(m).rng_ms / priced(m).step_ms : null);
  const here = (m) => (result && result.shares && m in result.shares ? result.shares[m] : null);
  const bits = (m) => (kept && kept[told] && kept[told][m] ? fmtInt(kept[told][m].rng_bits_per_device) : '–');
  const rows = pairedModes().map((m) => el('tr', { 'data-testid': 'story-share', 'data-mode': m },
    el('th', {}, MODE_LABEL[m]),
    el('td', { class: 'num' }, bits(m)),
    el('td', { class: 'num', 'data-testid': 'share-tpu', 'data-share': String(tpu(m) ?? '') }, share(tpu(m))),
    el('td', { class: 'num', 'data-testid': 'share-here', 'data-share': String(here(m) ?? '') }, share(here(m)))));
  li.append(el('div', { class: 'table-scroll' }, el('table', { class: 'compact', 'data-testid': 'story-shares' },
    el('thead', {}, el('tr', {}, el('th', {}, 'mode'), el('th', { class: 'num', title: told ? `${told} layout, the settings on the controls` : '' }, 'random bits per device'),
      el('th', { class: 'num', title: 'the random bits’ share of the step, in the report’s run priced on a TPU v4-8' }, 'share on TPU v4 (modelled)'),
      el('th', { class: 'num', title: 'the random bits’ share of the step, in one profiled step of the story’s run on this adapter' }, 'share here (measured)'))),
    el('tbody', {}, rows))));
  li.append(explicitBits());
  const t = tpu('auto');
  const h = here('auto');
  if (t != null && h != null) {
    li.append(el('p', { class: 'small', 'data-testid': 'share-words' }, h < t / 2
      ? `On the TPU the replicated bits are ${fmtPct(t)} of automatic’s step; here ${fmtPct(h)}: the rest of the step is larger here, so the same extra bits widen the gap less.`
      : `The replicated bits take a share of automatic’s step here (${fmtPct(h)}) comparable to the TPU’s (${fmtPct(t)}), so the gap shows here too.`));
  } else if (!result || !result.shares) {
    li.append(el('p', { class: 'muted small' }, 'The story’s run measures the share here in one profiled step of each mode.'));
  }
  // Not the collectives: what the programs communicate, for these settings.
  const p = state.programs;
  if (p && p.ok && MODES.every((m) => p.modes[m])) {
    const planned = pairedModes().filter((m) => p.modes[m]);
    const words = planned.map((m) => collectiveWords(p.modes[m].summary));
    const same = words.every((w) => w === words[0]);
    const hasAllReduce = planned.some((m) => p.modes[m].summary.collectives['all-reduce'].count > 0);
    li.append(el('p', { class: 'small', 'data-testid': 'story-collectives' },
      same ? `Not the collectives: with these settings ${planned.length > 2 ? 'every program issues' : 'both programs issue'} the same ones (${words[0]}). `
        : `With these settings ${planned.map((m, i) => `${MODE_LABEL[m]} issues ${words[i]}`).join('; ')}. `,
      hasAllReduce ? (state.settings.combine ? toggle('Stop combining all-reduces', { combine: false }) : toggle('Combine all-reduces', { combine: true })) : null));
  }
  return li;
}

/** Explicit mode's dropout bits as its program types them (where explicit is planned): the
 * type, the out_sharding= that gives it, and what each device generates under this layout. */
function explicitBits() {
  const p = state.programs;
  const x = p && p.ok && p.modes.explicit && p.modes.explicit.explicit;
  const site = x && x.random_bits && x.random_bits[0];
  if (!site) return null;
  return el('p', { class: 'small', 'data-testid': 'story-explicit-bits', 'data-layout': site.layout },
    'In explicit mode the bits of ', el('code', {}, site.value), ' have the type ', el('code', {}, site.ty),
    site.out_sharding ? [' (', el('code', {}, `out_sharding=${site.out_sharding}`), ')'] : '',
    `; with the ${site.layout} layout ${site.generation} (${fmtInt(site.generated_per_device)} of ${fmtInt(site.global_elements)} per device).`);
}

/** Step 4: the flip to the partitionable layout, measured, and what it did to the gap. */
function flipStep(orig, part, explicit) {
  const s = state.settings;
  return el('li', { 'data-testid': 'story-flag' }, el('strong', {}, 'The flip. '),
    'With jax_threefry_partitionable=True each device makes only its own block in every mode. Measured, automatic over shard_map: original ',
    ...ratioWords(orig, 'original'), ', partitionable ', ...ratioWords(part, 'partitionable'), '. ',
    explicit.original || explicit.partitionable
      ? ['Explicit over shard_map: original ', ...ratioWords(explicit.original, 'original', 'explicit'), ', partitionable ', ...ratioWords(explicit.partitionable, 'partitionable', 'explicit'), '. ']
      : null,
    verdict(orig, part),
    toggle(s.rng === 'original' ? 'Flip to partitionable' : 'Back to original', { rng: s.rng === 'original' ? 'partitionable' : 'original' }),
    el('span', { class: 'muted small' }, ` (the layout of the run on the controls: now ${s.rng})`));
}

/** Step 5: shard_map's own flaw, the same dropout key on every device, from real masks. */
function caveatStep() {
  const s = state.settings;
  const o = state.story.overlap;
  let masks;
  if (s.dropout === 0) masks = 'Dropout is off, so no masks are drawn. ';
  else if (!o || o.same_key === undefined) masks = 'This mesh has one data-parallel device, so there is no mask to repeat. ';
  else {
    const chance = (1 - s.dropout) ** 2 + s.dropout ** 2;
    masks = ['In shard_map, with the same key on every device, ',
      el('strong', { 'data-testid': 'mask-share', 'data-key': 'same' }, fmtPct(o.same_key)),
      ` of the dropout mask bits are identical across the ${o.devices} data-parallel devices: every device drops the same positions of different examples. With fold_in(key, axis_index('dp')), `,
      el('strong', { 'data-testid': 'mask-share', 'data-key': 'fold_in' }, fmtPct(o.fold_in)),
      ` are: what independent masks share by chance at dropout ${s.dropout} (${fmtPct(chance)}). (From the first ${fmtInt(o.elements)} bits of each device’s first mask.) `];
  }
  // The key only matters where masks could repeat: no toggle without them.
  const repeats = s.dropout !== 0 && o && o.same_key !== undefined;
  const keyToggle = !repeats ? null
    : s.dropout_key === 'same' ? toggle('Use fold_in', { dropout_key: 'fold_in' }) : toggle('Back to the same key', { dropout_key: 'same' });
  return el('li', { 'data-testid': 'story-caveat' }, el('strong', {}, 'The same-key caveat. '), masks, keyToggle);
}

/** JAX since the report. */
function today() {
  return el('p', { class: 'small', 'data-testid': 'story-today' }, el('strong', {}, 'JAX today. '),
    'The partitionable layout is the default (jax_threefry_partitionable=True since JAX 0.5.0), so jit no longer has every device generate the whole array. ',
    'And a third way to partition exists beside automatic partitioning and shard_map: explicit sharding (the default axis type since JAX 0.9, measured beside the other two above), where each array’s type carries its sharding and ambiguous results are errors. ',
    reportLink('Read the report'), '.');
}

/** The story, with the figures of the last run of the story and of the settings on the controls. */
export function renderStory() {
  const ol = $('story-steps');
  const s = state.settings;
  const p = state.programs;
  const result = state.story.result;
  const stats = (rng, mode = 'auto') => (result ? pairStats(result.pairs[rng], mode) : null);
  const orig = stats('original');
  const part = stats('partitionable');
  const explicit = { original: stats('original', 'explicit'), partitionable: stats('partitionable', 'explicit') };
  const items = [reportStep(), gapStep(result, orig, explicit.original)];
  if (!p || !p.ok || !s) {
    items.push(el('li', { class: 'muted' }, 'Fix the marked settings to see the programs’ side of the story.'));
  } else if (MODES.some((m) => !p.modes[m])) {
    const unplanned = MODES.filter((m) => !p.modes[m]);
    items.push(el('li', { class: 'muted', 'data-testid': 'story-unplanned' },
      `The story compares the modes, and ${unplanned.map((m) => MODE_LABEL[m]).join(' and ')} mode cannot plan these settings (the program inspector says why): run the story to load its settings.`));
  } else {
    items.push(causeStep(result, state.story.summaries[storyKey(s)]), flipStep(orig, part, explicit), caveatStep());
  }
  ol.replaceChildren(...items);
  $('story-today').replaceChildren(today());
  const err = state.story.linkError;
  $('story-link-error').replaceChildren(err ? el('p', { class: 'field-error', 'data-testid': 'field-error', 'data-field': 'story' },
    `The link’s story results could not be read (${err}), so the story shows none.`) : '');
  const run = $('story-run');
  const running = !!(result && result.running);
  run.textContent = running ? 'Cancel the story' : result ? 'Run the story again' : 'Run the story';
  run.setAttribute('aria-pressed', String(running));
}
