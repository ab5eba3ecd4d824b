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

/** A layout's measured ratio with its spread: "1.62× (the middle half of 6 paired steps: 1.55–1.70×)". */
function ratioWords(stats, rng) {
  if (!stats) return [el('em', { class: 'muted' }, 'not measured yet')];
  return [
    el('strong', { 'data-testid': 'story-ratio', 'data-rng': rng, 'data-q1': String(stats.q1), 'data-q3': String(stats.q3) }, `${stats.ratio.toFixed(2)}×`),
    el('span', { class: 'muted', 'data-testid': 'story-spread', 'data-rng': rng },
      ` (the middle half of its ${plural(stats.steps, 'paired step')}: ${stats.q1.toFixed(2)}–${stats.q3.toFixed(2)}×)`),
  ];
}

/** Whether the two layouts' gaps can be told apart: their spreads overlap or not, and which
 * of them holds 1.0× (no gap). */
function verdict(orig, part) {
  if (!orig || !part) return null;
  const apart = orig.q1 > part.q3 || part.q1 > orig.q3;
  const holdsOne = (x) => x.q1 <= 1 && 1 <= x.q3;
  const side = (x) => (x.q1 > 1 ? 'above' : 'below');
  const origWords = holdsOne(orig)
    ? 'the original layout’s spread holds 1.0×: on this GPU its gap is not told from noise'
    : `the original layout’s spread lies ${side(orig)} 1.0×: a gap noise does not explain`;
  // What is left with the flag on: none, or a smaller one the random bits do not cause (the two
  // programs differ in more than their bits).
  const partWords = holdsOne(part)
    ? 'partitionable’s spread holds 1.0×: the gap is gone'
    : Math.abs(part.ratio - 1) < Math.abs(orig.ratio - 1)
      ? `partitionable’s spread lies ${side(part)} 1.0×: a smaller gap remains that the random bits do not cause (both programs now make the same bits; they differ in other ops, see the inspector)`
      : `partitionable’s spread lies ${side(part)} 1.0×, and its gap is no smaller`;
  return el('span', { 'data-testid': 'story-verdict', 'data-distinguishable': String(apart) },
    apart ? 'The two are distinguishable: their spreads do not overlap. '
      : 'The two are not distinguishable: their spreads overlap, so noise on this GPU could explain the difference. Run the story again, or train a longer seq (attention dropout’s bits grow as seq²). ',
    `On its own, ${origWords}; ${partWords}. `);
}

/**
 * The story's five steps, with this run's numbers. Each step shows the layout it is about,
 * whatever layout the controls are on: the gap and the cause the original one (the report's),
 * the flag both, from the measurements and programs kept per layout.
 */
