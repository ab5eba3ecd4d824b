// The page: checks for WebGPU first, then loads the wasm handle (pkg/, built by
// `cargo xtask serve`), and drives it: settings in, steps, programs and summaries out (JSON).
// All model and partitioning logic lives in the wasm; this file renders and keeps the URL hash.
// It is the page's entry and owns the run: the settings and the hash, the session, the live
// figures and the cost model's bars, the adapter and the self-test. Its other parts are modules
// it imports and hands what they need: format.js (numbers and names), dom.js ($ and el),
// fields.js (the settings' grammar and the link), charts.js, inspector.js (the programs),
// story.js and story_run.js (the report's story and its measurement), strategy.js (which
// strategy?), learn.js, editor.js and calibrate.js.
// State for tests: document.body.dataset.state (loading | no-webgpu | ready | error),
// document.body.dataset.run (the session's phase), document.body.dataset.selftest
// (running | done), and window.shardlab.

import {
  initLearn, learnFacts, renderExamplePrediction, renderSample, renderSampleStep, renderTask,
} from './learn.js';
import * as fields from './fields.js';
import {
  FIELDS, fieldText, parseField, settingsHash,
} from './fields.js';
import * as editor from './editor.js';
import { setupThisGpu } from './calibrate.js';
import { $, el } from './dom.js';
import {
  MODES, RUN_MODES, MODE_LABEL, runsExplicit, dropoutNote, fmtBytes, fmtErr, fmtInt, fmtMs, fmtPct, fmtRate, fmtTimes, frame, pageWords, sentence,
} from './format.js';
import { init as initCharts, makeCharts, updateCharts } from './charts.js';
import { coordText, deviceColor, renderPrograms, selectInstr, wireInspector } from './inspector.js';
import { renderTimeline } from './timeline.js';
import { renderPipelineDiagram } from './pipeline.js';
import { renderMoe, renderRouting } from './moe.js';
import { init as initStory, renderStory } from './story.js';
import * as storyRun from './story_run.js';
import { renderStrategy } from './strategy.js';
import * as mesh from './mesh.js';
import * as axisTypes from './axis_types.js';

const state = {
  adapter: null, report: null, error: null, settings: null, configured: null, programs: null,
  last: null, steps: 0, playing: false, busy: false, charts: {}, hashNotice: null,
  // The session: one phase at a time, and the actions waiting for the next step boundary.
  phase: 'idle', queue: [], driving: false, deviceLost: false,
  // The story: its run for this adapter (`choice`), the report's run priced (`report`), the
  // last run of the story (`result`, story_run.js), both programs' summaries per settings
  // (minus mode and RNG layout) and layout, the mask overlap, and a link's unreadable results.
  story: { choice: null, report: null, result: null, summaries: {}, overlap: null, linkError: null },
};
window.shardlab = state;

let lab = null; // the wasm handle
let wasm = null;
let presets = null; // {default, presets: {name: settings}, devices: [...]}

function setState(s, status) {
  document.body.dataset.state = s;
  if (status !== undefined) document.querySelector('[data-testid="status"]').textContent = status;
}

// ---- errors -------------------------------------------------------------------------------

/** The banner: for real failures only (a step, the GPU, an export), never for settings. */
function showError(message, hint) {
  const text = String(message && message.message ? message.message : message);
  state.error = text;
  const box = document.querySelector('[data-testid="error"]');
  box.replaceChildren(el('h2', {}, 'Something went wrong'), el('pre', {}, text),
    el('p', { class: 'hint' }, hint || 'Change the settings or press Reset to train again; nothing needs a reload.'));
  box.hidden = false;
}

function clearError() {
  state.error = null;
  const box = document.querySelector('[data-testid="error"]');
  box.replaceChildren();
  box.hidden = true;
}

function fatal(message) {
  showError(message, 'Reload the page to try again. If it keeps failing, the message above names the part that failed.');
  setState('error', 'Error');
}

window.addEventListener('error', (e) => fatal(e.error || e.message));
window.addEventListener('unhandledrejection', (e) => fatal(e.reason));

function noWebGpu(reason) {
  if (reason) $('no-webgpu-reason').textContent = reason;
  $('no-webgpu').hidden = false;
  setState('no-webgpu', 'WebGPU unavailable');
}

// ---- formatting: the fmt* helpers, pageWords, plural, median and frame live in format.js ----

// ---- settings, controls and the URL hash ---------------------------------------------------

/** The link: the settings, and the story's results where they were measured on these settings
 * (the mode and the RNG layout aside: the story runs both). */
function hashOf(s) {
  const p = settingsHash(s);
  const r = state.story.result;
  const results = r ? storyRun.hashValue() : null;
  if (results && storyKey(r.settings) === storyKey(s)) p.set('story', results);
  return `#${p.toString()}`;
}

function showHashNotice(problem) {
  const box = $('hash-notice');
  state.hashNotice = problem;
  if (!problem) {
    box.hidden = true;
    return;
  }
  box.replaceChildren(el('strong', {}, 'Part of the link could not be read and is left out; the rest of its settings are shown. '),
    el('span', {}, `(${problem})`));
  box.hidden = false;
}

/**
 * Opens a link: its settings in the controls, each unreadable one shown as written and marked
 * at its control (then nothing runs until it is fixed, as when typed), and its story results.
 */
function openLink() {
  const { settings, bad, errors, story, problem } = fields.readLink(location.hash);
  showHashNotice(problem);
  writeControls(settings);
  for (const [k, text] of Object.entries(bad)) {
    const input = controlNamed(k);
    if (input && input.tagName === 'SELECT' && ![...input.options].some((o) => o.value === text)) {
      input.append(el('option', { value: text, 'data-from-link': '' }, text));
    }
    if (input) input.value = text;
  }
  openSpecsOf(settings);
  state.story.linkError = null;
  if (story !== null) {
    try {
      state.story.result = storyRun.readHashValue(story, settings);
    } catch (e) {
      state.story.linkError = e.message;
    }
  }
  if (errors.length) {
    state.settings = settings;
    refuseSettings(errors);
    return;
  }
  request({ kind: 'configure', settings, updateHash: !problem });
}

/** Settings the page's grammar refuses: marked at their controls, and nothing runs. */
function refuseSettings(errors) {
  markFieldErrors(errors);
  state.queue = [];
  state.playing = false;
  state.configured = null;
  renderUnconfigured();
  updateButtons();
}

const form = () => $('settings');

function writeControls(s) {
  const f = form();
  for (const k of Object.keys(FIELDS)) {
    const input = f.elements[k];
    if (!input) continue;
    if (input.type === 'checkbox') input.checked = !!s[k];
    else input.value = fieldText(k, s[k]);
  }
  editor.write(s);
  mesh.render();
  axisTypes.render(s);
  writeFoldFacts(s);
  for (const o of f.querySelectorAll('option[data-from-link]')) if (!o.selected) o.remove();
  window.dispatchEvent(new Event('shardlab:controls'));
}

/** The controls' settings and, for each control whose text the grammar refuses, its error. */
function readControls() {
  const f = form();
  const s = {};
  const errors = [];
  for (const k of Object.keys(FIELDS)) {
    const input = f.elements[k];
    if (input.type === 'checkbox') {
      s[k] = input.checked;
      continue;
    }
    try {
      s[k] = parseField(k, input.value.trim());
    } catch (e) {
      s[k] = input.value;
      errors.push({ field: k, message: e.message });
    }
  }
  const specs = editor.read(s, errors.length > 0);
  s.specs = specs.specs;
  errors.push(...specs.errors);
  return { settings: s, errors };
}

/** Where the settings' controls live: the form, and the sharding editor's own panel. */
const controlRoots = () => [form(), $('shardings')];
const controlNamed = (name) => controlRoots().map((r) => r.querySelector(`[name="${CSS.escape(name)}"]`)).find(Boolean);

