// The JAX report's story: what holds first, then the gap measured on this adapter with live
// progress and a cancel, the random bits' share there and here, the flip and the caveat; its
// results on screen and in the link. SwiftShader is a CPU adapter: the story measures its
// smallest size, so the whole run takes well under a minute.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { STEP_TIMEOUT_MS, close, hashOf, launch, openReady, settled } from './helpers.js';

before(launch);
after(close);

const running = (page) => page.evaluate(() => !!(window.shardlab.story.result && window.shardlab.story.result.running));
const ratios = (page, mode = 'auto') => page.locator(`[data-testid="story-flag"] [data-testid="story-ratio"][data-mode="${mode}"]`)
  .evaluateAll((xs) => xs.map((x) => ({ rng: x.dataset.rng, text: x.textContent, q1: Number(x.dataset.q1), q3: Number(x.dataset.q3) })));
/** The shares table's column `testid` (share-tpu, share-here) by mode. */
const shares = (page, testid) => page.locator('[data-testid="story-share"]').evaluateAll((rows, id) => Object.fromEntries(rows.map((r) => [r.dataset.mode, Number(r.querySelector(`[data-testid="${id}"]`).dataset.share)])), testid);

test('the story leads with the report priced, then measures this adapter live, cancels, and keeps its results in the link', { timeout: 4 * STEP_TIMEOUT_MS }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf());
  let hash;
  try {
    const story = page.getByTestId('story');
    assert.equal(await story.locator('h2').innerText(), 'The JAX report, step by step');
    // What holds comes first: the report's 2.71x and the cost model's price of the same run.
    const steps = await page.locator('#story-steps > li').evaluateAll((xs) => xs.map((x) => x.dataset.testid));
    assert.deepEqual(steps, ['story-report', 'story-gap', 'story-cause', 'story-flag', 'story-caveat']);
    await page.getByTestId('report-modelled').waitFor({ timeout: 60_000 });
    assert.match(await page.getByTestId('story-report').innerText(), /2\.95 s .* 1\.09 s .*2\.71×/);
    assert.ok(Number.parseFloat(await page.getByTestId('report-modelled').innerText()) > 1.5);
    assert.equal(await page.getByTestId('report-link').first().getAttribute('href'), 'https://github.com/jax-ml/jax/issues/19657');
    assert.match(await page.getByTestId('story-today').innerText(), /partitionable layout is the default[\s\S]*explicit sharding/);
    // The random bits' share on the TPU, per mode: the replicated ones are the jit modes' larger
    // share, explicit's as automatic's (its type names each block, but every device makes all).
    const tpu = await shares(page, 'share-tpu');
    assert.deepEqual(Object.keys(tpu), ['auto', 'explicit', 'shard_map']);
    assert.ok(tpu.auto > tpu.shard_map && tpu.shard_map > 0, JSON.stringify(tpu));
    assert.ok(Math.abs(tpu.explicit - tpu.auto) < 0.02, JSON.stringify(tpu));
    assert.match(await page.getByTestId('story-report').innerText(), /automatic, .* explicit and .* shard_map: automatic over shard_map/);
    // The adapter's configuration, chosen for it and said why, before anything is measured.
    const gap = page.getByTestId('story-gap');
    assert.match(await gap.innerText(), /Not measured yet/);
    assert.match(await page.getByTestId('story-config').innerText(), /^1 layer, d_model 16 in 2 heads, seq 64, batch 32, dropout 0\.1, dp=32$/);
    assert.match(await page.getByTestId('story-why').innerText(), /CPU/);

    // Live: the button becomes a cancel, the round is counted, and cancelling keeps what ran.
    const run = page.getByTestId('story-run');
    await run.click();
    await page.waitForFunction(() => document.querySelector('[data-testid="story-round"]')?.textContent.startsWith('Round 1 of'), null, { timeout: STEP_TIMEOUT_MS });
    assert.equal(await run.innerText(), 'Cancel the story');
    assert.equal(await run.getAttribute('aria-pressed'), 'true');
    assert.match(await page.getByTestId('story-round').innerText(), /^Round 1 of 7$/);
    await run.click();
    await settled(page);
    assert.equal(await running(page), false);
    assert.match(await page.getByTestId('story-round').innerText(), /Cancelled in round 1 of 7/);
    assert.equal(await run.innerText(), 'Run the story again');

    // Again, to the end: each pair's ratio is drawn as it arrives.
    await run.click();
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="story-pair"]').length >= 2, null, { timeout: STEP_TIMEOUT_MS });
    assert.equal(await running(page), true);
    await page.waitForFunction(() => !(window.shardlab.story.result.running) || window.shardlab.error, null, { timeout: 2 * STEP_TIMEOUT_MS });
    await settled(page);
    assert.equal(await page.evaluate(() => window.shardlab.error), null);
    // A mark per round, layout and jit mode: automatic's and explicit's steps over shard_map's.
    const marks = await page.locator('[data-testid="story-pair"]').evaluateAll((xs) => xs.map((x) => x.dataset.mode));
    assert.equal(marks.length, 28);
    assert.equal(marks.filter((m) => m === 'explicit').length, 14);

    // Every ratio one way, said so; the median round's times give the ratio shown.
    const shown = await ratios(page);
    assert.deepEqual(shown.map((r) => r.rng), ['original', 'partitionable']);
    assert.deepEqual((await ratios(page, 'explicit')).map((r) => r.rng), ['original', 'partitionable']);
    for (const t of await page.locator('[data-testid="story-spread"]').allInnerTexts()) assert.match(t, /middle half \d+\.\d\d–\d+\.\d\d×, 7 rounds/);
    assert.match(await page.getByTestId('story-method').innerText(), /median of the rounds’ paired ratios/);
    const text = await gap.innerText();
    const [, a, aUnit, e, eUnit, s, sUnit] = /automatic ([\d.]+) (ms|s), explicit ([\d.]+) (ms|s) and shard_map ([\d.]+) (ms|s)/.exec(text);
    const ms = (x, unit) => Number(x) * (unit === 's' ? 1000 : 1);
    const original = Number.parseFloat(shown[0].text);
    assert.ok(Math.abs(ms(a, aUnit) / ms(s, sUnit) - original) < 0.02 * original, `${text}`);
    assert.ok(ms(e, eUnit) > 0, text);
    // Explicit's row in words: its measured ratio beside automatic's, and what its type says.
    assert.match(await page.getByTestId('story-explicit').innerText(), /Explicit mode, JAX’s default since 0\.9, writes every value’s sharding in its type/);
    const bits = page.getByTestId('story-explicit-bits');
    assert.equal(await bits.getAttribute('data-layout'), 'original');
    assert.match(await bits.innerText(), /have the type u32\[32@dp,.*every device generates all the bits/);
    // The verdict follows the spreads, and says a gap closed only where one opened.
    const verdict = page.getByTestId('story-verdict');
    const opened = shown[0].q1 > 1;
    assert.equal(await verdict.getAttribute('data-opened'), String(opened));
    if (!opened) assert.doesNotMatch(await verdict.innerText(), /closed|shrank|gone/);
    // The share here, measured in the story's profiled step.
    const here = Object.values(await shares(page, 'share-here'));
    assert.ok(here.length === 3 && here.every((x) => x > 0 && x < 1), JSON.stringify(here));
    assert.match(await page.getByTestId('share-words').innerText(), /TPU/);
    // The profile it ran says nothing it contradicts.
    assert.doesNotMatch(await page.getByTestId('breakdown').innerText(), /No kernel gets below/);
    hash = new URL(page.url()).hash;
    assert.match(hash, /story=original/);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
  // The link reopens the story's results without measuring again.
  const again = await openReady(hash);
  try {
    assert.equal(await running(again.page), false);
    const reopened = await ratios(again.page);
    assert.equal(reopened.length, 2);
    assert.equal((await ratios(again.page, 'explicit')).length, 2);
    assert.equal(await again.page.locator('[data-testid="story-pair"]').count(), 28);
    assert.equal(await again.page.getByTestId('story-run').innerText(), 'Run the story again');
    assert.equal(await again.page.evaluate(() => window.shardlab.steps), 0);
  } finally {
    await again.context.close();
  }
});

