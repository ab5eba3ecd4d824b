// The timeline panel: both modes' modelled steps, a row per device, spans that name their op and
// find it in the program view, overlap switched off and on, and the trace as a download.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { close, hashOf, launch, openReady, setCheckedWhileLive } from './helpers.js';

before(launch);
after(close);

const rows = (page, mode) => page.locator(`[data-testid="timeline-row"][data-mode="${mode}"]`);
const stepMs = async (page, mode) => Number(await page.locator(`[data-testid="timeline-mode"][data-mode="${mode}"]`).getAttribute('data-step-ms'));

test('the timeline draws a row per device for both modes, and a span finds its op in the program view', { timeout: 180_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mesh: 'dp=4', batch: '8' }));
  try {
    const panel = page.getByTestId('timeline');
    assert.equal(await panel.isVisible(), true);
    for (const mode of ['auto', 'shard_map']) {
      assert.equal(await rows(page, mode).count(), 4, mode);
      const labels = await rows(page, mode).evaluateAll((rs) => rs.map((r) => r.dataset.device));
      assert.deepEqual(labels, ['dp=0', 'dp=1', 'dp=2', 'dp=3']);
      for (const row of await rows(page, mode).all()) {
        assert.ok(await row.locator('[data-testid="timeline-span"]').count() > 0, `${mode}: a row without spans`);
      }
    }
    // A span names its op; an inserted one (automatic mode) says why.
    const titles = await rows(page, 'auto').first().locator('[data-testid="timeline-span"]').evaluateAll((ss) => ss.map((s) => s.title));
    assert.ok(titles.some((t) => /inserted for/.test(t)), titles.slice(0, 5).join(' | '));
    // Pressing a span (keyboard) selects its op's line in the aligned program text.
    const span = rows(page, 'shard_map').first().locator('[data-testid="timeline-span"][data-instr]:not([data-instr=""])').nth(3);
    await span.focus();
    await page.keyboard.press('Enter');
    const selected = page.locator('#program-aligned td.selected[data-mode="shard_map"]');
    await selected.waitFor({ timeout: 10_000 });
    assert.equal(await selected.count(), 1);
    // The lines scrolled under a still pointer are not hovered: no box covers the selected line
    // until the pointer moves, and then none is drawn over it.
    const tip = page.getByTestId('explain');
    const marked = page.locator('#program-aligned [data-explain]');
    await marked.first().dispatchEvent('mouseover');
    assert.equal(await tip.isVisible(), false);
    await page.mouse.move(5, 5);
    await page.mouse.move(6, 6);
    const near = await marked.evaluateAll((xs) => {
      const sel = document.querySelector('#program-aligned td.selected').getBoundingClientRect();
      const above = xs.map((x, i) => [i, sel.top - x.getBoundingClientRect().bottom]).filter(([, d]) => d >= 0);
      return above.length ? above.sort((a, b) => a[1] - b[1])[0][0] : 0;
    });
    await marked.nth(near).dispatchEvent('mouseover');
    assert.equal(await tip.isVisible(), true);
    const [t, l] = [await tip.boundingBox(), await selected.boundingBox()];
    assert.ok(t.y + t.height <= l.y + 1 || t.y >= l.y + l.height - 1, `the box ${JSON.stringify(t)} covers the selected line ${JSON.stringify(l)}`);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('overlap off gives the serial step, never shorter, and the trace downloads as Chrome trace JSON', { timeout: 180_000 }, async () => {
  const { context, page } = await openReady(hashOf({ mesh: 'dp=4', batch: '8' }));
  try {
    const on = { auto: await stepMs(page, 'auto'), shard_map: await stepMs(page, 'shard_map') };
    await page.getByTestId('timeline-overlap').uncheck();
    await page.waitForFunction(() => window.shardlab.timeline && window.shardlab.timeline.overlap === false);
    for (const mode of ['auto', 'shard_map']) {
      const off = await stepMs(page, mode);
      assert.ok(off >= on[mode] - 1e-9, `${mode}: ${off} < ${on[mode]}`);
    }
    const [download] = await Promise.all([page.waitForEvent('download'), page.getByTestId('timeline-download').click()]);
    assert.match(download.suggestedFilename(), /^shardlab_dp_timeline\.json$/);
    const trace = JSON.parse(fs.readFileSync(await download.path(), 'utf8'));
    const processes = trace.traceEvents.filter((e) => e.ph === 'M' && e.name === 'process_name');
    assert.equal(processes.length, 8, 'a process per device of each mode');
    assert.ok(trace.traceEvents.some((e) => e.ph === 'X'));
  } finally {
    await context.close();
  }
});

test('switching overlap while Play trains redraws the timeline and training goes on', { timeout: 240_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mesh: 'dp=4', batch: '8' }));
  try {
    await page.getByTestId('play').click();
    await page.waitForFunction(() => window.shardlab.steps >= 1, null, { timeout: 180_000 });
    await setCheckedWhileLive(page.getByTestId('timeline-overlap'), false);
    await page.waitForFunction(() => window.shardlab.timeline && window.shardlab.timeline.overlap === false);
    const at = await page.evaluate(() => window.shardlab.steps);
    await page.waitForFunction((n) => window.shardlab.steps > n, at, { timeout: 180_000 });
    await setCheckedWhileLive(page.getByTestId('timeline-overlap'), true);
    await page.waitForFunction(() => window.shardlab.timeline.overlap === true);
    await page.getByTestId('play').click();
    await page.waitForFunction(() => !window.shardlab.driving && !window.shardlab.busy, null, { timeout: 180_000 });
    assert.equal(await page.evaluate(() => window.shardlab.error), null);
    assert.equal(await rows(page, 'auto').count(), 4);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});
