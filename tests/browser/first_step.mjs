// Measures what BENCHMARKS.md records for the page: the time from opening it to the first
// finished training step (default settings) in headless Chromium on SwiftShader WebGPU.
// Usage: node first_step.mjs http://127.0.0.1:PORT/   (serve <target>/site first, e.g. cargo xtask serve)
import { chromium } from 'playwright-core';

const url = process.argv[2];
if (!url) {
  console.error('usage: node first_step.mjs URL');
  process.exit(2);
}
const browser = await chromium.launch({
  executablePath: process.env.SHARDLAB_CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--disable-quic', '--enable-unsafe-webgpu', '--use-webgpu-adapter=swiftshader'],
});
try {
  const page = await browser.newPage();
  const t0 = Date.now();
  await page.goto(url);
  await page.waitForFunction(() => document.body.dataset.state === 'ready', null, { timeout: 120_000 });
  const ready = Date.now() - t0;
  await page.getByTestId('single-step').click();
  await page.waitForFunction(() => window.shardlab.steps > 0 || window.shardlab.error, null, { timeout: 300_000 });
  const error = await page.evaluate(() => window.shardlab.error);
  if (error) throw new Error(error);
  console.log(JSON.stringify({ ready_ms: ready, first_step_ms: Date.now() - t0 }));
} finally {
  await browser.close();
}
