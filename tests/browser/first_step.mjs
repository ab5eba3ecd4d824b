// Measures what BENCHMARKS.md records for the page: the time from opening it to the first
// finished training step (default settings) in headless Chromium on SwiftShader WebGPU.
// Usage: node first_step.mjs http://127.0.0.1:PORT/   (serve <target>/site first, e.g. cargo xtask serve)
import { args, launch } from './bench.mjs';

const [url] = args('node first_step.mjs URL');
const browser = await launch();
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
