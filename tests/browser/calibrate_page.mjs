// Measures what BENCHMARKS.md records for the page's "this GPU": the seconds its calibration
// takes in headless Chromium on SwiftShader WebGPU, the first (which also builds its pipelines
// and tunes its matmul classes) and each recalibration after it (the microbenchmarks alone,
// whose goal is under 5 s). A speed goal is a benchmark's to check, never a test's.
// Usage: node calibrate_page.mjs http://127.0.0.1:PORT/ [--rounds N]   (serve the page first,
// e.g. cargo xtask serve)
import { args, launch } from './bench.mjs';
import { cachedCalibrationSeconds, setControl } from './helpers.js';

const [url, ...rest] = args('node calibrate_page.mjs URL [--rounds N]');
const flag = rest.indexOf('--rounds');
const rounds = flag >= 0 ? Number(rest[flag + 1]) : 3;
if (!Number.isInteger(rounds) || rounds < 1 || rounds > 20) {
  console.error('--rounds takes a whole number from 1 to 20 (recalibrations after the first)');
  process.exit(2);
}
const browser = await launch();
try {
  const page = await browser.newPage();
  await page.goto(url);
  await page.waitForFunction(() => document.body.dataset.state === 'ready', null, { timeout: 120_000 });
  const cached = () => cachedCalibrationSeconds(page);
  await setControl(page, 'device', 'this');
  await page.waitForFunction(() => document.body.dataset.thisGpu === 'measured', null, { timeout: 300_000 });
  const first = await cached();
  const again = [];
  for (let i = 0; i < rounds; i++) {
    // A click sets the page measuring at once; once measured, the new calibration is cached.
    await page.getByTestId('recalibrate').click();
    await page.waitForFunction(() => document.body.dataset.thisGpu === 'measured', null, { timeout: 300_000 });
    again.push(await cached());
  }
  const sorted = [...again].sort((a, b) => a - b);
  console.log(JSON.stringify({ first_s: first, recalibrations_s: again, median_s: sorted[Math.floor(sorted.length / 2)] }));
} finally {
  await browser.close();
}
