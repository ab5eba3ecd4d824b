// "Which strategy?": the core's search over the page's model on as many devices of the chosen
// kind as the mesh has (the wasm handle's `which_strategy`, shardlab::search): the ten fastest
// ways that fit, each with its memory per device, modelled step and what limits it, and a button that loads it into the sandbox (its preset's strategy, mesh, mode,
// remat policy and microbatches; the model stays as it is). This file only renders the core's answer.
import { $, el } from './dom.js';
import { MODE_LABEL, fmtBytes, fmtMs, plural } from './format.js';

/** Searches for `settings` and shows the choices; `load(change)` applies one to the settings. */
export function renderStrategy(wasm, settings, load) {
  const box = $('strategy-result');
  box.replaceChildren(el('p', { class: 'muted small' }, 'Planning and pricing every strategy, mesh, mode and remat policy…'));
  // Yield once so the line above paints before the (synchronous) search.
  setTimeout(() => showStrategy(box, JSON.parse(wasm.Shardlab.which_strategy(JSON.stringify(settings))), load), 30);
}

function showStrategy(box, r, load) {
  if (!r.ok) {
    box.replaceChildren(el('p', { class: 'field-error', 'data-testid': 'strategy-error' }, r.error));
    return;
  }
  const rows = r.ranked.map((x) => el('tr', { 'data-testid': 'strategy-row', 'data-rank': String(x.rank) },
    el('td', { class: 'num' }, String(x.rank)),
    el('td', {}, MODE_LABEL[x.mode] || x.mode),
    el('td', {}, strategyText(x)),
    el('td', {}, x.mesh),
    el('td', {}, x.remat),
    el('td', { class: 'num' }, String(x.microbatches)),
    el('td', { class: 'num', 'data-testid': 'strategy-ms' }, fmtMs(x.step_ms)),
    el('td', { class: 'num' }, fmtBytes(x.bytes)),
    el('td', {}, `${x.limiting} (${Math.round(100 * x.limiting_share)}%)`),
    el('td', {}, x.load
      ? el('button', { type: 'button', 'data-testid': 'strategy-load', onclick: () => loaded(box, x, load) }, 'Load')
      : el('span', { class: 'muted', title: 'No preset of the page runs this strategy: it is priced only' }, 'priced only'))));
  box.replaceChildren(
    el('p', { class: 'small', 'data-testid': 'strategy-summary' }, `${plural(r.considered, 'configuration')} on ${r.devices} × ${r.device}, every combination of ${r.levers.slice(0, -1).join(', ')} and ${r.levers.at(-1)}: `,
      `${r.invalid} do not split this model, ${r.too_large} do not fit, ${r.screened} are behind the fastest by the closed-form estimate; of the ${r.priced} planned and priced, ${r.fits} fit. `,
      el('span', { class: 'tag modelled' }, 'modelled'), ' The fastest:'),
    el('div', { class: 'table-scroll' }, el('table', { class: 'compact', 'data-testid': 'strategy-table' },
      el('thead', {}, el('tr', {}, ...['#', 'mode', 'strategy', 'mesh', 'remat', 'microbatches', 'step', 'per device', 'limited by', ''].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows))),
    el('p', { class: 'muted small' }, 'Load runs a choice here, on simulated devices in this tab: the model stays as it is, the strategy, mesh, mode, remat, microbatches, a ring’s order and a pipeline’s schedule and virtual stages change (its stages equal).'),
    el('p', { class: 'small', 'data-testid': 'strategy-loaded', role: 'status', hidden: true }),
  );
}

/** A row's strategy: a preset's name, or a composition's mesh with the options that refine its
 * axes (ZeRO on dp, sequence parallelism on tp, the ring's order on cp); and a pipeline's schedule. */
function strategyText(x) {
  const options = [];
  if (x.load && x.strategy.includes('=')) {
    if (x.load.zero !== '0') options.push(`ZeRO-${x.load.zero}`);
    if (x.load.sequence_parallel) options.push('sequence parallel');
    if (x.load.cp_order === 'zigzag') options.push('zig-zag ring');
  }
  if (x.schedule) options.push(x.virtual_stages > 1 ? `${x.schedule} v${x.virtual_stages}` : x.schedule);
  return options.length ? `${x.strategy} (${options.join(', ')})` : x.strategy;
}

/** Loads choice `x` into the experiment, and says so here, where the button was pressed. */
function loaded(box, x, load) {
  load(x.load);
  const line = box.querySelector('[data-testid="strategy-loaded"]');
  const go = el('button', { type: 'button', class: 'inline', onclick: () => $('controls').scrollIntoView({ behavior: 'smooth', block: 'start' }) }, 'Go to the experiment');
  line.replaceChildren(`Loaded #${x.rank}: ${strategyText(x)} on ${x.mesh}, ${MODE_LABEL[x.mode] || x.mode}, remat ${x.remat}, ${x.microbatches} microbatch${x.microbatches === 1 ? '' : 'es'}. The experiment above trains it from step 0.`, go);
  line.hidden = false;
}
