// The in-browser peer benchmark's side of the page (web/peers.html): shardlab's engine (the
// wasm handle, `Shardlab.single`: docs/MODEL.md's model on one device with formula init and
// data) and jax-js's WebGPU backend (web/jaxjs_gpt.js: the same model written in jax-js) in one
// page, on the browser's one WebGPU adapter. tests/browser/peers_jaxjs.mjs and
// peers_jaxjs.test.js drive it through window.peers; each step is timed here, by the page's
// clock, from the call to its loss on the host, the same way for both sides.
import * as jax from './vendor/@jax-js/jax/index.js';
import { makeTrainer } from './jaxjs_gpt.js';

const runs = { shardlab: null, jaxjs: null };
let lab = null;

async function start() {
  const adapter = await navigator.gpu?.requestAdapter();
  if (!adapter) throw new Error('no WebGPU adapter');
  const wasm = await import('../pkg/shardlab_web.js');
  await wasm.default();
  lab = await wasm.Shardlab.create();
  const devices = await jax.init('webgpu');
  if (!devices.includes('webgpu')) throw new Error(`jax-js found no WebGPU device (it has ${devices.join(', ')})`);
  jax.defaultDevice('webgpu');
  const info = adapter.info ?? {};
  return {
    adapter: `${info.vendor ?? ''} ${info.architecture ?? ''} ${info.description ?? ''}`.trim(),
    shardlab: { version: wasm.Shardlab.version(), adapter: JSON.parse(lab.adapter()) },
    jaxjs_features: [...jax.getWebGPUDevice().features],
  };
}

const ready = start();

window.peers = {
  ready,
  /** Starts both sides' runs of `spec` (single::Spec's fields; optimizer 'sgd' or 'adamw'),
   * replacing any earlier ones. */
  async open(spec) {
    await ready;
    runs.jaxjs?.dispose();
    runs.shardlab?.free();
    runs.shardlab = lab.single(JSON.stringify(spec));
    const checked = JSON.parse(runs.shardlab.check());
    if (!checked.ok) throw new Error(`shardlab refuses the run: ${checked.error}`);
    const t0 = performance.now();
    runs.jaxjs = await makeTrainer(jax, spec);
    return { params: checked.params, jaxjs_setup_ms: performance.now() - t0 };
  },
  /** One train step of `side` ('shardlab' or 'jaxjs'): {loss, ms} with ms the page's time from
   * the call to the loss read back, and, for shardlab, the core's own step time and, on the
   * first step, the time it took to build (autotuning included). */
  async step(side) {
    const t0 = performance.now();
    if (side === 'jaxjs') {
      const loss = await runs.jaxjs.step();
      return { loss, ms: performance.now() - t0 };
    }
    const r = JSON.parse(await runs.shardlab.step());
    const ms = performance.now() - t0;
    if (!r.ok) throw new Error(`shardlab's step failed: ${r.error}`);
    return { loss: r.loss, ms, core_ms: r.step_ms, build_ms: r.build_ms };
  },
};

ready.then(
  () => { document.body.dataset.state = 'ready'; document.getElementById('status').textContent = 'Ready.'; },
  (e) => {
    document.body.dataset.state = 'error';
    document.getElementById('status').textContent = `Could not start: ${e.message ?? e}`;
    console.error(e);
  },
);
