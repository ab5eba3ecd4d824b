// Learning a learner can see: the task picker's explanation and example, the optimizer and
// learning-rate controls' grammar, the sample panel (what the model predicts or writes, every
// few steps), and the glossary with its popover. Imported by app.js; the model work is the
// wasm's (web/src/task.rs, web/src/sample.rs), this file only renders.

const $ = (id) => document.getElementById(id);
const state = () => window.shardlab;

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-') || k.startsWith('aria-') || k === 'role') e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// ---- the controls' grammar -------------------------------------------------------------------

const TASKS = ['copy', 'reverse', 'modadd', 'text'];
const OPTIMIZERS = { adamw: 'AdamW', sgd: 'SGD' };

/** The settings this file adds to app.js's FIELDS (same kinds, plus `lr`). */
export const LEARN_FIELDS = {
  task: { kind: 'enum', values: TASKS },
  optimizer: { kind: 'enum', values: Object.keys(OPTIMIZERS) },
  lr: { kind: 'lr' }, // min and max: the core's (PAGE_LIMITS), set by app.js's applyCoreLimits
};

/** The learning rate from its text, or throws a message in the page's words. The writer's
 * String(x) never uses an exponent within the bounds (1e-6 to 1), and a typed 3e-3 is read too. */
export function parseLr(text) {
  const { min, max } = LEARN_FIELDS.lr;
  const bad = (why) => new Error(`lr “${text.slice(0, 40)}” ${why}`);
  if (!/^(\d{1,3}(\.\d{1,17})?|\d(\.\d{1,16})?e-?\d{1,2})$/.test(text)) throw bad('is not a number like 0.003');
  const x = Number(text);
  if (!(Number.isFinite(x) && x >= min && x <= max)) {
    throw bad(`must be from ${min} to ${max} (AdamW learns well near 0.003, SGD near 0.1)`);
  }
  return x;
}

/** The run-facts line's words for what learns and how: "AdamW (lr 0.003), copy task". */
export const learnFacts = (s) => `${OPTIMIZERS[s.optimizer] || s.optimizer} (lr ${s.lr}), ${s.task} task`;

// ---- the task and its example -----------------------------------------------------------------

function explain(ex) {
  const v = state().settings.vocab;
  const k = Math.min(8, v - 1);
  switch (ex.task) {
    case 'copy':
      return `The task: copy. Each sequence is random symbols (1 to ${k}), a separator 0, then the same symbols again. At every position the model reads the tokens so far and predicts the next one. The first half is random and cannot be predicted; the second half can, so the loss falls as the model learns to copy.`;
    case 'reverse':
      return `The task: reverse. Each sequence is random symbols (1 to ${k}), a separator 0, then the same symbols in reverse order. The first half cannot be predicted; after the separator the model must read the run backwards, which it learns more slowly than copying.`;
    case 'modadd': {
      const p = ex.names.indexOf('+');
      return `The task: modadd. Equations a + b = c, where c is (a + b) mod ${p}, packed end to end (the numbers are tokens 0 to ${p - 1}, then + and =). a and b are random; the answer after each = is what the model can learn.`;
    }
    case 'text':
      return 'The task: text. The opening of Lewis Carroll’s Alice’s Adventures in Wonderland (1865, in the public domain), lower-cased, one token per character. At every position the model predicts the next character; the sample panel shows what it writes from a prompt.';
    default:
      return `The task: ${ex.task}.`;
  }
}

/** A token sequence as the task shows it: characters for text, numbers and signs otherwise. */
function tokens(ex, xs, marks) {
  const text = ex.task === 'text';
  const shown = text ? xs : xs.slice(0, 17);
  const name = (x) => (text ? (ex.names[x] || '?').replace(' ', '·') : ex.names[x] ?? String(x));
  const spans = shown.map((x, i) => el('span', { class: marks ? marks(i) : null }, `${name(x)}${!text && i + 1 < shown.length ? ' ' : ''}`));
  return el('code', { class: text ? 'text-tokens' : null }, spans, shown.length < xs.length ? ' …' : '');
}

