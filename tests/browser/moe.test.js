// A mixture of experts on the page: the moe preset sets its experts and an ep axis, trains, and
// draws each step's routing (tokens per expert per device, the choices dropped, the busiest
// device against the mean) from the routers' own counts; its all-to-alls' bytes and modelled time
// are said beside it; the controls change while it trains; its link reopens; it fits 390 px; and
// hostile settings are refused at their control, naming the fix.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { ARTIFACTS, STEP_TIMEOUT_MS, assertLinkReopens, close, formValues, hashOf, launch, openReady, overflows, setControl, settled, singleSteps } from './helpers.js';

before(launch);
after(close);

const configuredWith = (page, key, value) => page.waitForFunction(([k, v]) => window.shardlab.configured
  && String(window.shardlab.settings[k]) === v, [key, value], { timeout: 120_000 });
const fieldError = (page, field) => page.locator(`[data-testid="field-error"][data-field="${field}"]`);

/** The routing chart's rows: each device's experts' tokens and dropped choices. */
const chart = (page) => page.locator('[data-testid="moe-device"]').evaluateAll((rows) => rows.map((r) => ({
  device: Number(r.dataset.device),
  tokens: Number(r.dataset.tokens),
  experts: [...r.querySelectorAll('[data-testid="moe-expert"]')].map((e) => [Number(e.dataset.expert), Number(e.dataset.tokens), Number(e.dataset.dropped)]),
})));
const dropped = async (page) => Number(await page.getByTestId('moe-words').getAttribute('data-dropped'));

/** The moe preset on a model small enough for SwiftShader: 1 block, width 32, 8 × 8 tokens. */
const TINY_MOE = { preset: 'moe', mode: 'shard_map', mesh: 'dp=2,ep=2', experts: '4', top_k: '2', expert_width: '32', capacity: '1.25', aux_loss: '0.01' };

