// The live charts (uPlot, vendored from npm by xtask): each series' measured step time and loss,
// one point per plain step; a series is a mode under an RNG layout, so after the story (or a
// layout flipped while training) both layouts' steps stay on the charts, labelled. Split out of
// app.js, which owns the run: it hands over the page state once (`init`), and this module keeps
// the chart objects in `state.charts` (the browser tests read their points there) and reads
// `state.history`.

import { $, el } from './dom.js';
import { RUN_MODES, MODE_COLOR, MODE_LABEL, fmtMs } from './format.js';

let state = null; // app.js's page state (window.shardlab)
let uPlot = null; // the chart library, or null when it was not found

/** Called once by app.js, after the chart library has loaded (or failed to): `uPlot` may be null. */
export function init(page) {
  ({ state, uPlot } = page);
  window.addEventListener('resize', () => {
    for (const c of Object.values(state.charts)) {
      const box = c.root.parentElement;
      if (box && box.clientWidth) c.setSize({ width: box.clientWidth, height: 170 });
    }
  });
}

const CHARTS = [
  ['chart-measured', 'measured', 'ms'],
  ['chart-loss', 'loss', ''],
];

/** Before the first step each chart is a one-line hint; the charts appear with the first point. */
export function makeCharts() {
  for (const c of Object.values(state.charts)) c.destroy?.();
  state.charts = {};
  for (const [id] of CHARTS) {
    $(id).replaceChildren(el('p', { class: 'chart-hint muted small', 'data-testid': 'chart-hint' },
      uPlot ? 'Press Play or Step: each mode that runs gets a line here.'
        : 'The chart library (uPlot) was not found: run `npm ci` in tests/browser and rebuild.'));
  }
}

/** The history's series in a stable order: by RNG layout, then mode. */
function seriesList() {
  const order = (x) => ['original', 'partitionable'].indexOf(x.rng) * RUN_MODES.length + RUN_MODES.indexOf(x.mode);
  return Object.values(state.history.series).sort((a, b) => order(a) - order(b));
}

/** A series' legend label: its mode, and its RNG layout once the charts show both. */
function label(line, layouts) {
  return layouts > 1 ? `${MODE_LABEL[line.mode]}, ${line.rng}` : MODE_LABEL[line.mode];
}

function createCharts(lines) {
  const css = getComputedStyle(document.documentElement);
  const axisColor = css.getPropertyValue('--muted').trim() || '#5d6673';
  const gridColor = css.getPropertyValue('--line').trim() || '#e1e4e8';
  const layouts = new Set(lines.map((l) => l.rng)).size;
  for (const c of Object.values(state.charts)) c.destroy?.();
  state.charts = {};
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
        // The partitionable layout's lines are dashed, in their mode's colour.
        ...lines.map((l) => ({
          label: label(l, layouts), stroke: MODE_COLOR[l.mode], width: 2, spanGaps: true,
          dash: l.rng === 'partitionable' ? [6, 4] : undefined, value: (u, v) => fmt(v),
        })),
      ],
    };
    const chart = new uPlot(opts, [[], ...lines.map(() => [])], box);
    chart.key = key;
    chart.lines = lines.map((l) => `${l.mode}:${l.rng}`);
    state.charts[key] = chart;
  }
}

/**
 * Every series of the history, by step: the x axis is the step of each series' own run, so the
 * two layouts' (and the modes') step k share a column. The charts are rebuilt when a series joins or leaves.
 */
export function updateCharts() {
  if (!uPlot) return;
  const lines = seriesList();
  const names = lines.map((l) => `${l.mode}:${l.rng}`).join(' ');
  const chart = Object.values(state.charts)[0];
  if (!chart || chart.lines.join(' ') !== names) createCharts(lines);
  const n = Math.max(0, ...lines.map((l) => Math.max(l.measured.length, l.loss.length)));
  const index = Array.from({ length: n }, (_, i) => i);
  // The x axis counts steps as the counter does: the first step is step 1.
  const steps = index.map((i) => i + 1);
  for (const [key, c] of Object.entries(state.charts)) {
    c.setData([steps, ...lines.map((l) => index.map((i) => l[key][i] ?? null))]);
  }
}