function markFieldErrors(errors) {
  for (const root of controlRoots()) {
    for (const old of root.querySelectorAll('[data-testid="field-error"]')) old.remove();
    for (const old of root.querySelectorAll('.invalid')) old.classList.remove('invalid');
    for (const old of root.querySelectorAll('[aria-invalid]')) {
      old.removeAttribute('aria-invalid');
      old.removeAttribute('aria-describedby');
    }
  }
  const ids = new Map();
  for (const e of errors) {
    // A mesh axis's refusal sits at that axis's size, or the mesh where it has none.
    // An axis type's lands at its axis's select, or the types where the mesh has no such axis.
    const input = e.field && (controlNamed(e.field) || (e.field.startsWith('mesh.') && controlNamed('mesh'))
      || (e.field.startsWith('axis_type.') && controlNamed('axis_types')));
    const label = input ? input.closest('label') : form().querySelector('label');
    // Two modes can refuse one control in their own words: each message its own id.
    const base = `error-${e.field || 'settings'}`;
    const n = ids.get(base) || 0;
    ids.set(base, n + 1);
    const id = n ? `${base}-${n + 1}` : base;
    if (input) {
      input.classList.add('invalid');
      input.setAttribute('aria-invalid', 'true');
      input.setAttribute('aria-describedby', [input.getAttribute('aria-describedby'), id].filter(Boolean).join(' '));
    }
    // A folded part opens to show its error.
    for (let d = label.closest('details'); d; d = d.parentElement.closest('details')) d.open = true;
    // A spec field's own reason says the same: the message shows once.
    const reason = input && input.closest('.spec-field')?.querySelector('.spec-reason');
    if (reason) reason.hidden = true;
    const message = el('p', { class: 'field-error', id, 'data-testid': 'field-error', 'data-field': e.field || '' }, pageWords(e.message));
    if (e.fix) message.append(' ', fixButton(e.fix));
    label.after(message);
  }
  $('settings-blocked').hidden = errors.length === 0;
}

/** One press applies a refusal's fix: the spec override the core names (explicit mode's
 * `out_sharding=` or `reshard` of a named value), written into the editor and the link. */
function fixButton(fix) {
  const button = el('button', { type: 'button', class: 'fix-button', 'data-testid': 'apply-fix' },
    `Apply the fix: ${fix.name} = ${fix.spec} (${fix.code})`);
  button.addEventListener('click', () => {
    request({ kind: 'configure', settings: { ...state.settings, specs: { ...(state.settings.specs || {}), [fix.name]: fix.spec } } });
  });
  return button;
}

/** A link that sets shardings opens the editor on them. */
function openSpecsOf(s) {
  if (Object.keys(s.specs || {}).length) $('spec-editor').open = true;
}

/** Each folded part's summary line says what it holds, so folding hides no setting's value. */
function writeFoldFacts(s) {
  const facts = {
    model: `${s.layers} layers, d_model ${s.d_model}, ${s.heads} heads, seq ${s.seq}, batch ${s.batch}, vocab ${s.vocab}, dropout ${s.dropout}, attention ${s.attention}${s.remat === 'none' ? '' : `, remat ${s.remat}`}`,
    experts: s.experts > 0 ? `${s.experts} experts, top-${s.top_k}, width ${s.expert_width}, capacity ${s.capacity}, load-balancing ${s.aux_loss}` : 'none: the dense MLP',
    learning: learnFacts(s),
    memory: isPipeline(s) ? 'the microbatches are the pipeline’s'
      : `${s.microbatches === 1 ? 'no gradient accumulation' : `${s.microbatches} microbatches`}${shardedState(s) ? `, ${shardedState(s)}` : ''}`,
    sequence: `${[mesh.hasAxis(s.mesh, 'cp') ? 'context parallel' : null, mesh.hasAxis(s.mesh, 'tp') && s.sequence_parallel ? 'sequence parallel' : null].filter(Boolean).join(' and ') || 'not split'}, ${s.cp_order === 'zigzag' ? 'zig-zag' : 'contiguous'} blocks`,
    pipeline: `${s.schedule}, ${s.microbatches} microbatches${s.virtual_stages > 1 ? `, ${s.virtual_stages} virtual stages` : ''}${s.stage_layers.length ? `, blocks ${s.stage_layers.join(', ')}` : ''}`,
    rng: `${s.rng}, ${s.dropout_key === 'same' ? 'same key' : 'fold_in'}${s.combine ? ', all-reduces combined' : ''}`,
    shardings: Object.keys(s.specs || {}).length ? `${Object.keys(s.specs).length} changed from the preset` : 'the preset’s',
  };
  for (const span of document.querySelectorAll('.fold-facts')) span.textContent = `· ${facts[span.dataset.facts]}`;
  $('remat-trade').textContent = REMAT_TRADE[s.remat];
  placePipelineControls(s);
}

/** Whether the settings' mesh runs a pipeline (a pp axis). */
const isPipeline = (s) => mesh.hasAxis(s.mesh, 'pp');

/** What shards the optimizer state beyond the parameters' own split: ZeRO on dp, or an fsdp axis. */
const shardedState = (s) => [mesh.hasAxis(s.mesh, 'dp') && s.zero !== '0' ? `ZeRO-${s.zero}` : null,
  mesh.hasAxis(s.mesh, 'fsdp') ? 'fsdp' : null].filter(Boolean).join(', ');

/**
 * The pipeline fold shows for a pipeline's preset, or where a schedule other than the default
 * needs its error seen. While the preset is a pipeline it holds the microbatches control, next to
 * the bubble they shrink; the memory levers hold it otherwise (one control, moved).
 */
function placePipelineControls(s) {
  const pipeline = isPipeline(s);
  // Every preset without stages has the default schedule and one chunk per stage.
  const base = presets.presets[presets.default];
  $('fold-pipeline').hidden = !pipeline && s.schedule === base.schedule && s.virtual_stages === base.virtual_stages
    && !s.stage_layers.length;
  const home = pipeline ? $('pipeline-fields') : $('memory-fields');
  const control = $('microbatches-field');
  if (control.parentElement !== home) home.append(control);
}

/** The core's bubble formula (`(pp-1)/(3M+pp-1)`) with the settings' numbers in it. */
const bubbleFormula = (p) => p.formula.replaceAll('pp', String(p.stages)).replace(/(\d)M/, '$1·M')
  .replace('M', String(p.microbatches)).replaceAll('-', ' − ').replaceAll('+', ' + ');

/**
 * The configured pipeline's bubble (`r.pipeline`: the core's Schedule::bubble_fraction for its
 * stages and microbatches) and, when automatic mode does not run beside shard_map, the core's
 * refusal (`r.refused.auto`); both hidden when `r` is null (settings that do not configure).
 */
function renderPipeline(r) {
  const p = r && r.pipeline;
  renderMeasuredBubble(null);
  const bubble = $('pipeline-bubble');
  bubble.hidden = !p;
  bubble.dataset.bubble = p ? String(p.bubble) : '';
  if (p) {
    const v = p.virtual_stages > 1 ? `, ${p.virtual_stages} virtual stages` : '';
    const pr = r.prediction && r.prediction.modes.shard_map;
    const step = pr ? ` Modelled on ${r.prediction.devices} × ${r.prediction.label}, a step takes ${fmtMs(pr.step_ms)}.` : '';
    bubble.textContent = `${p.stages} stages, ${p.microbatches} microbatches${v}, ${p.schedule}: each stage idles `
      + `${bubbleFormula(p)} = ${fmtPct(p.bubble)} of the step while the pipeline fills and drains.${step}`
      + ' At each row’s end: the microbatches the stage holds at once, and its activations at their peak.';
    renderPipelineDiagram($('pipeline-diagram'), p);
  } else {
    $('pipeline-diagram').hidden = true;
  }
  const refused = r && r.refused && r.refused.auto;
  $('pipeline-auto').hidden = !refused;
  $('pipeline-auto').textContent = refused ? sentence(pageWords(refused)) : '';
}

/** A profiled pipeline step's bubble (the core's measured_bubble): each stage's idle share with
 * its passes at their measured times on this GPU, beside the formula above. Hidden until a
 * profiled step, and again when the settings change. */
function renderMeasuredBubble(m) {
  const box = $('pipeline-measured');
  box.hidden = !m;
  if (!m) return;
  const stages = m.idle.map((idle, s) => `stage ${s} ${fmtPct(idle)} (fill ${fmtMs(m.fill_ms[s])}, drain ${fmtMs(m.drain_ms[s])})`);
  box.textContent = `Measured on this GPU (the profiled step), each pass at its measured time as devices of their own would run them: ${stages.join(', ')} idle of ${fmtMs(m.step_ms)}.`;
  box.dataset.idle = JSON.stringify(m.idle);
}

