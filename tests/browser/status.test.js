// The header's status line follows the session: ready, training while Play runs, paused at the
// step it stopped on, and a settings error says what to do.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { close, hashOf, launch, openReady, reveal, settled, STEP_TIMEOUT_MS } from './helpers.js';

before(launch);
after(close);

const status = (page) => page.getByTestId('status').textContent();

test('the header says ready, then training while Play runs, then where it paused', { timeout: 240_000 }, async () => {
  const { context, page } = await openReady(hashOf());
  try {
    assert.equal(await status(page), 'Ready: press Play');
    await page.getByTestId('play').click();
    await page.waitForFunction(() => window.shardlab.steps >= 1, null, { timeout: STEP_TIMEOUT_MS });
    assert.match(await status(page), /^Training/);
    await page.getByTestId('play').click();
    await settled(page);
    const steps = await page.evaluate(() => window.shardlab.steps);
    assert.equal(await status(page), `Paused at step ${steps}: press Play to go on`);
    await reveal(page.locator('input[name="layers"]'));
    await page.locator('input[name="layers"]').fill('0');
    await page.locator('input[name="layers"]').dispatchEvent('change');
    await page.waitForFunction(() => window.shardlab.configured === null);
    await settled(page);
    assert.equal(await status(page), 'Fix the settings shown in red to train');
  } finally {
    await context.close();
  }
});
