// The page: checks for WebGPU first, then loads the wasm handle (pkg/, built by
// `cargo xtask serve`), shows the adapter and runs the kernel self-test. All logic lives in
// the wasm; this file only renders. State for tests: document.body.dataset.state
// (loading | no-webgpu | running | done | error) and window.shardlab.

const $ = (id) => document.getElementById(id);
const state = { adapter: null, report: null, error: null };
window.shardlab = state;

function setState(s, status) {
  document.body.dataset.state = s;
  if (status !== undefined) document.querySelector('[data-testid="status"]').textContent = status;
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-')) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function showError(message) {
  const text = String(message && message.message ? message.message : message);
  state.error = text;
  const box = document.querySelector('[data-testid="error"]');
  box.replaceChildren(el('h2', {}, 'Something went wrong'), el('pre', {}, text),
    el('p', { class: 'hint' }, 'Reload the page to try again. If it keeps failing, the message above names the part that failed.'));
  box.hidden = false;
  setState('error', 'Error');
}

window.addEventListener('error', (e) => showError(e.error || e.message));
window.addEventListener('unhandledrejection', (e) => showError(e.reason));

function noWebGpu(reason) {
  if (reason) $('no-webgpu-reason').textContent = reason;
  $('no-webgpu').hidden = false;
  setState('no-webgpu', 'WebGPU unavailable');
}

const fmtBytes = (n) => (n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(1)} GiB` : n >= 2 ** 20 ? `${(n / 2 ** 20).toFixed(0)} MiB` : `${n} B`);
const fmtErr = (x) => (x === null || x === undefined ? '—' : x === 0 ? '0' : x.toExponential(1));
const fmtMs = (ms) => (ms < 1 ? `${(ms * 1000).toFixed(0)} µs` : ms < 1000 ? `${ms.toFixed(1)} ms` : `${(ms / 1000).toFixed(1)} s`);

// Browsers often leave the adapter's name empty; GPUAdapterInfo's vendor and architecture say more.
function adapterName(a, info) {
  if (a.name) return a.name;
  const parts = info ? [info.vendor, info.architecture, info.device, info.description] : [];
  return [...new Set(parts.filter(Boolean))].join(' · ') || '(the browser does not say)';
}

function renderAdapter(a, info) {
  const facts = [['name', adapterName(a, info)], ['backend', a.backend], ['device type', a.device_type]];
  if (a.driver) facts.push(['driver', a.driver]);
  $('adapter-facts').replaceChildren(...facts.flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
  const features = [['timestamp-query', a.timestamp_query], ['shader-f16', a.shader_f16], ['subgroups', a.subgroups]];
  $('adapter-features').replaceChildren(...features.map(([name, on]) =>
    el('span', { class: on ? 'chip on' : 'chip off', title: on ? 'supported' : 'not supported' }, `${on ? '✓' : '✗'} ${name}`)));
  const limits = [
    ['max buffer size', fmtBytes(a.max_buffer_size)],
    ['max storage buffer binding', fmtBytes(a.max_storage_buffer_binding_size)],
    ['max invocations per workgroup', a.max_compute_invocations_per_workgroup],
    ['max workgroup size x', a.max_compute_workgroup_size_x],
    ['max workgroup storage', fmtBytes(a.max_compute_workgroup_storage_size)],
    ['max workgroups per dimension', a.max_compute_workgroups_per_dimension],
    ['max storage buffers per stage', a.max_storage_buffers_per_shader_stage],
  ];
  $('adapter-limits').replaceChildren(...limits.map(([k, v]) => el('tr', {}, el('th', {}, k), el('td', { class: 'num' }, v))));
  $('adapter').hidden = false;
}

const mark = (status) => el('span', { class: `mark ${status}`, title: status }, status === 'pass' ? '✓' : status === 'fail' ? '✗' : '–');

function renderReport(r) {
  $('kernel-rows').replaceChildren(...r.kernels.map((k) => {
    const row = el('tr', { class: k.status, 'data-testid': 'selftest-row', 'data-kind': 'kernel', 'data-status': k.status },
      el('td', {}, mark(k.status)), el('td', {}, k.name), el('td', { class: 'muted' }, k.shape),
      el('td', { class: 'num' }, fmtErr(k.max_abs_error)), el('td', { class: 'num' }, fmtMs(k.ms)));
    return k.message ? [row, el('tr', { class: 'message' }, el('td'), el('td', { colSpan: 4 }, k.message))] : [row];
  }).flat());
  $('pipeline-rows').replaceChildren(...r.pipelines.map((p) =>
    el('tr', { class: p.status, 'data-testid': 'selftest-row', 'data-kind': 'pipeline', 'data-status': p.status },
      el('td', {}, mark(p.status)), el('td', {}, p.shader), el('td', {}, p.entry), el('td', { class: 'muted' }, p.message || ''))));
  const count = (items) => {
    const pass = items.filter((i) => i.status === 'pass').length;
    const skip = items.filter((i) => i.status === 'skip').length;
    return `${pass}/${items.length} pass${skip ? `, ${skip} skipped` : ''}`;
  };
  $('kernel-count').textContent = count(r.kernels);
  $('pipeline-count').textContent = count(r.pipelines);
  if (r.pipelines.some((p) => p.status === 'fail')) $('pipelines-details').open = true;
  const badge = $('selftest-status');
  badge.textContent = r.passed ? `passed in ${fmtMs(r.ms)}` : 'FAILED';
  badge.className = `badge ${r.passed ? 'pass' : 'fail'}`;
}

async function main() {
  // WebGPU first: without it nothing else is loaded.
  if (!window.isSecureContext) {
    return noWebGpu('WebGPU needs a secure context, and this page was not opened in one (plain http on a non-local address).');
  }
  if (!('gpu' in navigator) || !navigator.gpu) return noWebGpu();
  const probe = await navigator.gpu.requestAdapter();
  if (!probe) {
    return noWebGpu('This browser has WebGPU but offers no GPU adapter (the GPU may be blocklisted, or hardware acceleration is off).');
  }

  setState('loading', 'Loading the wasm module…');
  const wasm = await import('../pkg/shardlab_web.js');
  await wasm.default();
  $('version').textContent = `shardlab ${wasm.Shardlab.version()}`;

  setState('loading', 'Opening the GPU…');
  const lab = await wasm.Shardlab.create();
  state.adapter = JSON.parse(lab.adapter());
  renderAdapter(state.adapter, probe.info);

  setState('running', 'Running the kernel self-test…');
  $('selftest').hidden = false;
  state.report = JSON.parse(await lab.selftest());
  renderReport(state.report);
  const gpuError = lab.take_error();
  if (gpuError) return showError(gpuError);
  setState('done', state.report.passed ? 'Ready: self-test passed' : 'Self-test failed');
}

main().catch(showError);
