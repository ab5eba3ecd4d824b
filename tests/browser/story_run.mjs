// Measures what BENCHMARKS.md records for the page's story: "Run the story" as a learner presses
// it, in headless Chromium on SwiftShader WebGPU, RUNS times, each in a fresh page. For each run:
// the seconds from the press to the results, the run the story picked for the adapter, each RNG
// layout's ratios automatic / shard_map and explicit / shard_map (the median of its rounds' paired ratios) with its
// interquartile range, whether the original layout's gap stands outside its spread (its lower
// quartile above 1.0), and the host's load average. Then one summary line.
// Usage: node story_run.mjs http://127.0.0.1:PORT/ [RUNS] [#hash]   (serve <target>/site first)
import os from 'node:os';
import { args, launch } from './bench.mjs';

const [url, runsText = '1', hash = ''] = args('node story_run.mjs URL [RUNS] [#hash]');
const runs = Number(runsText);
const browser = await launch();
const results = [];
try {
  for (let i = 0; i < runs; i++) {
    const page = await browser.newPage();
    await page.goto(url + hash);
    await page.waitForFunction(() => document.body.dataset.state === 'ready', null, { timeout: 120_000 });
    const load = os.loadavg()[0];
    const t0 = Date.now();
    await page.getByTestId('story-run').click();
    await page.waitForFunction(() => (window.shardlab.story.result && !window.shardlab.story.result.running
      && !window.shardlab.driving) || window.shardlab.error, null, { timeout: 1_800_000, polling: 250 });
    const seconds = (Date.now() - t0) / 1000;
    const error = await page.evaluate(() => window.shardlab.error);
    if (error) throw new Error(error);
    // Automatic's ratios keyed by layout, explicit's by `explicit_` and the layout.
    const ratios = await page.locator('[data-testid="story-flag"] [data-testid="story-ratio"]').evaluateAll((xs) => Object.fromEntries(
      xs.map((x) => [x.dataset.mode === 'auto' ? x.dataset.rng : `${x.dataset.mode}_${x.dataset.rng}`,
        { ratio: Number.parseFloat(x.textContent), q1: Number(x.dataset.q1), q3: Number(x.dataset.q3) }])));
    const r = await page.evaluate(() => ({ size: window.shardlab.story.choice.size, shares: window.shardlab.story.result.shares }));
    const row = { run: i + 1, seconds, load_before: load, load_after: os.loadavg()[0], ...r, ...ratios, opened: ratios.original.q1 > 1 };
    results.push(row);
    console.log(JSON.stringify(row));
    await page.close();
  }
} finally {
  await browser.close();
}
const opened = results.filter((r) => r.opened).length;
console.log(`summary: ${opened} of ${results.length} runs with the original layout's gap outside its spread; `
  + `seconds ${Math.min(...results.map((r) => r.seconds)).toFixed(1)}-${Math.max(...results.map((r) => r.seconds)).toFixed(1)}; `
  + `load ${Math.min(...results.map((r) => r.load_before)).toFixed(2)}-${Math.max(...results.map((r) => r.load_after)).toFixed(2)}`);
