// The page's layout: the first screen starts the experiment at a laptop's and a phone's size,
// the long forms fold open on demand, and nothing sticks out of its panel (or clips a
// placeholder) at 1280, 1024 and 390 px wide, with every fold open and every panel filled.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { STEP_TIMEOUT_MS, close, hashOf, launch, openReady, overflows, reveal, settled, singleSteps } from './helpers.js';

before(launch);
after(close);

/** What a learner needs to start: the run's buttons, the preset, the mode, the live step time. */
const FIRST_SCREEN = ['play', 'single-step', 'reset', 'preset', 'mode', 'run-line-ms'];

/** The ids of FIRST_SCREEN that are not wholly inside the viewport, unscrolled. */
async function outOfView(page) {
  return page.evaluate((ids) => {
    const w = window.innerWidth;
    const h = window.innerHeight;
    return ids.filter((id) => {
      const b = document.querySelector(`[data-testid="${id}"]`).getBoundingClientRect();
      return !(b.width > 0 && b.top >= 0 && b.left >= 0 && b.bottom <= h && b.right <= w);
    });
  }, FIRST_SCREEN);
}

for (const [width, height] of [[1280, 800], [390, 844]]) {
  test(`at ${width}×${height} the first screen has Play, Step, Reset, the preset, the mode and the step time`, { timeout: 240_000 }, async () => {
    const { context, page } = await openReady('', { viewport: { width, height } });
    try {
      assert.equal(await page.evaluate(() => window.scrollY), 0);
      assert.deepEqual(await outOfView(page), []);
      // The long forms are folded, each saying what it holds.
      for (const fold of ['model', 'learning', 'memory', 'shardings']) {
        const d = page.getByTestId(`fold-${fold}`);
        assert.equal(await d.evaluate((e) => e.open), false, `${fold} starts folded`);
        assert.match(await d.locator(':scope > summary').innerText(), /\S+ · \S/, `${fold}'s summary says what it holds`);
      }
      assert.match(await page.getByTestId('fold-model').locator(':scope > summary').innerText(), /d_model \d+/);
      // A step fills the step time beside the buttons, still without scrolling.
      await singleSteps(page, 1);
      assert.match(await page.getByTestId('run-line-ms').innerText(), /\d+(\.\d+)? (ms|s|µs)/);
      assert.deepEqual(await outOfView(page), []);
      // A fold opens on demand, and its controls are then in reach.
      await page.getByTestId('fold-model').locator(':scope > summary').click();
      assert.equal(await page.locator('input[name="layers"]').isVisible(), true);
    } finally {
      await context.close();
    }
  });
}

test('a setting refused inside a folded part opens the fold to show its error', { timeout: 120_000 }, async () => {
  const { context, page } = await openReady(hashOf());
  try {
    await reveal(page.locator('input[name="heads"]'));
    await page.locator('input[name="heads"]').fill('3');
    await page.getByTestId('fold-model').locator(':scope > summary').click(); // fold it again before the change lands
    await page.locator('input[name="heads"]').dispatchEvent('change');
    const error = page.locator('[data-testid="field-error"][data-field="heads"]');
    await error.waitFor({ state: 'visible', timeout: 30_000 });
    assert.equal(await page.getByTestId('fold-model').evaluate((e) => e.open), true);
  } finally {
    await context.close();
  }
});

test('nothing overflows its panel or clips a placeholder at 1280, 1024 and 390 px wide', { timeout: 600_000 }, async () => {
  // A spec and a with_sharding_constraint in the editor, the copy task's example rows.
  const hash = `${hashOf({ task: 'copy' })}&spec.w_fc=${encodeURIComponent("P(None, 'dp')")}&spec.h0.att=${encodeURIComponent('P()')}`;
  const { context, page, consoleErrors } = await openReady(hash, { viewport: { width: 390, height: 844 } });
  try {
    assert.equal(await page.getByTestId('constraint').count(), 1);
    // Fill the panels: a step, a profiled step, the scale-up prediction.
    await singleSteps(page, 1);
    await page.getByTestId('profile').click();
    await page.waitForFunction(() => !document.querySelector('[data-testid="breakdown"]').hidden || window.shardlab.error, null, { timeout: STEP_TIMEOUT_MS });
    await settled(page);
    await page.getByTestId('scale-up-run').click();
    await page.getByTestId('scale-up-row').first().waitFor({ timeout: 120_000 });
    await page.evaluate(() => { for (const d of document.querySelectorAll('details')) d.open = true; });
    for (const width of [1280, 1024, 390]) {
      await page.setViewportSize({ width, height: 900 });
      await page.waitForTimeout(300); // the charts follow the window's resize
      assert.deepEqual(await page.evaluate(overflows), [], `at ${width} px`);
    }
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});
