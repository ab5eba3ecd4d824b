// "Which strategy?": the core's search over the page's model lists the fastest choices that fit
// on the chosen device kind, and Load puts one into the sandbox (its strategy's preset, mesh,
// mode and remat), which then trains.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  close, formValues, hashOf, launch, location, openReady, settled, singleSteps, STEP_TIMEOUT_MS,
} from './helpers.js';

before(launch);
after(close);

test('the search lists choices fastest first and Load runs the one picked', { timeout: 2 * STEP_TIMEOUT_MS }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mesh: 'dp=4', device: 'h100' }));
  try {
    await page.getByTestId('strategy-run').click();
    await page.getByTestId('strategy-table').waitFor({ timeout: 60_000 });
    const rows = page.getByTestId('strategy-row');
    const n = await rows.count();
    assert.ok(n > 0 && n <= 10, `${n} rows`);
    const ranks = await rows.evaluateAll((rs) => rs.map((r) => Number(r.dataset.rank)));
    assert.deepEqual(ranks, ranks.slice().sort((a, b) => a - b));
    assert.match(await page.getByTestId('strategy-result').innerText(), /on 4 × H100 SXM/);

    // Load the last listed choice that the page can run: its settings arrive in the form and the link.
    const load = page.getByTestId('strategy-load');
    assert.ok(await load.count() > 0, 'some choice loads');
    const pick = load.last();
    const row = pick.locator('xpath=ancestor::tr');
    const [mode, strategy, mesh, remat, microbatches] = await row.locator('td').evaluateAll((tds) => tds.slice(1, 6).map((t) => t.textContent));
    await pick.click();
    await settled(page);
    const form = await formValues(page);
    assert.equal(form.mesh, mesh);
    assert.equal(form.remat, remat);
    assert.equal(String(form.microbatches), microbatches);
    assert.equal(form.mode, mode === 'automatic' ? 'auto' : mode);
    assert.match(location(page), new RegExp(`mesh=${mesh}`));
    // The composition's options arrive with its mesh: ZeRO on dp, sequence parallelism on tp.
    // A preset names them; a composition's row lists them after its mesh.
    const name = strategy.replace(/ \(.*\)$/, '');
    assert.equal(form.zero, /ZeRO-(\d)/.exec(strategy)?.[1] ?? { zero1: '1', zero2: '2' }[name] ?? '0', `row ${strategy}`);
    assert.equal(form.sequence_parallel, String(name === 'tp_sp' || /sequence parallel/.test(strategy)), `row ${strategy}`);
    assert.equal(await singleSteps(page, 1), 1);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('settings the page refuses are refused by the search too, naming the fix', { timeout: 60_000 }, async () => {
  // 3 devices do not divide the batch of 8: the page's own check answers, in the panel as well.
  const { context, page } = await openReady(hashOf({ mesh: 'dp=3' }));
  try {
    await page.getByTestId('strategy-run').click();
    const error = page.getByTestId('strategy-error');
    await error.waitFor({ timeout: 30_000 });
    assert.match(await error.innerText(), /dp=3 does not divide batch 8.*use a batch that is a multiple of 3/);
  } finally {
    await context.close();
  }
});
