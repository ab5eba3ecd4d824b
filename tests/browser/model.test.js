// The cost model on the page: the modelled figure for a chosen kind of device, the story's
// random bits in time, and the report's model predicted at a size no tab could train.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { assertLinkReopens, cachedCalibrationSeconds, close, formValues, hashOf, launch, location, openReady, setControl, singleSteps } from './helpers.js';

before(launch);
after(close);

/** Each modelled bar's total and the sum of its segments, by mode. */
const bars = (page) => page.evaluate(() => Object.fromEntries([...document.querySelectorAll('[data-testid="modelled-bar"]')]
  .map((b) => [b.dataset.mode, { step: Number(b.dataset.stepMs), sum: [...b.querySelectorAll('.seg')].reduce((s, x) => s + Number(x.dataset.ms), 0) }])));

test('the modelled figure predicts the chosen device, its bars add up, and the device round-trips the link', { timeout: 120_000 }, async () => {
  const first = await openReady(hashOf({ device: 'h100' }));
  try {
    const { page } = first;
    assert.equal((await formValues(page)).device, 'h100');
    const figure = page.getByTestId('chart-modelled');
    assert.match(await page.getByTestId('live').innerText(), /modelled step time on 2 × H100/);
    const h100 = await bars(page);
    assert.deepEqual(Object.keys(h100).sort(), ['auto', 'shard_map']);
    for (const [m, b] of Object.entries(h100)) {
      assert.ok(b.step > 0, m);
      assert.ok(Math.abs(b.sum - b.step) <= 1e-9 * b.step, `${m}: segments ${b.sum} vs step ${b.step}`);
    }
    assert.match(await figure.innerText(), /cost model/);

    await setControl(page, 'device', 'm2_max');
    await page.waitForFunction(() => window.shardlab.configured && window.shardlab.settings.device === 'm2_max', null, { timeout: 60_000 });
    assert.match(location(page), /device=m2_max/);
    assert.match(await page.getByTestId('live').innerText(), /2 × Apple M2 Max|2 × M2 Max/);
    const m2 = await bars(page);
    assert.notEqual(m2.auto.step, h100.auto.step, 'a different device gives a different prediction');

    await assertLinkReopens(page);
  } finally {
    await first.context.close();
  }
});

test('an unknown device in a link is refused at its control', { timeout: 60_000 }, async () => {
  const { context, page } = await openReady(hashOf({ device: 'tpu_v9' }));
  try {
    assert.match(await page.locator('[data-testid="field-error"][data-field="device"]').innerText(), /tpu_v9/);
    assert.equal((await formValues(page)).device, 'tpu_v9');
  } finally {
    await context.close();
  }
});