/** The task's explanation and its example (what the model reads, should predict, predicts). */
export function renderTask(ex) {
  const box = $('task');
  if (!ex || !ex.ok) {
    box.replaceChildren();
    renderSampleEmpty(null);
    return;
  }
  state().example = ex;
  box.replaceChildren(
    el('p', { 'data-testid': 'task-explain', 'data-task': ex.task }, explain(ex)),
    el('dl', { class: 'facts compact example', 'data-testid': 'example', 'data-task': ex.task },
      el('dt', {}, 'the model reads'), el('dd', {}, tokens(ex, ex.inputs)),
      el('dt', {}, 'it should predict'), el('dd', {}, tokens(ex, ex.targets)),
      el('dt', {}, 'it predicts'), el('dd', { id: 'example-prediction', 'data-testid': 'example-prediction' },
        el('span', { class: 'muted' }, 'not trained yet: press Step or Play'))));
  renderSampleEmpty(ex);
}

/** How many of the example's learnable positions `predicted` gets right. */
function score(ex, predicted) {
  const right = ex.learnable.filter((i) => predicted[i] === ex.targets[i]).length;
  return { right, learnable: ex.learnable.length };
}

const hitOrMiss = (ex, predicted) => (i) => (predicted[i] === ex.targets[i] ? 'hit' : 'miss');

/** The model's prediction for the example (argmax per position) after a step, beside the targets. */
export function renderExamplePrediction(step, predicted) {
  const box = $('example-prediction');
  const ex = state().example;
  if (!box || !ex || !ex.ok) return;
  const { right, learnable } = score(ex, predicted);
  const what = { copy: 'copied', reverse: 'reversed', modadd: 'answer', text: 'next-character' }[ex.task] || 'learnable';
  box.dataset.step = String(step);
  box.dataset.right = String(right);
  box.dataset.learnable = String(learnable);
  box.replaceChildren(tokens(ex, predicted, hitOrMiss(ex, predicted)),
    el('span', { class: 'muted small' }, ` after step ${step} (${right} of ${learnable} ${what} positions right)`),
    el('span', { class: 'muted small', 'data-testid': 'example-now' }));
}

// ---- the sample panel -----------------------------------------------------------------------

/** Samples shown at once, newest first. */
const SAMPLE_LINES = 4;

function renderSampleEmpty(ex) {
  const box = $('sample');
  if (!box) return;
  const text = ex && ex.task === 'text';
  delete box.dataset.step;
  delete box.dataset.text;
  box.replaceChildren(
    el('h3', {}, text ? 'What the model writes' : 'What the model predicts'),
    el('p', { class: 'muted small' }, ex
      ? `${text ? 'A few dozen characters it writes after a prompt from the text (sampled at temperature 0.7 with a fixed seed, so only the model changes them)' : 'Its prediction for the example at every position; the positions it gets right are marked'}, refreshed every few steps while it trains.`
      : 'Fix the marked settings to train.'),
    el('p', { class: 'muted small', 'data-testid': 'sample-now' }),
    el('ol', { class: 'sample-lines', reversed: true }),
    // replaceChildren writes a null as the text "null": only elements here.
    ...(ex ? [el('p', { class: 'muted', 'data-testid': 'sample-empty' }, 'not trained yet: press Step or Play')] : []));
}

/** After every step: where training is, when the newest line is older than that (samples
 * come every few steps, so a line is not mistaken for the current step). */
export function renderSampleStep(step) {
  // The example's prediction refreshes with the samples: where it is older, say so.
  const example = $('example-prediction');
  const exampleNow = example && example.querySelector('[data-testid="example-now"]');
  if (exampleNow) {
    exampleNow.textContent = Number(example.dataset.step) !== step
      ? `; training is at step ${step}, and the prediction refreshes within a few steps` : '';
  }
  const now = document.querySelector('[data-testid="sample-now"]');
  const newest = $('sample')?.dataset.step;
  if (!now) return;
  now.textContent = newest && Number(newest) !== step
    ? `Training is at step ${step}; the newest line is from step ${newest}, and the next comes within a few steps.`
    : '';
}