test('a story link whose gap never opened says so, one written before explicit joined still reads, and an unreadable one is marked at the story', { timeout: 120_000 }, async () => {
  // Three rounds each, as links wrote them before explicit joined (automatic/shard_map): the
  // original layout's ratios hold 1.0x.
  const results = 'original:10/10,11/10,10/11;partitionable:10/10,10/10,10/10';
  const { context, page } = await openReady(`${hashOf()}&story=${encodeURIComponent(results)}`);
  try {
    const verdict = page.getByTestId('story-verdict');
    assert.equal(await verdict.getAttribute('data-opened'), 'false');
    assert.match(await verdict.innerText(), /no gap opened/);
    assert.doesNotMatch(await verdict.innerText(), /closed|shrank|gone/);
    assert.match(await page.getByTestId('story-gap').innerText(), /automatic 10\.0 ms and shard_map 10\.0 ms/);
    assert.equal(await page.locator('[data-testid="story-ratio"][data-mode="explicit"]').count(), 0);
  } finally {
    await context.close();
  }
  // Today's links: automatic/explicit/shard_map a round; explicit's ratios read beside automatic's.
  const three = 'original:20/19/10,21/20/10,20/20/10;partitionable:10/10/10,10/10/10,10/10/10';
  const now = await openReady(`${hashOf()}&story=${encodeURIComponent(three)}`);
  try {
    assert.match(await now.page.getByTestId('story-gap').innerText(), /automatic 20\.0 ms, explicit 19\.0 ms and shard_map 10\.0 ms/);
    const explicit = await ratios(now.page, 'explicit');
    assert.deepEqual(explicit.map((r) => r.text), ['2.00×', '1.00×']);
    assert.equal(await now.page.getByTestId('story-explicit').getAttribute('data-near'), 'auto');
  } finally {
    await now.context.close();
  }
  const bad = await openReady(`${hashOf({ batch: '16' })}&story=original:fast`);
  try {
    const err = bad.page.locator('[data-testid="field-error"][data-field="story"]');
    assert.equal(await err.isVisible(), true);
    assert.match(await err.innerText(), /could not be read/);
    // The rest of the link is kept, and runs.
    assert.equal(await bad.page.evaluate(() => window.shardlab.settings.batch), 16);
    assert.equal(await bad.page.getByTestId('play').isDisabled(), false);
  } finally {
    await bad.context.close();
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
    const hash = new URL(page.url()).hash;
    const link = page.locator('td[data-mode="auto"] .line.collective a.ssa').last();
    const target = await link.getAttribute('data-target');
    await link.click();
    assert.equal(await page.locator(`#${target}`).count(), 1);
    assert.equal(new URL(page.url()).hash, hash);

    // Devices carry their mesh coordinates and a colour; FLOPs read as people read them.
    assert.match(await page.getByTestId('device-legend').innerText(), /0 \(dp=0\)[\s\S]*1 \(dp=1\)/);
    assert.match(await page.getByTestId('program-auto').getByTestId('flops').innerText(), /^\d+(\.\d+)? [kMGT]?FLOP$/);
  } finally {
    await context.close();
  }
});

