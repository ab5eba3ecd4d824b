// The seed, as a story: the JAX report's gap between automatic partitioning and shard_map walked
// through in five steps (the gap, not the collectives, the random bits, the flag, the same-key
// caveat), each with the numbers of this run and a button that changes the setting it is about.
// Split out of app.js, which owns the run and its session: it hands over, once (`init`), the page
// state this module reads (settings, programs, configured, story) and the two functions it calls,
// `storyKey` (the settings a measurement belongs to) and `changeSettings` (a button's change,
// applied at the next step boundary). "Run the story" itself is a session action in app.js.

import { $, el } from './dom.js';
import { MODES, MODE_LABEL, fmtInt, fmtMs, fmtPct, plural } from './format.js';

let state = null; // app.js's page state (window.shardlab): read only
let storyKey = null;
let changeSettings = null;

/** Called once by app.js, before the first settings are applied. */
export function init(page) {
  ({ state, storyKey, changeSettings } = page);
}

/** "29 all-gathers, 29 reduce-scatters" from a summary's per-kind totals. */
function collectiveWords(summary) {
  const rows = Object.entries(summary.collectives).filter(([, t]) => t.count > 0);
  return rows.length ? rows.map(([kind, t]) => plural(t.count, kind)).join(', ') : 'no collectives';
}

/** The story's five steps, with this run's numbers: its programs, its measurements, its model. */
export function renderStory() {
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
  // The key only matters where masks could repeat: no toggle without them.
  const repeats = s.dropout !== 0 && o && o.same_key !== undefined;
  const keyToggle = !repeats ? null
    : s.dropout_key === 'same' ? toggle('Use fold_in', { dropout_key: 'fold_in' }) : toggle('Back to the same key', { dropout_key: 'same' });
  const caveat = el('li', { 'data-testid': 'story-caveat' }, el('strong', {}, 'The same-key caveat. '), masks, keyToggle);

  ol.replaceChildren(gap, comm, cause, flag, caveat);
}
