// Links reopen: every preset's own link, the copy-link button, and hostile hashes.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { assertLinkReopens, close, formValues, hashOf, launch, location, openReady, overflows, setControl, singleSteps } from './helpers.js';

before(launch);
after(close);

test('every preset’s link reopens with the same settings and no notice', { timeout: 300_000 }, async () => {
  const first = await openReady('');
  try {
    for (const preset of ['seed', 'dp', 'zero1', 'zero2', 'fsdp', 'tp', 'dp_tp']) {
      await setControl(first.page, 'preset', preset);
      await first.page.waitForFunction((p) => window.shardlab.settings.preset === p && window.shardlab.configured, preset, { timeout: 120_000 });
      const shown = await formValues(first.page);
      // Floats in their shortest round-trip decimal: the box and the link read 0.1.
      assert.equal(shown.dropout, '0.1', preset);
      const hash = new URL(first.page.url()).hash;
      assert.match(hash, /dropout=0\.1(&|$)/);
      const second = await openReady(hash);
      try {
        assert.deepEqual(await formValues(second.page), shown, preset);
        assert.equal(await second.page.getByTestId('hash-notice').isVisible(), false, preset);
        assert.equal(await second.page.locator('[data-testid="field-error"]').count(), 0, preset);
      } finally {
        await second.context.close();
      }
    }
  } finally {
    await first.context.close();
  }
});

test('the copy-link button gives the link of the settings shown', { timeout: 120_000 }, async () => {
  const { context, page } = await openReady(hashOf({ batch: '16' }));
  try {
    await page.getByTestId('copy-link').click();
    await page.waitForFunction(() => window.shardlab.lastLink, null, { timeout: 10_000 });
    const link = await page.evaluate(() => window.shardlab.lastLink);
    assert.match(link, /batch=16/);
    assert.equal(await page.getByTestId('link-box').isVisible(), true);
  } finally {
    await context.close();
  }
});