/** A line for a panel that shows only the modes the core could plan: which one it could not. */
function refusedNote() {
  const refused = Object.keys((state.configured && state.configured.refused) || {});
  if (!refused.length) return null;
  return el('p', { class: 'muted small', 'data-testid': 'refused-note' },
    sentence(`${refused.map((m) => MODE_LABEL[m]).join(' and ')} mode cannot plan these settings, so it is not shown; the program inspector says why.`));
}

/** What each remat policy trades, in one sentence. */
const REMAT_TRADE = {
  none: 'Remat trades compute for memory: with none, every activation is held from the forward pass to the backward.',
  full: 'Full remat holds only each block’s input and recomputes the rest of the block in the backward pass: about one more forward pass of compute for far fewer held activations.',
  dots: 'Dots remat also holds the weight matmuls’ outputs, so the backward recomputes only the cheap ops between them (norms, GELU, attention): less extra compute than full, more memory.',
};

// ---- the session: one phase at a time ----------------------------------------------------------
// idle (configured, no step yet) → building (the first step builds the trainers) → stepping →
// paused; error after a failed step. Setting changes, story buttons and Reset are actions: made
// while a step runs, they wait for its end (the step boundary) and replace whatever waited.

function setPhase(p) {
  state.phase = p;
  document.body.dataset.run = p;
  updateButtons();
}

/** A step joins the line; anything else (configure, reset, a story run) replaces it. */
function request(...actions) {
  if (actions.every((a) => a.kind === 'step')) state.queue.push(...actions);
  else state.queue = actions;
  drive();
}

/** The one loop that talks to the wasm: actions first, then Play's steps. */
async function drive() {
  if (state.driving) return;
  state.driving = true;
  try {
    for (;;) {
      let action = state.queue.shift();
      if (!action && state.playing && state.configured) action = { kind: 'step' };
      if (!action) break;
      if (action.kind === 'configure') {
        writeControls(action.settings);
        if (!applySettings(action.settings, action)) {
          state.queue = [];
          state.playing = false;
        }
      } else if (action.kind === 'call') {
        action.fn();
      } else if (action.kind === 'reset') {
        await doReset();
      } else if (action.kind === 'step') {
        if (!state.configured) {
          state.queue = [];
          state.playing = false;
          continue;
        }
        if (!(await stepOnce(action.profiled, action.story))) {
          state.queue = [];
          state.playing = false;
        } else {
          // A frame between steps keeps input and painting responsive.
          await frame();
        }
      }
    }
  } finally {
    state.driving = false;
    storyRun.idle();
    setPhase(state.error ? 'error' : state.steps > 0 ? 'paused' : 'idle');
  }
}

/** What a failed step means for the learner: a lost device, no memory, or the core's words. */
function stepFailed(message) {
  const gpu = lab.take_error();
  const text = [message, gpu].filter(Boolean).join('\n');
  if (/device (was )?lost|destroyed/i.test(text)) {
    state.deviceLost = true;
    showError(`The GPU device was lost: ${text}`,
      'The browser took the GPU away (a driver reset, another tab, or the GPU going to sleep). Press Reset: the page opens a new device and trains again; nothing needs a reload.');
  } else if (/out of memory|outofmemory/i.test(text)) {
    const mem = state.configured && state.configured.memory;
    const per = mem ? Math.max(...Object.values(mem.per_device)) : null;
    showError(`The GPU ran out of memory for this run${per ? ` (${fmtBytes(per)} per simulated device)` : ''}: ${text}`,
      'Lower batch, seq, d_model or layers, then press Reset.');
  } else {
    showError(text);
  }
}

async function stepOnce(profiled = false, story = null) {
  state.busy = true;
  setPhase(state.steps === 0 ? 'building' : 'stepping');
  try {
    // The story's profile is the quick one: its categories, no floors.
    const r = JSON.parse(await (profiled ? lab.step_profiled(!story) : lab.step()));
    if (r.discarded) return true; // the run was replaced meanwhile: nothing to show
    if (!r.ok) {
      stepFailed(r.error);
      return false;
    }
    const gpuError = lab.take_error();
    if (gpuError) {
      stepFailed(gpuError);
      return false;
    }
    // The core refuses a non-finite loss; JSON carries NaN as null, so check here too.
    const diverged = RUN_MODES.find((m) => r.modes[m] && !r.modes[m].profiled && !Number.isFinite(r.modes[m].loss));
    if (diverged) {
      showError(`The ${MODE_LABEL[diverged]} loss is not a finite number at step ${r.step + 1}: training stopped.`,
        'Lower the dropout or the model size, then press Reset.');
      return false;
    }
    clearError();
    record(r, story);
    return true;
  } finally {
    state.busy = false;
  }
}

async function doReset() {
  state.playing = false;
  setPhase('building');
  const r = JSON.parse(await lab.reset(state.deviceLost));
  if (!r.ok) {
    showError(r.error, 'Reload the page if a new GPU device cannot be opened.');
    return;
  }
  state.deviceLost = false;
  clearError();
  // A fresh run from the controls' settings (also after an error or a lost device).
  const { settings, errors } = readControls();
  if (errors.length) {
    markFieldErrors(errors);
    state.configured = null;
    return;
  }
  applySettings(settings);
}

// ---- configure and train ------------------------------------------------------------------

/** Key of one experiment: the settings except the mode and the RNG layout. The charts keep its
 * history (both layouts' and every mode's steps side by side, so switching the mode or the
 * layout loses none), and the story's results belong to it. */
const historyKey = (s) => settingsHash({ ...s, mode: 'both', rng: 'original' }).toString();
const storyKey = historyKey;

function applySettings(s, { updateHash = true, fresh = false } = {}) {
  const before = state.settings;
  state.settings = s;
  if (updateHash) history.replaceState(null, '', hashOf(s));
  const r = JSON.parse(lab.configure(JSON.stringify(s), !fresh));
  if (!r.ok) {
    markFieldErrors(r.errors);
    renderUnconfigured();
    renderPipeline(r.pipeline ? r : null);
    return false;
  }
  markFieldErrors([]);
  if (!state.deviceLost) clearError();
  state.configured = r;
  resetView(r, historyKey(s));
  renderModeNotice(before, s, r);
  $('dropout-note').textContent = dropoutNote(s.dropout, s.dropout_key, r.modes);
  state.programs = JSON.parse(lab.programs());
  renderPipeline(r);
  renderMoe(r);
  // The story compares the modes: kept where the report's two are planned, with explicit's
  // where it is too.
  if (state.programs.ok && MODES.every((m) => state.programs.modes[m])) {
    const key = storyKey(s);
    const summaries = Object.fromEntries(RUN_MODES.filter((m) => state.programs.modes[m]).map((m) => [m, state.programs.modes[m].summary]));
    state.story.summaries[key] = { ...(state.story.summaries[key] || {}), [s.rng]: { ...summaries, prediction: r.prediction } };
  }
  state.story.overlap = JSON.parse(lab.mask_overlap());
  showPrograms(state.programs);
  editor.afterPrograms();
  renderStory();
  renderTask(JSON.parse(lab.example()));
  const perDevice = Math.max(...Object.values(r.memory.per_device));
  $('run-facts').textContent = `mesh ${s.mesh} (${(mesh.meshAxes(s.mesh) || []).map(([a]) => a).join(' × ')}) · ${r.devices} simulated devices · ${fmtInt(r.params)} parameters · ${fmtInt(r.tokens_per_step)} tokens per step · ${fmtBytes(perDevice)} per device · ${learnFacts(s)}`;
  renderPrediction(r.prediction);
  showTimeline();
  return true;
}

/** Settings that do not run: every figure of a run says so, none shows a stale or empty value. */
function renderUnconfigured() {
  state.configured = null;
  state.programs = null;
  state.timeline = null;
  $('timeline-body').replaceChildren(el('p', { class: 'muted small', 'data-testid': 'timeline-empty' }, 'Fix the marked settings to see a step in time.'));
  renderPipeline(null);
  renderMoe(null);
  // The charts keep the experiment's history: fixing the settings back resumes its run.
  if (!state.history) resetView();
  renderStory();
  renderTask(null);
  $('modelled-on').textContent = 'the chosen devices (fix the marked settings)';
  $('chart-modelled').replaceChildren();
  $('chart-memory').replaceChildren();
}

