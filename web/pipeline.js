// The pipeline diagram: each stage's passes in time, as the schedule's own table places them
// (shardlab::plan::Table::timing through Settings::pipeline: forward F, input-gradient B and
// weight-gradient W passes of one unit each, an unsplit backward two), with the time a stage
// runs nothing shaded as the bubble. Positions are shares of the step, so it fits any width.
import { el } from './dom.js';
import { fmtBytes } from './format.js';

/** Each pass by the letter the core writes (ir::Pass), as the legend and hovering name it. */
const PASS = {
  F: { cls: 'pd-forward', short: 'forward', words: 'forward' },
  B: { cls: 'pd-backward', short: 'backward (input)', words: 'backward: the input’s gradient, which the stage before waits for' },
  W: { cls: 'pd-weight', short: 'weight gradient', words: 'weight gradient: nothing waits for it, so it fills the drain' },
};
/** Where the schedule does not split the backward, B computes both gradients. */
const UNSPLIT_B = { ...PASS.B, short: 'backward', words: 'backward: the input’s and the weights’ gradients' };

const pct = (x) => `${(100 * x).toFixed(3)}%`;

/** Draws `p` (Settings::pipeline's JSON: `diagram` is the core's Timing; `in_flight` and
 * `stage_activations` each stage's held microbatch chunks and activations at their peak) into
 * `box`, each stage's memory at the end of its row. */
export function renderPipelineDiagram(box, p) {
  const { slots, makespan } = p.diagram;
  const chunks = p.virtual_stages;
  const split = slots.some((stage) => stage.some((x) => x.action.pass === 'W'));
  const pass = (letter) => (letter === 'B' && !split ? UNSPLIT_B : PASS[letter]);
  // Microbatch numbers from 1; with virtual stages, the chunk as a letter (3b: microbatch 3, chunk b).
  const label = (a) => `${a.microbatch + 1}${chunks > 1 ? String.fromCharCode(97 + a.chunk) : ''}`;
  const rows = slots.map((stage, s) => el('div', { class: 'pd-row', 'data-testid': 'pipeline-stage' },
    el('span', { class: 'pd-label' }, `stage ${s}`),
    el('div', { class: 'pd-track' }, ...stage.map(({ action: a, start, end }) => {
      const what = `stage ${s}, microbatch ${a.microbatch + 1}${chunks > 1 ? `, chunk ${a.chunk + 1} of ${chunks}` : ''}: `
        + `${pass(a.pass).words}`;
      return el('span', {
        class: `pd-slot ${pass(a.pass).cls}`,
        title: what,
        'aria-label': what,
        'data-testid': 'pipeline-slot',
        'data-pass': a.pass,
        style: `left:${pct(start / makespan)};width:${pct((end - start) / makespan)}`,
      }, label(a));
    })),
    stageMemory(p, s)));
  const key = (cls, text) => el('span', { class: 'pd-key' }, el('span', { class: `pd-swatch ${cls}` }), ` ${text}`);
  const legend = el('p', { class: 'pd-legend small' },
    ...['F', 'B', 'W'].filter((l) => l !== 'W' || split).map((l) => key(pass(l).cls, `${l} ${pass(l).short}`)),
    key('pd-idle', 'idle: the bubble'),
    chunks > 1 ? el('span', { class: 'pd-key' }, '3b: microbatch 3 on the stage’s chunk b') : null);
  box.replaceChildren(...rows, legend);
  box.hidden = false;
}

/** Stage `s`'s activations at their peak, and the microbatch chunks that make them. */
function stageMemory(p, s) {
  const held = p.in_flight[s];
  const what = `stage ${s} holds ${held} microbatch${p.virtual_stages > 1 ? ' chunk' : ''}${held === 1 ? '' : 'es'}`
    + ` at once: ${fmtBytes(p.stage_activations[s])} of activations at its peak`;
  return el('span', { class: 'pd-mem', title: what, 'aria-label': what, 'data-testid': 'pipeline-stage-memory' },
    `${held}× · ${fmtBytes(p.stage_activations[s])}`);
}
