// The timeline panel: both modes' modelled steps laid out in time, a row per device (labelled by
// its mesh coordinates) with a compute lane and a communication lane, on one time axis, so the
// seed's gap reads as a longer row of rng spans, and a pipeline's bubble as each stage's idle
// time, which its row's label gives as a share of the step. The layout is the core's
// (shardlab::profile::model_step, through the wasm handle's `timelines`); this file only draws
// it. Every span is focusable: hovering or focusing it names the op (and in automatic mode the
// rule that inserted it), and Enter, Space or a click selects the op in the program view.
import { el } from './dom.js';

/** Rows drawn per mode: enough for an 8-device mesh; an SPMD program's other rows are alike. */
export const MAX_ROWS = 8;
/** Spans narrower than this (px) merge with their neighbours of the same category. */
const MIN_PX = 2;

/** Runs of spans too narrow to see, merged: one element per visible piece. */
function pieces(spans, pxPerMs) {
  const out = [];
  for (const s of spans) {
    const last = out[out.length - 1];
    const narrow = s.dur_ms * pxPerMs < MIN_PX;
    if (narrow && last && last.merged && last.category === s.category
      && Math.abs(last.start_ms + last.dur_ms - s.start_ms) < 1e-9) {
      last.dur_ms = s.start_ms + s.dur_ms - last.start_ms;
      last.ops.push(s);
    } else {
      out.push({ start_ms: s.start_ms, dur_ms: s.dur_ms, category: s.category, merged: narrow, ops: [s] });
    }
  }
  return out;
}

/** What hovering a piece says: the op, its category and time, and why it was inserted. */
function describe(p, fmtMs) {
  const first = p.ops[0];
  if (p.ops.length > 1) {
    return `${p.ops.length} ${p.category} spans from ${first.name}, ${fmtMs(p.dur_ms)} in all`;
  }
  const what = first.kind === 'wait' ? `waiting for ${first.name}` : first.name;
  return [`${what} · ${first.category} · ${fmtMs(first.dur_ms)}`, first.inserted].filter(Boolean).join('\n');
}

function lane(mode, spans, pxPerMs, width, stream, { colors, fmtMs, onSelect }) {
  const parts = pieces(spans, pxPerMs).map((p) => {
    const first = p.ops[0];
    const select = () => { if (first.instr !== null && first.instr !== undefined) onSelect(mode, first.instr); };
    const node = el('span', {
      class: `tl-span${first.kind === 'wait' ? ' tl-wait' : ''}`,
      role: 'button',
      tabIndex: 0,
      title: describe(p, fmtMs),
      'aria-label': describe(p, fmtMs),
      'data-testid': 'timeline-span',
      'data-category': p.category,
      'data-instr': first.instr ?? '',
      style: `left:${(p.start_ms * pxPerMs).toFixed(2)}px;width:${Math.max(1, p.dur_ms * pxPerMs).toFixed(2)}px;`
        + `background:${colors[p.category] ?? '#a8a29e'}`,
    });
    node.addEventListener('click', select);
    node.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); select(); }
    });
    return node;
  });
  return el('div', { class: `tl-lane tl-${stream}`, style: `width:${width}px` }, parts);
}

/** A row's label: the device, and the share of the step it idles waiting for the others. */
function rowLabel(row, stepMs, fmtMs) {
  if (!(row.idle_ms > 0 && stepMs > 0)) return el('span', { class: 'tl-label' }, row.label);
  const share = `${(100 * row.idle_ms / stepMs).toFixed(1)}%`;
  return el('span', { class: 'tl-label', title: `${row.label} waits ${fmtMs(row.idle_ms)} of the step for the other devices` },
    row.label, el('span', { class: 'tl-idle', 'data-testid': 'timeline-idle' }, `idle ${share}`));
}

/** Draws `data` (the wasm handle's `timelines`) into `container`, `width` px of time axis. */
export function renderTimeline(container, data, { width, colors, fmtMs, modeLabel, onSelect }) {
  const pxPerMs = data.step_ms > 0 ? width / data.step_ms : 0;
  const blocks = Object.entries(data.modes).map(([mode, m]) => {
    const rows = m.rows.slice(0, MAX_ROWS).map((row) => el('div', {
      class: 'tl-row', 'data-testid': 'timeline-row', 'data-mode': mode, 'data-device': row.label, 'data-idle-ms': String(row.idle_ms),
    },
    rowLabel(row, m.step_ms, fmtMs),
    el('div', { class: 'tl-lanes' },
      lane(mode, row.compute, pxPerMs, width, 'compute', { colors, fmtMs, onSelect }),
      m.comm_stream ? lane(mode, row.comm, pxPerMs, width, 'comm', { colors, fmtMs, onSelect }) : null)));
    const more = m.rows.length > MAX_ROWS
      ? el('p', { class: 'small muted' }, `${m.rows.length - MAX_ROWS} more devices run the same program and are not drawn.`)
      : null;
    const saved = m.serial_ms - m.step_ms;
    const head = `${modeLabel(mode)}: ${fmtMs(m.step_ms)} a step`
      + (m.overlap && saved > 0 ? ` (overlap hides ${fmtMs(saved)} of ${fmtMs(m.serial_ms)})` : ' (nothing overlapped)');
    return el('div', { class: 'tl-mode', 'data-testid': 'timeline-mode', 'data-mode': mode, 'data-step-ms': String(m.step_ms) },
      el('h3', { class: 'tl-head' }, head), rows, more);
  });
  const axis = el('div', { class: 'tl-axis small muted', style: `margin-left:var(--tl-label);width:${width}px` },
    el('span', {}, '0'), el('span', {}, fmtMs(data.step_ms)));
  container.replaceChildren(...blocks, axis);
}
