// Long sequences on the page: the cp ("long context") and tp_sp presets train in both modes and
// their links reopen; zig-zag balances the ring in shard_map mode, as the modelled timeline
// shows, and runs under jit on the reordered tokens; gradient accumulation runs over the ring with dropout; settings that cannot run are
// refused at their control, naming the fix.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { assertLinkReopens, close, formValues, hashOf, launch, location, openReady, setControl, settled, singleSteps } from './helpers.js';

before(launch);
after(close);

const configuredWith = (page, key, value) => page.waitForFunction(([k, v]) => window.shardlab.configured
  && String(window.shardlab.settings[k]) === v, [key, value], { timeout: 120_000 });
const rows = (page, mode) => page.locator(`[data-testid="timeline-row"][data-mode="${mode}"]`);
const stepMs = async (page, mode) => Number(await page.locator(`[data-testid="timeline-mode"][data-mode="${mode}"]`).getAttribute('data-step-ms'));
const fieldError = (page, field) => page.locator(`[data-testid="field-error"][data-field="${field}"]`);

test('the long-context preset splits a sequence of 256 over cp=4, trains in both modes, and its link reopens', { timeout: 600_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mode: 'both' }));
  try {
    // As a learner does: pick the preset; its controls arrive.
    await setControl(page, 'preset', 'cp');
    await configuredWith(page, 'preset', 'cp');
    const form = await formValues(page);
    assert.equal(form.mesh, 'cp=4');
    assert.equal(form.seq, '256');
    assert.equal(form.cp_order, 'contiguous');
    assert.match(location(page), /preset=cp&/);
    // A row per device on the ring, in both modes.
    for (const mode of ['auto', 'shard_map']) {
      const labels = await rows(page, mode).evaluateAll((rs) => rs.map((r) => r.dataset.device));
      assert.deepEqual(labels, ['cp=0', 'cp=1', 'cp=2', 'cp=3'], mode);
    }
    assert.match(await page.getByTestId('long-sequence-words').textContent(), /ring attention/);
    // One step of each mode: the same loss from the same initial parameters, ring attention
    // against jit's gathered K and V.
    assert.equal(await singleSteps(page, 2), 2);
    const losses = await page.locator('[data-testid="loss"] [data-mode]').evaluateAll((ss) => Object.fromEntries(
      ss.map((s) => [s.dataset.mode, Number(s.textContent.split(' ').pop())])));
    assert.deepEqual(Object.keys(losses).sort(), ['auto', 'shard_map']);
    assert.ok(Number.isFinite(losses.auto) && losses.auto > 0, JSON.stringify(losses));
    assert.ok(Math.abs(losses.auto - losses.shard_map) < 1e-3, JSON.stringify(losses));

    await assertLinkReopens(page);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('zig-zag balances the ring in shard_map mode, runs under jit on the reordered tokens in automatic and explicit mode, and is refused at its control where it cannot run', { timeout: 600_000 }, async () => {
  // The long-context shape at a smaller size, so the test steps quickly on SwiftShader.
  const cp = { preset: 'cp', mesh: 'cp=4', seq: '64', batch: '2', mode: 'shard_map', cp_order: 'contiguous' };
  const { context, page } = await openReady(hashOf(cp));
  try {
    await settled(page);
    const contiguous = await stepMs(page, 'shard_map');
    await setControl(page, 'cp_order', 'zigzag');
    await configuredWith(page, 'cp_order', 'zigzag');
    await settled(page);
    const zigzag = await stepMs(page, 'shard_map');
    // Contiguous blocks leave the first devices waiting for the last; zig-zag evens the work.
    assert.ok(zigzag < contiguous, `zig-zag ${zigzag} ms against contiguous ${contiguous} ms`);
    assert.match(location(page), /cp_order=zigzag/);
    assert.equal(await singleSteps(page, 1), 1);

    // Under jit the program reorders the tokens itself: automatic mode runs zig-zag beside
    // shard_map's ring.
    await setControl(page, 'mode', 'both');
    await configuredWith(page, 'mode', 'both');
    await settled(page);
    assert.ok(await stepMs(page, 'auto') > 0);
    assert.equal(await page.locator('[data-testid="field-error"]').count(), 0);
    // The link it wrote reopens zig-zag in both modes.
    await assertLinkReopens(page, async (second) => {
      const form = await formValues(second);
      assert.deepEqual([form.cp_order, form.mode], ['zigzag', 'both']);
    });
    // Explicit mode types the reordered chunks as JAX does and runs the same order.
    await setControl(page, 'mode', 'auto+explicit');
    await configuredWith(page, 'mode', 'auto+explicit');
    await settled(page);
    assert.ok(await stepMs(page, 'explicit') > 0);
    assert.equal(await page.locator('[data-testid="field-error"]').count(), 0);
    // Unfused attention cannot follow the reordered queries under jit, nor run shard_map's
    // ring: the control shows one refusal, the running mode's.
    await setControl(page, 'attention', 'unfused');
    await fieldError(page, 'attention').first().waitFor({ timeout: 30_000 });
    assert.equal(await fieldError(page, 'attention').count(), 1);
    assert.match(await fieldError(page, 'attention').innerText(), /reorders the queries/);
    await setControl(page, 'attention', 'fused');
    await configuredWith(page, 'attention', 'fused');
    await setControl(page, 'mode', 'shard_map');
    await configuredWith(page, 'mode', 'shard_map');

    // 2 x cp = 8 zig-zag chunks do not split a sequence of 60.
    await setControl(page, 'seq', '60');
    await fieldError(page, 'seq').waitFor({ timeout: 30_000 });
    assert.match(await fieldError(page, 'seq').innerText(), /zig-zag chunks/);
    await setControl(page, 'seq', '64');
    await configuredWith(page, 'seq', '64');

    // On a preset that does not split the sequence there is nothing to order.
    await setControl(page, 'preset', 'dp');
    await setControl(page, 'cp_order', 'zigzag');
    await fieldError(page, 'cp_order').waitFor({ timeout: 30_000 });
    assert.match(await fieldError(page, 'cp_order').innerText(), /mesh dp=4 has no 'cp' axis: add one \(e\.g\. cp=4\)/);
  } finally {
    await context.close();
  }
});

test('gradient accumulation over the ring with dropout: two microbatches train alike in both modes, and the link reopens with them', { timeout: 600_000 }, async () => {
  // The cp preset keeps its dropout 0.1: each microbatch draws its own masks, ring attention's
  // blocks among them, the same in jit and in the shard_map body.
  const { context, page, consoleErrors } = await openReady(hashOf({ preset: 'cp', mesh: 'cp=4', seq: '64', batch: '2', mode: 'both', microbatches: '2' }));
  try {
    assert.equal(await page.locator('[data-testid="field-error"]').count(), 0);
    assert.equal(await singleSteps(page, 2), 2);
    const losses = await page.locator('[data-testid="loss"] [data-mode]').evaluateAll((ss) => Object.fromEntries(
      ss.map((s) => [s.dataset.mode, Number(s.textContent.split(' ').pop())])));
    assert.ok(Number.isFinite(losses.auto) && losses.auto > 0, JSON.stringify(losses));
    assert.ok(Math.abs(losses.auto - losses.shard_map) < 1e-3, JSON.stringify(losses));
    assert.match(location(page), /microbatches=2/);
    await assertLinkReopens(page, async (second) => {
      const form = await formValues(second);
      assert.deepEqual([form.preset, form.microbatches, form.dropout], ['cp', '2', '0.1']);
    });
    // A count that does not split the batch of 2 is refused at its control, naming the fix.
    await setControl(page, 'microbatches', '3');
    await fieldError(page, 'microbatches').waitFor({ timeout: 30_000 });
    assert.match(await fieldError(page, 'microbatches').innerText(), /microbatches 3 .*use one of 1, 2/);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('tp_sp trains in both modes on tp=2 and its link reopens; a link with an unknown cp order is refused naming it', { timeout: 600_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ preset: 'tp_sp', mesh: 'tp=2', heads: '2', mode: 'both' }));
  try {
    assert.equal(await singleSteps(page, 2), 2);
    await assertLinkReopens(page, async (second) => assert.equal((await formValues(second)).preset, 'tp_sp'));
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
  const bad = await openReady(hashOf({ preset: 'cp', mesh: 'cp=4', seq: '64', batch: '2', cp_order: 'diagonal' }));
  try {
    const marked = bad.page.locator('[data-testid="field-error"][data-field="cp_order"]');
    await marked.waitFor({ timeout: 30_000 });
    assert.match(await marked.innerText(), /cp_order “diagonal” is not one of contiguous, zigzag/);
  } finally {
    await bad.context.close();
  }
});
