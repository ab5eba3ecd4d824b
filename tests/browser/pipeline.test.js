// Pipeline parallelism on the page: the pp preset trains in shard_map mode on four stages and its
// link reopens; the bubble shrinks as the microbatches grow, in the core's fraction and in the
// modelled timeline's idle time per stage; automatic mode shows the core's refusal instead of
// running anything else; settings that cannot run are refused at their control, naming the fix.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { assertLinkReopens, close, formValues, hashOf, launch, location, openReady, overflows, reveal, setControl, settled, singleSteps } from './helpers.js';

before(launch);
after(close);

const configuredWith = (page, key, value) => page.waitForFunction(([k, v]) => window.shardlab.configured
  && String(window.shardlab.settings[k]) === v, [key, value], { timeout: 120_000 });
const rows = (page, mode) => page.locator(`[data-testid="timeline-row"][data-mode="${mode}"]`);
const fieldError = (page, field) => page.locator(`[data-testid="field-error"][data-field="${field}"]`);
const bubble = async (page) => Number(await page.getByTestId('pipeline-bubble').getAttribute('data-bubble'));
/** The largest share of the modelled shard_map step a stage idles, from the timeline's rows. */
const idleShare = (page) => page.evaluate(() => {
  const mode = document.querySelector('[data-testid="timeline-mode"][data-mode="shard_map"]');
  const step = Number(mode.dataset.stepMs);
  return Math.max(...[...mode.querySelectorAll('[data-testid="timeline-row"]')].map((r) => Number(r.dataset.idleMs) / step));
});
/** The pp preset's shape on the tiny model, so that it steps quickly on SwiftShader. */
const TINY_PP = { preset: 'pp', mode: 'shard_map', mesh: 'pp=4', layers: '4', microbatches: '4', schedule: 'gpipe' };