test('the same-key caveat offers fold_in only where masks could repeat, in numbers from real masks', { timeout: 120_000 }, async () => {
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
    const share = async (key) => (await dp.page.locator(`[data-testid="mask-share"][data-key="${key}"]`).innerText());
    assert.equal(await share('same'), '100.0%');
    const folded = Number.parseFloat(await share('fold_in'));
    assert.ok(folded > 70 && folded < 95, `fold_in share ${folded}`);
    assert.equal(await dp.page.getByTestId('story-caveat').getByTestId('story-toggle').count(), 1);
    assert.doesNotMatch(await dp.page.getByTestId('story').innerText(), /--[a-z]|shardlab plan/, 'CLI syntax on the page');
  } finally {
    await dp.context.close();
  }
});

test('the first minute: an introduction, the task with an example, and the way in takes over from Play', { timeout: 2 * STEP_TIMEOUT_MS }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mode: 'both' }));
  try {
    const intro = await page.getByTestId('intro').innerText();
    assert.ok(intro.split('\n').filter((l) => l.trim()).length >= 3, intro);
    assert.match(await page.getByTestId('task').innerText(), /copy/);
    assert.match(await page.getByTestId('example').innerText(), /reads[\s\S]*\d( \d)+[\s\S]*predict[\s\S]*\d( \d)+/);
    // Pressed while Play trains: the story waits for the step, stops Play, and loads its run.
    await page.getByTestId('play').click();
    await page.waitForFunction(() => window.shardlab.busy, null, { timeout: 10_000 });
    await page.getByTestId('reproduce').click();
    await page.waitForFunction(() => window.shardlab.settings.preset === 'seed' && window.shardlab.story.result?.round >= 1, null, { timeout: STEP_TIMEOUT_MS });
    assert.equal(await page.evaluate(() => window.shardlab.playing), false);
    assert.equal(await page.getByTestId('story-run').innerText(), 'Cancel the story');
    await page.getByTestId('story-run').click();
    await settled(page);
    assert.equal(await page.evaluate(() => window.shardlab.error), null);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});
