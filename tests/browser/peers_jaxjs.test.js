// The in-browser peer benchmark's correctness (tests/browser/peers_jaxjs.mjs times it; speed is
// never a test): on web/peers.html, jax-js's WebGPU backend trains docs/MODEL.md's model
// (web/jaxjs_gpt.js) beside shardlab's engine on the same adapter, and from the same formula
// init on the same formula batch the two give the same losses.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { close, foreign, launch, openPage, STEP_TIMEOUT_MS, URL_ } from './helpers.js';

before(launch);
after(close);

// GptConfig::tiny() with MODEL.md's SGD lr 0.1, no dropout.
const TINY = { layers: 1, d_model: 32, heads: 4, seq: 8, batch: 2, vocab: 64, dropout: 0, optimizer: 'sgd', lr: 0.1 };
// The loss at init and after one update, as a float32 JAX script of MODEL.md prints them
// (`shardlab export jax --init formula --data formula --opt sgd --lr 0.1` at these sizes).
const JAX_LOSSES = [4.1609378, 3.9805374];

test('jax-js trains the formula model to shardlab\'s losses on the same WebGPU adapter', { timeout: 2 * STEP_TIMEOUT_MS }, async () => {
  const { context, page, requests, consoleErrors } = await openPage();
  try {
    await page.goto(new URL('web/peers.html', URL_).href);
    await page.waitForFunction(() => document.body.dataset.state !== 'loading', null, { timeout: 60_000 });
    assert.equal(await page.evaluate(() => document.body.dataset.state), 'ready', consoleErrors.join(' | '));
    await page.evaluate((spec) => window.peers.open(spec), TINY);
    for (const [k, want] of JAX_LOSSES.entries()) {
      const shardlab = await page.evaluate(() => window.peers.step('shardlab'));
      const jaxjs = await page.evaluate(() => window.peers.step('jaxjs'));
      assert.ok(Math.abs(shardlab.loss - want) < 1e-5, `step ${k}: shardlab ${shardlab.loss}, JAX ${want}`);
      assert.ok(Math.abs(jaxjs.loss - shardlab.loss) < 1e-5, `step ${k}: jax-js ${jaxjs.loss}, shardlab ${shardlab.loss}`);
      assert.ok(shardlab.ms > 0 && jaxjs.ms > 0);
    }
    // A run shardlab refuses is an error naming the control, before anything trains.
    const refused = await page.evaluate((spec) => window.peers.open(spec).then(() => 'opened', (e) => e.message),
      { ...TINY, heads: 5 });
    assert.match(refused, /shardlab refuses the run: heads: d_model 32 is not divisible by heads 5/);
    // jax-js is served from the page's own host (web/vendor), as the page's other packages are.
    assert.ok(requests.some((u) => u.includes('/web/vendor/@jax-js/jax/')), 'jax-js was not loaded from web/vendor');
    assert.deepEqual(foreign(requests), []);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});
