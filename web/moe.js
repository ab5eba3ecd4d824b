// The mixture of experts as the learner watches it: where the experts live and what their two
// all-to-alls cost (configure's `moe`: the program summary's bytes and the modelled timeline's
// time), and each step's routing (the step's `routing`: the routers' own counts, read back after
// the step as the loss is) as tokens per expert per device, the choices dropped, and the busiest
// device against the mean, the device every all-to-all waits for. Numbers come from the core
// (web/src/moe.rs); this module only draws them, in shares of the widest row so it fits any width.
import { $, el } from './dom.js';
import { MODE_LABEL, fmtBytes, fmtInt, fmtMs } from './format.js';
import { coordText } from './inspector.js';

/** Steps of dropped choices the strip under the chart keeps. */
const HISTORY = 60;

let history = []; // [{step, dropped, choices, imbalance}] of the current run, oldest first

const pct = (x) => `${(100 * x).toFixed(2)}%`;
const times = (x) => `${x.toFixed(2)}×`;

/** The panel for a configured run (`r.moe`, null for a dense model), before any step. */
export function renderMoe(r) {
  const box = $('moe-routing');
  history = [];
  box.hidden = !(r && r.moe);
  if (box.hidden) return;
  const m = r.moe;
  const where = m.ep > 1
    ? `${m.experts} experts, ${m.experts_per_device} on each device along ep=${m.ep}; each token goes to its top ${m.top_k}, and the tokens are split over dp × ep.`
    : `${m.experts} experts on every device (no ep axis: each device runs all of them on its own tokens); each token goes to its top ${m.top_k}.`;
  const slots = m.dropless ? `dropless: each expert takes up to a whole sequence (${m.slots} slots)` : `${m.slots} slots per expert and sequence at the capacity factor; choices past them are dropped`;
  $('moe-where').textContent = `${where} ${slots}.`;
  $('moe-a2a').replaceChildren(...Object.entries(m.modes).map(([mode, a]) => el('span', { 'data-mode': mode, 'data-testid': 'moe-a2a-mode' },
    `${MODE_LABEL[mode] || mode}: `,
    a.all_to_alls
      ? `${a.all_to_alls} all-to-alls a step, ${fmtBytes(a.bytes)} per device, ${fmtMs(a.ms)} of the ${fmtMs(a.step_ms)} modelled step on ${m.device} (their spans are on the timeline below). `
      : 'no all-to-all: without an ep axis the tokens stay where they are. ')));
  $('moe-chart').replaceChildren(el('p', { class: 'chart-hint muted small' }, 'Press Play or Step: each device’s experts’ tokens show here.'));
  const words = $('moe-words');
  words.textContent = '';
  delete words.dataset.step;
  delete words.dataset.dropped;
  $('moe-history').replaceChildren();
}

/** One step's routing (`s.routing` of the first running mode that has one), drawn as a row per device. */
export function renderRouting(step, mode, routing, axes) {
  if (!routing) return;
  history = [...history.filter((h) => h.step < step), { step, dropped: routing.dropped, choices: routing.choices, imbalance: routing.imbalance }].slice(-HISTORY);
  const widest = Math.max(1, ...routing.devices.map((d) => d.experts.reduce((n, e) => n + e.tokens + e.dropped, 0)));
  const mean = routing.mean_tokens / widest;
  const rows = routing.devices.map((d) => {
    let at = 0;
    const segments = d.experts.flatMap((e) => {
      const what = `device ${d.device}, expert ${e.expert}: ${fmtInt(e.tokens)} tokens${e.dropped ? `, ${fmtInt(e.dropped)} choices dropped` : ''}`;
      const kept = el('span', {
        class: `moe-kept moe-e${e.expert % 8}`, title: what, 'aria-label': what, 'data-testid': 'moe-expert',
        'data-expert': String(e.expert), 'data-tokens': String(e.tokens), 'data-dropped': String(e.dropped),
        style: `left:${pct(at / widest)};width:${pct(e.tokens / widest)}`,
      }, `e${e.expert}`);
      at += e.tokens;
      const dropped = e.dropped ? el('span', { class: 'moe-dropped', title: what, style: `left:${pct(at / widest)};width:${pct(e.dropped / widest)}` }) : null;
      at += e.dropped;
      return [kept, dropped];
    });
    return el('div', { class: 'moe-row', 'data-testid': 'moe-device', 'data-device': String(d.device), 'data-tokens': String(d.tokens) },
      el('span', { class: 'moe-label', title: `device ${d.device}: ${coordText(d.device, axes)}` }, `dev ${d.device}`),
      el('div', { class: `moe-track${d.device === routing.busiest ? ' moe-busiest' : ''}` }, ...segments,
        el('span', { class: 'moe-mean', style: `left:${pct(mean)}`, title: `the mean: ${routing.mean_tokens.toFixed(1)} tokens` })));
  });
  const legend = el('p', { class: 'pd-legend small' },
    el('span', { class: 'pd-key' }, el('span', { class: 'pd-swatch moe-e0' }), el('span', { class: 'pd-swatch moe-e1' }), ' e0, e1, …: each expert’s tokens'),
    el('span', { class: 'pd-key' }, el('span', { class: 'pd-swatch moe-dropped-key' }), ' choices dropped at its capacity'),
    el('span', { class: 'pd-key' }, el('span', { class: 'pd-swatch moe-mean-key' }), ' the mean'));
  $('moe-chart').replaceChildren(...rows, legend);
  const share = routing.choices ? routing.dropped / routing.choices : 0;
  const words = $('moe-words');
  words.dataset.dropped = String(routing.dropped);
  words.dataset.step = String(step);
  const routers = routing.routers === 1 ? 'its one router' : `its ${routing.routers} routers together`;
  words.textContent = `Step ${fmtInt(step)} (${MODE_LABEL[mode] || mode}, ${routers}): `
    + `${fmtInt(routing.dropped)} of ${fmtInt(routing.choices)} choices dropped (${(100 * share).toFixed(1)}%). `
    + `The busiest device, ${routing.busiest}, ran ${fmtInt(routing.busiest_tokens)} tokens through its experts against a mean of ${routing.mean_tokens.toFixed(1)}: ${times(routing.imbalance)}. `
    + 'Each all-to-all waits for every device of its group, so the slowest device sets the step: '
    + (routing.imbalance > 1.05 ? `with ragged (dropless) dispatch its expert matmuls take ${times(routing.imbalance)} the mean’s time while the others wait. ` : 'here the load is nearly even. ')
    + 'shardlab pads every expert to its slots, so each device computes the same and an expert’s overflow is dropped; the load-balancing loss pulls the router towards even loads.';
  $('moe-history').replaceChildren(...history.map((h) => el('span', {
    class: 'moe-step', 'data-testid': 'moe-step',
    title: `step ${h.step}: ${fmtInt(h.dropped)} of ${fmtInt(h.choices)} dropped, busiest ${times(h.imbalance)} the mean`,
    style: `height:${pct(h.choices ? h.dropped / h.choices : 0)}`,
  })));
}
