// The session's state machine: clicks during a step wait for its end and never become errors;
// Pause then Play resumes; a lost GPU device is said, and Reset recovers without a reload.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  STEP_TIMEOUT_MS, close, hashOf, launch, location, openReady, reveal, setControl, settled, singleSteps,
} from './helpers.js';

before(launch);
after(close);

/** Presses Step and waits until the step runs (or, on a fast adapter under a slow poll, ran). */
async function stepStarted(page) {
  const before = await page.evaluate(() => window.shardlab.steps);
  await page.getByTestId('single-step').click();
  await page.waitForFunction((n) => window.shardlab.busy || window.shardlab.steps > n, before, { timeout: STEP_TIMEOUT_MS });
}

test('changes, story buttons and Reset made during a step apply at its end, never as an error', { timeout: 4 * STEP_TIMEOUT_MS }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mode: 'both' }));
  try {
    await stepStarted(page);
    // A setting and a story toggle while the step runs.
    await setControl(page, 'batch', '16');
    await page.getByTestId('story-toggle').filter({ hasText: 'Use fold_in' }).click();
    await settled(page);
    assert.equal(await page.evaluate(() => window.shardlab.error), null);
    assert.equal(await page.getByTestId('error').isVisible(), false);
    const s = await page.evaluate(() => window.shardlab.settings);
    assert.equal(s.batch, 16);
    assert.equal(s.dropout_key, 'fold_in');
    assert.match(location(page), /batch=16/);

    // Reset during a step.
    await stepStarted(page);
    await page.getByTestId('reset').click();
    await settled(page);
    assert.equal(await page.evaluate(() => window.shardlab.error), null);
    assert.equal(await page.getByTestId('step').textContent(), '0');
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('Reset while a profiled step measures the GPU\'s ceilings drops that step; the next profile shows its floor', { timeout: 6 * STEP_TIMEOUT_MS }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mode: 'both' }));
  try {
    // The first profile press measures the ceilings before it profiles: Reset lands in it.
    await page.getByTestId('profile').click();
    await page.waitForFunction(() => window.shardlab.busy, null, { timeout: 10_000 });
    await page.getByTestId('reset').click();
    await settled(page);
    assert.equal(await page.evaluate(() => window.shardlab.error), null);
    assert.equal(await page.getByTestId('error').isVisible(), false);
    assert.equal(await page.getByTestId('step').textContent(), '0');
    // A profile after the reset still gets its floor, per mode.
    const before = await page.evaluate(() => window.shardlab.steps);
    await page.getByTestId('profile').click();
    await page.waitForFunction((n) => window.shardlab.steps > n || window.shardlab.error, before, { timeout: 2 * STEP_TIMEOUT_MS });
    assert.equal(await page.evaluate(() => window.shardlab.error), null);
    const floors = await page.locator('[data-testid="floor-row"] td').evaluateAll((tds) => tds.map((td) => Number(td.dataset.floorMs)));
    assert.equal(floors.length, 2);
    assert.ok(floors.every((ms) => ms > 0), JSON.stringify(floors));
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('switching presets while training applies at the step boundary and keeps training', { timeout: 4 * STEP_TIMEOUT_MS }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf());
  try {
    await page.getByTestId('play').click();
    await page.waitForFunction(() => window.shardlab.busy, null, { timeout: 10_000 });
    await setControl(page, 'preset', 'fsdp');
    const before = await page.evaluate(() => window.shardlab.steps);
    await page.waitForFunction((b) => window.shardlab.steps >= b + 1 || window.shardlab.error, before, { timeout: 2 * STEP_TIMEOUT_MS });
    await page.getByTestId('play').click(); // pause
    await settled(page);
    assert.equal(await page.evaluate(() => window.shardlab.error), null);
    assert.equal(await page.getByTestId('error').isVisible(), false);
    assert.equal(await page.evaluate(() => window.shardlab.settings.preset), 'fsdp');
    assert.match(location(page), /preset=fsdp/);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('Pause then Play while a step runs resumes training', { timeout: 4 * STEP_TIMEOUT_MS }, async () => {
  const { context, page } = await openReady(hashOf());
  try {
    await page.getByTestId('play').click();
    await page.waitForFunction(() => window.shardlab.busy, null, { timeout: 10_000 });
    await page.getByTestId('play').click(); // pause
    await page.getByTestId('play').click(); // play again, same step still running
    const before = await page.evaluate(() => window.shardlab.steps);
    await page.waitForFunction((b) => window.shardlab.steps >= b + 2 || window.shardlab.error, before, { timeout: 2 * STEP_TIMEOUT_MS });
    assert.equal(await page.evaluate(() => window.shardlab.playing), true);
    assert.equal(await page.evaluate(() => document.body.dataset.run), 'stepping');
    await page.getByTestId('play').click();
    await settled(page);
    assert.equal(await page.evaluate(() => document.body.dataset.run), 'paused');
    assert.equal(await page.evaluate(() => window.shardlab.error), null);
  } finally {
    await context.close();
  }
});

test('a lost GPU device is said, and Reset trains again on a new device without a reload', { timeout: 4 * STEP_TIMEOUT_MS }, async () => {
  const { context, page } = await openReady(hashOf());
  try {
    assert.equal(await singleSteps(page, 1), 1);
    await page.evaluate(() => window.shardlab.loseDevice());
    await page.getByTestId('single-step').click();
    await page.waitForFunction(() => window.shardlab.error, null, { timeout: STEP_TIMEOUT_MS });
    assert.match(await page.getByTestId('error').innerText(), /GPU device was lost[\s\S]*Reset/);
    await settled(page);
    await page.getByTestId('reset').click();
    await settled(page);
    assert.equal(await page.getByTestId('error').isVisible(), false);
    const navigations = await page.evaluate(() => performance.getEntriesByType('navigation').length);
    assert.equal(await singleSteps(page, 1), 1);
    assert.equal(await page.evaluate(() => performance.getEntriesByType('navigation').length), navigations);
  } finally {
    await context.close();
  }
});

test('settings that cannot run are refused at their control in the page’s words', { timeout: 180_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf());
  try {
    const at = (field) => page.locator(`[data-testid="field-error"][data-field="${field}"]`);
    await setControl(page, 'vocab', '2');
    assert.match(await at('vocab').innerText(), /too small for task copy: it needs a separator and at least two symbols.*use vocab 16/);
    assert.doesNotMatch(await at('vocab').innerText(), /--/);
    await setControl(page, 'vocab', '32');

    // Any axes compose: the one the model cannot split is refused at its size.
    await setControl(page, 'mesh', 'tp=3');
    assert.match(await at('mesh.tp').innerText(), /tp=3 does not divide heads 2.*tp = one of 1, 2/);
    await setControl(page, 'mesh', 'dp=4');

    // 2^33 attention scores: refused with their size, before any buffer exists.
    for (const [k, v] of [['d_model', '64'], ['heads', '64'], ['seq', '512'], ['batch', '512']]) await setControl(page, k, v);
    assert.match(await at('seq').innerText(), /8,589,934,592 elements/);
    // Too big for memory: refused at configure with the memory per device.
    // (16 heads keep d_model 1024's heads at 64, the widest the fused attention kernels take.)
    for (const [k, v] of [['heads', '16'], ['batch', '128'], ['layers', '12'], ['d_model', '1024']]) await setControl(page, k, v);
    assert.match(await page.locator('[data-testid="field-error"]').innerText(), /GiB per device/);
    assert.equal(await page.getByTestId('error').isVisible(), false);

    // The wasm's own parser: a device count that overflows 32 bits is a message, never a trap.
    const r = await page.evaluate(() => JSON.parse(window.shardlab.lab.configure(JSON.stringify({ ...window.shardlab.settings, mesh: 'dp=2,x=2147483649' }), true)));
    assert.equal(r.ok, false);
    assert.match(r.errors[0].message, /more than 16384 devices.*use smaller axis sizes/);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('a spec, the task and the optimizer changed while training apply at the step boundary and training goes on', { timeout: 4 * STEP_TIMEOUT_MS }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mode: 'both' }));
  try {
    await page.getByTestId('play').click();
    await page.waitForFunction(() => window.shardlab.busy, null, { timeout: 10_000 });
    const spec = page.locator('[data-testid="spec-input"][data-param="w_fc"]');
    await reveal(spec);
    await spec.fill("P(None, 'dp')");
    await spec.dispatchEvent('change');
    await setControl(page, 'task', 'reverse');
    await setControl(page, 'optimizer', 'sgd');
    const before = await page.evaluate(() => window.shardlab.steps);
    await page.waitForFunction((b) => window.shardlab.steps >= b + 2 || window.shardlab.error, before, { timeout: 3 * STEP_TIMEOUT_MS });
    await page.getByTestId('play').click(); // pause
    await settled(page);
    assert.equal(await page.evaluate(() => window.shardlab.error), null);
    assert.equal(await page.getByTestId('error').isVisible(), false);
    const s = await page.evaluate(() => window.shardlab.settings);
    assert.equal(s.specs.w_fc, "P(None, 'dp')");
    assert.equal(s.task, 'reverse');
    assert.equal(s.optimizer, 'sgd');
    assert.match(location(page), /task=reverse/);
    assert.match(location(page), /optimizer=sgd/);
    // The automatic program now gathers w_fc where it is used.
    assert.ok(await page.locator('[data-testid="program-auto"] [data-testid="collective-row"][data-kind="all-gather"]').count() > 0);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('switching the mode mid-run keeps each mode’s run and charts, and says so', { timeout: 4 * STEP_TIMEOUT_MS }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mode: 'both' }));
  try {
    const points = () => page.evaluate(() => Object.fromEntries(Object.entries(window.shardlab.history.series)
      .map(([k, x]) => [k, x.measured.filter((v) => v != null).length])));
    assert.equal(await singleSteps(page, 2), 2);
    // The chart counts steps as the counter does.
    assert.deepEqual(await page.evaluate(() => window.shardlab.charts.measured.data[0]), [1, 2]);
    await setControl(page, 'mode', 'auto');
    await settled(page);
    const notice = page.getByTestId('mode-notice');
    assert.match(await notice.innerText(), /^Automatic goes on from step 2\. shard_map’s run is kept at step 2: switch back to resume it/);
    assert.equal(await page.getByTestId('step').textContent(), '2');
    assert.equal(await singleSteps(page, 1), 3);
    assert.deepEqual(await points(), { 'auto:original': 3, 'shard_map:original': 2 });
    await setControl(page, 'mode', 'both');
    await settled(page);
    assert.match(await notice.innerText(), /^Both modes go on: automatic from step 3, shard_map from step 2\.$/);
    await singleSteps(page, 1);
    assert.deepEqual(await points(), { 'auto:original': 4, 'shard_map:original': 3 });
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});