/** After the mode changed with nothing else: which modes go on, and which are kept where they
 * stopped (the core keeps a stopped mode's trainer while it fits the page's GPU budget). */
function renderModeNotice(before, s, r) {
  const box = $('mode-notice');
  const switched = before && before.mode !== s.mode && historyKey(before) === historyKey(s) && before.rng === s.rng;
  if (!switched) {
    if (before && historyKey(before) !== historyKey(s)) box.hidden = true;
    return;
  }
  const steps = r.mode_steps || {};
  const running = r.modes;
  const kept = RUN_MODES.filter((m) => !running.includes(m) && steps[m]);
  const from = (m) => `${MODE_LABEL[m]} from step ${fmtInt(steps[m] || 0)}`;
  const goesOn = running.length > 1 ? `${running.length === 2 ? 'Both' : `All ${running.length}`} modes go on: ${running.map(from).join(', ')}.` : `${sentence(from(running[0]).replace(' from', ' goes on from'))}.`;
  box.textContent = r.resumed
    ? `${goesOn}${kept.map((m) => ` ${MODE_LABEL[m]}’s run is kept at step ${fmtInt(steps[m])}: switch back to resume it; its steps stay on the charts.`).join('')}`
    : `${sentence(running.map((m) => MODE_LABEL[m]).join(' and '))} ${running.length > 1 ? 'start' : 'starts'} a new run: the previous one could not be kept beside it on this GPU.`;
  box.hidden = false;
}

// ---- the timeline: drawn by timeline.js from the core's modelled timelines -----------------

/** Both modes' modelled timelines for the current settings, overlap as the checkbox says. */
function showTimeline() {
  const t = JSON.parse(lab.timelines($('timeline-overlap').checked));
  if (!t.ok) return showError(t.error);
  state.timeline = t;
  $('timeline-device').textContent = t.label;
  const body = $('timeline-body');
  // The row labels take 6.5rem (style.css's --tl-label); the time axis gets the rest.
  const width = Math.max(200, body.clientWidth - 112);
  renderTimeline(body, t, {
    width,
    colors: CATEGORY_COLOR,
    fmtMs,
    modeLabel: (m) => MODE_LABEL[m],
    onSelect: (mode, instr) => {
      if (!selectInstr(mode, instr)) $('program-aligned').scrollIntoView({ block: 'start' });
    },
  });
  body.append(categoryLegend(), refusedNote() || '');
  return true;
}

/** The timelines as one Chrome trace-event file. */
function downloadTrace() {
  if (!state.timeline) return;
  const blob = new Blob([JSON.stringify(state.timeline.trace)], { type: 'application/json' });
  const a = el('a', { href: URL.createObjectURL(blob), download: `shardlab_${state.settings.preset}_timeline.json` });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 0);
}

/**
 * The live figures for a run that starts (or, `resumed`, goes on from `steps`). The charts keep
 * the history of the experiment `key` names: a resumed run adds to its own series, a new run
 * replaces its own, and the other RNG layout's series stay beside them.
 */
function resetView({ resumed = false, steps = 0, settings } = {}, key = null) {
  state.steps = resumed ? steps : 0;
  const h = state.history;
  if (!h || h.key !== key || key === null) state.history = { key, series: {} };
  else if (!resumed && settings) for (const m of RUN_MODES) delete h.series[seriesKey(m, settings.rng)];
  $('step').textContent = String(state.steps);
  $('run-line-step').textContent = `step ${fmtInt(state.steps)}`;
  if (!resumed) {
    state.last = null;
    for (const id of ['step-ms', 'loss', 'tokens-per-s', 'run-line-ms']) $(id).textContent = '—';
    $('breakdown').hidden = true;
    // A new run has not predicted anything yet.
    if (state.example) renderTask(state.example);
  }
  if (Object.keys(state.history.series).length) updateCharts();
  else makeCharts();
}

const seriesKey = (mode, rng) => `${mode}:${rng}`;

/** One mode's steps under one RNG layout: measured times and losses indexed by step. */
function seriesOf(mode, rng) {
  const all = state.history.series;
  return (all[seriesKey(mode, rng)] ||= { mode, rng, measured: [], loss: [] });
}

function record(r, story = null) {
  state.last = r;
  state.steps = r.step + 1;
  for (const m of RUN_MODES) {
    const s = r.modes[m];
    if (!s) continue;
    const line = seriesOf(m, state.settings.rng);
    // A profiled step waits after every phase: its time is not a step time, so it is neither
    // charted nor shown as the last step time. The loss it reads back is not reliable in
    // automatic mode (the step re-runs forward and backward under timestamp queries) either.
    // Each mode's own step: a mode switched off and on again goes on from where it stopped.
    line.measured[s.step] = s.profiled ? null : s.step_ms;
    line.loss[s.step] = s.profiled ? null : s.loss;
  }
  const ran = RUN_MODES.filter((m) => r.modes[m]);
  const profiled = ran.some((m) => r.modes[m].profiled);
  const per = (id, f) => $(id).replaceChildren(...ran.map((m) =>
    el('span', { 'data-mode': m }, ran.length > 1 ? `${MODE_LABEL[m]} ${f(r.modes[m])}` : f(r.modes[m]))));
  $('step').textContent = String(state.steps);
  $('run-line-step').textContent = `step ${fmtInt(state.steps)}`;
  if (!profiled) {
    per('step-ms', (s) => fmtMs(s.step_ms));
    $('run-line-ms').textContent = ran.map((m) => (ran.length > 1 ? `${MODE_LABEL[m]} ${fmtMs(r.modes[m].step_ms)}` : fmtMs(r.modes[m].step_ms))).join(', ');
    per('loss', (s) => s.loss.toFixed(4));
    per('tokens-per-s', (s) => fmtRate(s.tokens_per_s));
  }
  updateCharts();
  const routed = ran.find((m) => r.modes[m].routing);
  if (routed) renderRouting(r.modes[routed].step + 1, routed, r.modes[routed].routing, mesh.meshAxes(state.settings.mesh));
  for (const m of ran) if (r.modes[m].example_prediction) renderExamplePrediction(state.steps, r.modes[m].example_prediction);
  for (const m of ran) if (r.modes[m].sample) renderSample(state.steps, r.modes[m].sample, r.modes[m].loss);
  renderSampleStep(state.steps);
  if (profiled) renderBreakdown(r);
  storyRun.stepped(r, story);
  renderStory();
}

/**
 * Measured: one stacked bar per mode, its profiled step split by category plus the one
 * submission the step pays (the profile scales each op to its phase's wall time, so the
 * segments add up to the step); then the phases and the most expensive ops.
 */
