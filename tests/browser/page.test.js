// Browser tests of the page: Debian's Chromium (never a downloaded browser) driven by
// playwright-core, with WebGPU on SwiftShader. `cargo xtask test` serves the page and sets
// SHARDLAB_URL; SHARDLAB_CHROMIUM and SHARDLAB_ARTIFACTS may override the browser and the
// screenshot folder.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const URL_ = process.env.SHARDLAB_URL;
const CHROMIUM = process.env.SHARDLAB_CHROMIUM || '/usr/bin/chromium';
const ARTIFACTS = process.env.SHARDLAB_ARTIFACTS || path.resolve(here, '../../target/browser-artifacts');
// SwiftShader compiles and runs every kernel on the CPU: generous, but finite.
const SELFTEST_TIMEOUT_MS = 300_000;
const ARGS = [
  '--no-sandbox',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--disable-quic',
  '--enable-unsafe-webgpu',
  '--use-webgpu-adapter=swiftshader',
];

let browser;

before(async () => {
  assert.ok(URL_, 'SHARDLAB_URL is not set: run the browser tests with `cargo xtask test`, which serves the page');
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ARGS, headless: true });
});

after(async () => {
  await browser?.close();
});

/// A new page that records every request and every console error.
async function openPage(options = {}) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, ...options });
  const page = await context.newPage();
  const requests = [];
  const consoleErrors = [];
  page.on('request', (r) => requests.push(r.url()));
  page.on('console', (m) => m.type() === 'error' && consoleErrors.push(m.text()));
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  return { context, page, requests, consoleErrors };
}

function foreign(requests) {
  const origin = new URL(URL_).origin;
  return requests.filter((u) => !u.startsWith('data:') && !u.startsWith('blob:') && new URL(u).origin !== origin);
}

test('page shows the adapter and passes the kernel self-test on SwiftShader WebGPU', { timeout: SELFTEST_TIMEOUT_MS + 60_000 }, async () => {
  const { context, page, requests, consoleErrors } = await openPage();
  try {
    await page.goto(URL_);
    await page.waitForFunction(() => ['done', 'error', 'no-webgpu'].includes(document.body.dataset.state), null, {
      timeout: SELFTEST_TIMEOUT_MS,
    });
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: path.join(ARTIFACTS, 'page.png'), fullPage: true });

    const state = await page.evaluate(() => document.body.dataset.state);
    const errorText = (await page.getByTestId('error').textContent()).trim();
    assert.equal(errorText, '', `the page shows an error: ${errorText}`);
    assert.equal(state, 'done', `page state is ${state}; console errors: ${consoleErrors.join(' | ')}`);

    const { adapter, report } = await page.evaluate(() => window.shardlab);
    assert.ok(adapter.backend.length > 0 && adapter.max_compute_invocations_per_workgroup >= 256, JSON.stringify(adapter));
    assert.match(await page.getByTestId('adapter').innerText(), new RegExp(adapter.backend));

    // Every shader module and pipeline was created with no validation error.
    assert.ok(report.pipelines.length > 0, 'no pipelines in the report');
    const badPipelines = report.pipelines.filter((p) => p.status === 'fail');
    assert.deepEqual(badPipelines.map((p) => `${p.shader}::${p.entry}: ${p.message}`), []);
    // Only an extension the adapter lacks may skip a pipeline.
    for (const p of report.pipelines.filter((p) => p.status === 'skip')) assert.match(p.message, /lacks/);

    // Every kernel line passed, and the page shows each one.
    assert.ok(report.kernels.length > 0, 'no kernels in the report');
    const badKernels = report.kernels.filter((k) => k.status !== 'pass');
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