export function renderStory() {
  const ol = $('story-steps');
  const s = state.settings;
  const p = state.programs;
  if (!p || !p.ok || !s) {
    ol.replaceChildren(el('li', { class: 'muted' }, 'Fix the marked settings to see this run’s story.'));
    return;
  }
  const unplanned = MODES.filter((m) => !p.modes[m]);
  if (unplanned.length) {
    ol.replaceChildren(el('li', { class: 'muted', 'data-testid': 'story-unplanned' },
      `The story compares the two modes, and ${unplanned.map((m) => MODE_LABEL[m]).join(' and ')} mode cannot plan these settings (the program inspector says why): load the seed preset to follow it.`));
    return;
  }
  const key = storyKey(s);
  const measured = state.story.measured[key] || {};
  const kept = state.story.summaries[key] || {};
  // The report's layout where it has been seen, else the one on the controls.
  const told = kept.original ? 'original' : s.rng;
  const a = kept[told].auto;
  const m = kept[told].shard_map;
  const orig = measured.original;
  const toggle = (label, change) => el('button', { type: 'button', class: 'inline', 'data-testid': 'story-toggle', onclick: () => changeSettings(change) }, label);
  const runIt = 'press “Run the story” above to measure both modes under both RNG layouts in paired rounds';

  const gap = el('li', { 'data-testid': 'story-gap', 'data-rng': 'original' }, el('strong', {}, 'The gap. '),
    orig
      ? ['On your GPU, with these settings and the original RNG layout (the report’s), the automatic step takes ', fmtMs(orig.auto),
        ' and the shard_map step ', fmtMs(orig.shard_map), ' (medians, measured): automatic is ', ...ratioWords(orig, 'original'), ' the shard_map time. ']
      : [`Not measured yet for these settings: ${runIt}. `],
    s.mode === 'both' ? toggle('Train automatic only', { mode: 'auto' }) : toggle('Train both modes', { mode: 'both' }), ' ',
    el('span', { class: 'muted' }, '(The JAX report: 2.95 s/it automatic against 1.09 s/it with shard_map, 2.7×, on a TPU v4-8.)'));

  const aw = collectiveWords(p.modes.auto.summary);
  const mw = collectiveWords(p.modes.shard_map.summary);
  const hasAllReduce = p.modes.auto.summary.collectives['all-reduce'].count + p.modes.shard_map.summary.collectives['all-reduce'].count > 0;
  const comm = el('li', {}, el('strong', {}, 'Not the collectives. '),
    aw === mw
      ? `Both programs issue the same collectives: ${aw}. The same communication cannot explain a gap. `
      : `The automatic program issues ${aw}; shard_map issues ${mw}. `,
    hasAllReduce ? (s.combine ? toggle('Stop combining all-reduces', { combine: false }) : toggle('Combine all-reduces', { combine: true })) : null);

  const bits = (x) => (x.shard_map.rng_bits_per_device > 0 ? x.auto.rng_bits_per_device / x.shard_map.rng_bits_per_device : null);
  const bitsRatio = bits(kept[told]);
  const prof = (state.story.profiles[key] || {})[told];
  const rngShare = (mode) => {
    const x = prof && prof[mode] && prof[mode].breakdown;
    if (!x) return null;
    const total = x.step_ms;
    return total > 0 ? `${fmtMs(x.categories_ms.rng)} of ${fmtMs(total)} (${fmtPct(x.categories_ms.rng / total)}) in ${MODE_LABEL[mode]}` : null;
  };
  const shares = MODES.map(rngShare).filter(Boolean);
  const pr = kept[told].prediction;
  const modelledShare = (mode) => {
    const x = pr.modes[mode];
    return el('span', { 'data-testid': 'rng-modelled', 'data-mode': mode, 'data-rng-ms': String(x.rng_ms), 'data-step-ms': String(x.step_ms) },
      `${fmtMs(x.rng_ms)} of ${fmtMs(x.step_ms)} (${fmtPct(x.rng_share)}) in ${MODE_LABEL[mode]}`);
  };
  const modelled = el('span', {}, ` On ${pr.devices} × ${pr.label} the cost model gives the random bits `,
    modelledShare('auto'), ' and ', modelledShare('shard_map'), ' (modelled); the JAX report measured ',
    el('span', { 'data-testid': 'report-times' }, '2.95 vs 1.09 s/it on a TPU v4-8'), '. ');
  const other = told === 'original' && kept.partitionable ? kept.partitionable : null;
  const cause = el('li', { 'data-testid': 'story-cause', 'data-rng': told }, el('strong', {}, 'The cause: random bits. '),
    `With the ${told} layout each device generates ${fmtInt(a.rng_bits_per_device)} random bits per step in automatic mode and ${fmtInt(m.rng_bits_per_device)} in shard_map`,
    bitsRatio ? ` (${bitsRatio.toFixed(1)}×). ` : '. ',
    told === 'original'
      ? 'With the original Threefry layout no device can make its own block, so the partitioner has every device generate the whole global array and slice its part: the lines marked in the automatic program below. '
      : 'With the partitionable layout each device makes only its block. ',
    other ? `With partitionable, ${fmtInt(other.auto.rng_bits_per_device)} and ${fmtInt(other.shard_map.rng_bits_per_device)}${bits(other) ? ` (${bits(other).toFixed(1)}×)` : ''}: each device makes only its block. ` : '',
    shares.length
      ? el('span', { 'data-testid': 'rng-time' }, `In a profiled step the random bits took ${shares.join(', and ')} (measured).`)
      : 'Press “Where does the time go?” to measure the random bits’ share of each mode’s step.',
    modelled);

  const flag = el('li', { 'data-testid': 'story-flag' }, el('strong', {}, 'The flag. '),
    `jax_threefry_partitionable (the RNG layout here) is now ${s.rng === 'partitionable' ? 'True' : 'False'}. Measured ratio automatic/shard_map on these settings: original `,
    ...ratioWords(orig, 'original'), ', partitionable ', ...ratioWords(measured.partitionable, 'partitionable'), '. ',
    verdict(orig, measured.partitionable),
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