test('explicit mode trains, shows its typed program, and its link reopens it, at 390 px too', { timeout: 480_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mesh: 'dp=2' }), { viewport: { width: 390, height: 844 } });
  try {
    // Switched to mid-run, explicit mode joins the run: automatic's is kept where it stopped.
    assert.equal(await singleSteps(page, 1), 1);
    await setControl(page, 'mode', 'explicit');
    await page.waitForFunction(() => window.shardlab.configured && window.shardlab.settings.mode === 'explicit', null, { timeout: 120_000 });
    assert.deepEqual(await page.evaluate(() => window.shardlab.configured.modes), ['explicit']);
    assert.equal(await page.getByTestId('mode-notice').innerText(),
      'Explicit goes on from step 0. automatic’s run is kept at step 1: switch back to resume it; its steps stay on the charts.');
    await singleSteps(page, 1);
    assert.match(await page.getByTestId('loss').innerText(), /\d\.\d/);
    // The program view: the global program, each value typed with its sharding.
    const typed = page.getByTestId('program-explicit');
    await typed.waitFor({ state: 'attached', timeout: 60_000 });
    assert.equal(await typed.evaluate((e) => e.hidden), false);
    const lines = await typed.getByTestId('typed-line').allInnerTexts();
    assert.ok(lines.some((l) => /: \w+\[8@dp,/.test(l)), lines.slice(0, 5).join('\n'));
    assert.deepEqual(await page.evaluate(overflows), []);
    assert.match(new URL(page.url()).hash, /mode=explicit(&|$)/);
    await assertLinkReopens(page, async (second) => {
      assert.deepEqual(await second.evaluate(() => window.shardlab.configured.modes), ['explicit']);
    }, 'explicit');
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('a program explicit mode refuses shows JAX’s error with its fix, and one press applies it: it trains, the link keeps the fix', { timeout: 300_000 }, async () => {
  // The last stream split over tp and the head's weight on its rows: the logits' contraction is
  // sharded on both sides, which JAX calls ambiguous.
  const { context, page, consoleErrors } = await openReady(hashOf({
    preset: 'tp', mesh: 'tp=2', mode: 'explicit', layers: '2', 'spec.h1.x_mlp': "P(None, None, 'tp')", 'spec.w_head': "P('tp')",
  }));
  try {
    const err = page.locator('[data-testid="field-error"][data-field="spec.logits"]');
    await err.waitFor({ timeout: 60_000 });
    assert.match(await err.innerText(), /ShardingTypeError at .*dot_general.*Contracting dimensions are sharded/);
    assert.equal(await page.getByTestId('play').isDisabled(), true);
    await err.getByTestId('apply-fix').click();
    await page.waitForFunction(() => window.shardlab.configured && (window.shardlab.settings.specs || {}).logits === 'P()', null, { timeout: 120_000 });
    assert.equal(await page.locator('[data-testid="field-error"]').count(), 0);
    assert.equal(await singleSteps(page, 1), 1);
    assert.match(location(page), /spec\.logits=P\(\)/);
    await assertLinkReopens(page, async (second) => {
      assert.equal(await second.evaluate(() => window.shardlab.settings.specs.logits), 'P()');
      assert.equal(await second.evaluate(() => !!window.shardlab.configured), true);
    });
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('mode all alternates automatic, explicit and shard_map step by step, charts the three step times, and its link reopens it; any two alternate too', { timeout: 480_000 }, async () => {
  // Dropout 0: no mask is drawn, so the three programs compute the same losses.
  const { context, page, consoleErrors } = await openReady(hashOf({ mode: 'all', dropout: '0' }));
  const lines = ['auto:original', 'explicit:original', 'shard_map:original'];
  try {
    assert.equal(await singleSteps(page, 2), 2);
    assert.deepEqual(await page.evaluate(() => window.shardlab.configured.modes), ['auto', 'explicit', 'shard_map']);
    const series = await page.evaluate(() => Object.fromEntries(Object.entries(window.shardlab.history.series)
      .map(([k, x]) => [k, { times: x.measured.filter((v) => v != null), loss: x.loss }])));
    assert.deepEqual(Object.keys(series).sort(), lines);
    for (const k of lines) {
      assert.equal(series[k].times.length, 2, k);
      assert.ok(series[k].times.every((ms) => ms > 0), k);
      for (const step of [0, 1]) {
        const [want, got] = [series['auto:original'].loss[step], series[k].loss[step]];
        assert.ok(Number.isFinite(got) && Math.abs(got - want) <= 1e-4, `${k} step ${step}: ${got} against automatic's ${want}`);
      }
    }
    // One step-time line per mode on the chart.
    assert.deepEqual(await page.evaluate(() => window.shardlab.charts.measured.lines), lines);
    assert.match(new URL(page.url()).hash, /mode=all(&|$)/);
    await assertLinkReopens(page, async (second) => {
      assert.deepEqual(await second.evaluate(() => window.shardlab.configured.modes), ['auto', 'explicit', 'shard_map']);
    }, 'all');
    // Any two alternate too: explicit joins automatic, shard_map's run is kept.
    await setControl(page, 'mode', 'auto+explicit');
    await page.waitForFunction(() => window.shardlab.configured && window.shardlab.settings.mode === 'auto+explicit', null, { timeout: 120_000 });
    assert.deepEqual(await page.evaluate(() => window.shardlab.configured.modes), ['auto', 'explicit']);
    assert.equal(await singleSteps(page, 1), 3);
    assert.match(location(page), /mode=auto\+explicit(&|$)/);
    await assertLinkReopens(page, async (second) => {
      assert.deepEqual(await second.evaluate(() => window.shardlab.configured.modes), ['auto', 'explicit']);
    }, 'auto+explicit');
    // With dropout the note says which of the running modes agree: jit's two slice one mask.
    await setControl(page, 'dropout', '0.1');
    await page.waitForFunction(() => window.shardlab.configured && window.shardlab.settings.dropout === 0.1, null, { timeout: 120_000 });
    assert.match(await page.getByTestId('dropout-note').textContent(), /automatic and explicit mode compute the same losses/);
    await setControl(page, 'mode', 'explicit+shard_map');
    await page.waitForFunction(() => window.shardlab.configured && window.shardlab.settings.mode === 'explicit+shard_map', null, { timeout: 120_000 });
    assert.match(await page.getByTestId('dropout-note').textContent(), /shard_map’s losses differ from explicit mode’s .* not a bug/);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('a value the link grammar refuses is refused at its control too', { timeout: 120_000 }, async () => {
  const { context, page } = await openReady(hashOf());
  try {
    for (const [name, value] of [['mesh', 'dp=2,tp=1,x=1'], ['dropout', '1e-1'], ['layers', '-1']]) {
      await setControl(page, name, value);
      const err = page.locator(`[data-testid="field-error"][data-field="${name}"]`);
      assert.equal(await err.count(), 1, name);
      assert.equal(await page.getByTestId('play').isDisabled(), true, name);
      assert.equal(await page.getByTestId('error').isVisible(), false, name);
      await setControl(page, name, { mesh: 'dp=2', dropout: '0.1', layers: '1' }[name]);
      assert.equal(await page.locator('[data-testid="field-error"]').count(), 0, name);
    }
  } finally {
    await context.close();
  }
});

// A hostile hash keeps every key that reads, marks a value that does not at its control (shown as
// written, nothing run until it is fixed, as when typed there), and says what no control can
// show (an unknown key) in a notice. Nothing breaks.
const HOSTILE = {
  'huge number': ['#layers=99999999999999999999', 'layers'],
  garbage: ['#%%%25%ZZ&&==', null],
  unicode: ['#mesh=dp%EF%BC%9D4', 'mesh'],
  '3-axis mesh': ['#mesh=dp%3D2%2Ctp%3D2%2Cx%3D1', 'mesh'],
  'mesh overflowing 32 bits': ['#mesh=dp%3D2%2Cx%3D2147483649', 'mesh'],
  negative: ['#batch=-8', 'batch'],
  'exponent notation': ['#dropout=1e-1', 'dropout'],
  'exponent in an integer': ['#d_model=1e3', 'd_model'],
  'an inherited key': ['#constructor=1', null],
  'the prototype key': ['#__proto__=1', null],
};
for (const [what, [hash, field]] of Object.entries(HOSTILE)) {
  test(`a hostile hash (${what}) is marked where it belongs and the rest is kept`, { timeout: 90_000 }, async () => {
    const { context, page, consoleErrors } = await openReady(`${hash}&seq=16`);
    try {
      assert.equal((await formValues(page)).seq, '16', 'the readable key is kept');
      if (field) {
        const err = page.locator(`[data-testid="field-error"][data-field="${field}"]`);
        assert.equal(await err.isVisible(), true, hash);
        assert.equal(await page.getByTestId('hash-notice').isVisible(), false, hash);
        assert.equal(await page.getByTestId('play').isDisabled(), true);
        assert.equal(decodeURIComponent((await formValues(page))[field]), decodeURIComponent(new URLSearchParams(hash.slice(1)).get(field)));
      } else {
        assert.equal(await page.getByTestId('hash-notice').isVisible(), true, hash);
        assert.match(await page.getByTestId('hash-notice').innerText(), /could not be read/);
        assert.equal(await page.getByTestId('play').isDisabled(), false);
      }
      assert.equal(await page.getByTestId('error').isVisible(), false);
      assert.deepEqual(consoleErrors, []);
    } finally {
      await context.close();
    }
  });
}

test('a key that only the prototype has is an unknown setting, not a duplicate', { timeout: 90_000 }, async () => {
  for (const key of ['constructor', 'toString', '__proto__']) {
    const { context, page } = await openReady(`${hashOf()}&${key}=1`);
    try {
      const notice = await page.getByTestId('hash-notice').innerText();
      assert.match(notice, new RegExp(`unknown setting “${key}”`), notice);
      assert.doesNotMatch(notice, /twice/);
    } finally {
      await context.close();
    }
  }
});

test('a link’s refusal names the key, the value and the limit it broke, at its control', { timeout: 180_000 }, async () => {
  const cases = [
    ['#layers=1000000', 'layers', /layers “1000000” is outside 1 to \d+/],
    ['#batch=1000000000', 'batch', /batch “1000000000” is outside 1 to \d+/],
    ['#mesh=dp%3D4096', 'mesh', /mesh dp=4096: has 4096 devices, and the page simulates at most 64: use smaller axes/],
    ['#heads=many', 'heads', /heads “many” is not a whole number/],
    ['#rng=sometimes', 'rng', /rng “sometimes” is not one of original, partitionable/],
    ['#mode=explict', 'mode', /mode “explict” is not one of auto, shard_map, explicit, both, auto\+explicit, explicit\+shard_map, all/],
    [`#layers=2&x=${'a'.repeat(9000)}`, null, /it is 9,011 characters long, and a link here has at most 8,000/],
  ];
  const { context, page } = await openReady('');
  try {
    for (const [hash, field, expected] of cases) {
      await page.evaluate((h) => { location.hash = h; }, hash);
      const where = field ? page.locator(`[data-testid="field-error"][data-field="${field}"]`) : page.getByTestId('hash-notice');
      await where.waitFor({ timeout: 30_000 });
      assert.match(await where.innerText(), expected, hash);
    }
  } finally {
    await context.close();
  }
});

test('one bad key behaves alike whether it does not parse or parses to a wrong value: the rest is kept, the key is marked, and nothing says Ready', { timeout: 120_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ layers: '1000000', seq: '16' }));
  try {
    for (const [field, next] of [['layers', hashOf({ mesh: 'dp=0', seq: '16' })], ['mesh', null]]) {
      assert.equal(await page.locator(`[data-testid="field-error"][data-field="${field}"]`).isVisible(), true, field);
      assert.equal((await formValues(page)).seq, '16', field);
      assert.equal(await page.getByTestId('hash-notice').isVisible(), false, field);
      assert.equal(await page.getByTestId('play').isDisabled(), true, field);
      assert.doesNotMatch(await page.getByTestId('status').innerText(), /Ready/, field);
      assert.doesNotMatch(await page.getByTestId('chart-modelled').locator('xpath=..').innerText(), /\bN ×/, field);
      assert.doesNotMatch(await page.getByTestId('sample').innerText(), /null|undefined/, field);
      assert.equal(await page.getByTestId('recalibrate').isVisible(), false, field);
      assert.match(await page.getByTestId('timeline-body').innerText(), /Fix the marked settings/, field);
      if (next) await page.evaluate((h) => { location.hash = h; }, next);
      await page.waitForFunction(() => document.querySelector('[data-testid="field-error"][data-field="mesh"]') || !next, null, { timeout: 30_000 });
    }
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});
