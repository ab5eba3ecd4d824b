// Measures what BENCHMARKS.md records for the page's story: "Run the story" on the seed preset
// (or the settings of a hash) in headless Chromium on SwiftShader WebGPU, and what it reports:
// each RNG layout's paired ratio automatic / shard_map with its interquartile range, and
// whether the two are distinguishable.
// Usage: node story_run.mjs http://127.0.0.1:PORT/ [#hash]   (serve <target>/site first)
import { args, launch } from './bench.mjs';

const [url, hash = '#preset=seed'] = args('node story_run.mjs URL [#hash]');
const browser = await launch();
try {
  const page = await browser.newPage();
  await page.goto(url + hash);
  await page.waitForFunction(() => document.body.dataset.state === 'ready', null, { timeout: 120_000 });
  const t0 = Date.now();
  await page.getByTestId('story-run').click();
  await page.waitForFunction(() => (document.querySelector('[data-testid="story-verdict"]') && !window.shardlab.driving)
    || window.shardlab.error, null, { timeout: 1_800_000, polling: 1000 });
  const error = await page.evaluate(() => window.shardlab.error);
  if (error) throw new Error(error);
  const measured = await page.evaluate(() => Object.values(window.shardlab.story.measured).find((m) => m.original && m.partitionable));
  const verdict = await page.getByTestId('story-verdict').getAttribute('data-distinguishable');
  console.log(JSON.stringify({ seconds: (Date.now() - t0) / 1000, distinguishable: verdict === 'true', ...measured }));
} finally {
  await browser.close();
}
