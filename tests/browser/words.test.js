// The page's words: the device profile's estimated figures read as a learner's words (the
// identifier on hover), and the profile's check of itself is folded away.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { close, hashOf, launch, openReady, STEP_TIMEOUT_MS } from './helpers.js';

before(launch);
after(close);

test('estimated figures are named in words with the identifier on hover, and the profile check is folded', { timeout: 240_000 }, async () => {
  const { context, page } = await openReady(hashOf({ device: 'h100', mode: 'both' }));
  try {
    const modelled = page.getByTestId('chart-modelled');
    const figures = modelled.getByTestId('estimated-figure');
    assert.ok(await figures.count() > 0);
    const launchFigure = modelled.locator('[data-testid="estimated-figure"][title="launch_s"]');
    assert.equal(await launchFigure.innerText(), 'the cost of launching one kernel');
    assert.doesNotMatch(await modelled.innerText(), /launch_s|step_s|link_latency/);

    await page.getByTestId('profile').click();
    await page.waitForFunction(() => window.shardlab.steps > 0 || window.shardlab.error, null, { timeout: STEP_TIMEOUT_MS });
    const check = page.getByTestId('profile-check');
    await check.waitFor({ state: 'attached', timeout: 10_000 });
    assert.equal(await check.evaluate((d) => d.open), false);
    assert.doesNotMatch(await page.getByTestId('breakdown').innerText(), /off the step by|off by/);
    await check.locator('summary').click();
    assert.match(await check.innerText(), /off by \d/);
    // The floor note claims nothing its categories contradict.
    assert.doesNotMatch(await page.getByTestId('floor-note').innerText(), /No kernel gets below/);
  } finally {
    await context.close();
  }
});

test('the page’s words are its own: no CLI flag or command, a strategy summary that reads, and Load said where it was pressed', { timeout: 240_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf());
  try {
    // The report's model does not fit unfused: the core's reason, without the CLI's flags.
    await page.getByTestId('scale-up-run').click();
    await page.getByTestId('scale-up-overflow').waitFor({ timeout: 120_000 });
    await page.getByTestId('strategy-run').click();
    await page.getByTestId('strategy-row').first().waitFor({ timeout: 120_000 });
    const summary = await page.getByTestId('strategy-summary').innerText();
    assert.match(summary, /every combination of [a-z ,]+ and microbatches \(the fewest that fit\): /, summary);
    assert.doesNotMatch(summary, /\)\)/);
    assert.doesNotMatch(await page.locator('main').innerText(), /--[a-z]|`|shardlab (plan|train)/);
    await page.getByTestId('strategy-load').first().click();
    const loaded = page.getByTestId('strategy-loaded');
    assert.equal(await loaded.isVisible(), true);
    assert.match(await loaded.innerText(), /^Loaded #1: .* The experiment above trains it from step 0\./);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});
