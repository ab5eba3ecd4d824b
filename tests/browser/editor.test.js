// The sharding editor: specs per parameter group in the hash, re-planning on change, pictures of
// where a value lives, with_sharding_constraint from the inspector, and the mesh diagram.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { close, formValues, hashOf, launch, openReady, reveal, settled } from './helpers.js';

before(launch);
after(close);

/** One entry of the page's hash, as the hash reader reads it. */
const hashParam = (page, key) => new URLSearchParams(new URL(page.url()).hash.slice(1)).get(key);

const field = (page, param) => page.locator(`[data-testid="spec-input"][data-param="${param}"]`);

/** Types a spec into a field and commits it (as Enter or leaving the field does). */
async function setSpec(page, param, text) {
  const input = field(page, param);
  await reveal(input);
  await input.fill(text);
  await input.dispatchEvent('change');
}

/** Waits until the settings carry `spec` for `name` (or none, for null) and the plan is built. */
async function planned(page, name, spec) {
  await page.waitForFunction(([n, s]) => {
    const st = window.shardlab;
    const has = (st.settings && st.settings.specs && st.settings.specs[n]) || null;
    return has === s && st.configured && !st.driving;
  }, [name, spec], { timeout: 60_000 });
  await settled(page);
}

const collectives = (page) => page.locator('[data-testid="program-auto"] [data-testid="collective-row"]')
  .evaluateAll((rows) => rows.map((r) => `${r.dataset.kind}:${r.children[1].textContent}`).join(' '));

/** Clicks the automatic program's line that defines `name` and returns the picture's blocks. */
async function picture(page, mode, pattern) {
  // On the cell itself, not on one of the SSA links inside it (those lead to other lines).
  await page.locator(`#program-aligned td.src[data-mode="${mode}"]`).filter({ hasText: pattern }).first().dispatchEvent('click');
  await page.getByTestId('value-picture-body').waitFor({ timeout: 10_000 });
  return page.getByTestId('picture-block');
}

test('a spec edited in the editor reopens from the written link with no notice', { timeout: 180_000 }, async () => {
  const first = await openReady(hashOf());
  try {
    await setSpec(first.page, 'w_fc', "P(None,'dp')");
    await planned(first.page, 'w_fc', "P(None, 'dp')");
    const hash = new URL(first.page.url()).hash;
    assert.equal(hashParam(first.page, 'spec.w_fc'), "P(None, 'dp')");
    const second = await openReady(hash);
    try {
      assert.equal(await field(second.page, 'w_fc').inputValue(), "P(None, 'dp')");
      assert.equal(await second.page.getByTestId('hash-notice').isVisible(), false);
      assert.equal(await second.page.locator('[data-testid="field-error"]').count(), 0);
      // The field carries no reason of its own either: the spec is valid for the link's settings.
      assert.deepEqual(await second.page.locator('[data-testid="spec-reason"]:visible').allInnerTexts(), []);
      assert.equal(await second.page.getByTestId('fold-shardings').evaluate((e) => e.open), true, 'a link with specs opens the editor');
      assert.equal(await second.page.evaluate(() => window.shardlab.settings.specs.w_fc), "P(None, 'dp')");
      // Reset to preset empties the field, the settings and the link.
      await second.page.getByTestId('spec-reset').click();
      await planned(second.page, 'w_fc', null);
      assert.equal(await field(second.page, 'w_fc').inputValue(), '');
      assert.doesNotMatch(new URL(second.page.url()).hash, /spec\./);
    } finally {
      await second.context.close();
    }
  } finally {
    await first.context.close();
  }
});

test('a spec change re-plans the automatic program’s collectives without a step', { timeout: 180_000 }, async () => {
  const { context, page } = await openReady(hashOf());
  try {
    const before = await collectives(page);
    // w_fc's columns split over dp: the partitioner now gathers it where it is used.
    await setSpec(page, 'w_fc', "P(None, 'dp')");
    await planned(page, 'w_fc', "P(None, 'dp')");
    const after = await collectives(page);
    assert.notEqual(after, before);
    assert.match(after, /all-gather/);
    assert.equal(await page.evaluate(() => window.shardlab.steps), 0);
  } finally {
    await context.close();
  }
});

