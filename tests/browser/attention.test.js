// The attention control: the fused op (the default) and the unfused composition train alike,
// the choice travels in the link, and a head too wide for the fused kernels is refused at its
// control.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  close, formValues, hashOf, launch, openReady, setControl, singleSteps, STEP_TIMEOUT_MS,
} from './helpers.js';

before(launch);
after(close);

const firstLoss = async (page) => {
  assert.equal(await singleSteps(page, 1), 1);
  return page.evaluate(() => window.shardlab.last.modes.auto.loss);
};

test('attention unfused trains to the fused loss, reopens from its link, and a head too wide for the fused kernels is refused at heads', { timeout: 4 * STEP_TIMEOUT_MS }, async () => {
  // Dropout 0.1 in the original layout: both forms draw the same bits, so the losses agree.
  const { context, page, consoleErrors } = await openReady(hashOf({ mode: 'auto' }));
  let hash;
  try {
    assert.equal((await formValues(page)).attention, 'fused');
    const fused = await firstLoss(page);
    await setControl(page, 'attention', 'unfused');
    await page.waitForFunction(() => window.shardlab.steps === 0 && !window.shardlab.busy, null, { timeout: 30_000 });
    const unfused = await firstLoss(page);
    assert.ok(Math.abs(fused - unfused) < 1e-5, `fused ${fused}, unfused ${unfused}`);
    assert.match(await page.locator('.fold-facts[data-facts="model"]').innerText(), /attention unfused/);
    hash = new URL(page.url()).hash;
    assert.match(hash, /attention=unfused/);

    // d_model 256 over 2 heads is 128 per head: unfused takes it, fused is refused at heads.
    await setControl(page, 'd_model', '256');
    await setControl(page, 'heads', '2');
    const at = (field) => page.locator(`[data-testid="field-error"][data-field="${field}"]`);
    assert.equal(await at('heads').count(), 0);
    await setControl(page, 'attention', 'fused');
    assert.match(await at('heads').innerText(), /128 per head.*at most 64: use at least 4 heads, or attention unfused/);
    await setControl(page, 'heads', '4');
    assert.equal(await at('heads').count(), 0);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
  const reopened = await openReady(hash);
  try {
    assert.equal((await formValues(reopened.page)).attention, 'unfused');
    assert.equal(await reopened.page.getByTestId('hash-notice').isVisible(), false);
  } finally {
    await reopened.context.close();
  }
});