/** A new sample after step `step` at loss `loss`: it joins the top of the list. */
export function renderSample(step, sample, loss) {
  const box = $('sample');
  const ex = state().example;
  if (!box || !ex || !ex.ok || !sample) return;
  box.querySelector('[data-testid="sample-empty"]')?.remove();
  const lossText = Number.isFinite(loss) ? ` · loss ${loss.toFixed(3)}` : '';
  const head = el('span', { class: 'muted small sample-step' }, `step ${step}${lossText}`);
  let line;
  let text;
  if (ex.task === 'text' && sample.generated) {
    const name = (x) => ex.names[x] || '?';
    text = sample.generated.map(name).join('');
    line = el('li', { 'data-testid': 'sample-line', 'data-step': String(step) }, head,
      el('div', { class: 'sample-text' }, el('span', { class: 'prompt' }, sample.prompt.map(name).join('')), el('strong', {}, text)));
  } else {
    const p = sample.prediction;
    const { right, learnable } = score(ex, p);
    text = p.join(' ');
    const learn = new Set(ex.learnable);
    const marks = (i) => `${p[i] === ex.targets[i] ? 'hit' : 'miss'}${learn.has(i) ? ' learnable' : ''}`;
    line = el('li', { 'data-testid': 'sample-line', 'data-step': String(step) }, head, ` · ${right} of ${learnable} learnable positions right`,
      el('dl', { class: 'facts compact sample-grid' },
        el('dt', {}, 'input'), el('dd', {}, tokens(ex, ex.inputs)),
        el('dt', {}, 'target'), el('dd', {}, tokens(ex, ex.targets)),
        el('dt', {}, 'predicted'), el('dd', {}, tokens(ex, p, marks))));
  }
  line.dataset.text = text;
  line.dataset.loss = String(loss);
  box.dataset.step = String(step);
  box.dataset.text = text;
  const list = box.querySelector('.sample-lines');
  list.prepend(line);
  while (list.children.length > SAMPLE_LINES) list.lastChild.remove();
}

// ---- the glossary -----------------------------------------------------------------------------