test('the pp preset trains in shard_map mode on four stages, says why automatic mode does not run, and its link reopens', { timeout: 600_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mode: 'both' }));
  try {
    // As a learner does: pick the preset; its controls arrive, shard_map mode with them.
    await setControl(page, 'preset', 'pp');
    await configuredWith(page, 'preset', 'pp');
    const form = await formValues(page);
    assert.deepEqual([form.mesh, form.layers, form.microbatches, form.schedule, form.mode], ['pp=4', '4', '4', 'gpipe', 'shard_map']);
    assert.match(location(page), /preset=pp&/);
    // The microbatches sit beside the schedule and the bubble they shrink.
    assert.equal(await page.getByTestId('fold-pipeline').isVisible(), true);
    assert.equal(await page.locator('[data-testid="fold-pipeline"] [name="microbatches"]').count(), 1);
    assert.match(await page.getByTestId('pipeline-words').textContent(), /\(pp − 1\)\/\(M \+ pp − 1\)/);
    assert.ok(Math.abs(await bubble(page) - 3 / 7) < 1e-12, String(await bubble(page)));

    // A row per stage, shard_map's alone: automatic mode is refused, and the page says why.
    const labels = await rows(page, 'shard_map').evaluateAll((rs) => rs.map((r) => r.dataset.device));
    assert.deepEqual(labels, ['pp=0', 'pp=1', 'pp=2', 'pp=3']);
    assert.equal(await rows(page, 'auto').count(), 0);
    assert.match(await page.getByTestId('pipeline-auto').textContent(), /^Mode auto: cannot run a pipeline \(mesh pp=4\) yet: it needs .*collective-permute/);
    assert.match(await page.locator('[data-testid="program-refused"][data-mode="auto"]').textContent(), /collective-permute/);
    // The story compares both modes: its programs' side says why it cannot here.
    assert.match(await page.getByTestId('story-unplanned').innerText(), /automatic mode cannot plan these settings/);

    // Four steps through the pipeline: finite losses, the last below the first.
    assert.equal(await singleSteps(page, 4), 4);
    const losses = await page.evaluate(() => window.shardlab.history.series['shard_map:original'].loss);
    assert.equal(losses.length, 4);
    assert.ok(losses.every(Number.isFinite), JSON.stringify(losses));
    assert.ok(losses[3] < losses[0], JSON.stringify(losses));

    await assertLinkReopens(page);
    // Automatic mode picked for the pipeline: refused at the mode, and the bubble and an empty
    // timeline each still say what they are.
    await setControl(page, 'mode', 'auto');
    await fieldError(page, 'mode').waitFor({ timeout: 30_000 });
    const bubbleLine = page.getByTestId('pipeline-bubble');
    assert.equal(await bubbleLine.evaluate((e) => e.hidden), false);
    assert.match(await bubbleLine.textContent(), /4 stages, 4 microbatches/);
    assert.match(await page.getByTestId('timeline-body').innerText(), /Fix the marked settings/);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('more microbatches shrink the bubble: the core\'s fraction and each stage\'s idle time in the timeline', { timeout: 300_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ ...TINY_PP, microbatches: '1' }));
  try {
    await settled(page);
    // A profiled step measures each pass: the bubble on this GPU stands beside the formula
    // (one microbatch: the fewest passes to time).
    const measured = page.getByTestId('pipeline-measured');
    assert.equal(await measured.isHidden(), true);
    await page.getByTestId('profile').click();
    await page.waitForFunction(() => !document.getElementById('pipeline-measured').hidden, null, { timeout: 240_000 });
    await reveal(measured);
    const shares = JSON.parse(await measured.getAttribute('data-idle'));
    assert.equal(shares.length, 4);
    assert.ok(shares.every((x) => x > 0 && x < 1), JSON.stringify(shares));
    assert.match(await measured.innerText(), /Measured on this GPU .*stage 0 [\d.]+% \(fill .*, drain .*\), .*stage 3/);
    const fractions = [await bubble(page)];
    const idle = [await idleShare(page)];
    for (const m of ['2', '8']) {
      await setControl(page, 'microbatches', m);
      await configuredWith(page, 'microbatches', m);
      await settled(page);
      // Other settings: the measurement was of another step, and goes.
      assert.equal(await measured.evaluate((e) => e.hidden), true);
      fractions.push(await bubble(page));
      idle.push(await idleShare(page));
    }
    assert.deepEqual(fractions.map((f) => f.toFixed(6)), [3 / 4, 3 / 5, 3 / 11].map((f) => f.toFixed(6)));
    assert.match(await page.getByTestId('pipeline-bubble').innerText(), /4 stages, 8 microbatches, gpipe: each stage idles \(4 − 1\)\/\(8 \+ 4 − 1\) = 27\.3%/);
    // The timeline draws the bubble: with one microbatch a stage waits most of the step, and the
    // wait falls as the microbatches grow.
    assert.ok(idle[0] > 0, `idle shares ${idle}`);
    assert.ok(idle[0] > idle[1] && idle[1] > idle[2], `idle shares ${idle}`);
    assert.ok(await page.getByTestId('timeline-idle').count() > 0);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('automatic mode on the pipeline shows the core\'s refusal at the mode control and runs nothing in its place', { timeout: 300_000 }, async () => {
  const { context, page } = await openReady(hashOf(TINY_PP));
  try {
    await settled(page);
    for (const mode of ['auto', 'both']) {
      await setControl(page, 'mode', mode);
      const err = fieldError(page, 'mode');
      await err.waitFor({ timeout: 30_000 });
      const text = await err.innerText();
      assert.match(text, /mode auto: cannot run a pipeline \(mesh pp=4\) yet: it needs what MaxText's jit pipeline needs/, mode);
      assert.match(text, /collective-permute.*Use mode shard_map/, mode);
      assert.equal(await page.evaluate(() => window.shardlab.configured), null, mode);
      assert.equal(await page.getByTestId('play').isDisabled(), true, mode);
      assert.equal(await page.locator('[data-testid="timeline-row"]').count(), 0, mode);
      assert.equal(await page.getByTestId('error').isVisible(), false, mode);
    }
    // All three modes: automatic's and explicit's refusals, each at the mode control.
    await setControl(page, 'mode', 'all');
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="field-error"][data-field="mode"]').length === 2, null, { timeout: 30_000 });
    const refusals = (await fieldError(page, 'mode').allInnerTexts()).sort();
    assert.match(refusals[0], /mode auto: cannot run a pipeline \(mesh pp=4\) yet.*Use mode shard_map/s);
    assert.match(refusals[1], /mode explicit: cannot run a pipeline \(mesh pp=4\) yet.*Use mode shard_map/s);
    assert.equal(await page.evaluate(() => window.shardlab.configured), null);
    assert.equal(await page.getByTestId('play').isDisabled(), true);
    await setControl(page, 'mode', 'shard_map');
    await configuredWith(page, 'mode', 'shard_map');
    assert.equal(await page.locator('[data-testid="field-error"]').count(), 0);
    assert.equal(await singleSteps(page, 1), 1);
  } finally {
    await context.close();
  }
});

test('pipeline settings that cannot run are refused at their control naming the fix, and so is a link\'s unknown schedule', { timeout: 300_000 }, async () => {
  const { context, page } = await openReady(hashOf(TINY_PP));
  try {
    await settled(page);
    for (const [name, value, field, words] of [
      ['microbatches', '0', 'microbatches', /microbatches “0” is outside 1 to 512/],
      ['microbatches', '3', 'microbatches', /microbatches 3 does not divide batch 8.*use one of 1, 2, 4, 8/],
      // Four stages: six layers do not split into them, and eight stages are more than four layers.
      // Both land at the pp axis's size, naming the layers.
      ['layers', '6', 'mesh.pp', /pp=4 does not split layers 6 into equal stages: use a layer count that is a multiple of 4, or pp = one of 1, 2, 3, 6/],
      ['mesh', 'pp=8', 'mesh.pp', /pp=8 is more stages than layers 4: every stage runs at least one block; use pp = one of 1, 2, 4/],
      // Blocks per stage: one count per stage, adding up to the layers.
      ['stage_layers', '1,1,2', 'stage_layers', /stage layers 1,1,2: lists 3 stages, and mesh pp=4 has 4: give one block count per stage/],
      ['stage_layers', '2,1,1,1', 'stage_layers', /stage layers 2,1,1,1: adds up to 5 blocks, and the model has layers 4: the counts must add up to the layers/],
      // COUNT*TIMES is a run of one count, as the core writes long lists.
      ['stage_layers', '1*3', 'stage_layers', /stage layers 1,1,1: lists 3 stages, and mesh pp=4 has 4: give one block count per stage/],
      ['stage_layers', '1;3', 'stage_layers', /stage_layers “1;3” is not blocks per stage like 3,5 or per virtual stage like 0,1\*6,0 \(empty: equal stages\)/],
    ]) {
      await setControl(page, name, value);
      const err = fieldError(page, field);
      await err.waitFor({ timeout: 30_000 });
      assert.match(await err.innerText(), words, `${name} ${value}`);
      assert.equal(await page.getByTestId('play').isDisabled(), true, `${name} ${value}`);
      const back = TINY_PP[name] ?? '';
      await setControl(page, name, back);
      await configuredWith(page, name, back);
    }
  } finally {
    await context.close();
  }
  // A schedule orders a pipeline's microbatches: on a preset without stages it is refused where
  // the pipeline fold shows it.
  const dp = await openReady(hashOf({ schedule: '1f1b' }));
  try {
    const err = fieldError(dp.page, 'schedule');
    await err.waitFor({ timeout: 30_000 });
    assert.match(await err.innerText(), /schedule 1f1b: orders a pipeline's microbatches, and mesh dp=2 has no 'pp' axis: add one \(e\.g\. pp=2\)/);
    assert.equal(await dp.page.getByTestId('fold-pipeline').isVisible(), true);
  } finally {
    await dp.context.close();
  }
  const bad = await openReady(hashOf({ ...TINY_PP, schedule: 'interleaved' }));
  try {
    const marked = bad.page.locator('[data-testid="field-error"][data-field="schedule"]');
    await marked.waitFor({ timeout: 30_000 });
    assert.match(await marked.innerText(), /schedule “interleaved” is not one of gpipe, 1f1b/);
  } finally {
    await bad.context.close();
  }
});

test('1F1B and ZB-H1 train the same losses as GPipe, and the link keeps the schedule', { timeout: 300_000 }, async () => {
  const losses = {};
  for (const schedule of ['gpipe', '1f1b', 'zb_h1']) {
    const { context, page, consoleErrors } = await openReady(hashOf({ ...TINY_PP, schedule }));
    try {
      assert.equal((await formValues(page)).schedule, schedule);
      assert.match(location(page), new RegExp(`schedule=${schedule}`));
      assert.equal(await singleSteps(page, 2), 2);
      losses[schedule] = await page.evaluate(() => window.shardlab.history.series['shard_map:original'].loss);
      assert.deepEqual(consoleErrors, []);
    } finally {
      await context.close();
    }
  }
  // The same microbatches, masks and sums in another order: equal to float32 rounding.
  for (const schedule of ['1f1b', 'zb_h1']) {
    assert.equal(losses[schedule].length, 2);
    losses[schedule].forEach((l, k) => assert.ok(Math.abs(l - losses.gpipe[k]) < 1e-4, JSON.stringify(losses)));
  }
});

test('the diagram draws each stage\'s passes and its bubble; virtual stages interleave them, train, and reopen from the link; a v that splits no stage is refused at its control', { timeout: 400_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ ...TINY_PP, layers: '8', schedule: '1f1b' }));
  try {
    const diagram = page.getByTestId('pipeline-diagram');
    await reveal(diagram);
    const stageSlots = () => diagram.locator('[data-testid="pipeline-stage"]').evaluateAll((rs) =>
      rs.map((r) => [...r.querySelectorAll('[data-testid="pipeline-slot"]')].map((x) => x.textContent)));
    assert.equal(await diagram.isVisible(), true);
    // A forward and a backward of each of the 4 microbatches on each of the 4 stages.
    let slots = await stageSlots();
    assert.deepEqual(slots.map((r) => r.length), [8, 8, 8, 8]);
    assert.deepEqual([...new Set(slots[0])].sort(), ['1', '2', '3', '4']);
    assert.ok(Math.abs(await bubble(page) - 3 / 7) < 1e-12, String(await bubble(page)));
    // Beside each row, the stage's memory: 1F1B's stage s holds pp - s microbatches at once,
    // and the first stage's activations are the most; the step they make, modelled.
    const memory = await diagram.locator('[data-testid="pipeline-stage-memory"]').allInnerTexts();
    assert.deepEqual(memory.map((t) => t.split('×')[0]), ['4', '3', '2', '1'], JSON.stringify(memory));
    const stageBytes = await page.evaluate(() => window.shardlab.configured.pipeline.stage_activations);
    assert.ok(stageBytes[0] > stageBytes[1] && stageBytes[1] > stageBytes[2], JSON.stringify(stageBytes));
    assert.match(await page.getByTestId('pipeline-bubble').innerText(), /Modelled on 4 × .*, a step takes [\d.]+ (µs|ms)\./);

    // Two chunks per stage: each pass runs once per chunk, labelled by it, and the bubble shrinks.
    await setControl(page, 'virtual_stages', '2');
    await configuredWith(page, 'virtual_stages', '2');
    slots = await stageSlots();
    assert.deepEqual(slots.map((r) => r.length), [16, 16, 16, 16]);
    assert.ok(slots[0].includes('1a') && slots[0].includes('1b'), JSON.stringify(slots[0]));
    assert.ok(Math.abs(await bubble(page) - 3 / 11) < 1e-12, String(await bubble(page)));
    assert.match(await page.getByTestId('pipeline-bubble').innerText(), /2 virtual stages, 1f1b: each stage idles \(4 − 1\)\/\(2·4 \+ 4 − 1\) = 27\.3%/);
    assert.match(location(page), /virtual_stages=2/);
    assert.equal(await singleSteps(page, 1), 1);
    const losses = await page.evaluate(() => window.shardlab.history.series['shard_map:original'].loss);
    assert.ok(losses.every(Number.isFinite), JSON.stringify(losses));
    await assertLinkReopens(page);

    // Three chunks do not divide a stage's two blocks; ZB-H1 runs one chunk per stage.
    await setControl(page, 'virtual_stages', '3');
    const err = fieldError(page, 'virtual_stages');
    await err.waitFor({ timeout: 30_000 });
    assert.match(await err.innerText(), /virtual stages 3: does not divide stage 0's 2 blocks.*use one of 1, 2/);
    await setControl(page, 'virtual_stages', '2');
    await setControl(page, 'schedule', 'zb_h1');
    await err.waitFor({ timeout: 30_000 });
    assert.match(await err.innerText(), /virtual stages 2: runs one chunk per stage/);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('stages of their own sizes: a link sets blocks per stage, the diagram draws a bigger stage’s passes longer, it trains, and the link reopens it', { timeout: 300_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ ...TINY_PP, layers: '8', schedule: '1f1b', stage_layers: '1,3,3,1' }));
  try {
    await configuredWith(page, 'stage_layers', '1,3,3,1');
    const diagram = page.getByTestId('pipeline-diagram');
    await reveal(diagram);
    // A stage's pass takes as long as its blocks: stage 1's three times stage 0's.
    const widths = await diagram.locator('[data-testid="pipeline-stage"]').evaluateAll((rs) =>
      rs.map((r) => r.querySelector('[data-testid="pipeline-slot"]').getBoundingClientRect().width));
    assert.ok(Math.abs(widths[1] / widths[0] - 3) < 0.2 && Math.abs(widths[3] / widths[0] - 1) < 0.1, JSON.stringify(widths));
    assert.equal(await page.getByTestId('stage_layers').inputValue(), '1,3,3,1');
    assert.equal(await singleSteps(page, 1), 1);
    const losses = await page.evaluate(() => window.shardlab.history.series['shard_map:original'].loss);
    assert.ok(losses.every(Number.isFinite), JSON.stringify(losses));
    assert.match(location(page), /stage_layers=1,3,3,1(&|$)/);
    await assertLinkReopens(page, async (second) => {
      assert.deepEqual(await second.evaluate(() => window.shardlab.configured.settings.stage_layers), [1, 3, 3, 1]);
    });
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('blocks per virtual stage: a link gives each chunk its count, an empty first chunk only embedding, it trains, and the link reopens it', { timeout: 300_000 }, async () => {
  const counts = '0,1*4,0*3';
  const { context, page, consoleErrors } = await openReady(hashOf({ ...TINY_PP, schedule: '1f1b', virtual_stages: '2', stage_layers: counts }));
  try {
    // Eight virtual stages on four: stage 0 holds chunks 0 (empty) and 4 (one block).
    await configuredWith(page, 'stage_layers', '0,1,1,1,1,0,0,0');
    assert.equal(await singleSteps(page, 1), 1);
    const losses = await page.evaluate(() => window.shardlab.history.series['shard_map:original'].loss);
    assert.ok(losses.every(Number.isFinite), JSON.stringify(losses));
    await assertLinkReopens(page, async (second) => {
      assert.deepEqual(await second.evaluate(() => window.shardlab.configured.settings.stage_layers), [0, 1, 1, 1, 1, 0, 0, 0]);
    });
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('at 390 px wide the pipeline fold, its bubble, its diagram and a row per stage fit the phone, every fold open', { timeout: 300_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf(TINY_PP), { viewport: { width: 390, height: 844 } });
  try {
    assert.equal(await singleSteps(page, 1), 1);
    await settled(page);
    await page.evaluate(() => { for (const d of document.querySelectorAll('details')) d.open = true; });
    await page.waitForTimeout(300); // the charts follow the folds' layout
    assert.equal(await page.getByTestId('fold-pipeline').isVisible(), true);
    assert.equal(await page.getByTestId('pipeline-bubble').isVisible(), true);
    assert.equal(await page.getByTestId('pipeline-diagram').isVisible(), true);
    assert.equal(await rows(page, 'shard_map').count(), 4);
    assert.deepEqual(await page.evaluate(overflows), []);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});
