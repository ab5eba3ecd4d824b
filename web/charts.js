// The live charts (uPlot, vendored from npm by xtask): each running mode's measured step time and
// loss, one point per plain step. Split out of app.js, which owns the run: it hands over the page
// state once (`init`), and this module keeps the chart objects in `state.charts` (the browser
// tests read their points there) and reads `state.configured.modes` and `state.history`.

import { $, el } from './dom.js';
import { MODE_COLOR, MODE_LABEL, fmtMs } from './format.js';

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

export function updateCharts() {
  if (!uPlot) return;
  if (!Object.keys(state.charts).length) createCharts();
  const h = state.history;
  for (const [key, chart] of Object.entries(state.charts)) {
    chart.setData([h.step, ...chart.modes.map((m) => h[key][m])]);
  }
}