/** Each term: how the page's text spells it, what it is, and the JAX call it maps to. */
export const GLOSSARY = [
  { term: 'PartitionSpec', match: /PartitionSpec/, jax: 'jax.sharding.PartitionSpec',
    text: 'Says, for each dimension of an array, which mesh axis it is split along (or None: not split). P(\'dp\', None) splits the rows across the dp devices.' },
  { term: 'NamedSharding', match: /NamedSharding/, jax: 'jax.sharding.NamedSharding(mesh, spec)',
    text: 'A mesh plus a PartitionSpec: exactly which device holds which block of an array. jit reads it from the inputs and the constraints.' },
  { term: 'all-reduce', match: /all-reduces?\b/, jax: 'jax.lax.psum',
    text: 'Every device of an axis ends with the sum of the array over those devices. Data parallelism all-reduces the gradients.' },
  { term: 'all-gather', match: /all-gathers?\b/, jax: 'jax.lax.all_gather',
    text: 'Every device ends with the whole array, its blocks collected from every device of the axis. fsdp all-gathers each parameter before using it.' },
  { term: 'reduce-scatter', match: /reduce-scatters?\b/, jax: 'jax.lax.psum_scatter',
    text: 'The array is summed over the devices of an axis and each device keeps one block of the sum: an all-reduce that keeps only a slice.' },
  { term: 'all-to-all', match: /all-to-alls?\b/, jax: 'jax.lax.all_to_all',
    text: 'Each device sends a different block to every other device of the axis, re-splitting the array along another dimension.' },
  { term: 'collective-permute', match: /collective-permutes?\b/, jax: 'jax.lax.ppermute',
    text: 'Each device sends its block to one other device, by a fixed permutation of the axis (a ring shift, for example).' },
  { term: 'dynamic-slice', match: /dynamic[-_]slices?\b/, jax: 'jax.lax.dynamic_slice',
    text: 'Takes a block at an offset computed at run time: here, a device keeping only its own block of an array it holds whole.' },
  { term: 'Threefry', match: /Threefry/, jax: 'jax.random.key (impl threefry2x32)',
    text: 'JAX\'s counter-based random number generator. With jax_threefry_partitionable=False its bits cannot be made block by block, so every device makes all of them.' },
  { term: 'fold_in', match: /fold_in\b/, jax: 'jax.random.fold_in(key, data)',
    text: 'A new key from a key and a number. fold_in(key, axis_index(\'dp\')) gives each device its own dropout key in shard_map.' },
  { term: 'dp', match: /(?<![\w'=.-])dp(?![\w'=-])/, jax: "NamedSharding(mesh, P('dp')) on the batch",
    text: 'Data parallelism: each device holds all parameters and a slice of the batch; the gradients are all-reduced.' },
  { term: 'fsdp', match: /(?<![\w'=.-])fsdp(?![\w'=-])/, jax: "NamedSharding(mesh, P('fsdp', None)) on the parameters",
    text: 'Fully sharded data parallelism (ZeRO-3), a mesh axis of its own: it splits the batch like dp, and every parameter across its devices too; all-gathered to use, gradients reduce-scattered. It composes with dp, tp, cp and pp.' },
  { term: 'zero1', match: /(?<![\w'=.-])(zero1|ZeRO-1)(?![\w'=-])/, jax: "NamedSharding(mesh, P('dp', None)) on the optimizer state only",
    text: 'ZeRO-1: dp, with the optimizer state split across the devices. Each device updates its block of every parameter from the all-reduced gradient, then the blocks are all-gathered.' },
  { term: 'zero2', match: /(?<![\w'=.-])(zero2|ZeRO-2)(?![\w'=-])/, jax: "with_sharding_constraint(grad, P('dp', None))",
    text: 'ZeRO-2: ZeRO-1 with the gradients split too: each is reduce-scattered as it is made, so a device holds only its block of it.' },
  { term: 'microbatch', match: /microbatch(es)?\b/, jax: 'a Python loop (or lax.scan) of jax.value_and_grad',
    text: 'Gradient accumulation: the batch in slices, each slice\'s forward and backward in turn, the gradients summed, one update. Less memory for activations, the same result.' },
  { term: 'tp', match: /(?<![\w'=.-])tp(?![\w'=-])/, jax: "NamedSharding(mesh, P(None, 'tp')) on the weights",
    text: 'Tensor parallelism (Megatron): each weight matrix is split across the devices, by columns then by rows; the partial sums are all-reduced.' },
  { term: 'mixture of experts', match: /mixtures? of experts\b/, jax: 'jax.lax.top_k on the router\'s softmax',
    text: 'Each block\'s MLP becomes several expert MLPs and a router that sends each token to its top k of them (Switch, GShard, Mixtral). An expert takes at most its capacity of a sequence\'s choices; the rest are dropped and pass the block by the residual alone, unless routing is dropless.' },
  { term: 'ep', match: /(?<![\w'=.-])ep(?![\w'=-])/, jax: "jax.lax.all_to_all(x, 'ep', 0, 1) in shard_map",
    text: 'Expert parallelism: a mixture of experts\' experts split across the devices, the tokens over dp × ep. Two all-to-alls per block move each token to its experts\' devices and back, and the busiest device sets the pace.' },
  { term: 'mesh', match: /(?<![\w'=.-])mesh(?![\w'=-])/, jax: "jax.make_mesh((2, 2, 2), ('dp', 'tp', 'pp'))",
    text: 'The devices laid out on named axes, each axis named for what it splits: dp the batch, fsdp the batch and the parameters, tp heads and MLP columns, cp the sequence, pp the blocks into stages, ep a mixture\'s experts. Any of them compose; one table of logical-axis rules says which axes split each array.' },
];

const byTerm = new Map(GLOSSARY.map((g) => [g.term, g]));
/** Where terms are marked: the page's explanations, never code, controls or program text. */
const SKIP = 'code, pre, button, select, option, input, textarea, label, summary, a, svg, .term, .program-scroll, #glossary, #term-pop, #explain, [data-no-terms]';
const BLOCK = 'li, tr, p, dd, dt, h2, h3, h4, td, th, div, section';

const termButton = (g, text) => el('button', { type: 'button', class: 'term', 'data-term': g.term, 'data-testid': 'term', 'aria-describedby': 'term-pop' }, text);

