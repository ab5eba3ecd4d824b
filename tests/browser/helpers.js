// Shared by the browser test files: Debian's Chromium (never a downloaded browser) driven by
// playwright-core, with WebGPU on SwiftShader. `cargo xtask test` serves the page and sets
// SHARDLAB_URL; SHARDLAB_CHROMIUM and SHARDLAB_ARTIFACTS may override the browser and the
// screenshot folder.
import assert from 'node:assert/strict';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
export const URL_ = process.env.SHARDLAB_URL;
const CHROMIUM = process.env.SHARDLAB_CHROMIUM || '/usr/bin/chromium';
export const ARTIFACTS = process.env.SHARDLAB_ARTIFACTS || path.resolve(here, '../../target/browser-artifacts');
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

export async function launch() {
  assert.ok(URL_, 'SHARDLAB_URL is not set: run the browser tests with `cargo xtask test`, which serves the page');
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ARGS, headless: true });
}

export async function close() {
  await browser?.close();
}

/// A new page that records every request and every console error.
export async function openPage(options = {}) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, ...options });
  const page = await context.newPage();
  const requests = [];
  const consoleErrors = [];
  page.on('request', (r) => requests.push(r.url()));
  page.on('console', (m) => m.type() === 'error' && consoleErrors.push(m.text()));
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  return { context, page, requests, consoleErrors };
}

export function foreign(requests) {
  const origin = new URL(URL_).origin;
  return requests.filter((u) => !u.startsWith('data:') && !u.startsWith('blob:') && new URL(u).origin !== origin);
}

// SwiftShader runs every kernel on the CPU: the tests train a tiny model on 2 devices.
export const TINY = {
  preset: 'dp', mode: 'auto', mesh: 'dp=2', layers: '1', d_model: '32', heads: '2', seq: '8', batch: '8', vocab: '32',
  dropout: '0.1', rng: 'original', dropout_key: 'same', combine: '0', device: 'tpu_v4',
};
export const STEP_TIMEOUT_MS = 180_000;
export const hashOf = (over = {}) => `#${new URLSearchParams({ ...TINY, ...over }).toString()}`;

export async function openReady(hash, options = {}) {
  const opened = await openPage(options);
  await opened.page.goto(URL_ + hash);
  await opened.page.waitForFunction(() => ['ready', 'error', 'no-webgpu'].includes(document.body.dataset.state), null, {
    timeout: 60_000,
  });
  assert.equal(await opened.page.evaluate(() => document.body.dataset.state), 'ready', opened.consoleErrors.join(' | '));
  return opened;
}

/**
 * Sets a checkbox by clicking it as a person does, while the page trains. Play's redraws can shift
 * the layout between Playwright's scroll and its click, so a click that missed is tried again
 * (up to three times); a checkbox that never takes the state still fails.
 */
export async function setCheckedWhileLive(locator, checked) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await locator.setChecked(checked);
    } catch (e) {
      if (attempt >= 3 || !/did not change its state/.test(String(e))) throw e;
    }
  }
}

/** Presses Step `n` times, waiting for each step, and returns the page's step counter. */
export async function singleSteps(page, n) {
  for (let i = 0; i < n; i++) {
    const before = await page.evaluate(() => window.shardlab.steps);
    await page.getByTestId('single-step').click();
    await page.waitForFunction((b) => window.shardlab.steps > b || window.shardlab.error, before, { timeout: STEP_TIMEOUT_MS });
    const error = await page.evaluate(() => window.shardlab.error);
    assert.equal(error, null, `step failed: ${error}`);
  }
  return Number(await page.getByTestId('step').textContent());
}

/** Waits until the session has nothing in flight or waiting. */
export async function settled(page) {
  await page.waitForFunction(() => !window.shardlab.driving && !window.shardlab.busy, null, { timeout: STEP_TIMEOUT_MS });
}

/** The form's values by control name (the hash keys). */
export const formValues = (page) => page.evaluate(() => Object.fromEntries([...document.getElementById('settings').elements]
  .filter((e) => e.name).map((e) => [e.name, e.type === 'checkbox' ? String(e.checked) : e.value])));