test('the moe preset trains on dp=2,ep=2 and charts each step\'s tokens per expert per device, the drops and the busiest device', { timeout: 300_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mode: 'shard_map' }));
  try {
    // A dense model: the mesh builder does not offer ep.
    assert.equal(await page.locator('#mesh-add option[value="ep"]').evaluate((o) => o.hidden), true);
    // As a learner does: pick the preset; its experts and its ep axis arrive.
    await setControl(page, 'preset', 'moe');
    await configuredWith(page, 'preset', 'moe');
    const form = await formValues(page);
    assert.deepEqual([form.mesh, form.experts, form.top_k, form.capacity, form.aux_loss], ['dp=2,ep=2', '4', '2', '1.25', '0.01']);
    assert.match(await page.getByTestId('mesh-axes').innerText(), /ep[\s\S]*splits the experts of a mixture of experts, and the batch/);
    assert.match(await page.getByTestId('moe-where').textContent(), /4 experts, 2 on each device along ep=2; .*split over dp × ep/);
    assert.match(await page.getByTestId('moe-a2a').innerText(), /shard_map: 8 all-to-alls a step, [\d.]+ (KiB|B|MiB) per device, [\d.]+ (µs|ms) of the [\d.]+ (µs|ms|s) modelled step/);
    assert.ok(await page.locator('[data-testid="timeline-span"][title*="all_to_all"]').count() > 0, 'the all-to-alls are on the timeline');

    // Smaller, so that the CPU adapter steps it quickly; two steps, each charted.
    for (const [k, v] of [['d_model', '32'], ['layers', '1'], ['seq', '8'], ['expert_width', '32']]) {
      await setControl(page, k, v);
      await configuredWith(page, k, v);
    }
    assert.equal(await singleSteps(page, 2), 2);
    const rows = await chart(page);
    assert.deepEqual(rows.map((r) => r.device), [0, 1, 2, 3]);
    // Each device holds 2 of the 4 experts (ep's coordinate picks which), and every choice of
    // the 8 × 8 tokens' 2 is either some expert's token or dropped.
    assert.deepEqual(rows.map((r) => r.experts.map(([e]) => e)), [[0, 1], [2, 3], [0, 1], [2, 3]]);
    const kept = rows.reduce((n, r) => n + r.tokens, 0);
    assert.equal(kept + await dropped(page), 8 * 8 * 2);
    assert.match(await page.getByTestId('moe-words').textContent(), /^Step 2 \(shard_map, its one router\): \d+ of 128 choices dropped .* The busiest device, \d, ran \d+ tokens through its experts against a mean of [\d.]+: [\d.]+×/);
    assert.equal(await page.locator('[data-testid="moe-step"]').count(), 2);

    // Press things while it trains: dropless while playing drops nothing from then on.
    await page.getByTestId('play').click();
    await page.waitForFunction(() => window.shardlab.steps >= 3, null, { timeout: STEP_TIMEOUT_MS });
    await setControl(page, 'capacity', 'dropless');
    await configuredWith(page, 'capacity', 'dropless');
    // The new run's first step charts its routing.
    await page.waitForFunction(() => window.shardlab.settings.capacity === 'dropless'
      && document.querySelector('[data-testid="moe-words"]').dataset.step, null, { timeout: STEP_TIMEOUT_MS });
    await page.getByTestId('play').click();
    await settled(page);
    assert.equal(await dropped(page), 0);
    assert.match(await page.getByTestId('moe-where').textContent(), /dropless: each expert takes up to a whole sequence \(8 slots\)/);

    await assertLinkReopens(page);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('hostile mixture settings are refused at their control, naming the fix, and ep is offered with experts', { timeout: 120_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf(TINY_MOE));
  try {
    await settled(page);
    for (const [field, value, message] of [
      ['top_k', '5', /^top-k 5 must be between 1 and experts 4/],
      ['capacity', '0', /capacity factor 0 must be a number above 0 \(1\.25 is Switch's\), or capacity factor dropless/],
      ['capacity', 'NaN', /capacity factor NaN must be a number above 0/],
      ['experts', '3', /^ep=2 does not divide experts 3: .*use ep = one of 1, 3/],
      ['expert_width', '0', /^expert width 0: each expert needs at least 1 hidden unit \(the dense MLP has 4 x d_model\)/],
    ]) {
      await setControl(page, field, value);
      const target = field === 'experts' ? 'mesh.ep' : field;
      await fieldError(page, target).waitFor({ timeout: 30_000 });
      assert.match(await fieldError(page, target).innerText(), message, `${field}=${value}`);
      assert.equal(await fieldError(page, '').count() + await page.locator('[data-testid="field-error"]').count(), 1, `one error for ${field}=${value}`);
      await setControl(page, field, TINY_MOE[field]);
      await fieldError(page, target).waitFor({ state: 'detached', timeout: 30_000 });
    }
    // A pipeline does not carry a mixture's loss yet: refused at its axis (on a model of 2 blocks,
    // which pp=2 could otherwise split).
    await setControl(page, 'layers', '2');
    await configuredWith(page, 'layers', '2');
    await setControl(page, 'mesh', 'ep=2,pp=2');
    await fieldError(page, 'mesh.pp').waitFor({ timeout: 30_000 });
    assert.match(await fieldError(page, 'mesh.pp').innerText(), /drop the pp axis/);
    assert.equal(await page.locator('#mesh-add option[value="ep"]').evaluate((o) => o.hidden), false);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('at 390 px wide the routing chart and its words fit their panel', { timeout: 180_000 }, async () => {
  const { context, page } = await openReady(hashOf({ ...TINY_MOE, mesh: 'dp=4,ep=2', experts: '8' }), { viewport: { width: 390, height: 844 } });
  try {
    assert.equal(await singleSteps(page, 1), 1);
    assert.equal((await chart(page)).length, 8);
    await page.getByTestId('moe-routing').screenshot({ path: path.join(ARTIFACTS, 'moe-390.png') });
    assert.deepEqual(await page.evaluate(overflows), []);
  } finally {
    await context.close();
  }
});
