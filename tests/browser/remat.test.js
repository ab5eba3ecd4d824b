// The remat control: jax.checkpoint per block with a policy. Losses stay bit-identical, the
// program view marks what the backward recomputes, the held activations shrink, the sentence
// under the control says what the policy trades, and the link carries the choice.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  close, formValues, hashOf, launch, openReady, setControl, singleSteps, STEP_TIMEOUT_MS,
} from './helpers.js';

before(launch);
after(close);

const activations = (page) => page.evaluate(() => window.shardlab.programs.modes.auto.summary.peak_bytes_per_device.activations);

test('remat full trains to the same loss bit for bit, marks recomputed ops, holds fewer activations and reopens from its link', { timeout: 4 * STEP_TIMEOUT_MS }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mode: 'auto', layers: '2' }));
  let hash;
  try {
    assert.equal((await formValues(page)).remat, 'none');
    assert.equal(await page.locator('.line.recomputed').count(), 0);
    const heldNone = await activations(page);
    assert.equal(await singleSteps(page, 1), 1);
    const none = await page.evaluate(() => window.shardlab.last.modes.auto.loss);

    await setControl(page, 'remat', 'full');
    await page.waitForFunction(() => window.shardlab.steps === 0 && !window.shardlab.busy, null, { timeout: 30_000 });
    assert.match(await page.getByTestId('remat-trade').innerText(), /holds only each block’s input/);
    assert.ok(await page.locator('.line.recomputed').count() > 0, 'the program marks recomputed ops');
    const explain = await page.locator('.line.recomputed').first().getAttribute('data-explain');
    assert.match(explain, /Recomputed in the backward pass.*jax\.checkpoint/);
    const heldFull = await activations(page);
    assert.ok(heldFull < heldNone, `activations ${heldFull} under full, ${heldNone} under none`);
    assert.equal(await singleSteps(page, 1), 1);
    const full = await page.evaluate(() => window.shardlab.last.modes.auto.loss);
    assert.equal(full, none, 'remat does not move a bit of the loss');
    assert.match(await page.locator('.fold-facts[data-facts="model"]').innerText(), /remat full/);
    hash = new URL(page.url()).hash;
    assert.match(hash, /remat=full/);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
  const reopened = await openReady(hash);
  try {
    assert.equal((await formValues(reopened.page)).remat, 'full');
    assert.equal(await reopened.page.getByTestId('hash-notice').isVisible(), false);
  } finally {
    await reopened.context.close();
  }
});

test('a remat policy that does not exist is refused in a link at its control, naming the choices', { timeout: 60_000 }, async () => {
  const { context, page } = await openReady(hashOf({ remat: 'everything' }));
  try {
    const marked = await page.locator('[data-testid="field-error"][data-field="remat"]').innerText();
    assert.match(marked, /remat “everything” is not one of none, full, dots/);
  } finally {
    await context.close();
  }
});
