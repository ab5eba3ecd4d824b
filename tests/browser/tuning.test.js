// The page's matmul tuning: the first step does not wait for the autotuner (its matmuls run a
// provisional variant while the tuner's pipelines compile in the background), and the switch to
// the tuned variants at a step boundary leaves the losses where the tuned kernels put them.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { STEP_TIMEOUT_MS, close, hashOf, launch, openReady, singleSteps } from './helpers.js';

before(launch);
after(close);

/** Steps once and returns the step's result. */
async function step(page) {
  await singleSteps(page, 1);
  return page.evaluate(() => window.shardlab.last);
}

test('the first step runs provisional matmuls without tuning, and the tuned switch keeps the losses', { timeout: 6 * STEP_TIMEOUT_MS }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mode: 'auto' }));
  try {
    const first = await step(page);
    const built = first.modes.auto;
    assert.ok(built.build_ms > 0, JSON.stringify(built));
    assert.equal(built.build.tuning_ms, 0, 'building the first trainer ran no timing runs');
    assert.ok(built.provisional_matmuls > 0, JSON.stringify(built));
    assert.equal(first.retuned_ms, null);

    // The tuner's pipelines compile in the background while training goes on; the step after they
    // are ready switches every matmul to its tuned variant.
    const losses = [built.loss];
    let switched = null;
    const deadline = Date.now() + 4 * STEP_TIMEOUT_MS;
    while (switched === null && Date.now() < deadline) {
      const r = await step(page);
      losses.push(r.modes.auto.loss);
      if (r.retuned_ms !== null) switched = r;
      else await page.waitForTimeout(500);
    }
    assert.ok(switched, `no step switched to the tuned matmuls: ${losses.length} steps`);
    assert.equal(switched.modes.auto.provisional_matmuls, 0, JSON.stringify(switched.modes.auto));
    assert.equal(switched.step, losses.length - 1, 'one step at a time, none lost or repeated');

    // The same run again on the tuned kernels from the start: every class is tuned now, so the
    // new trainer neither tunes nor runs anything provisional, and the losses match the first
    // run's to the tolerance the matmul variants share.
    await page.getByTestId('reset').click();
    await page.waitForFunction(() => window.shardlab.steps === 0, null, { timeout: 60_000 });
    const again = [];
    for (let i = 0; i < losses.length; i++) {
      const r = await step(page);
      if (i === 0) {
        assert.equal(r.modes.auto.build.tuning_ms, 0);
        assert.equal(r.modes.auto.provisional_matmuls, 0, JSON.stringify(r.modes.auto));
      }
      assert.equal(r.retuned_ms, null);
      again.push(r.modes.auto.loss);
    }
    for (let i = 0; i < losses.length; i++) {
      assert.ok(Math.abs(losses[i] - again[i]) <= 1e-4 * Math.abs(again[i]), `step ${i}: ${losses[i]} vs ${again[i]}`);
    }
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});
