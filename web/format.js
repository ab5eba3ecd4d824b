// How the page writes numbers and names: byte sizes, times, rates, FLOPs, percentages and plurals,
// the core's notes in the page's words, and the modes' labels and colours. Pure functions and
// constants, no state and no elements: split out of app.js so that the inspector, the charts and the
// story (each its own module) write a number the same way the live figures do.

/** The two modes the page compares (the JAX report's pair: alternated, the story, the aligned
 * programs), in the order the page shows them. */
export const MODES = ['auto', 'shard_map'];
/** Every mode a run may train in: what shows a run's figures (step times, losses, memory) shows any. */
export const RUN_MODES = ['auto', 'explicit', 'shard_map'];
/** Whether the mode control's `value` (a mode, `both`, `all`, or modes joined by `+`) runs
 * explicit mode. */
export const runsExplicit = (value) => value === 'all' || String(value).split('+').includes('explicit');
export const MODE_LABEL = { auto: 'automatic', explicit: 'explicit', shard_map: 'shard_map' };
export const MODE_COLOR = { auto: '#4f46e5', explicit: '#059669', shard_map: '#d97706' };

export const fmtBytes = (n) => (n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(1)} GiB` : n >= 2 ** 20 ? `${(n / 2 ** 20).toFixed(1)} MiB`
  : n >= 2 ** 10 ? `${(n / 2 ** 10).toFixed(1)} KiB` : `${n} B`);
export const fmtErr = (x) => (x === null || x === undefined ? '—' : x === 0 ? '0' : x.toExponential(1));
export const fmtMs = (ms) => (ms < 1 ? `${(ms * 1000).toFixed(0)} µs` : ms < 1000 ? `${ms.toFixed(1)} ms` : `${(ms / 1000).toFixed(2)} s`);
export const fmtInt = (n) => Number(n).toLocaleString('en-US');
export const fmtRate = (x) => (x >= 1e6 ? `${(x / 1e6).toFixed(2)} M` : x >= 1e3 ? `${(x / 1e3).toFixed(1)} k` : x.toFixed(0));
/** 44.5 MFLOP, 1.20 GFLOP: SI prefixes, three significant digits. */
export function fmtFlops(x) {
  const units = [[1e15, 'PFLOP'], [1e12, 'TFLOP'], [1e9, 'GFLOP'], [1e6, 'MFLOP'], [1e3, 'kFLOP']];
  for (const [size, unit] of units) if (x >= size) return `${Number((x / size).toPrecision(3))} ${unit}`;
  return `${x} FLOP`;
}
/** The core's notes name CLI flags, e.g. "(--dropout-key fold_in)" or "(remat full,
 * `--remat full`)": the page has controls instead, so the flags are dropped, and code the core
 * marks with backticks reads as plain text. */
export const pageWords = (text) => String(text)
  .replace(/,\s*`--[^`]*`/g, '')
  .replace(/\s*\(`?--[^)]*\)/g, '')
  .replace(/`([^`]*)`/g, '$1');
export const fmtPct = (x) => `${(100 * x).toFixed(1)}%`;
/** "3.3×": how many times one time is another. */
export function fmtTimes(x) {
  return `${x < 10 ? x.toFixed(1) : x.toFixed(0)}×`;
}
/** A message of the core's (lower case, as field errors read) as a sentence of its own. */
export const sentence = (text) => String(text).charAt(0).toUpperCase() + String(text).slice(1);
export const plural = (n, word) => `${fmtInt(n)} ${word}${n === 1 ? '' : 's'}`;
export const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)] : NaN;
};
/** The `q` quantile of `xs` (0.25: the lower quartile), linear between the order statistics. */
export function quantile(xs, q) {
  const s = [...xs].sort((a, b) => a - b);
  if (!s.length) return NaN;
  const at = (s.length - 1) * q;
  const lo = Math.floor(at);
  return s[lo] + (s[Math.min(lo + 1, s.length - 1)] - s[lo]) * (at - lo);
}
/** Resolves once the browser has painted a frame: the session waits on it between steps. */
export const frame = () => new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));


/** Why the running modes' losses agree or differ under dropout. jit's modes (automatic,
 * explicit) slice every device's block out of one global mask, as one device draws it;
 * shard_map's body draws each device's own from its key. `modes`: the run's, in order. */
export function dropoutNote(dropout, dropoutKey, modes) {
  const jit = modes.filter((m) => m !== 'shard_map').map((m) => MODE_LABEL[m]);
  const jitWords = jit.length ? `${sentence(jit.join(' and '))} mode${jit.length > 1 ? 's' : ''}` : null;
  const key = dropoutKey === 'same' ? 'the same key on every device' : 'fold_in(key, axis_index(\'dp\'))';
  if (!(dropout > 0)) {
    return modes.length > 1
      ? 'At dropout 0 no mask is drawn, so every mode computes the same losses; with dropout jit’s modes slice one global mask and shard_map draws each device’s own, so shard_map’s losses differ.'
      : 'At dropout 0 no mask is drawn.';
  }
  const jitRule = `${jitWords} slice${jit.length > 1 ? '' : 's'} every device’s block out of one global mask, the mask one device draws`;
  const smRule = `shard_map’s body draws each device’s mask from its key (${key})`;
  if (!modes.includes('shard_map')) {
    return jit.length > 1
      ? `With dropout ${dropout} automatic and explicit mode compute the same losses, one device’s: both are jit programs that slice every device’s block out of one global mask; they differ only in where the shardings are written.`
      : `With dropout ${dropout}, ${jitRule.charAt(0).toLowerCase()}${jitRule.slice(1)}: its losses are one device’s.`;
  }
  if (!jit.length) return `With dropout ${dropout}, ${smRule}: its losses are not one device’s, and that is not a bug.`;
  return `With dropout ${dropout} shard_map’s losses differ from ${jit.join(' and ')} mode’s from the first step, and that is not a bug: they draw different masks. ${jitRule}; ${smRule}. At dropout 0 no mask is drawn, and the losses agree.`;
}