function renderBreakdown(r) {
  const ran = RUN_MODES.filter((m) => r.modes[m] && r.modes[m].breakdown);
  renderMeasuredBubble(ran.map((m) => r.modes[m].breakdown.pipeline).find(Boolean));
  const b = (m) => r.modes[m].breakdown;
  const scale = Math.max(...ran.map((m) => b(m).step_ms), 1e-9);
  const bars = el('div', { class: 'bars' }, ran.map((m) => {
    const x = b(m);
    const parts = { ...x.categories_ms, submit: x.submit_ms };
    return barRow(m, parts, MEASURED_CATEGORIES, scale, 'measured-bar', x.step_ms, { 'data-sum-ms': String(x.categories_sum_ms) });
  }));
  const offBy = (x) => fmtPct(Math.abs(x.categories_sum_ms - x.step_ms) / x.step_ms);
  const row = (label, f) => el('tr', {}, el('th', {}, label), ran.map((m) => el('td', { class: 'num' }, f(b(m)))));
  const phases = el('table', { class: 'compact' },
    el('thead', {}, el('tr', {}, el('th'), ran.map((m) => el('th', { class: 'num' }, MODE_LABEL[m])))),
    el('tbody', {}, [
      ...['forward', 'backward', 'update'].map((p) => row(p, (x) => fmtMs(x.phases_ms[p]))),
      row('one submission', (x) => fmtMs(x.submit_ms)),
      row('step, measured whole', (x) => fmtMs(x.step_ms)),
      // The floor: what no kernel gets below on this GPU (see floorNote).
      el('tr', { 'data-testid': 'floor-row' }, el('th', {}, 'floor on this GPU'), ran.map((m) => el('td', {
        class: 'num', 'data-mode': m, 'data-floor-ms': String(b(m).floor ? b(m).floor.step_ms : ''),
      }, b(m).floor ? fmtMs(b(m).floor.step_ms) : '–'))),
      row('step over its floor', (x) => (x.floor ? `${fmtTimes(x.step_ms / x.floor.step_ms)}` : '–')),
    ]));
  // How well the ops' shares add up to the step measured whole: a check of the profile itself,
  // folded away from the learner's first look.
  const selfCheck = el('details', { class: 'small', 'data-testid': 'profile-check' },
    el('summary', {}, 'how much to trust this profile'),
    el('p', {}, 'The ops are timed alone and shared out over their phase, so their categories need not add up to the step measured whole. Here they are off by ',
      ran.flatMap((m, i) => [i ? ', ' : '', `${offBy(b(m))} (${MODE_LABEL[m]})`]), '. ',
      '“One submission” is the fixed cost of handing the step to the GPU and reading the loss back.'));
  const top = el('div', {}, ran.map((m) => el('div', { 'data-testid': 'top-ops', 'data-mode': m },
    el('p', { class: 'small' }, el('strong', {}, `${MODE_LABEL[m]}: the most expensive ops`)),
    el('ol', { class: 'small' }, b(m).top_ops.map((o) => el('li', {},
      el('code', {}, o.op), ` ${o.phase}, ${o.category}: ${fmtMs(o.ms)} `, el('span', { class: 'muted' }, o.shape)))))));
  $('breakdown').replaceChildren(
    el('h3', {}, el('span', { class: 'tag measured' }, 'measured'), ` where step ${r.step + 1}'s time went`),
    el('p', { class: 'muted small' }, 'Each op timed alone by wall clock (split submissions), shared out over its phase’s measured time. Profiling re-runs the step many times, so this step is not charted and its time is not a step time.'),
    bars, measuredLegend(), phases, floorNote(ran.map((m) => [m, b(m)])), top, selfCheck);
  $('breakdown').hidden = false;
}

/**
 * What the floor is, and each category's time over its floor per mode: where the step is far from
 * what this GPU allows (a kernel to improve) and where it is at it (only fewer bytes or FLOPs help).
 */
function floorNote(modes) {
  const f = modes.map(([, x]) => x.floor).find((x) => x);
  if (!f) {
    const why = modes.map(([, x]) => x.floor_error).find((x) => x);
    return el('p', { class: 'muted small', 'data-testid': 'floor-note' }, why
      ? `No floor: this GPU’s ceilings could not be measured (${why}). The profile above does not need them.`
      : 'No floor: this profile was the story’s, which measures the categories only; “Where does the time go?” also measures this GPU’s ceilings for each category’s floor.');
  }
  const perMode = modes.filter(([, x]) => x.floor).map(([m, x]) => {
    const parts = Object.entries(x.floor.categories_ms)
      .filter(([c, floor]) => floor > 0 && x.categories_ms[c] > 0)
      .map(([c, floor]) => `${c} ${fmtTimes(x.categories_ms[c] / floor)}`);
    return el('span', { 'data-testid': 'floor-categories', 'data-mode': m }, ` ${MODE_LABEL[m]}: ${parts.join(', ')}.`);
  });
  return el('p', { class: 'small', 'data-testid': 'floor-note' },
    `Floor: every op at the larger of its FLOPs at ${f.fma_gflops.toFixed(1)} GFLOP/s and its bytes at ${f.copy_gbps.toFixed(2)} GB/s, `
    + 'both measured on this GPU (FMAs alone, and a storage-buffer copy); launches not counted. '
    + 'Each category’s time over its floor (a category under 1× is not faster than the floor: the profile shares each phase’s time out by its ops timed alone, and charges some categories less than they took):', ...perMode);
}

// ---- the cost model: modelled steps on real devices ----------------------------------------

/** The breakdown's categories in the order the bars stack them. */
/** `idle`: a device waiting for the others (a pipeline's bubble, an unbalanced ring). */
const CATEGORIES = ['matmul', 'attention', 'rng', 'collectives', 'optimizer', 'other', 'launch', 'idle'];
const CATEGORY_COLOR = {
  matmul: '#4f46e5', attention: '#0891b2', rng: '#dc2626', collectives: '#16a34a',
  optimizer: '#9333ea', other: '#64748b', launch: '#ca8a04', idle: '#cbd5e1', submit: '#a8a29e',
};

/** The measured bars' segments: the categories, then the one submission a step pays. */
const MEASURED_CATEGORIES = ['matmul', 'attention', 'rng', 'collectives', 'optimizer', 'other', 'submit'];

/** One mode's stacked bar: a segment per category of `parts` (ms), scaled to `scale` ms. */
function barRow(mode, parts, categories, scale, testid, totalMs, extra = {}) {
  const segs = categories.filter((c) => parts[c] > 0).map((c) => el('span', {
    class: 'seg', 'data-category': c, 'data-ms': String(parts[c]),
    style: `width:${(100 * parts[c] / scale).toFixed(3)}%;background:${CATEGORY_COLOR[c]}`,
    title: `${c}: ${fmtMs(parts[c])}`,
  }));
  return el('div', { class: 'bar-row', 'data-testid': testid, 'data-mode': mode, 'data-step-ms': String(totalMs), ...extra },
    el('span', { class: 'bar-label' }, MODE_LABEL[mode]),
    el('span', { class: 'bar' }, segs),
    el('span', { class: 'bar-total num' }, fmtMs(totalMs)));
}

/** One stacked bar per mode: its modelled step split by category, the segments summing to it. */
function predictionBars(modes, scale, testid) {
  return el('div', { class: 'bars' }, RUN_MODES.filter((m) => modes[m]).map((m) =>
    barRow(m, modes[m].breakdown_ms, CATEGORIES, scale, testid, modes[m].step_ms)));
}

function measuredLegend() {
  return el('p', { class: 'legend small' }, MEASURED_CATEGORIES.map((c) =>
    el('span', {}, el('i', { style: `background:${CATEGORY_COLOR[c]}` }), c === 'submit' ? 'one submission' : c)));
}

function categoryLegend() {
  return el('p', { class: 'legend small' }, CATEGORIES.map((c) =>
    el('span', {}, el('i', { style: `background:${CATEGORY_COLOR[c]}` }), c)));
}

/** Which of the profile's figures are estimates, in words, with each identifier on hover. */
function estimatedFigures(labels) {
  const items = labels.flatMap(({ field, label }, i) => [i ? ', ' : '', el('abbr', { title: field, 'data-testid': 'estimated-figure' }, label)]);
  return el('span', {}, ' Estimated rather than published: ', items, '.');
}

/** The modelled figure: both modes' steps on N real devices of the chosen kind. */
function renderPrediction(pr) {
  // web/calibrate.js shows its recalibrate button when the prediction is for this GPU.
  window.dispatchEvent(new CustomEvent('shardlab:prediction', { detail: pr }));
  $('modelled-on').textContent = `${pr.devices} × ${pr.label}`;
  const planned = RUN_MODES.filter((m) => pr.modes[m]);
  const scale = Math.max(...planned.map((m) => pr.modes[m].step_ms));
  const fits = planned.every((m) => pr.modes[m].fits);
  $('chart-modelled').replaceChildren(
    predictionBars(pr.modes, scale, 'modelled-bar'),
    categoryLegend(),
    el('p', { class: 'muted small' }, `From each mode’s per-device program priced op by op on ${pr.label} (the cost model; nothing here ran on one). `,
      fits ? `${planned.length > 1 ? 'Both fit' : 'It fits'} in its memory.` : overflowWords(pr.modes),
      pr.estimated_labels.length ? estimatedFigures(pr.estimated_labels) : ''),
    refusedNote() || '',
  );
  renderMemory(pr);
}

/** The parts of a device's memory, stacked in this order. */
const MEMORY_PARTS = [
  ['params', 'parameters', '#4f46e5'],
  ['optimizer_state', 'optimizer state', '#9333ea'],
  ['gradients', 'gradients', '#16a34a'],
  ['activations', 'activations', '#ca8a04'],
];

