// The story belongs to the run, the first minute, and the inspector.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { STEP_TIMEOUT_MS, close, hashOf, launch, location, openReady, setControl, settled } from './helpers.js';

before(launch);
after(close);

test('Run the story measures both RNG layouts on this run’s settings, and nothing carries over', { timeout: 6 * STEP_TIMEOUT_MS }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mode: 'both' }));
  try {
    const story = page.getByTestId('story');
    assert.equal(await page.getByTestId('story-ratio').count(), 0);
    assert.match(await story.innerText(), /not measured yet/);
    // The same-key caveat in numbers, from real masks.
    const share = async (key) => (await page.locator(`[data-testid="mask-share"][data-key="${key}"]`).innerText());
    assert.equal(await share('same'), '100.0%');
    const folded = Number.parseFloat(await share('fold_in'));
    assert.ok(folded > 70 && folded < 95, `fold_in share ${folded}`);
    assert.doesNotMatch(await story.innerText(), /--[a-z]/, 'CLI syntax on the page');

    await page.getByTestId('story-run').click();
    await page.waitForFunction(() => (document.querySelector('[data-testid="story-verdict"]') && !window.shardlab.driving) || window.shardlab.error, null, { timeout: 5 * STEP_TIMEOUT_MS });
    await settled(page);
    assert.equal(await page.evaluate(() => window.shardlab.error), null);
    // It ends on the original layout, where the story starts.
    assert.equal(await page.evaluate(() => window.shardlab.settings.rng), 'original');
    const rngs = await page.locator('[data-testid="story-ratio"]').evaluateAll((xs) => xs.map((x) => x.dataset.rng));
    assert.deepEqual([...new Set(rngs)].sort(), ['original', 'partitionable']);
    for (const t of await page.locator('[data-testid="story-ratio"]').allInnerTexts()) assert.match(t, /^\d+\.\d\d×$/);
    // Each ratio comes with its spread over the paired rounds (five, after a warm-up step each).
    for (const t of await page.locator('[data-testid="story-spread"]').allInnerTexts()) {
      assert.match(t, /middle half of its 5 paired steps: \d+\.\d\d–\d+\.\d\d×/);
    }
    const verdict = page.getByTestId('story-verdict');
    assert.match(await verdict.innerText(), /(are|are not) distinguishable/);
    const apart = await verdict.getAttribute('data-distinguishable');
    const spreads = await page.locator('[data-testid="story-flag"] [data-testid="story-ratio"]').evaluateAll((xs) => xs.map((x) => [Number(x.dataset.q1), Number(x.dataset.q3)]));
    const [[q1o, q3o], [q1p, q3p]] = spreads;
    assert.equal(apart, String(q1o > q3p || q1p > q3o), 'the verdict follows the spreads');
    // The story's steps were interleaved: both layouts' steps sit side by side on the charts,
    // labelled, one series per mode and layout.
    const labels = await page.evaluate(() => window.shardlab.charts.measured.series.slice(1).map((x) => x.label));
    assert.deepEqual(labels, ['automatic, original', 'shard_map, original', 'automatic, partitionable', 'shard_map, partitionable']);
    const points = () => page.evaluate(() => window.shardlab.charts.measured.data.slice(1).map((xs) => xs.filter((v) => v != null).length));
    assert.deepEqual(await points(), [6, 6, 6, 6]);

    // Each step reads its own layout, whatever the controls are on: the gap and the cause are
    // the original layout's before and after the flip.
    const gap = page.getByTestId('story-gap');
    const cause = page.getByTestId('story-cause');
    const before = [await gap.innerText(), await cause.innerText()];
    assert.match(before[1], /With the original layout each device generates [\d,]+ random bits per step in automatic mode and [\d,]+ in shard_map \(2\.0×\)/);
    await page.getByTestId('story-toggle').filter({ hasText: 'Flip to partitionable' }).click();
    await settled(page);
    assert.equal(await page.evaluate(() => window.shardlab.settings.rng), 'partitionable');
    assert.deepEqual([await gap.innerText(), await cause.innerText()], before);
    // The flip resumed the parked partitionable run: the charts keep both layouts' steps.
    assert.deepEqual(await points(), [6, 6, 6, 6]);
    assert.equal(await page.getByTestId('step').textContent(), '6');
    await page.getByTestId('story-toggle').filter({ hasText: 'Back to original' }).click();
    await settled(page);
    assert.equal(await page.evaluate(() => window.shardlab.settings.rng), 'original');
    assert.deepEqual(await points(), [6, 6, 6, 6]);

    // Another preset's story starts unmeasured, and names its own collectives.
    await setControl(page, 'preset', 'fsdp');
    await settled(page);
    assert.equal(await page.getByTestId('story-ratio').count(), 0);
    assert.match(await story.innerText(), /all-gathers[\s\S]*reduce-scatters/);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('the first minute: an introduction, the way in, and the task with an example', { timeout: 120_000 }, async () => {
  const { context, page } = await openReady(hashOf());
  try {
    const intro = await page.getByTestId('intro').innerText();
    assert.ok(intro.split('\n').filter((l) => l.trim()).length >= 3, intro);
    assert.equal(await page.getByTestId('reproduce').isVisible(), true);
    const task = await page.getByTestId('task').innerText();
    assert.match(task, /copy/);
    assert.match(await page.getByTestId('example').innerText(), /reads[\s\S]*\d( \d)+[\s\S]*predict[\s\S]*\d( \d)+/);
    // The way in loads the JAX report's run and starts its story (stopped here: too big for SwiftShader).
    await page.getByTestId('reproduce').click();
    await page.waitForFunction(() => window.shardlab.settings.preset === 'seed', null, { timeout: 60_000 });
    assert.match(location(page), /preset=seed/);
    await page.getByTestId('reset').click();
    await settled(page);
  } finally {
    await context.close();
  }
});

test('the inspector aligns the programs, explains inserted ops on focus and tap, and links SSA ids', { timeout: 120_000 }, async () => {
  const { context, page } = await openReady(hashOf({ mesh: 'dp=2' }));
  try {
    // Aligned: rows with a line on both sides carry the same op.
    const pairs = await page.locator('[data-testid="program-text"] tbody tr').evaluateAll((rows) => rows
      .filter((r) => r.children[0].textContent && r.children[1].textContent)
      .map((r) => [...r.children].map((c) => (/=\s*([A-Za-z_][\w.-]*)/.exec(c.textContent) || [])[1])));
    assert.ok(pairs.length > 20, `${pairs.length} paired rows`);
    assert.ok(pairs.every(([a, b]) => a === b), JSON.stringify(pairs.find(([a, b]) => a !== b)));

    // Explanations in words on keyboard focus and on tap, not only as native tooltips.
    const marked = page.locator('td[data-mode="auto"] .line.rng_replicated').first();
    await marked.focus();
    assert.equal(await page.getByTestId('explain').isVisible(), true);
    assert.match(await page.getByTestId('explain').innerText(), /whole global array/);
    await page.keyboard.press('Escape');
    const inserted = page.locator('td[data-mode="auto"] .line.collective').first();
    await inserted.click();
    assert.match(await page.getByTestId('explain').innerText(), /partitioner inserted/);

    // An SSA id leads to its defining line, and the settings' hash is untouched.
    const hash = location(page);
    const link = page.locator('td[data-mode="auto"] .line.collective a.ssa').last();
    const target = await link.getAttribute('data-target');
    await link.click();
    assert.equal(await page.locator(`#${target}`).count(), 1);
    assert.equal(location(page), hash);

    // Devices carry their mesh coordinates and a colour; FLOPs read as people read them.
    assert.match(await page.getByTestId('device-legend').innerText(), /0 \(dp=0\)[\s\S]*1 \(dp=1\)/);
    assert.match(await page.getByTestId('program-auto').getByTestId('flops').innerText(), /^\d+(\.\d+)? [kMGT]?FLOP$/);
  } finally {
    await context.close();
  }
});

test('the same-key caveat offers fold_in only where masks could repeat', { timeout: 120_000 }, async () => {
  const { context, page } = await openReady(hashOf({ preset: 'tp', mesh: 'tp=2' }));
  try {
    const caveat = page.getByTestId('story-caveat');
    assert.match(await caveat.innerText(), /no mask to repeat/);
    assert.equal(await caveat.getByTestId('story-toggle').count(), 0);
  } finally {
    await context.close();
  }
  const dp = await openReady(hashOf());
  try {
    assert.equal(await dp.page.getByTestId('story-caveat').getByTestId('story-toggle').count(), 1);
  } finally {
    await dp.context.close();
  }
});

test('Run the story pressed while Play trains waits for the step, measures, and its link reopens; a flip during Play applies at the boundary', { timeout: 6 * STEP_TIMEOUT_MS }, async () => {
  const first = await openReady(hashOf({ mode: 'both' }));
  let hash;
  try {
    const { page, consoleErrors } = first;
    await page.getByTestId('play').click();
    await page.waitForFunction(() => window.shardlab.busy, null, { timeout: 10_000 });
    await page.getByTestId('story-run').click();
    await page.waitForFunction(() => (document.querySelector('[data-testid="story-verdict"]') && !window.shardlab.driving) || window.shardlab.error, null, { timeout: 5 * STEP_TIMEOUT_MS });
    await settled(page);
    assert.equal(await page.evaluate(() => window.shardlab.error), null);
    // The story took over from Play, and ended on the original layout with both measured.
    assert.equal(await page.evaluate(() => window.shardlab.playing), false);
    assert.equal(await page.evaluate(() => window.shardlab.settings.rng), 'original');
    assert.equal(await page.locator('[data-testid="story-flag"] [data-testid="story-ratio"]').count(), 2);
    hash = new URL(page.url()).hash;
    assert.match(hash, /rng=original/);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await first.context.close();
  }
  const again = await openReady(hash);
  try {
    const { page, consoleErrors } = again;
    assert.equal(await page.getByTestId('hash-notice').isVisible(), false);
    assert.equal(await page.evaluate(() => window.shardlab.settings.mode), 'both');
    // A flip pressed while Play's step runs applies at its end, and training goes on.
    await page.getByTestId('play').click();
    await page.waitForFunction(() => window.shardlab.busy, null, { timeout: 10_000 });
    await page.getByTestId('story-toggle').filter({ hasText: 'Flip to partitionable' }).click();
    await page.waitForFunction(() => window.shardlab.settings.rng === 'partitionable' && window.shardlab.steps >= 1, null, { timeout: 2 * STEP_TIMEOUT_MS });
    assert.equal(await page.evaluate(() => window.shardlab.playing), true);
    await page.getByTestId('play').click();
    await settled(page);
    assert.equal(await page.evaluate(() => window.shardlab.error), null);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await again.context.close();
  }
});
