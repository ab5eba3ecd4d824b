// Browser tests of the page: Debian's Chromium (never a downloaded browser) driven by
// playwright-core, with WebGPU on SwiftShader. `cargo xtask test` serves the page and sets
// SHARDLAB_URL; SHARDLAB_CHROMIUM and SHARDLAB_ARTIFACTS may override the browser and the
// screenshot folder.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs, { mkdirSync } from 'node:fs';
import path from 'node:path';
import {
  ARTIFACTS, STEP_TIMEOUT_MS, URL_, close, foreign, hashOf, launch, location, openPage, openReady, reveal, setControl, singleSteps,
} from './helpers.js';

// SwiftShader compiles and runs every kernel on the CPU: generous, but finite.
const SELFTEST_TIMEOUT_MS = 300_000;

before(launch);
after(close);

test('page shows the adapter and passes the kernel self-test on SwiftShader WebGPU', { timeout: SELFTEST_TIMEOUT_MS + 60_000 }, async () => {
  const { context, page, requests, consoleErrors } = await openPage();
  try {
    await page.goto(URL_);
    await page.waitForFunction(() => ['ready', 'error', 'no-webgpu'].includes(document.body.dataset.state), null, {
      timeout: 60_000,
    });
    assert.equal(await page.evaluate(() => document.body.dataset.state), 'ready', `console errors: ${consoleErrors.join(' | ')}`);
    // The self-test runs on demand, so training is not kept waiting for it.
    await page.getByTestId('selftest-run').click();
    await page.waitForFunction(() => document.body.dataset.selftest === 'done', null, { timeout: SELFTEST_TIMEOUT_MS });
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: path.join(ARTIFACTS, 'page.png'), fullPage: true });

    const state = await page.evaluate(() => document.body.dataset.state);
    const errorText = (await page.getByTestId('error').textContent()).trim();
    assert.equal(errorText, '', `the page shows an error: ${errorText}`);
    assert.equal(state, 'ready', `page state is ${state}; console errors: ${consoleErrors.join(' | ')}`);

    const { adapter, report } = await page.evaluate(() => window.shardlab);
    assert.ok(adapter.backend.length > 0 && adapter.max_compute_invocations_per_workgroup >= 256, JSON.stringify(adapter));
    assert.match(await page.getByTestId('adapter').innerText(), new RegExp(adapter.backend));

    // Every shader module and pipeline was created with no validation error.
    assert.ok(report.pipelines.length > 0, 'no pipelines in the report');
    // The mixture of experts' router, dispatch and combine among them.
    assert.ok(['route', 'dispatch', 'combine'].every((e) => report.pipelines.some((p) => p.shader === 'moe' && p.entry.startsWith(e))),
      JSON.stringify(report.pipelines.filter((p) => p.shader === 'moe').map((p) => p.entry)));
    const badPipelines = report.pipelines.filter((p) => p.status === 'fail');
    assert.deepEqual(badPipelines.map((p) => `${p.shader}::${p.entry}: ${p.message}`), []);
    // Only an extension the adapter lacks may skip a pipeline.
    for (const p of report.pipelines.filter((p) => p.status === 'skip')) assert.match(p.message, /lacks/);

    // Every kernel line passed, and the page shows each one. Only a matmul variant this adapter
    // cannot run may be skipped (sg needs subgroups of 8 or 16; SwiftShader's are 4), and naive
    // and tex16 must run.
    assert.ok(report.kernels.length > 0, 'no kernels in the report');
    const unsupported = (k) => k.status === 'skip' && /^matmul (?!naive|tex16)/.test(k.name) && /does not support/.test(k.message);
    const badKernels = report.kernels.filter((k) => k.status !== 'pass' && !unsupported(k));
    assert.deepEqual(badKernels.map((k) => `${k.name} (${k.shape}): ${k.message}`), []);
    assert.equal(report.passed, true);
    const rows = page.locator('[data-testid="selftest-row"][data-kind="kernel"]');
    assert.equal(await rows.count(), report.kernels.length);
    assert.equal(await page.locator('[data-testid="selftest-row"][data-status="fail"]').count(), 0);
    assert.match(await page.getByTestId('selftest-status').textContent(), /passed/);

    assert.deepEqual(foreign(requests), [], 'requests to other hosts');
    assert.ok(requests.some((u) => u.endsWith('.wasm')), 'the wasm module was not requested');
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('without WebGPU the page says which browser or flag to use and loads no wasm', async () => {
  const { context, page, requests } = await openPage();
  try {
    // As in a browser without WebGPU: navigator.gpu is absent.
    await page.addInitScript(() => {
      delete Navigator.prototype.gpu;
    });
    await page.goto(URL_);
    await page.waitForFunction(() => document.body.dataset.state === 'no-webgpu', null, { timeout: 30_000 });
    const text = await page.getByTestId('no-webgpu').innerText();
    for (const hint of ['Chrome or Edge 113', 'chrome://flags/#enable-unsafe-webgpu', 'dom.webgpu.enabled', 'Safari 26']) {
      assert.ok(text.includes(hint), `the notice does not mention ${hint}: ${text}`);
    }
    assert.equal(await page.getByTestId('adapter').isVisible(), false);
    assert.deepEqual(requests.filter((u) => u.endsWith('.wasm') || u.includes('/pkg/')), []);
    assert.deepEqual(foreign(requests), []);
  } finally {
    await context.close();
  }
});

// ---- the sandbox ---------------------------------------------------------------------------

/** Points per series of a chart: [steps, then each running mode] (non-null values). */
const chartPoints = (page, key) => page.evaluate((k) => window.shardlab.charts[k].data.map((s) => s.filter((v) => v != null).length), key);

test('trains in each mode, switches modes, and its charts get points', { timeout: 4 * STEP_TIMEOUT_MS }, async () => {
  const { context, page, requests, consoleErrors } = await openReady(hashOf({ mode: 'auto' }));
  try {
    // Before the first step each chart is a hint, not an empty box.
    assert.equal(await page.getByTestId('chart-hint').count(), 2);
    assert.equal(await page.locator('[data-testid="chart-measured"] canvas').count(), 0);
    assert.equal(await singleSteps(page, 2), 2);
    assert.equal(await page.getByTestId('chart-hint').count(), 0);
    // Legends name only the modes that run.
    assert.deepEqual(await page.locator('[data-testid="chart-measured"] .u-legend .u-series th').allInnerTexts().then((t) => t.map((x) => x.trim())), ['step', 'automatic']);
    assert.match(await page.getByTestId('step-ms').textContent(), /^\d+(\.\d+)? (ms|µs|s)$/);
    const loss = Number(await page.getByTestId('loss').textContent());
    assert.ok(loss > 0 && loss < 10, `loss ${loss}`);
    assert.deepEqual(await chartPoints(page, 'measured'), [2, 2]);
    assert.deepEqual(await chartPoints(page, 'loss'), [2, 2]);

    // Switching the mode starts that mode's run, and keeps automatic's (and its line).
    await page.getByTestId('mode').selectOption('shard_map');
    assert.equal(await page.getByTestId('step').textContent(), '0');
    assert.equal(await singleSteps(page, 2), 2);
    assert.deepEqual(await chartPoints(page, 'measured'), [2, 2, 2]);
    assert.match(location(page), /mode=shard_map/);

    // Both: Play runs steps in a loop, one of each mode per step, without freezing the page.
    await page.getByTestId('mode').selectOption('both');
    await page.getByTestId('play').click();
    await page.waitForFunction(() => window.shardlab.steps >= 3 || window.shardlab.error, null, { timeout: 3 * STEP_TIMEOUT_MS });
    // The page answers while training: an evaluate round-trip is quick.
    const t0 = Date.now();
    await page.evaluate(() => document.title);
    assert.ok(Date.now() - t0 < 2_000, 'the page did not answer within 2 s while training');
    await page.getByTestId('play').click();
    await page.waitForFunction(() => !window.shardlab.driving && !window.shardlab.playing, null, { timeout: STEP_TIMEOUT_MS });
    assert.equal(await page.evaluate(() => window.shardlab.error), null);
    const steps = await page.evaluate(() => window.shardlab.steps);
    assert.ok(steps >= 3);
    for (const key of ['measured', 'loss']) {
      assert.deepEqual(await chartPoints(page, key), [steps, steps, steps], key);
    }
    const text = await page.getByTestId('step-ms').innerText();
    assert.match(text, /automatic .*ms/);
    assert.match(text, /shard_map .*ms/);
    // Measured and modelled times are separate charts, each labelled.
    assert.match(await page.getByTestId('live').innerText(), /measured[\s\S]*modelled/);
    assert.ok(await page.locator('[data-testid="chart-measured"] canvas').count() > 0, 'no chart canvas');

    // A profiled step: a stacked bar per mode whose segments add up to the profiled step
    // (within 25%), phases per mode, not charted, and its time is not shown as the last step time.
    const lastStep = await page.getByTestId('step-ms').innerText();
    // Wall times on a shared CPU drift, and SwiftShader's submissions cost more when they run
    // something: as in the native step_profile test, a profile counts if one of three adds up
    // within 25%, which still catches a missing phase or category.
    let bars;
    let profiles = 0;
    const tries = [];
    for (;;) {
      const before = await page.evaluate(() => window.shardlab.steps);
      await page.getByTestId('profile').click();
      await page.waitForFunction((n) => window.shardlab.steps > n || window.shardlab.error, before, { timeout: STEP_TIMEOUT_MS });
      profiles += 1;
      assert.equal(await page.evaluate(() => window.shardlab.error), null);
      const breakdown = await page.getByTestId('breakdown').innerText();
      assert.match(breakdown, /forward[\s\S]*backward[\s\S]*update[\s\S]*one submission/);
      bars = await page.locator('[data-testid="measured-bar"]').evaluateAll((rows) => rows.map((r) => ({
        mode: r.dataset.mode,
        step: Number(r.dataset.stepMs),
        segs: [...r.querySelectorAll('.seg')].map((s) => ({ c: s.dataset.category, ms: Number(s.dataset.ms) })),
      })));
      assert.deepEqual(bars.map((b) => b.mode).sort(), ['auto', 'shard_map']);
      const sums = bars.map((b) => b.segs.reduce((x, s) => x + s.ms, 0));
      tries.push(bars.map((b, i) => `${b.mode}: segments ${sums[i]} ms vs step ${b.step} ms`).join(', '));
      if (bars.every((b, i) => b.step > 0 && Math.abs(sums[i] - b.step) <= 0.25 * b.step)) break;
      assert.ok(profiles < 3, `no profile adds up within 25%: ${tries.join('; ')}`);
    }
    for (const b of bars) {
      // (No optimizer segment is required: this tiny model's AdamW is one vec4 dispatch that the
      // browser's 0.1 ms clock cannot time alone, so it may read 0. The native step_profile
      // test checks that the optimizer's time lands in its category.)
      assert.ok(b.segs.some((s) => s.c === 'matmul'), JSON.stringify(b.segs));
    }
    assert.equal(await page.locator('[data-testid="top-ops"]').count(), 2);
    // The floor on this GPU's measured ceilings, per mode, and each category against its own.
    const floors = await page.locator('[data-testid="floor-row"] td').evaluateAll((tds) => tds.map((td) => ({
      mode: td.dataset.mode, ms: Number(td.dataset.floorMs), text: td.textContent,
    })));
    assert.deepEqual(floors.map((f) => f.mode).sort(), ['auto', 'shard_map']);
    for (const f of floors) assert.ok(f.ms > 0 && /s$/.test(f.text), JSON.stringify(f));
    const note = await page.getByTestId('floor-note').innerText();
    assert.match(note, /Floor: every op at the larger of its FLOPs at [\d.]+ GFLOP\/s and its bytes at [\d.]+ GB\/s/);
    for (const m of ['auto', 'shard_map']) {
      const cats = await page.locator(`[data-testid="floor-categories"][data-mode="${m}"]`).innerText();
      assert.match(cats, /matmul [\d.]+×/, `${m}: ${cats}`);
    }
    assert.deepEqual(await chartPoints(page, 'measured'), [steps + profiles, steps, steps]);
    assert.deepEqual(await chartPoints(page, 'loss'), [steps + profiles, steps, steps]);
    assert.equal(await page.getByTestId('step-ms').innerText(), lastStep);

    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: path.join(ARTIFACTS, 'sandbox.png'), fullPage: true });
    assert.deepEqual(foreign(requests), [], 'requests to other hosts');
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('the inspector shows all-reduces in dp and replicated random bits in the seed preset', { timeout: 180_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mode: 'both' }));
  try {
    // dp: gradients are all-reduced in both programs, and the highlighted lines say so.
    for (const pane of ['program-auto', 'program-shard-map']) {
      const box = page.getByTestId(pane);
      assert.ok(await box.locator('[data-testid="collective-row"][data-kind="all-reduce"]').count() === 1, pane);
      const mode = pane === 'program-auto' ? 'auto' : 'shard_map';
      assert.ok(await page.locator(`[data-testid="program-text"] td[data-mode="${mode}"] .line.collective[data-op="all-reduce"]`).count() > 0, `${pane}: no all-reduce line`);
    }
    // Automatic mode lists what the partitioner inserted, with the rule.
    const inserted = await page.evaluate(() => window.shardlab.programs.modes.auto.inserted);
    assert.ok(inserted.some((r) => r.op === 'psum' && r.rule.length > 0), JSON.stringify(inserted.slice(0, 3)));

    // The seed preset, inspected without training (too big for SwiftShader to train quickly).
    await setControl(page, 'preset', 'seed');
    await page.waitForFunction(() => window.shardlab.settings.preset === 'seed' && window.shardlab.configured, null, { timeout: 120_000 });
    const bits = async () => Promise.all(['program-auto', 'program-shard-map'].map(async (p) =>
      Number((await page.getByTestId(p).getByTestId('rng-bits').textContent()).replace(/,/g, ''))));
    const [autoBits, smBits] = await bits();
    assert.equal(autoBits, 8 * smBits, 'original layout: every device makes the global bits');
    assert.ok(await page.locator('td[data-mode="auto"] .line.rng_replicated').count() > 0, 'no replicated random bits highlighted');
    assert.equal(await page.locator('td[data-mode="shard_map"] .line.rng_replicated').count(), 0);
    // The story's table says the same, per mode; explicit's row waits for its program (the
    // preset runs automatic and shard_map).
    const storyBits = await page.locator('[data-testid="story-share"]').evaluateAll((rows) => Object.fromEntries(rows.map((r) => [r.dataset.mode, r.children[1].textContent])));
    assert.deepEqual([storyBits.auto, storyBits.shard_map].map((t) => Number(t.replace(/,/g, ''))), [autoBits, smBits]);
    assert.equal(storyBits.explicit, '–');
    // The same-key caveat is flagged in shard_map mode.
    assert.match(await page.getByTestId('program-shard-map').innerText(), /masks repeat across 'dp'/);

    // Flipping the flag: each device makes only its block.
    await reveal(page.getByTestId('rng'));
    await page.getByTestId('rng').selectOption('partitionable');
    await page.waitForFunction(() => window.shardlab.settings.rng === 'partitionable', null, { timeout: 120_000 });
    const [autoAfter, smAfter] = await bits();
    assert.equal(autoAfter, smAfter);
    assert.equal(await page.locator('td[data-mode="auto"] .line.rng_replicated').count(), 0);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('the settings round-trip through the URL hash', { timeout: 120_000 }, async () => {
  const first = await openReady(hashOf({ preset: 'fsdp', mode: 'both', combine: '1', device: 'h100' }));
  let hash;
  try {
    const form = (p) => p.evaluate(() => Object.fromEntries([...document.getElementById('settings').elements]
      .filter((e) => e.name).map((e) => [e.name, e.type === 'checkbox' ? String(e.checked) : e.value])));
    const shown = await form(first.page);
    assert.equal(shown.preset, 'fsdp');
    assert.equal(shown.combine, 'true');
    assert.equal(shown.device, 'h100');
    await reveal(first.page.locator('input[name="batch"]'));
    await first.page.locator('input[name="batch"]').fill('16');
    await first.page.locator('input[name="batch"]').dispatchEvent('change');
    hash = new URL(first.page.url()).hash;
    assert.match(hash, /batch=16/);
    const second = await openReady(hash);
    try {
      assert.deepEqual(await form(second.page), { ...shown, batch: '16' });
      assert.equal(await second.page.getByTestId('hash-notice').isVisible(), false);
    } finally {
      await second.context.close();
    }
  } finally {
    await first.context.close();
  }
});

test('a malformed or hostile hash is shown where it belongs, as text, and runs no script', { timeout: 120_000 }, async () => {
  for (const hash of ['#layers=abc&mode=both', '#preset=%3Cimg%20src%3Dx%20onerror%3D%22window.pwned%3D1%22%3E', '#%E0%A4%A=1', '#nonsense']) {
    const { context, page, consoleErrors } = await openReady(hash);
    try {
      const marked = await page.locator('[data-testid="field-error"]').count();
      assert.ok(marked > 0 || await page.getByTestId('hash-notice').isVisible(), hash);
      if (hash.startsWith('#layers')) assert.equal(await page.getByTestId('mode').inputValue(), 'both', 'the rest is kept');
      assert.equal(await page.evaluate(() => window.pwned), undefined);
      assert.equal(await page.locator('main img').count(), 0);
      assert.equal((await page.getByTestId('error').textContent()).trim(), '');
      assert.deepEqual(consoleErrors, []);
    } finally {
      await context.close();
    }
  }
});

test('an impossible combination is explained at its control, and fixing it recovers', { timeout: 120_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf());
  try {
    await reveal(page.locator('input[name="heads"]'));
    await page.locator('input[name="heads"]').fill('3');
    await page.locator('input[name="heads"]').dispatchEvent('change');
    // heads is flagged at heads, with the heads that would divide d_model.
    const fieldError = page.locator('[data-testid="field-error"][data-field="heads"]');
    assert.equal(await fieldError.count(), 1);
    assert.match(await fieldError.innerText(), /d_model 32 is not divisible by heads 3: choose heads that divide d_model/);
    // Settings are not failures: the error banner stays for real failures only.
    assert.equal(await page.getByTestId('error').isVisible(), false);
    assert.equal(await page.getByTestId('play').isDisabled(), true);

    // Any axes compose: an axis the model cannot split is refused at its size.
    await page.locator('input[name="heads"]').fill('2');
    await page.locator('input[name="heads"]').dispatchEvent('change');
    await page.locator('input[name="mesh"]').fill('tp=4');
    await page.locator('input[name="mesh"]').dispatchEvent('change');
    const meshError = page.locator('[data-testid="field-error"][data-field="mesh.tp"]');
    assert.match(await meshError.innerText(), /tp=4 does not divide heads 2/);

    await page.locator('input[name="mesh"]').fill('dp=2');
    await page.locator('input[name="mesh"]').dispatchEvent('change');
    assert.equal(await page.locator('[data-testid="field-error"]').count(), 0);
    assert.equal(await singleSteps(page, 1), 1);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('Export to JAX produces a runnable script of the current settings', { timeout: 120_000 }, async () => {
  const opened = await openReady(hashOf({ mode: 'shard_map' }));
  try {
    const { page } = opened;
    const [download] = await Promise.all([page.waitForEvent('download'), page.getByTestId('export').click()]);
    assert.match(download.suggestedFilename(), /^shardlab_shard_map_.*\.py$/);
    const script = fs.readFileSync(await download.path(), 'utf8');
    assert.match(script, /shard_map/);
    assert.match(script, /jax\.lax\.(psum|pmean)/);
    assert.match(script, /"step"/);
    // Automatic mode exports jit with the same shardings.
    await page.locator('select[name="mode"]').selectOption('auto');
    await page.locator('select[name="mode"]').dispatchEvent('change');
    await page.getByTestId('export').click();
    const auto = await page.evaluate(() => window.shardlab.lastExport);
    assert.match(auto.filename, /^shardlab_auto_/);
    assert.match(auto.script, /NamedSharding/);
    assert.match(auto.script, /in_shardings/);
    assert.equal(await page.getByTestId('error').isVisible(), false);
  } finally {
    await opened.context.close();
  }
});