/** What each memory lever trades, one sentence each (the bar shows what it saves). */
const LEVER_WORDS = {
  microbatches: 'Gradient accumulation holds one microbatch’s activations at a time, for as many forward and backward passes per step (and, with zero2 or fsdp, as many gradient reductions).',
  zero1: 'ZeRO-1 keeps 1/N of the optimizer state on each device, for an all-gather of the updated parameters every step.',
  zero2: 'ZeRO-2 keeps 1/N of the gradients too, reduce-scattering each microbatch’s as it is made: one reduction per microbatch instead of one per step.',
  remat: 'Remat (under model) recomputes each block’s activations in the backward pass instead of holding them: more compute for fewer held activations.',
};

/** Memory per device, stacked by what holds it, one bar per mode, its modelled step beside it. */
function renderMemory(pr) {
  // Each part at its largest: the gradients held for the whole step, as ZeRO counts them.
  const held = (b) => MEMORY_PARTS.reduce((n, [k]) => n + b[k], 0);
  const scale = Math.max(...RUN_MODES.filter((m) => pr.modes[m]).map((m) => held(pr.modes[m].bytes_per_device)));
  const rows = RUN_MODES.filter((m) => pr.modes[m]).map((m) => {
    const b = pr.modes[m].bytes_per_device;
    const segs = MEMORY_PARTS.filter(([k]) => b[k] > 0).map(([k, name, color]) => el('span', {
      class: 'seg', 'data-part': k, 'data-bytes': String(b[k]),
      style: `width:${(100 * b[k] / scale).toFixed(3)}%;background:${color}`,
      title: `${name}: ${fmtBytes(b[k])}`,
    }));
    return el('div', { class: 'bar-row', 'data-testid': 'memory-bar', 'data-mode': m, 'data-total': String(held(b)), 'data-at-once': String(b.total) },
      el('span', { class: 'bar-label' }, MODE_LABEL[m]),
      el('span', { class: 'bar' }, segs),
      el('span', { class: 'bar-total num' }, fmtBytes(held(b)),
        el('span', { class: 'muted', 'data-testid': 'memory-step-ms' }, ` · ${fmtMs(pr.modes[m].step_ms)}`)));
  });
  const s = state.settings || {};
  const levers = [
    (s.microbatches || 1) > 1 ? 'microbatches' : null,
    mesh.hasAxis(s.mesh || '', 'dp') && s.zero && s.zero !== '0' ? `zero${s.zero}` : null,
    s.remat && s.remat !== 'none' ? 'remat' : null,
  ].filter(Boolean);
  $('chart-memory').replaceChildren(
    el('div', { class: 'bars' }, rows),
    el('p', { class: 'legend small' }, MEMORY_PARTS.map(([, name, color]) => el('span', {}, el('i', { style: `background:${color}` }), name))),
    el('p', { class: 'muted small', 'data-testid': 'memory-levers' },
      `From each mode’s memory plan: the parameters, optimizer state and gradients held for the step (as ZeRO counts them) and the peak of everything else, with the modelled step on ${pr.label} beside it. At once, where the gradients live only from the backward pass on, ${RUN_MODES.filter((m) => pr.modes[m]).map((m) => `${MODE_LABEL[m]} needs ${fmtBytes(pr.modes[m].bytes_per_device.total)}`).join(' and ')}. `,
      ...(levers.length ? levers : ['microbatches', 'zero1', 'zero2', 'remat']).map((k) => el('span', { 'data-lever': k },
        `${k === 'remat' && s.remat !== 'none' ? REMAT_TRADE[s.remat] : LEVER_WORDS[k]} `))),
  );
}

/** Why the modes that do not fit do not, in the core's words: one line per different reason. */
function overflowWords(modes, label = (m) => MODE_LABEL[m]) {
  const seen = new Set();
  const lines = Object.entries(modes).filter(([, x]) => x.overflow && !seen.has(x.overflow) && seen.add(x.overflow));
  return el('span', { 'data-testid': 'overflow' }, lines.map(([m, x]) => el('span', { class: 'overflow' }, `${label(m)} ${pageWords(x.overflow)} `)));
}

/** The JAX report's experiment at full size, predicted (computed once, on demand). */
function renderScaleUp() {
  const box = $('scale-up-result');
  if (state.story.report) return showScaleUp(box, state.story.report);
  box.replaceChildren(el('p', { class: 'muted small' }, 'Building and pricing six programs…'));
  // Yield once so the line above paints before the (synchronous) work.
  setTimeout(() => showScaleUp(box, JSON.parse(wasm.Shardlab.scale_up())), 30);
}

function showScaleUp(box, r) {
  if (!r.ok) {
    box.replaceChildren(el('p', { class: 'field-error' }, r.error));
    return;
  }
  const priced = RUN_MODES.filter((m) => r.layouts.original.modes[m]);
  const rows = ['original', 'partitionable'].map((rng) => {
    const l = r.layouts[rng];
    return el('tr', { 'data-testid': 'scale-up-row', 'data-rng': rng },
      el('th', {}, rng),
      priced.map((m) => el('td', { class: 'num', 'data-testid': 'scale-up-ms', 'data-mode': m }, fmtMs(l.modes[m].step_ms))),
      el('td', { class: 'num', 'data-testid': 'scale-up-ratio' }, `${l.ratio.toFixed(2)}×`),
      el('td', { 'data-testid': 'scale-up-fits' }, l.fits ? 'fits' : 'does not fit'));
  });
  const c = r.config;
  box.replaceChildren(...[
    el('p', { class: 'small' }, `${c.layers} layers, d_model ${c.d_model}, ${c.heads} heads, seq ${c.seq}, batch ${c.batch}, vocab ${fmtInt(c.vocab)} (${fmtInt(r.params)} parameters), dropout ${c.dropout}, ${c.mesh} on ${r.devices} × ${r.label}. `,
      el('span', { class: 'tag modelled' }, 'modelled'), ' per step:'),
    el('div', { class: 'table-scroll' }, el('table', { class: 'compact' },
      el('thead', {}, el('tr', {}, el('th', {}, 'RNG layout'), priced.map((m) => el('th', { class: 'num' }, MODE_LABEL[m])),
        el('th', { class: 'num', title: 'automatic over shard_map' }, 'ratio'), el('th', {}, 'memory'))),
      el('tbody', {}, rows))),
    c.batch < r.report_batch ? el('p', { class: 'small', 'data-testid': 'scale-up-batch-note' }, `Batch ${c.batch}, not the report’s ${r.report_batch}: at batch ${r.report_batch} the global logits have more elements than a ${r.address_bits}-bit WebAssembly page can index. The native build predicts batch ${r.report_batch}.`) : null,
    el('p', { class: 'muted small' }, 'The JAX report measured 2.95 s/it (automatic) vs 1.09 s/it (shard_map) on a TPU v4-8 with the original layout: 2.7×.'),
    unfusedWords(r),
  ].filter(Boolean));
  // Why a run does not fit, per mode and layout or attention (each different reason once).
  const all = Object.fromEntries([
    ...['original', 'partitionable'].flatMap((rng) => priced.map((m) => [`${m}:${rng}`, r.layouts[rng].modes[m]])),
    ...priced.map((m) => [`${m}:${r.unfused.rng}, attention unfused`, r.unfused.modes[m]]),
  ]);
  if (Object.values(all).some((x) => x.overflow)) {
    box.append(el('p', { class: 'small', 'data-testid': 'scale-up-overflow' },
      overflowWords(all, (k) => { const [m, rest] = k.split(':'); return `${MODE_LABEL[m]}, ${rest}:`; })));
  }
  // The partitionable layout's one cost: it hashes once per word, where the original hashes a
  // pair of counters into two words, so shard_map (which made only its block either way) pays more.
  const sm = (rng) => r.layouts[rng].modes.shard_map.step_ms;
  if (sm('partitionable') > sm('original')) {
    box.append(el('p', { class: 'small', 'data-testid': 'scale-up-partitionable' },
      `With partitionable, shard_map’s step is slower (${fmtMs(sm('original'))} → ${fmtMs(sm('partitionable'))}): shard_map made only its own block of the random bits either way, and the partitionable layout hashes once per 32-bit word, where the original hashes a pair of counters into two words, so the same bits cost twice the hashing. Automatic gains far more, because it stops making the whole global array on every device.`));
  }
}