/** Opens the folded parts around `locator` as a learner does: by pressing their summaries,
 * outermost first. */
export async function reveal(locator) {
  const closed = locator.locator('xpath=ancestor::details[not(@open)]/summary');
  while ((await closed.count()) > 0) await closed.first().click();
}

/** Sets one control as a user would and fires its change event. */
export async function setControl(page, name, value) {
  const input = page.locator(`[name="${name}"]`);
  await reveal(input);
  if ((await input.evaluate((e) => e.tagName)) === 'SELECT') await input.selectOption(value);
  else {
    await input.fill(value);
    await input.dispatchEvent('change');
  }
}

/** Opens the link `page` wrote in a fresh page: it must reopen with the same settings and no
 * notice; `more(second)` checks whatever else must come back. */
export async function assertLinkReopens(page, more = async () => {}, what = '') {
  const second = await openReady(new URL(page.url()).hash);
  try {
    assert.deepEqual(await formValues(second.page), await formValues(page), what);
    assert.equal(await second.page.getByTestId('hash-notice').isVisible(), false, what);
    await more(second.page);
  } finally {
    await second.context.close();
  }
}

export const location = (page) => decodeURIComponent(new URL(page.url()).hash);

/** The seconds the page's cached "this GPU" calibration took, as the page recorded them
 * (undefined before one is cached). */
export const cachedCalibrationSeconds = (page) => page.evaluate(() => JSON.parse(localStorage.getItem(
  Object.keys(localStorage).find((k) => k.startsWith('shardlab.this-gpu.'))) ?? 'null')?.seconds);

/** Everything that sticks out of its panel, every visible placeholder its input cuts off, and
 * every option its select cuts (run in the page: `page.evaluate(overflows)`). */
export function overflows() {
  const out = [];
  const scrolls = (e) => /auto|scroll|hidden|clip/.test(getComputedStyle(e).overflowX);
  const panels = [...document.querySelectorAll('.site-header, main > .panel, .site-footer')].filter((p) => p.offsetParent);
  for (const panel of panels) {
    const edge = panel.getBoundingClientRect();
    const walk = (e) => {
      for (const c of e.children) {
        const b = c.getBoundingClientRect();
        if (b.width > 0 && (b.right > edge.right + 1 || b.left < edge.left - 1)) {
          out.push(`${panel.id || panel.className}: <${c.tagName.toLowerCase()}${c.id ? `#${c.id}` : ''} class="${c.className}"> spans ${Math.round(b.left)}–${Math.round(b.right)} px, the panel ${Math.round(edge.left)}–${Math.round(edge.right)}: “${c.textContent.trim().slice(0, 50)}”`);
        } else if (!scrolls(c)) walk(c);
      }
    };
    walk(panel);
  }
  const ctx = document.createElement('canvas').getContext('2d');
  for (const i of document.querySelectorAll('input[placeholder]')) {
    if (!i.offsetParent || i.value) continue;
    const s = getComputedStyle(i);
    ctx.font = s.font;
    const need = ctx.measureText(i.placeholder).width + parseFloat(s.paddingLeft) + parseFloat(s.paddingRight);
    if (need > i.clientWidth + 1) out.push(`the placeholder “${i.placeholder}” of ${i.name || i.dataset.testid} needs ${Math.round(need)} px, its input has ${i.clientWidth}`);
  }
  // A select shows its chosen option in its box: every option must fit there, its arrow beside.
  for (const sel of document.querySelectorAll('select')) {
    if (!sel.offsetParent) continue;
    const s = getComputedStyle(sel);
    ctx.font = s.font;
    const room = sel.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight) - 20;
    for (const o of sel.options) {
      const need = ctx.measureText(o.textContent).width;
      if (need > room + 1) out.push(`the option “${o.textContent}” of ${sel.name || sel.id} needs ${Math.round(need)} px, its select shows ${Math.round(room)}`);
    }
  }
  if (document.documentElement.scrollWidth > window.innerWidth) out.push(`the page is ${document.documentElement.scrollWidth} px wide in a ${window.innerWidth} px window`);
  return out;
}