test('a picture has one block per shard: P(dp, None) on dp=4 is 4 blocks, P() one replicated block', { timeout: 180_000 }, async () => {
  const { context, page } = await openReady(hashOf({ mesh: 'dp=4' }));
  try {
    let blocks = await picture(page, 'auto', '= parameter tokens');
    assert.equal(await page.getByTestId('picture-spec').textContent(), "P('dp', None)");
    assert.equal(await blocks.count(), 4);
    assert.deepEqual(await blocks.evaluateAll((bs) => bs.map((b) => b.textContent)), ['dp=0', 'dp=1', 'dp=2', 'dp=3']);
    await setSpec(page, 'tokens', 'P()');
    await planned(page, 'tokens', 'P()');
    // The pictured value is drawn again for the new plan.
    await page.waitForFunction(() => document.querySelector('[data-testid="picture-spec"]')?.textContent === 'P()', null, { timeout: 10_000 });
    blocks = page.getByTestId('picture-block');
    assert.equal(await blocks.count(), 1);
    assert.match(await blocks.first().textContent(), /replicated: all 4 devices/);
    // shard_map's values have pictures too: its tokens keep the preset's split.
    blocks = await picture(page, 'shard_map', '= parameter tokens');
    assert.equal(await blocks.count(), 4);
  } finally {
    await context.close();
  }
});