/** The table prices attention as one fused op; the same run unfused, for contrast. */
function unfusedWords(r) {
  const u = r.unfused.modes;
  const gib = (m) => fmtBytes(u[m].bytes_per_device.total);
  const fit = MODES.every((m) => u[m].fits);
  return el('p', { class: 'small', 'data-testid': 'scale-up-unfused' },
    'Attention is priced as one fused op, as a TPU runs it (splash attention): no seq × seq array is held. ',
    `Unfused, as a model that writes softmax(q kᵀ) v op by op runs, every layer holds its scores, probabilities and dropout mask: with the ${r.unfused.rng} layout automatic needs ${gib('auto')} and shard_map ${gib('shard_map')} per device (${fmtMs(u.auto.step_ms)} and ${fmtMs(u.shard_map.step_ms)} a step), and it ${fit ? 'still fits' : 'does not fit'}.`);
}

function updateButtons() {
  const ready = !!state.configured;
  const play = $('play');
  if (!play) return;
  play.textContent = state.playing ? '❚❚ Pause' : '▶ Play';
  play.setAttribute('aria-pressed', String(state.playing));
  play.disabled = !ready && !state.playing;
  const stepping = state.driving && (state.busy || state.queue.length > 0);
  $('single').disabled = !ready || state.playing;
  $('profile').disabled = !ready || state.playing;
  const label = state.playing ? 'training' : { idle: 'ready', building: 'building', stepping: 'stepping', paused: 'paused', error: 'error' }[state.phase];
  $('run-state').textContent = stepping && !state.playing ? (state.phase === 'building' ? 'building' : 'stepping') : label;
  $('run-state').className = `badge ${state.playing ? 'pass' : state.phase === 'error' ? 'fail' : ''}`;
  // The header says what the session is doing once the page is up (loading and errors say
  // their own).
  if (document.body.dataset.state === 'ready') setState('ready', headerStatus(stepping));
}

/** The header's status line for the session as it stands. */
function headerStatus(stepping) {
  if (state.playing) return 'Training: press Pause to stop';
  if (state.phase === 'error') return 'Stopped: the message above says why';
  if (state.phase === 'building') return 'Building the programs…';
  if (stepping) return 'Stepping…';
  if (!state.configured) return 'Fix the settings shown in red to train';
  return state.steps > 0 ? `Paused at step ${fmtInt(state.steps)}: press Play to go on` : 'Ready: press Play';
}

// ---- charts: makeCharts and updateCharts live in charts.js ---------------------------------

// ---- program inspector: renderPrograms and wireInspector live in inspector.js --------------

function showPrograms(p) {
  if (!p.ok) return showError(p.error);
  return renderPrograms(p, { running: state.configured ? state.configured.modes : [], mesh: state.settings.mesh });
}

// ---- the seed, as a story: renderStory lives in story.js; its buttons' actions are here ----

/** A settings change from a button: it takes effect at the next step boundary. */
function changeSettings(change) {
  const { settings, errors } = readControls();
  if (errors.length) {
    markFieldErrors(errors);
    return;
  }
  const next = { ...settings, ...change };
  writeControls(next);
  showHashNotice(null);
  request({ kind: 'configure', settings: next });
}

// ---- the task: renderTask, renderExamplePrediction and renderSample live in learn.js -----

// ---- adapter and self-test -----------------------------------------------------------------

// Browsers often leave the adapter's name empty; GPUAdapterInfo's vendor and architecture say more.
function adapterName(a, info) {
  if (a.name) return a.name;
  const parts = info ? [info.vendor, info.architecture, info.device, info.description] : [];
  return [...new Set(parts.filter(Boolean))].join(' · ') || '(the browser does not say)';
}