test('scale up predicts the report’s model on a v4-8 for every mode and layout', { timeout: 120_000 }, async () => {
  const { context, page } = await openReady(hashOf());
  try {
    const t0 = Date.now();
    await page.getByTestId('scale-up-run').click();
    await page.getByTestId('scale-up-row').first().waitFor({ timeout: 60_000 });
    const took = Date.now() - t0;
    const rows = await page.getByTestId('scale-up-row').evaluateAll((rs) => rs.map((r) => ({
      rng: r.dataset.rng,
      ms: [...r.querySelectorAll('[data-testid="scale-up-ms"]')].map((x) => x.textContent),
      modes: [...r.querySelectorAll('[data-testid="scale-up-ms"]')].map((x) => x.dataset.mode),
      ratio: Number(r.querySelector('[data-testid="scale-up-ratio"]').textContent.replace('×', '')),
      fits: r.querySelector('[data-testid="scale-up-fits"]').textContent,
    })));
    assert.deepEqual(rows.map((r) => r.rng), ['original', 'partitionable']);
    for (const r of rows) {
      assert.deepEqual(r.modes, ['auto', 'explicit', 'shard_map']);
      for (const t of r.ms) assert.match(t, /\d.*(ms|s)$/);
      // With attention fused (no seq × seq array held), batch 32 fits a v4's 32 GiB, as the
      // report's run did.
      assert.equal(r.fits, 'fits');
    }
    // The original layout's replicated random bits cost automatic mode more than the
    // partitionable layout's do.
    assert.ok(rows[0].ratio > rows[1].ratio, JSON.stringify(rows));
    assert.ok(rows[1].ratio > 0.5 && rows[1].ratio < 2, JSON.stringify(rows));
    const result = await page.getByTestId('scale-up-result').innerText();
    // The report's batch 32, though its logits (6.6 GB) exceed what a 32-bit usize counts in
    // bytes: sizes are u64 where they overflow, so wasm32 plans it.
    assert.match(result, /24 layers, d_model 1024, 16 heads, seq 1024, batch 32, vocab 50,?304/);
    assert.equal(await page.getByTestId('scale-up-batch-note').count(), 0);
    // Unfused, the same run holds every layer's scores, probabilities and mask, and does not
    // fit: the page says so, why, how far over, which tensor is the largest, and the lever.
    assert.match(await page.getByTestId('scale-up-unfused').innerText(),
      /Unfused, .* automatic needs \d+\.\d GiB and shard_map \d+\.\d GiB per device .* does not fit/);
    const why = await page.getByTestId('scale-up-overflow').innerText();
    assert.match(why, /automatic, original, attention unfused: needs \d+\.\d GiB per device against the 32\.0 GiB of a TPU v4: \d+\.\d GiB over/);
    // In the page's words: the tensor named without the terminal's backticks or the CLI's flags.
    assert.match(why, /the largest tensor [^\s`]+ (\([a-z_]+\) )?\[[\d,]+\]/);
    assert.doesNotMatch(why, /`|--[a-z]/);
    assert.match(why, /rematerialization \(jax\.checkpoint\)/);
    // And why the partitionable layout slows shard_map down.
    assert.match(await page.getByTestId('scale-up-partitionable').innerText(), /hashes once per 32-bit word/);
    assert.ok(took < 20_000, `scale up took ${took} ms`);
  } finally {
    await context.close();
  }
});

test('the task shows what the model predicts for its example after a step', { timeout: 240_000 }, async () => {
  const { context, page } = await openReady(hashOf());
  try {
    const box = page.getByTestId('example-prediction');
    assert.match(await box.innerText(), /not trained yet/);
    assert.equal(await singleSteps(page, 1), 1);
    await page.waitForFunction(() => document.getElementById('example-prediction').dataset.step === '1', null, { timeout: 10_000 });
    const tokens = await box.locator('code span').allInnerTexts();
    assert.equal(tokens.length, 8, 'one prediction per position (seq 8)');
    for (const t of tokens) assert.ok(Number(t) >= 0 && Number(t) < 32, t);
    assert.match(await box.innerText(), /after step 1 \(\d+ of \d+ copied positions right\)/);
    assert.equal(await box.getByTestId('example-now').innerText(), '');
    // It refreshes every few steps: between refreshes it says where training is.
    assert.equal(await singleSteps(page, 2), 3);
    assert.equal(await box.getAttribute('data-step'), '1');
    assert.match(await box.getByTestId('example-now').innerText(), /training is at step 3/);
    // Reset forgets the run, and its prediction.
    await page.getByTestId('reset').click();
    await page.waitForFunction(() => window.shardlab.steps === 0, null, { timeout: 30_000 });
    assert.match(await box.innerText(), /not trained yet/);
  } finally {
    await context.close();
  }
});

test('this GPU: picking it calibrates the cost model here and shows a modelled step with its breakdown; a reload uses the cached calibration', { timeout: 240_000 }, async () => {
  const { context, page } = await openReady(hashOf({ device: 'tpu_v4' }));
  try {
    const tpu = await bars(page);
    assert.equal(await page.evaluate(() => document.body.dataset.thisGpu), undefined, 'nothing is calibrated before it is picked');
    const t0 = Date.now();
    await setControl(page, 'device', 'this');
    await page.waitForFunction(() => document.body.dataset.thisGpu === 'measured', null, { timeout: 60_000 });
    const took = Date.now() - t0;
    await page.waitForFunction(() => window.shardlab.configured && window.shardlab.settings.device === 'this', null, { timeout: 60_000 });
    const live = await page.getByTestId('live').innerText();
    assert.match(live, /modelled step time on 2 × this GPU/);
    const mine = await bars(page);
    for (const [m, b] of Object.entries(mine)) {
      assert.ok(b.step > 0 && Math.abs(b.sum - b.step) <= 1e-9 * b.step, `${m}: ${JSON.stringify(b)}`);
      assert.notEqual(b.step, tpu[m].step, 'this GPU is priced on its own profile');
    }
    const cats = await page.getByTestId('modelled-bar').first().locator('.seg').evaluateAll((xs) => xs.map((x) => x.dataset.category));
    assert.ok(cats.includes('matmul') && cats.includes('launch'), cats.join(','));
    assert.match(await page.getByTestId('this-gpu-status').innerText(), /calibrated in \d/);
    // The first calibration also compiles its pipelines and tunes its matmul classes (once per
    // page, shared with training); a slow, loaded CPU takes most of this bound for that.
    assert.ok(took < 45_000, `calibration and the new prediction took ${took} ms`);
    const first = await cachedCalibrationSeconds(page);
    // Recalibrating in the same page measures again and caches the new profile. How long it
    // takes (the goal: under 5 s on SwiftShader) is calibrate_page.mjs's to measure: a timed
    // assertion here failed a loaded machine's run at 6.2 s.
    await page.getByTestId('recalibrate').click();
    assert.equal(await page.evaluate(() => document.body.dataset.thisGpu), 'measuring');
    await page.waitForFunction(() => document.body.dataset.thisGpu === 'measured', null, { timeout: 60_000 });
    const again = await cachedCalibrationSeconds(page);
    assert.notEqual(again, first, 'a new calibration was cached');
    assert.ok(again > 0, `the page's recalibration recorded ${again} s`);
    // The new profile's prediction replaces the old one.
    await page.waitForFunction((old) => [...document.querySelectorAll('[data-testid="modelled-bar"]')]
      .some((b) => b.dataset.mode === 'auto' && Number(b.dataset.stepMs) !== old), mine.auto.step, { timeout: 60_000 });
    const mine2 = await bars(page);

    // A reload (same browser profile, so the same localStorage) installs the cached calibration.
    await page.reload();
    await page.waitForFunction(() => document.body.dataset.state === 'ready', null, { timeout: 60_000 });
    assert.equal(await page.evaluate(() => document.body.dataset.thisGpu), 'cached');
    assert.equal((await formValues(page)).device, 'this');
    await page.waitForFunction(() => window.shardlab.configured && window.shardlab.settings.device === 'this', null, { timeout: 60_000 });
    const reloaded = await bars(page);
    assert.equal(reloaded.auto.step, mine2.auto.step, 'the cached profile gives the same prediction');
    assert.match(await page.getByTestId('this-gpu-status').innerText(), /cached/);
  } finally {
    await context.close();
  }
});
