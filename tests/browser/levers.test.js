// The memory levers on the page: the microbatch control, the zero1 and zero2 presets, and the
// memory bar (parameters, optimizer state, gradients, activations per device) that moves when
// they change, the modelled step beside it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { assertLinkReopens, close, formValues, hashOf, launch, location, openReady, setControl, singleSteps } from './helpers.js';

before(launch);
after(close);

/** Each mode's memory bar: its parts in bytes and its total. */
const memory = (page) => page.evaluate(() => Object.fromEntries([...document.querySelectorAll('[data-testid="memory-bar"]')]
  .map((b) => [b.dataset.mode, {
    total: Number(b.dataset.total),
    ...Object.fromEntries([...b.querySelectorAll('.seg')].map((s) => [s.dataset.part, Number(s.dataset.bytes)])),
  }])));

const configuredWith = (page, key, value) => page.waitForFunction(([k, v]) => window.shardlab.configured
  && String(window.shardlab.settings[k]) === v, [key, value], { timeout: 60_000 });

test('microbatches shrink the activations in the memory bar and nothing else; counts that do not split the batch are refused at the control', { timeout: 300_000 }, async () => {
  const { context, page } = await openReady(hashOf({ microbatches: '1' }));
  try {
    const one = await memory(page);
    assert.deepEqual(Object.keys(one).sort(), ['auto', 'shard_map']);
    for (const [m, b] of Object.entries(one)) {
      const parts = b.params + b.optimizer_state + b.gradients + b.activations;
      assert.equal(parts, b.total, `${m}: the parts add up to the total`);
    }
    await setControl(page, 'microbatches', '4');
    await configuredWith(page, 'microbatches', '4');
    assert.match(location(page), /microbatches=4/);
    const four = await memory(page);
    for (const m of ['auto', 'shard_map']) {
      assert.ok(four[m].activations < one[m].activations, `${m}: ${four[m].activations} < ${one[m].activations}`);
      for (const k of ['params', 'optimizer_state', 'gradients']) assert.equal(four[m][k], one[m][k], `${m} ${k}`);
    }
    assert.match(await page.getByTestId('memory-levers').innerText(), /one microbatch’s activations at a time/);
    assert.ok(await page.getByTestId('memory-step-ms').count() === 2);

    // Batch 8 over dp=2: 4 rows a device.
    for (const [value, words] of [
      ['3', /microbatches 3 does not divide batch 8.*use one of 1, 2, 4, 8/],
      ['8', /microbatches 8 does not divide the 4 examples each data-parallel shard holds.*use one of 1, 2, 4/],
      ['0', /microbatches “0” is outside 1 to 512/],
    ]) {
      await setControl(page, 'microbatches', value);
      const err = page.locator('[data-testid="field-error"][data-field="microbatches"]');
      await err.waitFor({ timeout: 30_000 });
      assert.match(await err.innerText(), words, value);
      assert.equal(await page.getByTestId('play').isDisabled(), true, value);
      assert.equal(await page.getByTestId('error').isVisible(), false, value);
    }
    await setControl(page, 'microbatches', '2');
    await configuredWith(page, 'microbatches', '2');
    assert.equal(await page.locator('[data-testid="field-error"]').count(), 0);
    // Both modes train with accumulation.
    assert.equal(await singleSteps(page, 2), 2);
    const loss = Number(await page.getByTestId('loss').textContent());
    assert.ok(Number.isFinite(loss) && loss > 0, String(loss));
  } finally {
    await context.close();
  }
});

test('zero1 and zero2 shard the optimizer state, then the gradients, in the memory bar, train, and their links reopen', { timeout: 300_000 }, async () => {
  const dp = await openReady(hashOf({ preset: 'dp' }));
  let base;
  try {
    base = await memory(dp.page);
  } finally {
    await dp.context.close();
  }
  for (const [preset, words] of [['zero1', /ZeRO-1 keeps 1\/N of the optimizer state/], ['zero2', /ZeRO-2 keeps 1\/N of the gradients/]]) {
    const first = await openReady(hashOf({ preset, microbatches: '2' }));
    try {
      const { page } = first;
      const bars = await memory(page);
      for (const m of ['auto', 'shard_map']) {
        // dp=2: each device holds half of what it shards.
        assert.equal(bars[m].params, base[m].params, `${preset} ${m} params`);
        assert.equal(bars[m].optimizer_state * 2, base[m].optimizer_state, `${preset} ${m} optimizer state`);
        const grads = preset === 'zero2' ? bars[m].gradients * 2 : bars[m].gradients;
        assert.equal(grads, base[m].gradients, `${preset} ${m} gradients`);
      }
      assert.match(await page.getByTestId('memory-levers').innerText(), words);
      assert.equal(await singleSteps(page, 2), 2);
      await assertLinkReopens(page, async (second) => assert.equal((await formValues(second)).preset, preset));
    } finally {
      await first.context.close();
    }
  }
});

test('ZeRO on a mesh without a dp axis is refused at the ZeRO control, naming the axis to add', { timeout: 120_000 }, async () => {
  const { context, page } = await openReady(hashOf({ preset: 'zero2' }));
  try {
    await setControl(page, 'mesh', 'tp=2');
    const err = page.locator('[data-testid="field-error"][data-field="zero"]');
    await err.waitFor({ timeout: 30_000 });
    assert.match(await err.innerText(), /has no 'dp' axis: add one/);
    await setControl(page, 'mesh', 'dp=2');
    await configuredWith(page, 'mesh', 'dp=2');
    assert.equal(await page.locator('[data-testid="field-error"]').count(), 0);
  } finally {
    await context.close();
  }
});