function renderAdapter(a, info) {
  const facts = [['name', adapterName(a, info)], ['backend', a.backend], ['device type', a.device_type]];
  if (a.driver) facts.push(['driver', a.driver]);
  $('adapter-facts').replaceChildren(...facts.flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
  const features = [['timestamp-query', a.timestamp_query], ['shader-f16', a.shader_f16], ['subgroups', a.subgroups]];
  $('adapter-features').replaceChildren(...features.map(([name, on]) =>
    el('span', { class: on ? 'chip on' : 'chip off', title: on ? 'supported' : 'not supported' }, `${on ? '✓' : '✗'} ${name}`)));
  const limits = [
    ['max buffer size', fmtBytes(a.max_buffer_size)],
    ['max storage buffer binding', fmtBytes(a.max_storage_buffer_binding_size)],
    ['max invocations per workgroup', a.max_compute_invocations_per_workgroup],
    ['max workgroup size x', a.max_compute_workgroup_size_x],
    ['max workgroup storage', fmtBytes(a.max_compute_workgroup_storage_size)],
    ['max workgroups per dimension', a.max_compute_workgroups_per_dimension],
    ['max storage buffers per stage', a.max_storage_buffers_per_shader_stage],
  ];
  $('adapter-limits').replaceChildren(...limits.map(([k, v]) => el('tr', {}, el('th', {}, k), el('td', { class: 'num' }, v))));
  $('adapter').hidden = false;
}

const mark = (status) => el('span', { class: `mark ${status}`, title: status }, status === 'pass' ? '✓' : status === 'fail' ? '✗' : '–');

function renderReport(r) {
  $('kernel-rows').replaceChildren(...r.kernels.map((k) => {
    const row = el('tr', { class: k.status, 'data-testid': 'selftest-row', 'data-kind': 'kernel', 'data-status': k.status },
      el('td', {}, mark(k.status)), el('td', {}, k.name), el('td', { class: 'muted' }, k.shape),
      el('td', { class: 'num' }, fmtErr(k.max_abs_error)), el('td', { class: 'num' }, fmtMs(k.ms)));
    return k.message ? [row, el('tr', { class: 'message' }, el('td'), el('td', { colSpan: 4 }, k.message))] : [row];
  }).flat());
  $('pipeline-rows').replaceChildren(...r.pipelines.map((p) =>
    el('tr', { class: p.status, 'data-testid': 'selftest-row', 'data-kind': 'pipeline', 'data-status': p.status },
      el('td', {}, mark(p.status)), el('td', {}, p.shader), el('td', {}, p.entry), el('td', { class: 'muted' }, p.message || ''))));
  const count = (items) => {
    const pass = items.filter((i) => i.status === 'pass').length;
    const skip = items.filter((i) => i.status === 'skip').length;
    return `${pass}/${items.length} pass${skip ? `, ${skip} skipped` : ''}`;
  };
  $('kernel-count').textContent = count(r.kernels);
  $('pipeline-count').textContent = count(r.pipelines);
  if (r.pipelines.some((p) => p.status === 'fail')) $('pipelines-details').open = true;
  $('selftest-results').hidden = false;
  const badge = $('selftest-status');
  badge.textContent = r.passed ? `passed in ${fmtMs(r.ms)}` : 'FAILED';
  badge.className = `badge ${r.passed ? 'pass' : 'fail'}`;
}


/**
 * Downloads the current settings as a runnable JAX script: the automatic mode's jit with the
 * same shardings, in explicit mode the same typed program (axis types, out_sharding=, reshard),
 * or in shard_map mode the same per-device body. It prints one JSON line per
 * step like `shardlab train --json`, and with dropout 0 its losses match shardlab's.
 */
function exportJax() {
  const chosen = state.settings && state.settings.mode;
  const mode = chosen === 'shard_map' || chosen === 'explicit' ? chosen : 'auto';
  const r = JSON.parse(lab.export_jax(mode, 20));
  if (!r.ok) return showError(r.error);
  window.shardlab.lastExport = { filename: r.filename, script: r.script };
  const url = URL.createObjectURL(new Blob([r.script], { type: 'text/x-python' }));
  const a = el('a', { href: url, download: r.filename });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

async function copyLink() {
  const url = location.href;
  const box = $('link-box');
  // The link shows at once, selected, so it can be copied by hand: a clipboard that is refused or
  // never answers (no permission, headless, an insecure origin) leaves the person with the link.
  const input = el('input', { readOnly: true, value: url, 'aria-label': 'link to these settings' });
  box.replaceChildren(input);
  box.hidden = false;
  input.select();
  state.lastLink = url;
  try {
    await navigator.clipboard.writeText(url);
    box.append(el('span', { class: 'muted small' }, 'Link copied: it reopens these settings.'));
  } catch {
    // Nothing to add: the link is already shown and selected.
  }
}

async function runSelftest() {
  state.playing = false;
  while (state.driving) await new Promise((r) => setTimeout(r, 50));
  $('selftest-run').disabled = true;
  document.body.dataset.selftest = 'running';
  $('selftest-status').textContent = 'running…';
  try {
    state.report = JSON.parse(await lab.selftest());
    renderReport(state.report);
    const gpuError = lab.take_error();
    if (gpuError) showError(gpuError);
  } finally {
    document.body.dataset.selftest = 'done';
    $('selftest-run').disabled = false;
  }
}

// ---- start ---------------------------------------------------------------------------------

/** The core's preset names and bounds into FIELDS and onto the number inputs; a field the
 * core bounds but the page lacks (or the reverse) is a build mismatch, said at once. */
function applyCoreLimits() {
  FIELDS.preset.values = presets.order;
  FIELDS.schedule.values = presets.schedules;
  FIELDS.zero.values = presets.zero_stages;
  const offered = [...form().elements.namedItem('schedule').options].map((o) => o.value);
  if (offered.join() !== presets.schedules.join()) {
    throw new Error(`the page offers the schedules ${offered.join(', ')} and the core has ${presets.schedules.join(', ')}`);
  }
  for (const [name, { min, max }] of Object.entries(presets.limits)) {
    const f = FIELDS[name];
    if (!f) throw new Error(`the core bounds a setting “${name}” this page does not have`);
    Object.assign(f, { min, max });
    const input = form().elements.namedItem(name);
    if (input && input.type === 'number') Object.assign(input, { min: String(min), max: String(max) });
  }
  const unbounded = Object.entries(FIELDS).filter(([, f]) => ['int', 'float', 'lr'].includes(f.kind) && f.max === undefined);
  if (unbounded.length) throw new Error(`the core sent no bounds for ${unbounded.map(([n]) => n).join(', ')}`);
}

function wireControls(thisGpu, adapterInfo) {
  mesh.init({ el, axes: presets.axes, coordText, deviceColor });
  axisTypes.init();
  $('device').replaceChildren(...presets.devices.map((d) => el('option', { value: d.name }, d.label)));
  FIELDS.device.values = presets.devices.map((d) => d.name);
  const onChange = (e) => {
    const { settings, errors } = readControls();
    showHashNotice(null);
    if (e.target.name === 'preset' && !errors.some((x) => x.field === 'preset')) {
      // A preset sets the model and mesh; the mode and the modelled device stay as chosen,
      // unless the preset runs one mode only (a pipeline runs in shard_map mode), which it sets.
      // The task and its optimizer stay too.
      const next = presets.presets[settings.preset];
      const keep = [...(RUN_MODES.includes(next.mode) ? [] : ['mode']), 'device', 'task', 'optimizer', 'lr']
        .filter((k) => !errors.some((x) => x.field === k));
      const s = { ...next, ...Object.fromEntries(keep.map((k) => [k, settings[k]])) };
      writeControls(s);
      request({ kind: 'configure', settings: s });
      return;
    }
    if (errors.length) {
      // Refused by the page's grammar (the same one links use): said at the control, not run.
      refuseSettings(errors);
      return;
    }
    request({ kind: 'configure', settings });
  };
  for (const root of controlRoots()) root.addEventListener('change', onChange);
  $('play').addEventListener('click', () => {
    state.playing = !state.playing;
    updateButtons();
    if (state.playing) drive();
  });
  $('single').addEventListener('click', () => request({ kind: 'step' }));
  $('profile').addEventListener('click', () => request({ kind: 'step', profiled: true }));
  $('export').addEventListener('click', () => exportJax());
  $('copy-link').addEventListener('click', () => copyLink());
  $('reset').addEventListener('click', () => {
    state.playing = false;
    request({ kind: 'reset' });
  });
  $('story-run').addEventListener('click', () => storyRun.runOrCancel().catch(fatal));
  $('scale-up-run').addEventListener('click', () => renderScaleUp());
  $('strategy-run').addEventListener('click', () => {
    const { settings, errors } = readControls();
    if (errors.length) {
      markFieldErrors(errors);
      return;
    }
    renderStrategy(wasm, settings, (change) => changeSettings(change));
  });
  $('reproduce').addEventListener('click', () => {
    if (!(state.story.result && state.story.result.running)) storyRun.runOrCancel().catch(fatal);
    $('story').scrollIntoView({ behavior: 'smooth', block: 'start' });
  });
  $('selftest-run').addEventListener('click', () => runSelftest().catch(fatal));
  window.addEventListener('hashchange', () => {
    if (state.settings && location.hash === hashOf(state.settings)) return;
    openLink();
  });
  wireInspector();
  initStory({ state, storyKey, changeSettings });
  storyRun.init({
    state, wasm, request, readControls, writeControls, showHashNotice, thisGpu, adapter: adapterInfo,
    render: () => { renderStory(); updateButtons(); },
    writeHash: () => { if (state.settings) history.replaceState(null, '', hashOf(state.settings)); },
  });
  editor.init({
    wasm, el, deviceColor, coordText, changeSettings,
    lab: () => lab, settings: () => state.settings, programs: () => state.programs,
    prediction: () => state.configured && state.configured.prediction,
    devices: () => (state.configured ? state.configured.devices : 1),
  });
}

async function main() {
  // WebGPU first: without it nothing else is loaded.
  if (!window.isSecureContext) {
    return noWebGpu('WebGPU needs a secure context, and this page was not opened in one (plain http on a non-local address).');
  }
  if (!('gpu' in navigator) || !navigator.gpu) return noWebGpu();
  const probe = await navigator.gpu.requestAdapter();
  if (!probe) {
    return noWebGpu('This browser has WebGPU but offers no GPU adapter (the GPU may be blocklisted, or hardware acceleration is off).');
  }

  setState('loading', 'Loading the wasm module…');
  let uPlot;
  [wasm, uPlot] = await Promise.all([
    import('../pkg/shardlab_web.js'),
    import('./vendor/uplot/uPlot.esm.js').then((m) => m.default).catch(() => null),
  ]);
  initCharts({ state, uPlot });
  await wasm.default();
  $('version').textContent = `shardlab ${wasm.Shardlab.version()}`;
  presets = JSON.parse(wasm.Shardlab.presets());
  fields.init({ presets, editor });
  applyCoreLimits();

  setState('loading', 'Opening the GPU…');
  lab = await wasm.Shardlab.create();
  // Test hook: loses the GPU device as a driver reset would (issue 10's browser test).
  state.loseDevice = () => lab.lose_device_for_test();
  state.lab = lab;
  state.adapter = JSON.parse(lab.adapter());
  renderAdapter(state.adapter, probe.info);

  // "this GPU" joins the modelled device kinds (web/calibrate.js).
  const thisGpu = setupThisGpu({ wasm, lab, adapter: state.adapter, presets, el });
  const info = probe.info || {};
  wireControls(thisGpu, {
    name: state.adapter.name, device_type: state.adapter.device_type, vendor: info.vendor || '',
    architecture: info.architecture || '', description: info.description || '', fallback: !!(info.isFallbackAdapter ?? probe.isFallbackAdapter),
  });
  thisGpu.wire($('device'), $('device').closest('label'));
  for (const id of ['controls', 'live', 'shardings', 'timeline', 'story', 'scale-up', 'strategy', 'inspector', 'glossary', 'selftest']) $(id).hidden = false;
  $('timeline-overlap').addEventListener('change', () => { if (state.configured) showTimeline(); });
  $('timeline-download').addEventListener('click', downloadTrace);
  initLearn();
  setPhase('idle');
  openLink();
  setState('ready');
  updateButtons();
  // The report's run priced, and the story's run for this adapter: after the first paint.
  setTimeout(() => {
    state.story.report = JSON.parse(wasm.Shardlab.scale_up());
    storyRun.choose().then((c) => {
      state.story.choice = state.story.choice || c;
      renderStory();
    }).catch(fatal);
  }, 0);
}

main().catch(fatal);