test('a bad spec is refused at its field with the reason said once, and in a link at its field too', { timeout: 180_000 }, async () => {
  const { context, page } = await openReady(hashOf());
  try {
    await reveal(field(page, 'w_fc'));
    // A spec that does not parse: its hint once, the mesh's own axes, no CLI backticks.
    await field(page, 'w_fc').fill('P(dp');
    const reason = page.locator('[data-testid="spec-reason"][data-param="w_fc"]');
    await reason.waitFor({ state: 'visible', timeout: 10_000 });
    const hint = await reason.textContent();
    assert.equal(hint.match(/write/g).length, 1, hint);
    assert.doesNotMatch(hint, /`|'tp'/, hint);
    await field(page, 'w_fc').fill("P('tp')");
    await page.waitForFunction(() => /tp/.test(document.querySelector('[data-testid="spec-reason"][data-param="w_fc"]').textContent));
    await field(page, 'w_fc').dispatchEvent('change');
    const error = page.locator('[data-testid="field-error"][data-field="spec.w_fc"]');
    await error.waitFor({ timeout: 10_000 });
    // Beside the field that names w_fc, the error does not name it again.
    assert.match(await error.textContent(), /'tp'/);
    assert.doesNotMatch(await error.textContent(), /^w_fc: /);
    // Said once: the field's own reason gives way to the error.
    assert.equal(await reason.isVisible(), false);
    assert.equal(await page.evaluate(() => window.shardlab.configured), null);
  } finally {
    await context.close();
  }
  const link = await openReady(`${hashOf({ batch: '16' })}&spec.w_fc=${encodeURIComponent("P('zz')")}`);
  try {
    // Marked at its field, shown as written; the rest of the link is kept.
    const marked = link.page.locator('[data-testid="field-error"][data-field="spec.w_fc"]');
    assert.match(await marked.textContent(), /zz/);
    assert.equal(await link.page.locator('[name="spec.w_fc"]').inputValue(), "P('zz')");
    assert.equal((await formValues(link.page)).batch, '16');
  } finally {
    await link.context.close();
  }
});

test('with_sharding_constraint from the inspector shows in the program and the link, and comes off', { timeout: 180_000 }, async () => {
  const { context, page } = await openReady(hashOf());
  try {
    await picture(page, 'auto', /#\s+h0\.att\b/);
    await page.getByTestId('constraint-input').fill('P()');
    await page.getByTestId('constraint-apply').click();
    await planned(page, 'h0.att', 'P()');
    assert.equal(hashParam(page, 'spec.h0.att'), 'P()');
    await page.getByTestId('constraint-badge').first().waitFor({ timeout: 10_000 });
    const inserted = await page.locator('[data-testid="program-auto"] [data-testid="inserted"]').textContent();
    assert.match(inserted, /with_sharding_constraint/);
    // The editor's fold counts it; opened, it lists it with a way to take it off.
    assert.match(await page.getByTestId('fold-shardings').locator(':scope > summary').innerText(), /1 changed from the preset/);
    await reveal(page.getByTestId('constraint-remove'));
    await page.getByTestId('constraint-remove').click();
    await planned(page, 'h0.att', null);
    assert.equal(await page.getByTestId('constraint-badge').count(), 0);
  } finally {
    await context.close();
  }
});

test('the mesh diagram draws the selected collective’s device groups', { timeout: 180_000 }, async () => {
  const { context, page } = await openReady(hashOf({ preset: 'dp_tp', mesh: 'dp=2,tp=2', heads: '2' }));
  try {
    assert.equal(await page.getByTestId('mesh-device').count(), 4);
    const line = page.locator('#program-aligned td.src[data-mode="auto"] .line.collective').first();
    await line.dispatchEvent('click');
    const groups = page.getByTestId('mesh-group');
    await groups.first().waitFor({ state: 'attached', timeout: 10_000 });
    const drawn = await groups.evaluateAll((gs) => gs.map((g) => g.dataset.devices));
    const caption = await page.getByTestId('mesh-caption').textContent();
    // The groups of a collective over some of dp=2,tp=2's axes: every device in exactly one,
    // each group the devices that differ only along those axes.
    const axes = [...caption.matchAll(/'(dp|tp)'/g)].map((m) => m[1]);
    const expected = { dp: ['0,2', '1,3'], tp: ['0,1', '2,3'], 'dp,tp': ['0,1,2,3'] }[axes.join(',')];
    assert.deepEqual(drawn, expected, caption);
  } finally {
    await context.close();
  }
});

test('a short shared link with a preset and a spec opens without a false error', { timeout: 120_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(`#preset=dp&spec.w_fc=${encodeURIComponent("P(None, 'dp')")}`);
  try {
    assert.equal(await page.getByTestId('hash-notice').isVisible(), false);
    assert.equal(await field(page, 'w_fc').inputValue(), "P(None, 'dp')");
    assert.deepEqual(await page.locator('[data-testid="spec-reason"]:visible').allInnerTexts(), []);
    assert.equal(await page.locator('[data-testid="field-error"]').count(), 0);
    assert.equal(await page.evaluate(() => window.shardlab.settings.specs.w_fc), "P(None, 'dp')");
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('a spec edit shows, at its field, the collectives it added or removed and the modelled step it changed', { timeout: 120_000 }, async () => {
  const { context, page } = await openReady(hashOf({ mesh: 'dp=2' }));
  try {
    await reveal(field(page, 'w_fc'));
    // Sharding a weight over dp (FSDP-style) adds the all-gathers that bring it back.
    await setSpec(page, 'w_fc', "P(None, 'dp')");
    await planned(page, 'w_fc', "P(None, 'dp')");
    const effect = page.locator('[data-testid="spec-effect"][data-param="w_fc"]');
    await effect.waitFor({ state: 'visible', timeout: 10_000 });
    const text = await effect.innerText();
    assert.match(text, /\+\d+ all-gathers?/, text);
    assert.match(text, /modelled step on 2 × TPU v4 [\d.]+ (µs|ms) → [\d.]+ (µs|ms)/, text);
    // Beside dropout, how the running mode draws its masks (a spec edit runs automatic mode).
    assert.match(await page.getByTestId('dropout-note').textContent(), /automatic mode slices every device’s block out of one global mask/);
  } finally {
    await context.close();
  }
});