/** Wraps the first mention of each term in each block of `root` in a focusable term button. */
export function markTerms(root) {
  if (!root) return;
  if (root.closest(SKIP)) return;
  // Whole skipped subtrees are rejected at their root (the program text has thousands of lines).
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_ELEMENT | NodeFilter.SHOW_TEXT, {
    acceptNode: (n) => (n.nodeType === Node.ELEMENT_NODE
      ? (n.matches(SKIP) ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_SKIP)
      : (n.nodeValue.trim() ? NodeFilter.FILTER_ACCEPT : NodeFilter.FILTER_SKIP)),
  });
  const nodes = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) nodes.push(n);
  for (const node of nodes) {
    const block = node.parentElement.closest(BLOCK) || root;
    let rest = node;
    for (;;) {
      let best = null;
      for (const g of GLOSSARY) {
        if (block.querySelector(`.term[data-term="${g.term}"]`)) continue;
        const m = g.match.exec(rest.nodeValue);
        if (m && (!best || m.index < best.m.index)) best = { g, m };
      }
      if (!best) break;
      const after = rest.splitText(best.m.index);
      rest = after.splitText(best.m[0].length);
      after.replaceWith(termButton(best.g, best.m[0]));
    }
  }
}

function popoverContent(g) {
  return [el('strong', {}, g.term), ' ', g.text, el('span', { class: 'jax' }, ' In JAX: ', el('code', {}, g.jax))];
}

/** The glossary section: every term, its definition and its JAX call. */
function renderGlossary() {
  const box = $('glossary-list');
  if (!box) return;
  box.replaceChildren(...GLOSSARY.flatMap((g) => [
    el('dt', { 'data-testid': 'glossary-entry', 'data-term': g.term }, el('dfn', {}, termButton(g, g.term))),
    el('dd', {}, g.text, ' ', el('span', { class: 'jax' }, 'In JAX: ', el('code', { 'data-testid': 'glossary-jax' }, g.jax))),
  ]));
}

/** The popover: the same words on hover, keyboard focus and tap; Escape closes it. */
function wirePopover() {
  const pop = $('term-pop');
  let pinned = null;
  const show = (t) => {
    const g = byTerm.get(t.dataset.term);
    if (!g) return;
    pop.replaceChildren(...popoverContent(g));
    pop.dataset.term = g.term;
    pop.hidden = false;
    const r = t.getBoundingClientRect();
    const width = document.documentElement.clientWidth;
    pop.style.left = `${Math.max(8, Math.min(window.scrollX + r.left, window.scrollX + width - pop.offsetWidth - 8))}px`;
    pop.style.top = `${window.scrollY + r.bottom + 6}px`;
    t.setAttribute('aria-expanded', 'true');
  };
  const hide = (force) => {
    if (pinned && !force) return;
    pinned = null;
    pop.hidden = true;
    for (const t of document.querySelectorAll('.term[aria-expanded="true"]')) t.setAttribute('aria-expanded', 'false');
  };
  const termOf = (e) => (e.target instanceof Element ? e.target.closest('.term') : null);
  document.addEventListener('mouseover', (e) => {
    const t = termOf(e);
    if (t && !pinned) show(t);
  });
  document.addEventListener('mouseout', (e) => {
    if (termOf(e)) hide(false);
  });
  document.addEventListener('focusin', (e) => {
    const t = termOf(e);
    if (t) show(t);
  });
  document.addEventListener('focusout', (e) => {
    if (termOf(e)) hide(true);
  });
  document.addEventListener('click', (e) => {
    const t = termOf(e);
    if (!t) {
      if (pinned && !pop.contains(e.target)) hide(true);
      return;
    }
    // A click or tap pins the popover; a second one on the same term closes it. Enter on a
    // focused term pins what focus already showed.
    if (pinned === t && e.detail > 0) {
      hide(true);
      return;
    }
    pinned = t;
    show(t);
  });
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && !pop.hidden) hide(true);
  });
}

/** Places where the page explains itself: their terms are marked whenever they re-render. */
const EXPLAINED = ['intro', 'story-steps', 'inspector', 'scale-up', 'run-facts', 'task'];

export function initLearn() {
  renderGlossary();
  wirePopover();
  for (const id of EXPLAINED) {
    const root = $(id);
    if (!root) continue;
    let queued = false;
    const mark = () => {
      queued = false;
      markTerms(root);
    };
    // Marking mutates the subtree too; the second pass finds nothing left to mark.
    new MutationObserver(() => {
      if (!queued) {
        queued = true;
        requestAnimationFrame(mark);
      }
    }).observe(root, { childList: true, subtree: true });
    markTerms(root);
  }
}
